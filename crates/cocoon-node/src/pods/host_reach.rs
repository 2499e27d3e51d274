//! Host reach (issue 26 item 9): what a pod may make the **host** reach on its behalf.
//!
//! Two pod annotations make the node agent's host act outside the VM:
//!
//! * a `cocoonset.cocoonstack.io/image` that is a URL (`mode=run` cloud images) makes the host
//!   download it (`cocoon image pull <url>`): without a limit any tenant could point it at the
//!   cloud metadata service or an internal endpoint (SSRF);
//! * `cocoonset.cocoonstack.io/network` picks the CNI conflist the VM is wired into: without a
//!   limit any tenant could join any network configured on the host.
//!
//! Both are allowlisted in the node configuration:
//!
//! * `VK_RUN_IMAGE_URL_ALLOW`: URL prefixes separated by `,` or whitespace, each
//!   `http(s)://host[:port][/path]` (no userinfo, query or fragment). An image URL is allowed
//!   when some prefix has the **same scheme, host and port** (the scheme's default port when
//!   none is written) and its path is a **whole-segment prefix** of the image's path
//!   (`https://h/images` admits `https://h/images` and `https://h/images/x.qcow2`, never
//!   `https://h/images-old/x` or `https://h.evil/images/x`). There is no substring or
//!   wildcard matching. The image URL must also be in the canonical form the URL parser
//!   writes back (lower-case scheme and host, no `..` segments, no backslash, no
//!   percent-encoded host, no userinfo), so the string handed to `cocoon` is exactly the one
//!   checked. Any image containing `://` counts as a URL (other schemes are never allowed).
//!   Unset or empty: **every URL image is refused** (registry refs are not affected).
//! * `VK_NETWORK_ALLOW`: CNI network (conflist) names separated by `,` or whitespace, or `*`
//!   for any. A pod without the annotation (the runtime's default network) is always allowed.
//!   Unset or empty: **only the default network**.
//!
//! The rules are pure ([`check`]); CreatePod and the wake shell act on the verdict with a
//! `TenantIsolationRefused` Event and a failed lifecycle naming the annotation.

use cocoon_api::contract::VmSpec;
use url::Url;

use super::PodConfig;
use super::tenant::Refusal;

/// One `VK_RUN_IMAGE_URL_ALLOW` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlPrefix {
    scheme: String,
    host: String,
    port: u16,
    /// The path without a trailing `/` (empty for the root).
    path: String,
}

impl UrlPrefix {
    /// Parses one entry; the error says why it is not a usable prefix.
    pub fn parse(raw: &str) -> Result<UrlPrefix, String> {
        let url = Url::parse(raw).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{raw:?}: only http and https URLs can be allowed"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!("{raw:?}: userinfo is not allowed"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("{raw:?}: a prefix has no query or fragment"));
        }
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Err(format!("{raw:?}: a prefix needs a host"));
        };
        Ok(UrlPrefix {
            scheme: url.scheme().to_owned(),
            host: host.to_owned(),
            port,
            path: url.path().trim_end_matches('/').to_owned(),
        })
    }

    /// Same scheme, host and port, and a whole-segment path prefix.
    pub fn admits(&self, url: &Url) -> bool {
        let path = url.path();
        url.scheme() == self.scheme
            && url.host_str() == Some(self.host.as_str())
            && url.port_or_known_default() == Some(self.port)
            && (self.path.is_empty()
                || path == self.path
                || path
                    .strip_prefix(self.path.as_str())
                    .is_some_and(|rest| rest.starts_with('/')))
    }
}

/// `VK_NETWORK_ALLOW`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NetworkAllow {
    /// Only the default network (no annotation).
    #[default]
    DefaultOnly,
    /// The default network and these conflists.
    Names(Vec<String>),
    /// Any network (`*`).
    Any,
}

/// What the node lets pods make the host reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostReach {
    /// `VK_RUN_IMAGE_URL_ALLOW` (empty: no URL image).
    pub run_image_urls: Vec<UrlPrefix>,
    /// `VK_NETWORK_ALLOW`.
    pub networks: NetworkAllow,
}

fn items(raw: &str) -> impl Iterator<Item = &str> {
    raw.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|v| !v.is_empty())
}

/// Parses `VK_RUN_IMAGE_URL_ALLOW`.
pub fn parse_url_allow(raw: &str) -> Result<Vec<UrlPrefix>, String> {
    items(raw).map(UrlPrefix::parse).collect()
}

/// Parses `VK_NETWORK_ALLOW`: `*` alone (or anywhere) allows every network.
pub fn parse_network_allow(raw: &str) -> Result<NetworkAllow, String> {
    let names: Vec<&str> = items(raw).collect();
    if names.contains(&"*") {
        return Ok(NetworkAllow::Any);
    }
    if let Some(bad) = names
        .iter()
        .find(|n| n.starts_with('-') || n.chars().any(char::is_control))
    {
        return Err(format!("{bad:?} is not a network name"));
    }
    Ok(if names.is_empty() {
        NetworkAllow::DefaultOnly
    } else {
        NetworkAllow::Names(names.into_iter().map(str::to_owned).collect())
    })
}

/// Why a URL image is refused (the `why` of [`Refusal::ImageUrlNotAllowed`]).
pub fn url_verdict(prefixes: &[UrlPrefix], image: &str) -> Result<(), String> {
    if prefixes.is_empty() {
        return Err("no URL image is allowed on this node".into());
    }
    let url = Url::parse(image).map_err(|e| format!("not a valid URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("userinfo is not allowed".into());
    }
    if url.as_str() != image {
        return Err(format!(
            "not in canonical form (would be {:?})",
            url.as_str()
        ));
    }
    if prefixes.iter().any(|p| p.admits(&url)) {
        Ok(())
    } else {
        Err("no allowed prefix matches its scheme, host, port and path".into())
    }
}

/// Is `image` a URL (anything with `://`)?
pub fn is_url_image(image: &str) -> bool {
    image.contains("://")
}

/// The host-reach decision for a managed pod's image and network annotations.
pub fn check(reach: &HostReach, image: &str, network: &str) -> Result<(), Refusal> {
    if is_url_image(image) {
        url_verdict(&reach.run_image_urls, image).map_err(|why| Refusal::ImageUrlNotAllowed {
            url: image.to_owned(),
            why,
        })?;
    }
    let allowed = match &reach.networks {
        _ if network.is_empty() => true,
        NetworkAllow::Any => true,
        NetworkAllow::DefaultOnly => false,
        NetworkAllow::Names(names) => names.iter().any(|n| n == network),
    };
    if allowed {
        Ok(())
    } else {
        Err(Refusal::NetworkNotAllowed {
            network: network.to_owned(),
        })
    }
}

/// [`check`] over this node's allowlists; unmanaged pods start nothing on the host.
pub(crate) fn host_reach_check(cfg: &PodConfig, spec: &VmSpec) -> Result<(), Refusal> {
    if !spec.managed {
        return Ok(());
    }
    let verdict = check(&cfg.host_reach, &spec.image, &spec.network);
    if let Err(e) = &verdict {
        tracing::warn!(vm = %spec.vm_name, refusal = %e, "host reach refused the pod");
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(urls: &str, nets: &str) -> HostReach {
        HostReach {
            run_image_urls: parse_url_allow(urls).expect("urls"),
            networks: parse_network_allow(nets).expect("nets"),
        }
    }

    #[test]
    fn url_images_need_a_matching_prefix() {
        let r = reach(
            "https://images.example/cloud/, http://10.0.0.5:8080/img",
            "",
        );
        // (image, allowed)
        let rows = [
            ("https://images.example/cloud/jammy.qcow2", true),
            ("https://images.example/cloud", true),
            ("https://images.example:443/cloud/x.qcow2", false), // not canonical
            ("https://images.example/cloud-old/x.qcow2", false),
            ("https://images.example/x.qcow2", false),
            ("http://images.example/cloud/x.qcow2", false), // other scheme
            ("https://images.example:8443/cloud/x.qcow2", false), // other port
            ("https://images.example.evil/cloud/x.qcow2", false),
            (
                "https://evil.example/cloud/x?https://images.example/cloud/",
                false,
            ),
            ("https://images.example/cloud/../admin", false),
            ("https://images.example/cloud/%2e%2e/admin", false),
            ("https://user:pw@images.example/cloud/x", false),
            ("https://images.example@evil.example/cloud/x", false),
            ("https://images.example\\@evil.example/cloud/x", false),
            ("HTTPS://IMAGES.EXAMPLE/cloud/x", false),
            ("http://10.0.0.5:8080/img/a.qcow2", true),
            ("http://10.0.0.5/img/a.qcow2", false),
            ("http://169.254.169.254/latest/meta-data/", false),
            ("file:///etc/shadow", false),
            ("ftp://images.example/cloud/x", false),
        ];
        for (image, want) in rows {
            let got = check(&r, image, "");
            assert_eq!(got.is_ok(), want, "{image}: {got:?}");
            if let Err(e) = got {
                assert!(
                    e.to_string()
                        .starts_with("annotation cocoonset.cocoonstack.io/image: URL"),
                    "{e}"
                );
            }
        }
        // Registry refs never count as URLs.
        assert!(check(&r, "ghcr.io/o/img:1", "").is_ok());
        assert!(check(&HostReach::default(), "ubuntu:24.04", "").is_ok());
    }

    #[test]
    fn the_default_refuses_every_url_and_every_named_network() {
        let d = HostReach::default();
        let e = check(&d, "https://images.example/x.qcow2", "").expect_err("url");
        assert_eq!(
            e.to_string(),
            "annotation cocoonset.cocoonstack.io/image: URL \"https://images.example/x.qcow2\" is not allowed on this node (VK_RUN_IMAGE_URL_ALLOW: no URL image is allowed on this node)"
        );
        let e = check(&d, "ubuntu:24.04", "cocoon-dhcp").expect_err("net");
        assert_eq!(
            e.to_string(),
            "annotation cocoonset.cocoonstack.io/network: CNI network \"cocoon-dhcp\" is not allowed on this node (VK_NETWORK_ALLOW)"
        );
        assert!(check(&d, "ubuntu:24.04", "").is_ok(), "default network");
    }

    #[test]
    fn networks_by_exact_name_or_any() {
        let r = reach("", "cocoon-dhcp, tenant-a");
        for (net, want) in [
            ("", true),
            ("cocoon-dhcp", true),
            ("tenant-a", true),
            ("tenant", false),
            ("tenant-a-admin", false),
            ("host-mgmt", false),
        ] {
            assert_eq!(check(&r, "img", net).is_ok(), want, "{net}");
        }
        assert!(check(&reach("", "*"), "img", "host-mgmt").is_ok());
    }

    #[test]
    fn allowlist_parsing() {
        assert_eq!(parse_url_allow("").expect("empty"), Vec::new());
        assert_eq!(parse_url_allow(" , ").expect("blank"), Vec::new());
        for bad in [
            "images.example/cloud",
            "ftp://images.example/",
            "https://u:p@images.example/",
            "https://images.example/?x=1",
            "https://images.example/#f",
        ] {
            assert!(parse_url_allow(bad).is_err(), "{bad}");
        }
        let p = parse_url_allow("https://Images.Example:443/a/b/").expect("ok");
        assert_eq!(
            p,
            vec![UrlPrefix {
                scheme: "https".into(),
                host: "images.example".into(),
                port: 443,
                path: "/a/b".into(),
            }]
        );
        assert_eq!(
            parse_network_allow("").expect("e"),
            NetworkAllow::DefaultOnly
        );
        assert_eq!(parse_network_allow("a,*").expect("any"), NetworkAllow::Any);
        assert!(parse_network_allow("--bridge").is_err());
    }
}
