//! The registry operations of registry.md §2 on logical repositories (VM names): manifests,
//! delete by digest behind a probe, tags, blob probe/download/upload (chunked, resumable).
//!
//! * this file — the client, manifests, deletes, tags and the catalog, snapshot identity.
//! * `blob` — blob probes and verified downloads ([`BlobStream`], [`Verifier`]).
//! * `upload` — blob uploads: monolithic, PATCH chunks resumed from the registry's offset,
//!   in-memory v2 chunks, and the streamed upload of a growing spool file.

mod blob;
mod upload;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use cocoon_api::contract::oci;
use http::{Method, StatusCode, header};
use url::Url;

pub use blob::{BlobStream, Verifier};
pub use upload::FileBlob;
pub(crate) use upload::SpoolProgress;

use crate::config::RegistryConfig;
use crate::error::{Error, Result, ResultExt};
use crate::http::{Body, Http, Limit, MAX_SMALL_BODY, Req, Scope, header_str};
use crate::manifest::{Kind, Manifest, SnapshotConfig, classify};
use crate::paging::PageWalk;
use crate::reference::{Digest, Reference, RegistryBase, validate_repository, validate_tag};
use crate::retry::retry;
use crate::validate::{MAX_CONFIG_SIZE, check_config_descriptor};

/// Read/upload buffer size for blob bodies.
pub(crate) const IO_BUF: usize = 1 << 20;

/// What a manifest HEAD reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestHead {
    /// `Docker-Content-Digest`, when the registry sent a valid one.
    pub digest: Option<Digest>,
    /// `Content-Type`.
    pub media_type: Option<String>,
}

/// A fetched manifest: the exact bytes, the media type, and the digest over the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedManifest {
    pub bytes: Bytes,
    pub media_type: Option<String>,
    pub digest: Digest,
}

/// How `delete_tag` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The manifest (and every tag pointing at it) was deleted.
    Deleted(Digest),
    /// The tag was not there (or vanished between probe and delete).
    Absent,
}

/// How [`RegistryClient::delete_tag_checked`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckedDelete {
    /// The manifest the check accepted was deleted (by its digest).
    Deleted(Digest),
    /// The tag was not there (or vanished before the delete).
    Absent,
    /// The check refused the manifest with these annotations: nothing was deleted.
    Kept(BTreeMap<String, String>),
}

/// What a snapshot tag records: the manifest annotations and the config's snapshot id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub digest: Digest,
    /// The manifest annotations.
    pub annotations: BTreeMap<String, String>,
    /// `cocoonstack.snapshot.baseimage`, when recorded.
    pub base_image: Option<String>,
    /// The snapshot identity (`snapshotId` of the config blob).
    pub snapshot_id: String,
    /// The whole config blob.
    pub config: SnapshotConfig,
}

/// A client for one registry (`OCI_REGISTRY`). Cheap to clone; clones share the connection
/// pool and the auth cache.
#[derive(Clone)]
pub struct RegistryClient {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: RegistryConfig,
    http: Http,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("base", &self.inner.cfg.base.to_string())
            .finish()
    }
}

impl RegistryClient {
    /// A client for `cfg`.
    pub fn new(cfg: RegistryConfig) -> Result<RegistryClient> {
        cfg.validate()?;
        let http = Http::new(&cfg)?;
        Ok(RegistryClient {
            inner: Arc::new(Inner { cfg, http }),
        })
    }

    /// A client configured from the environment ([`RegistryConfig::from_env`]).
    pub fn from_env() -> Result<RegistryClient> {
        Self::new(RegistryConfig::from_env()?)
    }

    /// The configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.inner.cfg
    }

    /// The registry base.
    pub fn base(&self) -> &RegistryBase {
        &self.inner.cfg.base
    }

    pub(crate) fn http(&self) -> &Http {
        &self.inner.http
    }

    fn small(&self) -> Limit {
        Limit::Total(self.inner.http.request_timeout)
    }

    fn path(&self, repo: &str) -> Result<String> {
        validate_repository(repo)?;
        Ok(self.inner.cfg.base.repository_path(repo))
    }

    fn manifest_url(&self, path: &str, reference: &Reference) -> Result<Url> {
        self.http()
            .url(&format!("{path}/manifests/{}", reference.as_str()))
    }

    /// `HEAD /v2/<R>/manifests/<ref>`: `Some` on 200, `None` on 404, an error otherwise.
    pub async fn head_manifest(
        &self,
        repo: &str,
        reference: &Reference,
    ) -> Result<Option<ManifestHead>> {
        let path = self.path(repo)?;
        let url = self.manifest_url(&path, reference)?;
        let scope = Scope::repo(&path, "pull");
        retry(&self.inner.cfg.retry, "head manifest", || async {
            let req = Req::new(Method::HEAD, url.clone(), Some(scope.clone()), self.small())
                .header(header::ACCEPT, oci::MANIFEST_ACCEPT)?;
            let resp = self.http().send(&req).await?;
            match resp.status() {
                StatusCode::OK => Ok(Some(ManifestHead {
                    digest: header_str(&resp, "docker-content-digest")
                        .and_then(|d| Digest::parse(d).ok()),
                    media_type: header_str(&resp, "content-type").map(str::to_string),
                })),
                StatusCode::NOT_FOUND => Ok(None),
                _ => Err(self.http().status_error(resp, "manifest").await),
            }
        })
        .await
    }

    /// Whether `<repo>:<tag>` exists (registry.md §2 has_manifest).
    pub async fn has_manifest(&self, repo: &str, tag: &str) -> Result<bool> {
        let reference = Reference::parse(tag)?;
        Ok(self.head_manifest(repo, &reference).await?.is_some())
    }

    /// `GET /v2/<R>/manifests/<ref>`; 404 is [`Error::NotFound`] (`manifest not found`).
    /// For a digest reference the bytes are checked against it.
    pub async fn get_manifest(&self, repo: &str, reference: &Reference) -> Result<FetchedManifest> {
        let path = self.path(repo)?;
        let url = self.manifest_url(&path, reference)?;
        let scope = Scope::repo(&path, "pull");
        let fetched = retry(&self.inner.cfg.retry, "get manifest", || async {
            let req = Req::new(Method::GET, url.clone(), Some(scope.clone()), self.small())
                .header(header::ACCEPT, oci::MANIFEST_ACCEPT)?;
            let resp = self.http().send(&req).await?;
            if resp.status() != StatusCode::OK {
                return Err(self.http().status_error(resp, "manifest").await);
            }
            let media_type = header_str(&resp, "content-type").map(str::to_string);
            let bytes = self.http().read_small(resp, MAX_SMALL_BODY).await?;
            let digest = Digest::of(&bytes);
            Ok(FetchedManifest {
                bytes,
                media_type,
                digest,
            })
        })
        .await?;
        if let Reference::Digest(want) = reference
            && *want != fetched.digest
        {
            return Err(Error::DigestMismatch {
                what: format!("manifest {repo}@{want}"),
                expected: want.to_string(),
                actual: fetched.digest.to_string(),
            });
        }
        Ok(fetched)
    }

    /// The manifest's annotations (the recorded base image among them).
    pub async fn manifest_annotations(
        &self,
        repo: &str,
        tag: &str,
    ) -> Result<BTreeMap<String, String>> {
        let m = self.get_manifest(repo, &Reference::parse(tag)?).await?;
        Ok(Manifest::parse(&m.bytes)?.annotations)
    }

    /// `PUT /v2/<R>/manifests/<tag>` with `Content-Type: media_type`; returns the digest of
    /// the bytes (which the registry stores unchanged).
    pub async fn put_manifest(
        &self,
        repo: &str,
        tag: &str,
        bytes: Bytes,
        media_type: &str,
    ) -> Result<Digest> {
        validate_tag(tag)?;
        let path = self.path(repo)?;
        let url = self.manifest_url(&path, &Reference::Tag(tag.to_string()))?;
        let scope = Scope::repo(&path, "pull,push");
        let digest = Digest::of(&bytes);
        retry(&self.inner.cfg.retry, "put manifest", || async {
            let req = Req::new(Method::PUT, url.clone(), Some(scope.clone()), self.small())
                .header(header::CONTENT_TYPE, media_type)?
                .body(Body::Full(bytes.clone()));
            let resp = self.http().send(&req).await?;
            match resp.status() {
                StatusCode::CREATED | StatusCode::OK => Ok(()),
                _ => Err(self.http().status_error(resp, "manifest").await),
            }
        })
        .await?;
        Ok(digest)
    }

    /// Deletes the manifest `digest` (registry.md §2.1 step 2): `true` when deleted, `false`
    /// when it was already gone.
    pub async fn delete_manifest(&self, repo: &str, digest: &Digest) -> Result<bool> {
        let path = self.path(repo)?;
        let url = self.manifest_url(&path, &Reference::Digest(digest.clone()))?;
        let scope = Scope::repo(&path, "pull,delete");
        retry(&self.inner.cfg.retry, "delete manifest", || async {
            let req = Req::new(
                Method::DELETE,
                url.clone(),
                Some(scope.clone()),
                self.small(),
            );
            let resp = self.http().send(&req).await?;
            match resp.status().as_u16() {
                200 | 202 | 204 => Ok(true),
                404 => Ok(false),
                405 => Err(Error::DeleteUnsupported { status: 405 }),
                _ => {
                    let e = self.http().status_error(resp, "manifest").await;
                    match &e {
                        Error::Protocol {
                            status: Some(400),
                            code: Some(c),
                            ..
                        } if c == "UNSUPPORTED" => Err(Error::DeleteUnsupported { status: 400 }),
                        _ => Err(e),
                    }
                }
            }
        })
        .await
    }

    /// Deletes `<repo>:<tag>` if present (registry.md §2.1 and §2.2): probe with HEAD, resolve
    /// the digest (GET and hash when the header is missing), `DELETE` by digest; a 404 at any
    /// step means already gone. Nothing is sent past the probe for an absent tag, so a
    /// missing repository is never created. Deleting by digest removes every tag pointing at
    /// that manifest.
    pub async fn delete_tag(&self, repo: &str, tag: &str) -> Result<DeleteOutcome> {
        let reference = Reference::Tag(tag.to_string());
        validate_tag(tag)?;
        let probe = |e: Error| e.context(format!("probe snapshot {repo}:{tag}"));
        let Some(head) = self.head_manifest(repo, &reference).await.map_err(probe)? else {
            return Ok(DeleteOutcome::Absent);
        };
        let digest = match head.digest {
            Some(d) => d,
            None => match self.get_manifest(repo, &reference).await {
                Ok(m) => m.digest,
                Err(e) if e.is_not_found() => return Ok(DeleteOutcome::Absent),
                Err(e) => return Err(probe(e)),
            },
        };
        let deleted = self
            .delete_manifest(repo, &digest)
            .await
            .context(|| format!("delete snapshot {repo}:{tag}"))?;
        tracing::info!(repo, tag, %digest, deleted, "delete tag");
        Ok(if deleted {
            DeleteOutcome::Deleted(digest)
        } else {
            DeleteOutcome::Absent
        })
    }

    /// Deletes `<repo>:<tag>` only when `allow` accepts its manifest annotations (the owner
    /// rule, `cocoon_api::contract::owner`): GET the manifest, ask `allow`, `DELETE` by the
    /// digest that was read. The check and the delete name the same bytes: a tag re-pointed
    /// in between keeps its new manifest (only the checked digest is deleted). An absent tag
    /// sends nothing past the GET, so a missing repository is never created.
    pub async fn delete_tag_checked(
        &self,
        repo: &str,
        tag: &str,
        allow: impl FnOnce(&BTreeMap<String, String>) -> bool,
    ) -> Result<CheckedDelete> {
        validate_tag(tag)?;
        let reference = Reference::Tag(tag.to_string());
        let fetched = match self.get_manifest(repo, &reference).await {
            Ok(m) => m,
            Err(e) if e.is_not_found() => return Ok(CheckedDelete::Absent),
            Err(e) => return Err(e.context(format!("read the owner of {repo}:{tag}"))),
        };
        let annotations = Manifest::parse(&fetched.bytes)
            .context(|| format!("read the owner of {repo}:{tag}"))?
            .annotations;
        if !allow(&annotations) {
            tracing::info!(repo, tag, digest = %fetched.digest, "tag kept: its owner check refused the delete");
            return Ok(CheckedDelete::Kept(annotations));
        }
        let deleted = self
            .delete_manifest(repo, &fetched.digest)
            .await
            .context(|| format!("delete snapshot {repo}:{tag}"))?;
        tracing::info!(repo, tag, digest = %fetched.digest, deleted, "delete tag (owner checked)");
        Ok(if deleted {
            CheckedDelete::Deleted(fetched.digest)
        } else {
            CheckedDelete::Absent
        })
    }

    /// The name registry.md §2.2 gives the probe-then-delete every deletion goes through.
    pub async fn delete_tag_if_present(&self, repo: &str, tag: &str) -> Result<DeleteOutcome> {
        self.delete_tag(repo, tag).await
    }

    /// `GET /v2/<R>/tags/list`, following pagination; a missing repository has no tags.
    pub async fn list_tags(&self, repo: &str) -> Result<Vec<String>> {
        let path = self.path(repo)?;
        let scope = Scope::repo(&path, "pull");
        #[derive(serde::Deserialize)]
        struct Tags {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let limits = self.inner.cfg.list_limits;
        let first = self
            .http()
            .url(&format!("{path}/tags/list?n={}", limits.page_size))?;
        let mut walk = PageWalk::new(format!("tags of {repo}"), limits);
        let mut out = Vec::new();
        let mut next = Some(first);
        while let Some(url) = next.take() {
            walk.visit(&url)?;
            let (body, link) = match self.get_page(&url, &scope, "repository").await {
                Ok(v) => v,
                Err(e) if e.is_not_found() => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            let page: Tags = serde_json::from_slice(&body)
                .map_err(|e| Error::protocol(format!("tags list of {repo}: {e}")))?;
            let tags = page.tags.unwrap_or_default();
            walk.add_entries(tags.len())?;
            out.extend(tags);
            next = link;
        }
        Ok(out)
    }

    /// `GET /v2/_catalog`, following pagination (logical names under the prefix only).
    pub async fn catalog(&self) -> Result<Vec<String>> {
        #[derive(serde::Deserialize)]
        struct Catalog {
            #[serde(default)]
            repositories: Option<Vec<String>>,
        }
        let prefix = self.inner.cfg.base.prefix().to_string();
        let mut out = Vec::new();
        let limits = self.inner.cfg.list_limits;
        let mut walk = PageWalk::new("catalog", limits);
        let mut next = Some(
            self.http()
                .url(&format!("_catalog?n={}", limits.page_size))?,
        );
        while let Some(url) = next.take() {
            walk.visit(&url)?;
            let (body, link) = self.get_page(&url, &Scope::catalog(), "catalog").await?;
            let page: Catalog = serde_json::from_slice(&body)
                .map_err(|e| Error::protocol(format!("catalog: {e}")))?;
            let repositories = page.repositories.unwrap_or_default();
            walk.add_entries(repositories.len())?;
            for r in repositories {
                if prefix.is_empty() {
                    out.push(r);
                } else if let Some(rest) = r.strip_prefix(&format!("{prefix}/")) {
                    out.push(rest.to_string());
                }
            }
            next = link;
        }
        Ok(out)
    }

    async fn get_page(&self, url: &Url, scope: &Scope, what: &str) -> Result<(Bytes, Option<Url>)> {
        retry(&self.inner.cfg.retry, what, || async {
            let req = Req::new(Method::GET, url.clone(), Some(scope.clone()), self.small());
            let resp = self.http().send(&req).await?;
            if resp.status() != StatusCode::OK {
                return Err(self.http().status_error(resp, what).await);
            }
            let link = header_str(&resp, "link")
                .and_then(parse_next_link)
                .map(|l| self.http().resolve_location(url, &l))
                .transpose()?;
            Ok((self.http().read_small(resp, 16 << 20).await?, link))
        })
        .await
    }

    /// The recorded identity of a snapshot tag: manifest annotations plus the config's
    /// snapshot id. `None` when the tag does not exist.
    pub async fn snapshot_info(&self, repo: &str, tag: &str) -> Result<Option<SnapshotInfo>> {
        let reference = Reference::parse(tag)?;
        let fetched = match self.get_manifest(repo, &reference).await {
            Ok(m) => m,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let m = Manifest::parse(&fetched.bytes)?;
        let kind = classify(&m, fetched.media_type.as_deref());
        if !matches!(kind, Kind::Snapshot { .. }) {
            return Err(Error::WrongKind {
                kind: kind.to_string(),
                wanted: "snapshot".into(),
            });
        }
        let (cdigest, csize) = check_config_descriptor(&m)?;
        let cfg_bytes = self
            .get_blob_bytes(repo, &cdigest, csize, MAX_CONFIG_SIZE)
            .await?;
        let config: SnapshotConfig = serde_json::from_slice(&cfg_bytes)
            .map_err(|e| Error::protocol(format!("parse snapshot config: {e}")))?;
        Ok(Some(SnapshotInfo {
            digest: fetched.digest,
            base_image: m.annotations.get(oci::ANNOTATION_BASE_IMAGE).cloned(),
            annotations: m.annotations,
            snapshot_id: config.snapshot_id.clone(),
            config,
        }))
    }

    /// The wire repository path of `repo` (validated).
    pub(crate) fn repo_path(&self, repo: &str) -> Result<String> {
        self.path(repo)
    }
}

/// The `next` target of a `Link: <url>; rel="next"` header.
fn parse_next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        let is_next = params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"" || p.trim() == "rel=next");
        let t = target.trim();
        (is_next && t.starts_with('<') && t.ends_with('>')).then(|| t[1..t.len() - 1].to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_links_are_parsed() {
        assert_eq!(
            parse_next_link(r#"</v2/_catalog?last=b&n=2>; rel="next""#).as_deref(),
            Some("/v2/_catalog?last=b&n=2")
        );
        assert_eq!(parse_next_link(r#"<http://x/y>; rel="prev""#), None);
        assert_eq!(parse_next_link("garbage"), None);
    }

    /// A listener that accepts connections and never answers: every call must end in a
    /// transient timeout, retried as configured.
    #[tokio::test]
    async fn a_silent_registry_times_out_and_is_retried_as_transient() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(sock); // keep it open, say nothing
            }
        });
        let mut cfg = RegistryConfig::for_registry(&addr.to_string()).expect("cfg");
        cfg.request_timeout = std::time::Duration::from_millis(200);
        cfg.retry = crate::RetryPolicy {
            attempts: 2,
            base_delay: std::time::Duration::from_millis(10),
            max_delay: std::time::Duration::from_millis(10),
        };
        let c = RegistryClient::new(cfg).expect("client");
        let err = c
            .has_manifest("vm-a", "hibernate")
            .await
            .expect_err("must time out");
        assert_eq!(err.class(), crate::ErrorClass::Transport, "{err}");
        assert!(
            matches!(err, Error::Transport { timeout: true, .. }),
            "{err}"
        );
        assert!(err.is_transient());
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "one retry"
        );
        server.abort();
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_transport_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let mut cfg = RegistryConfig::for_registry(&format!("127.0.0.1:{port}")).expect("cfg");
        cfg.retry = crate::RetryPolicy::none();
        let c = RegistryClient::new(cfg).expect("client");
        let err = c
            .has_manifest("vm-a", "hibernate")
            .await
            .expect_err("refused");
        assert_eq!(err.class(), crate::ErrorClass::Transport, "{err}");
        assert!(!err.is_not_found());
    }
}
