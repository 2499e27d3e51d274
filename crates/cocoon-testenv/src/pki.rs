//! Throwaway PKI generated in-process with rcgen: a CA, the apiserver serving cert, one
//! client cert per identity, and the service-account key pair (all ECDSA P-256).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// A client identity of the control plane: file stem, CN and optional O (group).
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub stem: &'static str,
    pub common_name: &'static str,
    pub organization: Option<&'static str>,
}

/// The identities we issue client certificates for. The scheduler and controller-manager
/// CNs match the bootstrap RBAC bindings, so no extra RBAC is needed.
pub const IDENTITIES: [Identity; 4] = [
    Identity {
        stem: "admin",
        common_name: "testenv-admin",
        organization: Some("system:masters"),
    },
    Identity {
        stem: "scheduler",
        common_name: "system:kube-scheduler",
        organization: None,
    },
    Identity {
        stem: "controller-manager",
        common_name: "system:kube-controller-manager",
        organization: None,
    },
    Identity {
        stem: "apiserver-kubelet-client",
        common_name: "kube-apiserver-kubelet-client",
        organization: Some("kubeadm:cluster-admins"),
    },
];

/// Absolute paths of the generated files.
#[derive(Debug, Clone)]
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }
    pub fn cert(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}.crt"))
    }
    pub fn key(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}.key"))
    }
    pub fn sa_pub(&self) -> PathBuf {
        self.dir.join("sa.pub")
    }
    pub fn sa_key(&self) -> PathBuf {
        self.dir.join("sa.key")
    }

    /// Writes the whole PKI into `dir` (created if needed).
    pub fn generate(dir: &Path) -> Result<Pki> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let pki = Pki {
            dir: dir.to_path_buf(),
        };

        let ca_params = ca_params();
        let ca_key = KeyPair::generate()?;
        write(&pki.ca_key(), &ca_key.serialize_pem())?;
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;
        write(&pki.ca_cert(), &ca.pem())?;

        let mut server = leaf("kube-apiserver", None, ExtendedKeyUsagePurpose::ServerAuth);
        server.subject_alt_names = vec![
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
        ];
        for dns in [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ] {
            server
                .subject_alt_names
                .push(SanType::DnsName(dns.try_into()?));
        }
        issue(&pki, "apiserver", &server, &ca)?;

        for id in IDENTITIES {
            let params = leaf(
                id.common_name,
                id.organization,
                ExtendedKeyUsagePurpose::ClientAuth,
            );
            issue(&pki, id.stem, &params, &ca)?;
        }

        // The apiserver verifies service-account tokens with the PKIX public key and the
        // apiserver/controller-manager sign with the PKCS#8 private key; both accept P-256.
        let sa = KeyPair::generate()?;
        write(&pki.sa_key(), &sa.serialize_pem())?;
        write(&pki.sa_pub(), &sa.public_key_pem())?;
        Ok(pki)
    }
}

/// Issues a kubelet client certificate for `node` (CN `system:node:<node>`, O
/// `system:nodes`, so the Node authorizer lets it act for that node) with the CA of an
/// existing PKI in `pki_dir`, written as `<out_stem>.crt` / `.key` into `out_dir`. The CA's
/// distinguished name is the one [`Pki::generate`] gives it, so the issuer name matches.
pub fn issue_node_client(
    pki_dir: &Path,
    node: &str,
    out_dir: &Path,
    out_stem: &str,
) -> Result<(PathBuf, PathBuf)> {
    let pki = Pki {
        dir: pki_dir.to_path_buf(),
    };
    let ca_key_path = pki.ca_key();
    let ca_key_pem = std::fs::read_to_string(&ca_key_path)
        .map_err(|e| Error::io(format!("reading {}", ca_key_path.display()), e))?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)?;
    let issuer = rcgen::Issuer::new(ca_params(), ca_key);
    let params = leaf(
        &format!("system:node:{node}"),
        Some("system:nodes"),
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let out = Pki {
        dir: out_dir.to_path_buf(),
    };
    write(&out.key(out_stem), &key.serialize_pem())?;
    write(&out.cert(out_stem), &cert.pem())?;
    Ok((out.cert(out_stem), out.key(out_stem)))
}

fn ca_params() -> CertificateParams {
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = dn("testenv-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params
}

fn dn(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn.push(DnType::CommonName, cn);
    dn
}

fn leaf(cn: &str, org: Option<&str>, eku: ExtendedKeyUsagePurpose) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(cn, org);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![eku];
    params.use_authority_key_identifier_extension = true;
    params
}

fn issue(
    pki: &Pki,
    stem: &str,
    params: &CertificateParams,
    ca: &CertifiedIssuer<'_, KeyPair>,
) -> Result<()> {
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    write(&pki.key(stem), &key.serialize_pem())?;
    write(&pki.cert(stem), &cert.pem())
}

fn write(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // Keys are throwaway, but keep them private anyway so nothing warns about modes.
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    f.write_all(contents.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
