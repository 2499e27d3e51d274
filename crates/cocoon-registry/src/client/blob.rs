//! Blob probes and downloads verified against their descriptor's size and digest.

use bytes::Bytes;
use http::{Method, StatusCode};

use super::RegistryClient;
use crate::error::{Error, Result};
use crate::http::{BodyReader, Limit, Req, Scope, header_str};
use crate::reference::{Digest, Hasher};
use crate::retry::retry;

/// A blob download whose size and sha256 are verified as it is read. The data before the
/// final `None` is unverified: the caller must discard it if `next` fails.
pub struct BlobStream {
    body: BodyReader,
    verifier: Verifier,
}

impl BlobStream {
    /// The next chunk; `Ok(None)` only after size and digest were verified.
    pub async fn next(&mut self) -> Result<Option<Bytes>> {
        match self.body.next().await? {
            Some(b) => {
                self.verifier.update(&b)?;
                Ok(Some(b))
            }
            None => {
                self.verifier.finish()?;
                Ok(None)
            }
        }
    }

    pub(crate) fn into_parts(self) -> (BodyReader, Verifier) {
        (self.body, self.verifier)
    }
}

/// Checks a byte stream against a descriptor's size and digest.
#[derive(Debug)]
pub struct Verifier {
    what: String,
    expected: Digest,
    size: u64,
    seen: u64,
    hasher: Option<Hasher>,
}

impl Verifier {
    /// Expects `size` bytes hashing to `expected`; `what` names the blob in errors.
    pub fn new(what: impl Into<String>, expected: Digest, size: u64) -> Verifier {
        Verifier {
            what: what.into(),
            expected,
            size,
            seen: 0,
            hasher: Some(Hasher::new()),
        }
    }

    /// Feeds bytes; more than the expected size fails at once.
    pub fn update(&mut self, b: &[u8]) -> Result<()> {
        self.seen += b.len() as u64;
        if self.seen > self.size {
            return Err(Error::SizeMismatch {
                what: self.what.clone(),
                expected: self.size,
                actual: self.seen,
            });
        }
        if let Some(h) = self.hasher.as_mut() {
            h.update(b);
        }
        Ok(())
    }

    /// Checks the total size and the digest.
    pub fn finish(&mut self) -> Result<()> {
        if self.seen != self.size {
            return Err(Error::SizeMismatch {
                what: self.what.clone(),
                expected: self.size,
                actual: self.seen,
            });
        }
        let actual = self.hasher.take().unwrap_or_default().finish();
        if actual != self.expected {
            return Err(Error::DigestMismatch {
                what: self.what.clone(),
                expected: self.expected.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(())
    }
}

impl RegistryClient {
    /// `HEAD /v2/<R>/blobs/<digest>`: 200 → true, 404 → false.
    pub async fn has_blob(&self, repo: &str, digest: &Digest) -> Result<bool> {
        let path = self.path(repo)?;
        self.has_blob_at(&path, digest).await
    }

    pub(super) async fn has_blob_at(&self, path: &str, digest: &Digest) -> Result<bool> {
        let url = self.http().url(&format!("{path}/blobs/{digest}"))?;
        let scope = Scope::repo(path, "pull,push");
        retry(&self.inner.cfg.retry, "head blob", || async {
            let req = Req::new(Method::HEAD, url.clone(), Some(scope.clone()), self.small());
            let resp = self.http().send(&req).await?;
            match resp.status() {
                StatusCode::OK => Ok(true),
                StatusCode::NOT_FOUND => Ok(false),
                _ => Err(self.http().status_error(resp, "blob").await),
            }
        })
        .await
    }

    /// `GET /v2/<R>/blobs/<digest>` as a stream verified against `size` and the digest.
    pub async fn get_blob(&self, repo: &str, digest: &Digest, size: u64) -> Result<BlobStream> {
        let path = self.path(repo)?;
        let url = self.http().url(&format!("{path}/blobs/{digest}"))?;
        let scope = Scope::repo(&path, "pull");
        let idle = self.inner.http.idle_timeout;
        let resp = retry(&self.inner.cfg.retry, "get blob", || async {
            let req = Req::new(
                Method::GET,
                url.clone(),
                Some(scope.clone()),
                Limit::Idle(idle),
            );
            let resp = self.http().send(&req).await?;
            if resp.status() != StatusCode::OK {
                return Err(self.http().status_error(resp, "blob").await);
            }
            Ok(resp)
        })
        .await?;
        let what = format!("blob {repo}@{digest}");
        if let Some(len) = header_str(&resp, "content-length").and_then(|l| l.parse::<u64>().ok())
            && len != size
        {
            return Err(Error::SizeMismatch {
                what,
                expected: size,
                actual: len,
            });
        }
        Ok(BlobStream {
            body: BodyReader::new(resp, idle),
            verifier: Verifier::new(what, digest.clone(), size),
        })
    }

    /// Reads a whole (small) blob into memory, verified; at most `max` bytes.
    pub async fn get_blob_bytes(
        &self,
        repo: &str,
        digest: &Digest,
        size: u64,
        max: u64,
    ) -> Result<Bytes> {
        if size > max {
            return Err(Error::protocol(format!(
                "blob {digest} too large: {size} > {max}"
            )));
        }
        let mut s = self.get_blob(repo, digest, size).await?;
        let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        while let Some(b) = s.next().await? {
            out.extend_from_slice(&b);
        }
        Ok(Bytes::from(out))
    }

    pub(crate) async fn has_blob_path(&self, path: &str, digest: &Digest) -> Result<bool> {
        self.has_blob_at(path, digest).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RegistryConfig;

    /// A blob download that stops mid-body fails after the no-progress limit instead of
    /// hanging.
    #[tokio::test]
    async fn a_stalled_download_times_out() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut sock, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                let _ = sock
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
                    .await;
                held.push(sock); // ninety bytes never come
            }
        });
        let mut cfg = RegistryConfig::for_registry(&addr.to_string()).expect("cfg");
        cfg.transfer_idle_timeout = std::time::Duration::from_millis(300);
        let c = RegistryClient::new(cfg).expect("client");
        let digest = Digest::of(&[0u8; 100]);
        let mut blob = c
            .get_blob("vm-a", &digest, 100)
            .await
            .expect("headers arrive");
        assert_eq!(blob.next().await.ok().flatten().map(|b| b.len()), Some(10));
        let err = blob.next().await.expect_err("stalled");
        assert!(
            matches!(err, Error::Transport { timeout: true, .. }),
            "{err}"
        );
        server.abort();
    }
    #[test]
    fn verifier_checks_size_and_digest() {
        let d = Digest::of(b"hello");
        let mut v = Verifier::new("b", d.clone(), 5);
        v.update(b"hel").expect("update");
        v.update(b"lo").expect("update");
        assert!(v.finish().is_ok());

        let mut v = Verifier::new("b", d.clone(), 5);
        v.update(b"hellx").expect("update");
        assert!(matches!(v.finish(), Err(Error::DigestMismatch { .. })));

        let mut v = Verifier::new("b", d.clone(), 5);
        assert!(matches!(
            v.update(b"hello!"),
            Err(Error::SizeMismatch { .. })
        ));

        let mut v = Verifier::new("b", d, 5);
        v.update(b"hell").expect("update");
        assert!(matches!(v.finish(), Err(Error::SizeMismatch { .. })));
    }
}
