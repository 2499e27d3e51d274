//! A client of the kubelet API for tests: raw HTTPS with the server's certificate pinned, an
//! optional client certificate and an optional bearer token; and a throwaway CA that issues
//! client certificates for any user.

use std::net::SocketAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A client certificate and its key.
pub struct ClientCert {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for ClientCert {
    fn clone(&self) -> Self {
        ClientCert {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl ClientCert {
    /// Reads a PEM certificate and key (e.g. the testenv's `apiserver-kubelet-client` pair).
    pub fn from_pem_files(cert: &std::path::Path, key: &std::path::Path) -> Self {
        let chain = CertificateDer::pem_file_iter(cert)
            .expect("client cert file")
            .collect::<Result<Vec<_>, _>>()
            .expect("client cert pem");
        let key = PrivateKeyDer::from_pem_file(key).expect("client key pem");
        ClientCert { chain, key }
    }
}

/// How a request authenticates.
#[derive(Clone, Default)]
pub struct Creds {
    pub cert: Option<ClientCert>,
    pub token: Option<String>,
}

impl Creds {
    pub fn none() -> Self {
        Creds::default()
    }
    pub fn cert(cert: ClientCert) -> Self {
        Creds {
            cert: Some(cert),
            token: None,
        }
    }
    pub fn token(token: &str) -> Self {
        Creds {
            cert: None,
            token: Some(token.to_owned()),
        }
    }
}

/// A throwaway CA (ECDSA P-256) that issues client certificates.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("ca key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("ca cert"),
        }
    }

    /// The CA certificate in PEM (for `VK_CLIENT_CA_FILE`).
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate in DER.
    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A client certificate for user `cn` in groups `orgs`.
    pub fn client(&self, cn: &str, orgs: &[&str]) -> ClientCert {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        for o in orgs {
            dn.push(DnType::OrganizationName, *o);
        }
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().expect("client key");
        let cert = params.signed_by(&key, &self.issuer).expect("client cert");
        ClientCert {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }
}

/// Accepts exactly the pinned certificate (the server's self-signed one).
#[derive(Debug)]
struct Pinned {
    der: Vec<u8>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.der.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "unexpected server certificate".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// One HTTPS request with `Connection: close`: `Ok((status, body))`, or `Err` with the text
/// of a connection or TLS failure (a refused client certificate fails here).
pub async fn request(
    addr: SocketAddr,
    server_der: &[u8],
    method: &str,
    path: &str,
    creds: &Creds,
) -> Result<(u16, String), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned {
            der: server_der.to_vec(),
            provider,
        }));
    let config = match &creds.cert {
        Some(c) => builder
            .with_client_auth_cert(c.chain.clone(), c.key.clone_key())
            .map_err(|e| e.to_string())?,
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls handshake: {e}"))?;
    let auth = creds
        .token
        .as_ref()
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    // TLS 1.3 reports a refused client certificate only on the first read; a missing
    // close_notify after the response is fine.
    let read = tls.read_to_end(&mut raw).await;
    if raw.is_empty() {
        return Err(match read {
            Err(e) => format!("read: {e}"),
            Ok(_) => "connection closed without a response".into(),
        });
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no response head in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

/// A TLS connection to the kubelet API (server certificate pinned, `creds`' certificate if
/// any), for requests whose response streams (followed logs).
pub async fn connect(
    addr: SocketAddr,
    server_der: &[u8],
    creds: &Creds,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned {
            der: server_der.to_vec(),
            provider,
        }));
    let config = match &creds.cert {
        Some(c) => builder
            .with_client_auth_cert(c.chain.clone(), c.key.clone_key())
            .map_err(|e| e.to_string())?,
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls handshake: {e}"))
}

/// A streaming `GET path`: the status and the first body bytes read with the head, and the
/// connection to read the rest from (the body comes chunked; tests look for text in it).
pub async fn stream_get(
    addr: SocketAddr,
    server_der: &[u8],
    path: &str,
    creds: &Creds,
) -> Result<(u16, String, tokio_rustls::client::TlsStream<TcpStream>), String> {
    let mut tls = connect(addr, server_der, creds).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = tls.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "connection closed before the response head: {:?}",
                String::from_utf8_lossy(&raw)
            ));
        }
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("no status in {head:?}"))?;
            return Ok((status, body.to_owned(), tls));
        }
    }
}
