//! The kubelet serving certificate (`node.md` §1 step 6): load `VK_TLS_CERT`/`VK_TLS_KEY`, or
//! fall back to an in-memory self-signed ECDSA P-256 certificate valid for 10 years.
//!
//! The fallback covers empty paths, a missing certificate file and an expired certificate. A
//! certificate that exists but cannot be parsed (or whose key is unreadable) is an error: that is
//! a broken deployment, not a first start. rustls gets the ring provider explicitly, never a
//! process-wide default.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use chrono::Datelike;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Errors loading or generating the serving certificate.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("read kubelet certificate {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("generate self-signed kubelet certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("build kubelet TLS config: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("read client CA {path} (VK_CLIENT_CA_FILE): {reason}")]
    ClientCa { path: String, reason: String },
    #[error("client CA verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// Reads the client CA bundle (`VK_CLIENT_CA_FILE`): every PEM certificate in the file, at
/// least one.
pub fn load_client_ca(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError::ClientCa {
        path: path.display().to_string(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no PEM certificate in the file".into()));
    }
    Ok(certs)
}

/// A certificate chain and its key, in DER.
#[derive(Debug)]
pub struct TlsMaterial {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// True when generated in memory.
    pub self_signed: bool,
}

impl Clone for TlsMaterial {
    fn clone(&self) -> Self {
        TlsMaterial {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            self_signed: self.self_signed,
        }
    }
}

impl TlsMaterial {
    /// Loads `cert`/`key`, or generates a self-signed certificate for `node_name`/`node_ip`
    /// when the paths are empty, the certificate is missing or it has expired.
    pub fn load_or_generate(
        cert: &Path,
        key: &Path,
        node_name: &str,
        node_ip: IpAddr,
    ) -> Result<Self, TlsError> {
        if cert.as_os_str().is_empty() || key.as_os_str().is_empty() {
            tracing::info!("no kubelet TLS paths configured; using a self-signed certificate");
            return Self::self_signed(node_name, node_ip);
        }
        if !cert.exists() {
            tracing::info!(cert = %cert.display(), "kubelet certificate missing; using a self-signed certificate");
            return Self::self_signed(node_name, node_ip);
        }
        let read_err = |path: &Path, e: &dyn std::fmt::Display| TlsError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| read_err(cert, &e))?
            .collect::<Result<_, _>>()
            .map_err(|e| read_err(cert, &e))?;
        let Some(leaf) = chain.first() else {
            return Err(read_err(cert, &"no certificate in file"));
        };
        if is_expired(leaf.as_ref()).map_err(|e| read_err(cert, &e))? {
            tracing::warn!(cert = %cert.display(), "kubelet certificate expired; using a self-signed certificate");
            return Self::self_signed(node_name, node_ip);
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| read_err(key, &e))?;
        Ok(TlsMaterial {
            chain,
            key,
            self_signed: false,
        })
    }

    /// CN = node name; SANs = node name, `localhost`, node IP, `127.0.0.1`; 10 years from today.
    pub fn self_signed(node_name: &str, node_ip: IpAddr) -> Result<Self, TlsError> {
        let mut sans = vec![node_name.to_string(), "localhost".to_string()];
        for ip in [node_ip.to_string(), "127.0.0.1".to_string()] {
            if !sans.contains(&ip) {
                sans.push(ip);
            }
        }
        let mut params = rcgen::CertificateParams::new(sans)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, node_name);
        let today = chrono::Utc::now().date_naive();
        // Month/day come from a valid date, so they fit in u8; Feb 29 + 10 years is not
        // always a date, hence the day clamp to 28.
        let (m, d) = (
            u8::try_from(today.month()).unwrap_or(1),
            u8::try_from(today.day().min(28)).unwrap_or(1),
        );
        params.not_before = rcgen::date_time_ymd(today.year(), m, d);
        params.not_after = rcgen::date_time_ymd(today.year() + 10, m, d);
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let cert = params.self_signed(&key)?;
        Ok(TlsMaterial {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            self_signed: true,
        })
    }

    /// A rustls server config (ring provider, HTTP/1.1 ALPN). With `client_ca`, a client
    /// certificate is requested and, when presented, must chain to one of them (a foreign one
    /// fails the handshake); a client may also present none and authenticate with a token.
    pub fn server_config(
        &self,
        client_ca: &[CertificateDer<'static>],
    ) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = if client_ca.is_empty() {
            builder.with_no_client_auth()
        } else {
            let mut roots = rustls::RootCertStore::empty();
            for ca in client_ca {
                roots.add(ca.clone())?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()?;
            builder.with_client_cert_verifier(verifier)
        };
        let mut config = builder.with_single_cert(self.chain.clone(), self.key.clone_key())?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// True when the certificate's notAfter is in the past.
fn is_expired(der: &[u8]) -> Result<bool, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    Ok(cert.validity().not_after.timestamp() < chrono::Utc::now().timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_has_the_spec_names() {
        let m = TlsMaterial::self_signed("vk1", "10.0.0.7".parse().expect("ip")).expect("cert");
        let (_, cert) = x509_parser::parse_x509_certificate(m.chain[0].as_ref()).expect("parse");
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok());
        assert_eq!(cn, Some("vk1"));
        let sans = cert
            .subject_alternative_name()
            .expect("ext")
            .expect("sans")
            .value
            .general_names
            .iter()
            .map(|n| format!("{n}"))
            .collect::<Vec<_>>()
            .join(",");
        // x509-parser prints IP SANs as hex octets.
        for want in [
            "DNSName(vk1)",
            "DNSName(localhost)",
            "IPAddress(0a:00:00:07)",
            "IPAddress(7f:00:00:01)",
        ] {
            assert!(sans.contains(want), "{want} not in {sans}");
        }
        let years = (cert.validity().not_after.timestamp()
            - cert.validity().not_before.timestamp())
            / (365 * 24 * 3600);
        assert_eq!(years, 10);
        assert!(m.server_config(&[]).is_ok());
        assert!(m.server_config(&m.chain).is_ok());
    }

    #[test]
    fn missing_file_falls_back_and_files_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("c.crt"), dir.path().join("c.key"));
        let m = TlsMaterial::load_or_generate(&cert, &key, "n", "127.0.0.1".parse().expect("ip"))
            .expect("fallback");
        assert!(m.self_signed);

        let params = rcgen::CertificateParams::new(vec!["n".to_string()]).expect("params");
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let c = params.self_signed(&kp).expect("cert");
        std::fs::write(&cert, c.pem()).expect("write cert");
        std::fs::write(&key, kp.serialize_pem()).expect("write key");
        let m = TlsMaterial::load_or_generate(&cert, &key, "n", "127.0.0.1".parse().expect("ip"))
            .expect("load");
        assert!(!m.self_signed);

        let mut old = rcgen::CertificateParams::new(vec!["n".to_string()]).expect("params");
        old.not_before = rcgen::date_time_ymd(2000, 1, 1);
        old.not_after = rcgen::date_time_ymd(2001, 1, 1);
        std::fs::write(&cert, old.self_signed(&kp).expect("cert").pem()).expect("write");
        let m = TlsMaterial::load_or_generate(&cert, &key, "n", "127.0.0.1".parse().expect("ip"))
            .expect("expired → fallback");
        assert!(m.self_signed);
    }
}
