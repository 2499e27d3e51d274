//! The local registry behaves like registry.md §8 says: raw-HTTP OCI push, probe, get and
//! delete by digest; probes of missing repos create nothing; htpasswd auth rejects bad creds.

use cocoon_testenv::{Registry, RegistryAuth, run_test, unique_name};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Explicit manifest types: distribution answers 404 for OCI manifests without them.
const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Monolithic blob upload: POST for a session, PUT the whole body with `?digest=`.
async fn put_blob(
    http: &reqwest::Client,
    base: &str,
    repo: &str,
    bytes: &[u8],
    auth: Option<&RegistryAuth>,
) -> anyhow::Result<String> {
    let d = digest(bytes);
    let mut post = http.post(format!("{base}/v2/{repo}/blobs/uploads/"));
    if let Some(a) = auth {
        post = post.basic_auth(&a.username, Some(&a.password));
    }
    let resp = post.send().await?;
    anyhow::ensure!(
        resp.status() == StatusCode::ACCEPTED,
        "upload POST: {}",
        resp.status()
    );
    let location = resp
        .headers()
        .get("Location")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| anyhow::anyhow!("upload POST without Location"))?;
    let location = if location.starts_with("http") {
        location.to_string()
    } else {
        format!("{base}{location}")
    };
    let sep = if location.contains('?') { '&' } else { '?' };
    let mut put = http
        .put(format!("{location}{sep}digest={d}"))
        .header("Content-Type", "application/octet-stream")
        .body(bytes.to_vec());
    if let Some(a) = auth {
        put = put.basic_auth(&a.username, Some(&a.password));
    }
    let resp = put.send().await?;
    anyhow::ensure!(
        resp.status() == StatusCode::CREATED,
        "upload PUT: {}",
        resp.status()
    );
    Ok(d)
}

/// `GET /v2/_catalog`, one big page.
async fn catalog(http: &reqwest::Client, base: &str) -> anyhow::Result<Vec<String>> {
    let body: serde_json::Value = http
        .get(format!("{base}/v2/_catalog?n=1000"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(body["repositories"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default())
}

fn manifest(config: &[u8], config_digest: &str, layer: &[u8], layer_digest: &str) -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": "application/vnd.cocoonstack.snapshot.v1+json",
        "config": {
            "mediaType": "application/vnd.cocoonstack.snapshot.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.cocoonstack.vm.config+json",
            "digest": layer_digest,
            "size": layer.len(),
            "annotations": { "org.opencontainers.image.title": "config.json" },
        }],
        "annotations": { "org.opencontainers.image.created": "2026-01-01T00:00:00Z" },
    }))
    .unwrap_or_default()
}

#[tokio::test]
async fn oci_artifact_push_probe_get_delete() {
    run_test(|env| async move {
        let http = reqwest::Client::new();
        let base = format!("http://{}", env.registry_addr());
        let repo = format!("testenv/{}", unique_name("vm"));

        let config = br#"{"schemaVersion":"v1","snapshotId":"sid-1"}"#.to_vec();
        let layer = br#"{"cpu":2,"memory":"1G"}"#.to_vec();
        let config_digest = put_blob(&http, &base, &repo, &config, None).await?;
        let layer_digest = put_blob(&http, &base, &repo, &layer, None).await?;
        let body = manifest(&config, &config_digest, &layer, &layer_digest);
        let manifest_digest = digest(&body);

        let url = format!("{base}/v2/{repo}/manifests/latest");
        let resp = http
            .put(&url)
            .header("Content-Type", OCI_MANIFEST)
            .body(body.clone())
            .send()
            .await?;
        anyhow::ensure!(
            resp.status() == StatusCode::CREATED,
            "manifest PUT: {}",
            resp.status()
        );

        let repos = catalog(&http, &base).await?;
        anyhow::ensure!(repos.contains(&repo), "pushed repo missing from {repos:?}");

        let head = http.head(&url).header("Accept", ACCEPT).send().await?;
        anyhow::ensure!(head.status() == StatusCode::OK, "HEAD: {}", head.status());
        let header_digest = head
            .headers()
            .get("Docker-Content-Digest")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        anyhow::ensure!(
            header_digest == manifest_digest,
            "{header_digest} != {manifest_digest}"
        );

        let get = http.get(&url).header("Accept", ACCEPT).send().await?;
        anyhow::ensure!(get.status() == StatusCode::OK, "GET: {}", get.status());
        anyhow::ensure!(
            get.bytes().await?.as_ref() == body.as_slice(),
            "stored bytes differ"
        );

        let by_digest = format!("{base}/v2/{repo}/manifests/{manifest_digest}");
        let del = http.delete(&by_digest).send().await?;
        anyhow::ensure!(
            del.status() == StatusCode::ACCEPTED,
            "DELETE: {}",
            del.status()
        );
        let head = http.head(&url).header("Accept", ACCEPT).send().await?;
        anyhow::ensure!(
            head.status() == StatusCode::NOT_FOUND,
            "HEAD after delete: {}",
            head.status()
        );

        // A probe of a repository that never existed: 404, and it must not appear afterwards.
        let missing = format!("testenv/{}", unique_name("never"));
        let probe = http
            .head(format!("{base}/v2/{missing}/manifests/hibernate"))
            .header("Accept", ACCEPT)
            .send()
            .await?;
        anyhow::ensure!(
            probe.status() == StatusCode::NOT_FOUND,
            "probe: {}",
            probe.status()
        );
        let repos = catalog(&http, &base).await?;
        anyhow::ensure!(!repos.contains(&missing), "probe created {missing}");
        Ok::<_, anyhow::Error>(())
    })
    .await;
}

#[tokio::test]
async fn htpasswd_registry_rejects_wrong_credentials() {
    cocoon_testenv::init_tracing();
    let auth = RegistryAuth::new("cocoon", "s3cret");
    let reg = Registry::start_temp(Some(auth.clone()))
        .await
        .expect("start htpasswd registry");
    let http = reqwest::Client::new();
    let v2 = format!("{}/v2/", reg.url());

    let anon = http.get(&v2).send().await.expect("anonymous GET");
    assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
    assert!(anon.headers().contains_key("WWW-Authenticate"));
    let wrong = http
        .get(&v2)
        .basic_auth("cocoon", Some("wrong"))
        .send()
        .await
        .expect("wrong-password GET");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let right = http
        .get(&v2)
        .basic_auth(&auth.username, Some(&auth.password))
        .send()
        .await
        .expect("authenticated GET");
    assert_eq!(right.status(), StatusCode::OK, "{}", reg.log_tail(20));

    let repo = unique_name("auth");
    let pushed = put_blob(&http, &reg.url(), &repo, b"hello", Some(&auth)).await;
    assert!(pushed.is_ok(), "{pushed:?}\n{}", reg.log_tail(20));
    let denied = put_blob(&http, &reg.url(), &repo, b"hello", None).await;
    assert!(denied.is_err(), "anonymous push accepted");
    reg.shutdown();
}
