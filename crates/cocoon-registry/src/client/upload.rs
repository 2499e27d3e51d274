//! Blob uploads: monolithic, PATCH chunks resumed from the offset the registry reports,
//! in-memory v2 chunks, and the streamed upload of a spool file a compressor is still writing.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, StatusCode, header};
use url::Url;

use super::{IO_BUF, RegistryClient};
use crate::error::{Error, Result};
use crate::http::{Body, Limit, Req, Scope, file_body, header_str, redact};
use crate::reference::Digest;
use crate::retry::retry;
use crate::sparse::ExtentReader;

/// The bytes of a blob to upload from a file: a layer's extents of that file.
#[derive(Debug, Clone)]
pub struct FileBlob {
    pub file: Arc<File>,
    pub extents: Vec<crate::manifest::Segment>,
    pub size: u64,
    pub digest: Digest,
}

impl RegistryClient {
    /// Uploads an in-memory blob (monolithic) unless the registry has it; returns its digest.
    pub async fn put_blob_bytes(&self, repo: &str, bytes: Bytes) -> Result<Digest> {
        let path = self.path(repo)?;
        let digest = Digest::of(&bytes);
        if self.has_blob_at(&path, &digest).await? {
            return Ok(digest);
        }
        retry(&self.inner.cfg.retry, "put blob", || async {
            let loc = self.start_upload(&path).await?;
            self.finish_upload(&path, loc, &digest, Body::Full(bytes.clone()), self.small())
                .await
        })
        .await?;
        Ok(digest)
    }

    /// Uploads a blob from a file: monolithic up to the chunk size, PATCH chunks above it
    /// (a failed chunk resumes from the offset the registry reports). Does not probe first.
    pub(crate) async fn put_file_blob(&self, path: &str, blob: &FileBlob) -> Result<()> {
        retry(&self.inner.cfg.retry, "upload blob", || async {
            let loc = self.start_upload(path).await?;
            let idle = Limit::Idle(self.inner.http.idle_timeout);
            if blob.size <= self.inner.cfg.chunk_size {
                let body = stream_body(blob, 0, blob.size);
                self.finish_upload(path, loc, &blob.digest, body, idle)
                    .await
            } else {
                let loc = self.upload_chunks(path, loc, blob).await?;
                let commit = Limit::Total(self.inner.http.commit_timeout);
                self.finish_upload(path, loc, &blob.digest, Body::Empty, commit)
                    .await
            }
        })
        .await
    }

    /// `POST /v2/<R>/blobs/uploads/` → the session URL.
    async fn start_upload(&self, path: &str) -> Result<Url> {
        let url = self.http().url(&format!("{path}/blobs/uploads/"))?;
        let scope = Scope::repo(path, "pull,push");
        let req = Req::new(Method::POST, url.clone(), Some(scope), self.small());
        let resp = self.http().send(&req).await?;
        if resp.status() != StatusCode::ACCEPTED {
            return Err(self.http().status_error(resp, "upload").await);
        }
        let loc = header_str(&resp, "location")
            .ok_or_else(|| Error::protocol("upload POST answered without Location"))?;
        self.http().resolve_location(&url, loc)
    }

    /// `PUT <session>?digest=<d>` with the remaining body (all of it when monolithic).
    async fn finish_upload(
        &self,
        path: &str,
        mut loc: Url,
        digest: &Digest,
        body: Body,
        limit: Limit,
    ) -> Result<()> {
        loc.query_pairs_mut().append_pair("digest", digest.as_str());
        let req = Req::new(
            Method::PUT,
            loc,
            Some(Scope::repo(path, "pull,push")),
            limit,
        )
        .header(header::CONTENT_TYPE, "application/octet-stream")?
        .body(body);
        let resp = self.http().send(&req).await?;
        match resp.status() {
            StatusCode::CREATED | StatusCode::NO_CONTENT | StatusCode::OK => Ok(()),
            _ => Err(self.http().status_error(resp, "blob upload").await),
        }
    }

    /// PATCHes the blob in chunks; returns the session URL for the closing PUT.
    async fn upload_chunks(&self, path: &str, mut loc: Url, blob: &FileBlob) -> Result<Url> {
        let chunk = self.inner.cfg.chunk_size;
        let scope = Scope::repo(path, "pull,push");
        let idle = Limit::Idle(self.inner.http.idle_timeout);
        let mut offset = 0u64;
        let mut failures = 0u32;
        while offset < blob.size {
            let end = (offset + chunk).min(blob.size);
            let req = Req::new(Method::PATCH, loc.clone(), Some(scope.clone()), idle)
                .header(header::CONTENT_TYPE, "application/octet-stream")?
                .header(header::CONTENT_RANGE, &format!("{offset}-{}", end - 1))?
                .body(stream_body(blob, offset, end - offset));
            let result = match self.http().send(&req).await {
                Ok(resp) if resp.status() == StatusCode::ACCEPTED => {
                    let l = header_str(&resp, "location")
                        .ok_or_else(|| Error::protocol("upload PATCH answered without Location"))?;
                    Ok(self.http().resolve_location(&loc, l)?)
                }
                Ok(resp) => Err(self.http().status_error(resp, "blob upload").await),
                Err(e) => Err(e),
            };
            match result {
                Ok(next) => {
                    loc = next;
                    offset = end;
                    failures = 0;
                }
                Err(e) => {
                    failures += 1;
                    let Some(delay) = self.inner.cfg.retry.delay_after(failures, &e, 0.5) else {
                        return Err(e);
                    };
                    tracing::debug!(url = %redact(&loc), offset, error = %e, "chunk failed; asking the registry where the upload stands");
                    tokio::time::sleep(delay).await;
                    // A failure here gives up the session; the caller's retry starts over.
                    let (l, committed) = self.upload_status(&loc, &scope).await.map_err(|_| e)?;
                    loc = l;
                    offset = committed;
                }
            }
        }
        Ok(loc)
    }

    /// `GET <session>` → (session URL, bytes the registry holds).
    async fn upload_status(&self, loc: &Url, scope: &Scope) -> Result<(Url, u64)> {
        let req = Req::new(Method::GET, loc.clone(), Some(scope.clone()), self.small());
        let resp = self.http().send(&req).await?;
        if resp.status() != StatusCode::NO_CONTENT {
            return Err(self.http().status_error(resp, "upload").await);
        }
        let next = match header_str(&resp, "location") {
            Some(l) => self.http().resolve_location(loc, l)?,
            None => loc.clone(),
        };
        let committed = header_str(&resp, "range")
            .and_then(|r| r.split_once('-'))
            .and_then(|(_, end)| end.trim().parse::<u64>().ok())
            .map(|end| end + 1)
            .ok_or_else(|| Error::protocol("upload status without Range"))?;
        Ok((next, committed))
    }

    /// Uploads an in-memory blob (a v2 chunk) in one PUT, limited by stalls rather than by
    /// a whole-call timeout; does not probe first.
    pub(crate) async fn put_bytes_blob(
        &self,
        path: &str,
        digest: &Digest,
        bytes: Bytes,
    ) -> Result<()> {
        retry(&self.inner.cfg.retry, "upload chunk", || async {
            let loc = self.start_upload(path).await?;
            let idle = Limit::Idle(self.inner.http.idle_timeout);
            self.finish_upload(path, loc, digest, Body::Full(bytes.clone()), idle)
                .await
        })
        .await
    }
}

/// How far a spool file a compressor is writing has got: bytes on disk, and the blob's
/// digest once the compressor finished.
pub(crate) type SpoolProgress = (u64, Option<Digest>);

impl RegistryClient {
    /// Uploads a blob while it is still being written to `file` (a compressor's spool, which
    /// reports through `written`): a PATCH of whatever is on disk once `piece` more bytes are
    /// there, then the closing PUT with the digest when the writer finished. So compression
    /// and upload overlap instead of following each other. Not retried and not probed first
    /// (the digest is known only at the end): on failure the caller uploads the finished
    /// spool the ordinary way. Returns the blob's digest and size.
    pub(crate) async fn put_growing_blob(
        &self,
        path: &str,
        file: Arc<File>,
        mut written: tokio::sync::watch::Receiver<SpoolProgress>,
        piece: u64,
    ) -> Result<(Digest, u64)> {
        let mut loc = self.start_upload(path).await?;
        let scope = Scope::repo(path, "pull,push");
        let idle = Limit::Idle(self.inner.http.idle_timeout);
        let mut offset = 0u64;
        loop {
            let (on_disk, done) = {
                let state = written
                    .wait_for(|(n, digest)| digest.is_some() || *n >= offset + piece)
                    .await
                    .map_err(|_| Error::protocol("the compressor stopped"))?;
                (state.0, state.1.clone())
            };
            if on_disk > offset {
                let blob = FileBlob {
                    file: file.clone(),
                    extents: crate::manifest::Segment::whole(on_disk),
                    size: on_disk,
                    digest: Digest::of(b""),
                };
                let req = Req::new(Method::PATCH, loc.clone(), Some(scope.clone()), idle)
                    .header(header::CONTENT_TYPE, "application/octet-stream")?
                    .header(header::CONTENT_RANGE, &format!("{offset}-{}", on_disk - 1))?
                    .body(stream_body(&blob, offset, on_disk - offset));
                let resp = self.http().send(&req).await?;
                if resp.status() != StatusCode::ACCEPTED {
                    return Err(self.http().status_error(resp, "blob upload").await);
                }
                let next = header_str(&resp, "location")
                    .ok_or_else(|| Error::protocol("upload PATCH answered without Location"))?;
                loc = self.http().resolve_location(&loc, next)?;
                offset = on_disk;
            }
            if let Some(digest) = done {
                let commit = Limit::Total(self.inner.http.commit_timeout);
                self.finish_upload(path, loc, &digest, Body::Empty, commit)
                    .await?;
                return Ok((digest, on_disk));
            }
        }
    }
}

/// A replayable streaming body of `len` layer bytes starting at layer offset `start`.
fn stream_body(blob: &FileBlob, start: u64, len: u64) -> Body {
    let file = blob.file.clone();
    let extents = blob.extents.clone();
    Body::Stream {
        len,
        make: Box::new(move |progress| {
            let mut reader = ExtentReader::new(file.clone(), extents.clone());
            reader.seek(start);
            file_body(reader, len, IO_BUF, progress)
        }),
    }
}
