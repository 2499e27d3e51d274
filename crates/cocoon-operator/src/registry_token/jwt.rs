//! The registry token itself: a JWT signed ES256 with the service's P-256 key, its header `kid`
//! the libtrust fingerprint of the public key (the form docker-registry looks up among the keys
//! of its `auth.token.rootcertbundle` certificates).

use base64::Engine as _;
use ring::rand::{SecureRandom as _, SystemRandom};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde::Serialize;

use super::grant::Access;

/// Errors of loading the key or signing.
#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("{field}: {detail}")]
    Key { field: String, detail: String },
    #[error("signing the token failed")]
    Sign,
    #[error("encoding the token: {0}")]
    Json(#[from] serde_json::Error),
}

/// DER prefix of a P-256 SubjectPublicKeyInfo, before the 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The claims of one token (distribution token spec).
#[derive(Debug, Clone, Serialize)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: String,
    pub exp: i64,
    pub nbf: i64,
    pub iat: i64,
    pub jti: String,
    pub access: Vec<Access>,
}

#[derive(Serialize)]
struct Header<'a> {
    typ: &'static str,
    alg: &'static str,
    kid: &'a str,
}

/// The signing key.
pub struct Signer {
    key: EcdsaKeyPair,
    kid: String,
    rng: SystemRandom,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("kid", &self.kid).finish()
    }
}

impl Signer {
    /// Loads a PEM `PRIVATE KEY` (PKCS#8, EC P-256) such as `openssl genpkey -algorithm EC
    /// -pkeyopt ec_paramgen_curve:P-256` writes; `field` names the setting in errors.
    pub fn from_pem(pem: &str, field: &str) -> Result<Signer, JwtError> {
        let err = |detail: &str| JwtError::Key {
            field: field.to_owned(),
            detail: detail.to_owned(),
        };
        let der = pem_block(pem, "PRIVATE KEY")
            .ok_or_else(|| err("no PEM \"PRIVATE KEY\" (PKCS#8) block; EC P-256 keys only"))?;
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
            .map_err(|e| err(&format!("not a PKCS#8 EC P-256 key: {e}")))?;
        let kid = libtrust_key_id(key.public_key().as_ref());
        Ok(Signer { key, kid, rng })
    }

    /// The `kid` of every token: the libtrust fingerprint of the public key.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// A random token id (`jti`).
    pub fn jti(&self) -> Result<String, JwtError> {
        let mut b = [0u8; 16];
        self.rng.fill(&mut b).map_err(|_| JwtError::Sign)?;
        Ok(b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// The compact JWS of `claims`.
    pub fn sign(&self, claims: &Claims) -> Result<String, JwtError> {
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let header = serde_json::to_vec(&Header {
            typ: "JWT",
            alg: "ES256",
            kid: &self.kid,
        })?;
        let input = format!("{}.{}", b64(&header), b64(&serde_json::to_vec(claims)?));
        // The fixed encoding is JOSE's r‖s.
        let sig = self
            .key
            .sign(&self.rng, input.as_bytes())
            .map_err(|_| JwtError::Sign)?;
        Ok(format!("{input}.{}", b64(sig.as_ref())))
    }

    /// The uncompressed public point (for tests that verify tokens).
    pub fn public_key(&self) -> &[u8] {
        self.key.public_key().as_ref()
    }
}

/// libtrust's key id: the SHA-256 of the DER SubjectPublicKeyInfo, cut to 240 bits, base32
/// without padding, in 12 groups of 4 joined by `:`.
pub fn libtrust_key_id(p256_point: &[u8]) -> String {
    let mut spki = P256_SPKI_PREFIX.to_vec();
    spki.extend_from_slice(p256_point);
    let digest = ring::digest::digest(&ring::digest::SHA256, &spki);
    let b32 = base32(&digest.as_ref()[..30]);
    b32.as_bytes()
        .chunks(4)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join(":")
}

/// RFC 4648 base32 (standard alphabet), no padding.
fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((acc >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((acc << (5 - bits)) & 31) as usize]));
    }
    out
}

/// The DER of the first PEM block labelled `label`.
fn pem_block(pem: &str, label: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem.find(&begin)? + begin.len();
    let stop = start + pem[start..].find(&end)?;
    let body: String = pem[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_matches_rfc4648_vectors() {
        // RFC 4648 §10, padding removed.
        for (input, want) in [
            ("", ""),
            ("f", "MY"),
            ("fo", "MZXQ"),
            ("foo", "MZXW6"),
            ("foob", "MZXW6YQ"),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI"),
        ] {
            assert_eq!(base32(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn key_id_has_libtrust_shape() {
        let kid = libtrust_key_id(&[4u8; 65]);
        let groups: Vec<&str> = kid.split(':').collect();
        assert_eq!(groups.len(), 12, "{kid}");
        assert!(groups.iter().all(|g| g.len() == 4), "{kid}");
    }

    #[test]
    fn signed_token_verifies_with_the_public_key() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let signer = Signer::from_pem(&key.serialize_pem(), "KEY").expect("signer");
        let claims = Claims {
            iss: "i".into(),
            sub: "s".into(),
            aud: "a".into(),
            exp: 2,
            nbf: 0,
            iat: 1,
            jti: signer.jti().expect("jti"),
            access: Vec::new(),
        };
        let jwt = signer.sign(&claims).expect("sign");
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let dec = |s: &str| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(s)
                .expect("b64url")
        };
        let header: serde_json::Value = serde_json::from_slice(&dec(parts[0])).expect("header");
        assert_eq!(header["alg"], "ES256");
        assert_eq!(header["kid"], signer.kid());
        let pk = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            signer.public_key(),
        );
        let input = format!("{}.{}", parts[0], parts[1]);
        pk.verify(input.as_bytes(), &dec(parts[2]))
            .expect("signature verifies");
    }

    #[test]
    fn a_key_that_is_not_pkcs8_p256_names_the_setting() {
        let err = Signer::from_pem("nothing here", "REGISTRY_TOKEN_KEY_FILE").unwrap_err();
        assert!(
            err.to_string().starts_with("REGISTRY_TOKEN_KEY_FILE: "),
            "{err}"
        );
    }
}
