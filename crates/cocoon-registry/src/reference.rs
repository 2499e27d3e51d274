//! Addressing (registry.md §1): the `OCI_REGISTRY` base (host plus optional path prefix), the
//! logical repository → wire path mapping, and tag/digest/reference parsing. Pure.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use crate::error::{Error, Result};

/// The scheme written in `OCI_REGISTRY`, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// `OCI_REGISTRY` parsed: `[http://|https://]host[:port][/prefix...]`.
///
/// Plain HTTP is used when the value starts with `http://`, or when the host is loopback
/// (`localhost`, 127.0.0.0/8, `[::1]`) and no scheme is written, or when the host is listed
/// as insecure in [`crate::RegistryConfig`]. Everything else is HTTPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryBase {
    scheme: Option<Scheme>,
    /// `host[:port]` as written (host part lowercased).
    host: String,
    /// The path prefix without leading or trailing `/`; empty when there is none.
    prefix: String,
}

impl RegistryBase {
    /// Parses an `OCI_REGISTRY` value. `field` names the setting in errors.
    pub fn parse(value: &str) -> Result<RegistryBase> {
        const FIELD: &str = "OCI_REGISTRY";
        let v = value.trim();
        if v.is_empty() {
            return Err(Error::MissingSetting { name: FIELD.into() });
        }
        let (scheme, rest) = if let Some(r) = strip_prefix_ci(v, "http://") {
            (Some(Scheme::Http), r)
        } else if let Some(r) = strip_prefix_ci(v, "https://") {
            (Some(Scheme::Https), r)
        } else if v.contains("://") {
            return Err(Error::invalid(
                FIELD,
                format!("unsupported scheme in {v:?} (use http:// or https://, or none)"),
            ));
        } else {
            (None, v)
        };
        let rest = rest.trim_end_matches('/');
        let (host, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let host = validate_host(host).map_err(|reason| Error::invalid(FIELD, reason))?;
        if !prefix.is_empty() {
            validate_repository(prefix).map_err(|e| match e {
                Error::Invalid { reason, .. } => {
                    Error::invalid(FIELD, format!("path prefix {prefix:?}: {reason}"))
                }
                e => e,
            })?;
        }
        Ok(RegistryBase {
            scheme,
            host,
            prefix: prefix.to_string(),
        })
    }

    /// `host[:port]`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The path prefix (no surrounding slashes), possibly empty.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The scheme written in `OCI_REGISTRY`, if any.
    pub fn explicit_scheme(&self) -> Option<Scheme> {
        self.scheme
    }

    /// Whether the host is loopback: `localhost`, 127.0.0.0/8 or `::1`.
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(host_name(&self.host))
    }

    /// The scheme to use, given the hosts configured as insecure.
    pub fn scheme(&self, insecure_hosts: &[String]) -> Scheme {
        match self.scheme {
            Some(s) => s,
            None if self.is_loopback() => Scheme::Http,
            None if insecure_hosts.iter().any(|h| {
                h.eq_ignore_ascii_case(&self.host) || h.eq_ignore_ascii_case(host_name(&self.host))
            }) =>
            {
                Scheme::Http
            }
            None => Scheme::Https,
        }
    }

    /// The wire repository path of logical repository `repo`: `<prefix>/<repo>`.
    pub fn repository_path(&self, repo: &str) -> String {
        if self.prefix.is_empty() {
            repo.to_string()
        } else {
            format!("{}/{}", self.prefix, repo)
        }
    }

    /// The human-readable form `<OCI_REGISTRY>/<repo>:<tag>` or `<OCI_REGISTRY>/<repo>@<digest>`.
    pub fn reference_string(&self, repo: &str, reference: &Reference) -> String {
        format!("{}/{}{}", self, repo, reference.suffix())
    }
}

impl fmt::Display for RegistryBase {
    /// `host[:port][/prefix]`, without a scheme (the form image references use).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            f.write_str(&self.host)
        } else {
            write!(f, "{}/{}", self.host, self.prefix)
        }
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// The host name of `host[:port]` (brackets of an IPv6 literal removed).
fn host_name(host_port: &str) -> &str {
    if let Some(rest) = host_port.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host_port.split(':').next().unwrap_or(host_port)
}

fn is_loopback_host(name: &str) -> bool {
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match name.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.octets()[0] == 127,
        Ok(IpAddr::V6(v6)) => v6 == Ipv6Addr::LOCALHOST,
        Err(_) => false,
    }
}

fn validate_host(host: &str) -> std::result::Result<String, String> {
    if host.is_empty() {
        return Err("missing registry host".into());
    }
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let Some((addr, after)) = rest.split_once(']') else {
            return Err(format!("unterminated IPv6 literal in {host:?}"));
        };
        if addr.parse::<Ipv6Addr>().is_err() {
            return Err(format!("invalid IPv6 address {addr:?}"));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("unexpected {p:?} after IPv6 literal"))?,
            ),
        };
        (format!("[{addr}]"), port)
    } else {
        let (name, port) = match host.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        };
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
            && !name.starts_with(['.', '-'])
            && !name.ends_with(['.', '-']);
        if !ok {
            return Err(format!("invalid registry host {name:?}"));
        }
        (name.to_ascii_lowercase(), port)
    };
    match port {
        None => Ok(name),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Ok(format!("{name}:{p}")),
            _ => Err(format!("invalid port {p:?}")),
        },
    }
}

/// Checks a repository path against the distribution grammar: `/`-separated components of
/// lowercase letters and digits, joined inside a component by `.`, `_`, `__` or runs of `-`.
pub fn validate_repository(repo: &str) -> Result<()> {
    const FIELD: &str = "repository";
    if repo.is_empty() {
        return Err(Error::invalid(FIELD, "must not be empty"));
    }
    if repo.len() > 255 {
        return Err(Error::invalid(
            FIELD,
            format!("{repo:?} is longer than 255 characters"),
        ));
    }
    for comp in repo.split('/') {
        if !valid_component(comp) {
            return Err(Error::invalid(
                FIELD,
                format!(
                    "{repo:?}: component {comp:?} must be lowercase letters and digits, \
                     separated by '.', '_', '__' or '-'"
                ),
            ));
        }
    }
    Ok(())
}

fn valid_component(comp: &str) -> bool {
    let b = comp.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: ".", "_", "__", or one or more "-".
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &comp[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// Checks a tag: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
pub fn validate_tag(tag: &str) -> Result<()> {
    let b = tag.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let ok = !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|&c| word(c) || c == b'.' || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "tag",
            format!("{tag:?} must match [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}"),
        ))
    }
}

/// A `sha256:<64 lowercase hex>` content digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<hex>`; other algorithms are rejected (this client verifies sha256 only).
    pub fn parse(s: &str) -> Result<Digest> {
        let Some((alg, hex)) = s.split_once(':') else {
            return Err(Error::invalid(
                "digest",
                format!("{s:?} is not <algorithm>:<hex>"),
            ));
        };
        if alg != "sha256" {
            return Err(Error::invalid(
                "digest",
                format!("unsupported digest algorithm {alg:?} in {s:?}"),
            ));
        }
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        {
            return Err(Error::invalid(
                "digest",
                format!("{s:?} must be sha256: followed by 64 lowercase hex digits"),
            ));
        }
        Ok(Digest(s.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        let mut h = Hasher::new();
        h.update(bytes);
        h.finish()
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hex part.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Incremental sha256. ring's assembly is used rather than a Rust implementation because it
/// is just as fast in unoptimised builds (tests hash gigabytes; a pure-Rust sha256 runs at
/// ~35 MB/s without optimisation, ring at ~1.7 GB/s).
pub struct Hasher(ring::digest::Context);

impl Hasher {
    pub fn new() -> Hasher {
        Hasher(ring::digest::Context::new(&ring::digest::SHA256))
    }

    pub fn update(&mut self, b: &[u8]) {
        self.0.update(b);
    }

    /// The digest of everything fed so far.
    pub fn finish(self) -> Digest {
        Digest(format!("sha256:{}", hex::encode(self.0.finish().as_ref())))
    }
}

impl Default for Hasher {
    fn default() -> Self {
        Hasher::new()
    }
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hasher(sha256)")
    }
}

/// A manifest reference: a tag, or a digest (registry.md §1: a reference containing `:` is a
/// digest).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reference {
    Tag(String),
    Digest(Digest),
}

impl Reference {
    /// Parses a tag or a `sha256:` digest.
    pub fn parse(s: &str) -> Result<Reference> {
        if s.contains(':') {
            Digest::parse(s).map(Reference::Digest)
        } else {
            validate_tag(s)?;
            Ok(Reference::Tag(s.to_string()))
        }
    }

    /// The path segment after `/manifests/`.
    pub fn as_str(&self) -> &str {
        match self {
            Reference::Tag(t) => t,
            Reference::Digest(d) => d.as_str(),
        }
    }

    /// `:<tag>` or `@<digest>`.
    pub fn suffix(&self) -> String {
        match self {
            Reference::Tag(t) => format!(":{t}"),
            Reference::Digest(d) => format!("@{d}"),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Digest> for Reference {
    fn from(d: Digest) -> Self {
        Reference::Digest(d)
    }
}

/// A registry-relative image ref `repo[:tag]` or `repo@sha256:…` (clone-mode images,
/// registry.md §4); the tag defaults to `latest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    pub repository: String,
    pub reference: Reference,
}

impl ImageRef {
    /// Parses `repo[:tag]` or `repo@digest`; `field` names the source in errors.
    pub fn parse(s: &str, field: &str) -> Result<ImageRef> {
        let wrap = |e: Error| match e {
            Error::Invalid { reason, .. } => Error::invalid(field, reason),
            e => e,
        };
        let (repo, reference) = if let Some((repo, digest)) = s.split_once('@') {
            (
                repo,
                Reference::Digest(Digest::parse(digest).map_err(wrap)?),
            )
        } else {
            match s.rsplit_once(':') {
                Some((repo, tag)) if !tag.contains('/') => {
                    validate_tag(tag).map_err(wrap)?;
                    (repo, Reference::Tag(tag.to_string()))
                }
                _ => (
                    s,
                    Reference::Tag(cocoon_api::contract::tags::LATEST.to_string()),
                ),
            }
        };
        validate_repository(repo).map_err(wrap)?;
        Ok(ImageRef {
            repository: repo.to_string(),
            reference,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oci_registry_values_parse_into_host_prefix_and_scheme() {
        // (value, host, prefix, scheme without insecure hosts)
        let cases = [
            ("127.0.0.1:5055", "127.0.0.1:5055", "", Scheme::Http),
            ("localhost:5000/", "localhost:5000", "", Scheme::Http),
            ("127.9.9.9", "127.9.9.9", "", Scheme::Http),
            ("[::1]:5000", "[::1]:5000", "", Scheme::Http),
            (
                "europe-docker.pkg.dev/proj/repo",
                "europe-docker.pkg.dev",
                "proj/repo",
                Scheme::Https,
            ),
            (
                "ghcr.io/cocoonstack",
                "ghcr.io",
                "cocoonstack",
                Scheme::Https,
            ),
            (
                "http://reg.lan:5000/vms",
                "reg.lan:5000",
                "vms",
                Scheme::Http,
            ),
            (
                "https://127.0.0.1:5443",
                "127.0.0.1:5443",
                "",
                Scheme::Https,
            ),
            (
                "Registry.Example.COM",
                "registry.example.com",
                "",
                Scheme::Https,
            ),
        ];
        for (value, host, prefix, scheme) in cases {
            let b = RegistryBase::parse(value).unwrap_or_else(|e| panic!("{value}: {e}"));
            assert_eq!(b.host(), host, "{value}");
            assert_eq!(b.prefix(), prefix, "{value}");
            assert_eq!(b.scheme(&[]), scheme, "{value}");
        }
    }

    #[test]
    fn insecure_hosts_switch_to_plain_http() {
        let b = RegistryBase::parse("reg.lan:5000/x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.scheme(&[]), Scheme::Https);
        assert_eq!(b.scheme(&["reg.lan:5000".into()]), Scheme::Http);
        assert_eq!(b.scheme(&["reg.lan".into()]), Scheme::Http);
        assert_eq!(b.scheme(&["other".into()]), Scheme::Https);
    }

    #[test]
    fn bad_oci_registry_values_name_the_variable() {
        assert_eq!(
            RegistryBase::parse("  ").map_err(|e| e.to_string()),
            Err("OCI_REGISTRY must be set".to_string())
        );
        for bad in [
            "ftp://x",
            "/prefix",
            "host:99999",
            "host:port",
            "[::1",
            "ho st",
            "host/UPPER",
            "host//x",
        ] {
            let e = RegistryBase::parse(bad).err();
            let msg = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(msg.starts_with("OCI_REGISTRY"), "{bad}: {msg}");
        }
    }

    #[test]
    fn repositories_map_under_the_prefix_and_print_human_readable() {
        let b = RegistryBase::parse("r.io/p/q").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b.repository_path("vk-ns-demo-0-505043"),
            "p/q/vk-ns-demo-0-505043"
        );
        let tag = Reference::parse("hibernate").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.reference_string("vm-a", &tag), "r.io/p/q/vm-a:hibernate");
        let d = format!("sha256:{}", "a".repeat(64));
        let dig = Reference::parse(&d).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b.reference_string("vm-a", &dig),
            format!("r.io/p/q/vm-a@{d}")
        );
        let plain = RegistryBase::parse("127.0.0.1:5055").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain.repository_path("vm-a"), "vm-a");
    }

    #[test]
    fn repository_grammar() {
        for ok in [
            "a",
            "vk-ns-demo-0-505043",
            "a.b",
            "a_b",
            "a__b",
            "a---b",
            "x/y/z",
            "0a",
        ] {
            assert!(validate_repository(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "A", "a/", "/a", "-a", "a-", "a..b", "a___b", "a b", "a/B", "a:b",
        ] {
            assert!(validate_repository(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn references_with_a_colon_are_digests() {
        assert_eq!(
            Reference::parse("latest").ok(),
            Some(Reference::Tag("latest".into()))
        );
        let d = format!("sha256:{}", "0123456789abcdef".repeat(4));
        assert!(matches!(Reference::parse(&d), Ok(Reference::Digest(_))));
        for bad in [
            "sha256:abc",
            "sha512:00",
            "",
            ".x",
            "a".repeat(129).as_str(),
            "UP:x",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn clone_mode_image_refs_default_to_latest() {
        let parse = |s| ImageRef::parse(s, "agent.image").unwrap_or_else(|e| panic!("{s}: {e}"));
        let r = parse("base-vm");
        assert_eq!(
            (r.repository.as_str(), r.reference.as_str()),
            ("base-vm", "latest")
        );
        let r = parse("team/base-vm:v2");
        assert_eq!(
            (r.repository.as_str(), r.reference.as_str()),
            ("team/base-vm", "v2")
        );
        let d = format!("sha256:{}", "f".repeat(64));
        let r = parse(&format!("base@{d}"));
        assert_eq!(r.reference, Reference::Digest(Digest(d)));
        let e = ImageRef::parse("Base:v1", "agent.image")
            .err()
            .map(|e| e.to_string());
        assert!(e.unwrap_or_default().starts_with("agent.image:"));
    }

    #[test]
    fn digest_of_bytes() {
        assert_eq!(
            Digest::of(b"").as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
