//! Unit tests of [`crate::auth`]: challenges, credentials and credential helpers.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;

use super::auth::*;
use crate::error::{Error, Result};

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn challenges_parse_like_distribution_sends_them() {
    assert_eq!(
        parse_challenge(r#"Basic realm="cocoon-testenv""#),
        Some(Challenge::Basic)
    );
    assert_eq!(
        parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:samalba/my-app:pull,push""#
        ),
        Some(Challenge::Bearer {
            realm: "https://auth.docker.io/token".into(),
            service: Some("registry.docker.io".into()),
            scope: Some("repository:samalba/my-app:pull,push".into()),
        })
    );
    assert_eq!(
        parse_challenge(r#"bearer realm=https://t.example/token"#),
        Some(Challenge::Bearer {
            realm: "https://t.example/token".into(),
            service: None,
            scope: None,
        })
    );
    assert_eq!(parse_challenge("Bearer service=x"), None, "no realm");
    assert_eq!(parse_challenge("Negotiate abc"), None);
}

#[test]
fn env_selects_token_then_basic_then_docker_config() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(pk, _)| *pk == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let src = CredentialSource::from_env(&env(&[(ENV_TOKEN, "t"), (ENV_USERNAME, "u")]));
    assert!(matches!(
        src,
        Ok(CredentialSource::Static(Credentials::Bearer { .. }))
    ));
    let src = CredentialSource::from_env(&env(&[(ENV_USERNAME, "u"), (ENV_PASSWORD, "p")]));
    assert!(matches!(
        src,
        Ok(CredentialSource::Static(Credentials::Basic { .. }))
    ));
    let err = CredentialSource::from_env(&env(&[(ENV_USERNAME, "u")])).err();
    assert_eq!(
        err.map(|e| e.to_string()),
        Some(format!("{ENV_PASSWORD}: must be set with {ENV_USERNAME}"))
    );
    let src = CredentialSource::from_env(&env(&[("HOME", "/nonexistent-home")]));
    assert!(matches!(src, Ok(CredentialSource::Anonymous)));
}

#[test]
fn docker_config_auths_entries() {
    let cfg = format!(
        r#"{{"auths":{{
                "reg.example:5000": {{"auth":"{}"}},
                "https://index.docker.io/v1/": {{"auth":"{}"}},
                "https://tok.example": {{"identitytoken":"refresh-1"}},
                "plain.example": {{"username":"pu","password":"pp"}},
                "bad.example": {{"auth":"{}"}}
            }}}}"#,
        b64("alice:s3:cret"),
        b64("hub:pw"),
        b64("no-colon"),
    );
    let cfg = DockerConfig::parse(cfg.as_bytes()).expect("parse");
    let no_helper =
        |_: &str, _: &str| -> Result<Option<Vec<u8>>> { panic!("no helper configured") };
    let get = |h: &str| cfg.credentials_for(h, &no_helper);
    assert_eq!(
        get("reg.example:5000").ok(),
        Some(Credentials::basic("alice", "s3:cret"))
    );
    assert_eq!(
        get("registry-1.docker.io").ok(),
        Some(Credentials::basic("hub", "pw"))
    );
    assert_eq!(
        get("tok.example").ok(),
        Some(Credentials::IdentityToken {
            token: "refresh-1".into()
        })
    );
    assert_eq!(
        get("plain.example").ok(),
        Some(Credentials::basic("pu", "pp"))
    );
    assert_eq!(get("other.example").ok(), Some(Credentials::Anonymous));
    let e = get("bad.example")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.starts_with("auths.bad.example.auth:"), "{e}");
}

#[test]
fn docker_config_helpers_take_precedence_and_fall_through_when_empty() {
    let cfg = DockerConfig::parse(
        format!(
            r#"{{"credsStore":"store","credHelpers":{{"gcr.example":"gcr"}},
                    "auths":{{"file.example":{{"auth":"{}"}}}}}}"#,
            b64("f:p")
        )
        .as_bytes(),
    )
    .expect("parse");
    let run = |helper: &str, server: &str| -> Result<Option<Vec<u8>>> {
        Ok(match (helper, server) {
            ("gcr", "gcr.example") => Some(
                br#"{"ServerURL":"gcr.example","Username":"oauth2accesstoken","Secret":"ya29"}"#
                    .to_vec(),
            ),
            ("store", "tok.example") => Some(br#"{"Username":"<token>","Secret":"idt"}"#.to_vec()),
            _ => None,
        })
    };
    let get = |h: &str| cfg.credentials_for(h, &run).ok();
    assert_eq!(
        get("gcr.example"),
        Some(Credentials::basic("oauth2accesstoken", "ya29"))
    );
    assert_eq!(
        get("tok.example"),
        Some(Credentials::IdentityToken {
            token: "idt".into()
        })
    );
    assert_eq!(get("file.example"), Some(Credentials::basic("f", "p")));
    assert_eq!(get("none.example"), Some(Credentials::Anonymous));
}

#[test]
fn credential_helpers_are_executed() {
    let dir = std::env::temp_dir().join(format!("cocoon-reg-helper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    install_helper(
        &dir,
        "fake",
        "#!/bin/sh\nread server\nif [ \"$1\" = get ] && [ \"$server\" = reg.example ]; then\n  echo '{\"Username\":\"hu\",\"Secret\":\"hs\"}'\nelse\n  echo 'credentials not found in native keychain'; exit 1\nfi\n",
    );
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, br#"{"credsStore":"fake"}"#).expect("write");
    let src = CredentialSource::DockerConfig {
        path: cfg_path,
        helper_dir: Some(dir.clone()),
        helper_timeout: DEFAULT_HELPER_TIMEOUT,
    };
    assert_eq!(
        src.resolve("reg.example").ok(),
        Some(Credentials::basic("hu", "hs"))
    );
    assert_eq!(
        src.resolve("other.example").ok(),
        Some(Credentials::Anonymous)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn debug_never_prints_secrets() {
    let s = format!("{:?}", Credentials::basic("u", "hunter2"));
    assert!(!s.contains("hunter2"));
    let auth = b64("alice:pw-in-auth");
    let cfg = DockerConfig::parse(
        format!(
            r#"{{"credsStore":"store","auths":{{
                    "a.example": {{"auth":"{auth}"}},
                    "b.example": {{"username":"bob","password":"pw-plain"}},
                    "c.example": {{"identitytoken":"idt-secret","registrytoken":"rt-secret"}}
                }}}}"#
        )
        .as_bytes(),
    )
    .expect("parse");
    let shown = format!("{cfg:?} {cfg:#?}");
    for secret in [
        auth.as_str(),
        "pw-in-auth",
        "pw-plain",
        "idt-secret",
        "rt-secret",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(
        shown.contains("bob") && shown.contains(REDACTED),
        "non-secrets and the presence of secrets still show: {shown}"
    );
    let out: HelperOutput =
        serde_json::from_str(r#"{"Username":"hu","Secret":"helper-secret"}"#).expect("json");
    let shown = format!("{out:?}");
    assert!(
        !shown.contains("helper-secret") && shown.contains("hu"),
        "{shown}"
    );
    let tok: TokenResponse = serde_json::from_str(
        r#"{"token":"tok-secret","access_token":"acc-secret","expires_in":300}"#,
    )
    .expect("json");
    let shown = format!("{tok:?}");
    assert!(
        !shown.contains("tok-secret") && !shown.contains("acc-secret") && shown.contains("300"),
        "{shown}"
    );
}

/// Installs `body` as the executable `dir/docker-credential-<name>`.
fn install_helper(dir: &Path, name: &str, body: &str) {
    let src = dir.join(format!("docker-credential-{name}.src"));
    std::fs::write(&src, body).expect("write");
    // Installed by another process: an executable this process held open for writing could
    // leak into a child forked by a concurrent test and make exec fail with ETXTBSY.
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(&src)
        .arg(dir.join(format!("docker-credential-{name}")))
        .status()
        .expect("run install");
    assert!(status.success(), "install the helper");
}

/// Live (not zombie) processes whose environment holds `mark`.
fn live_with_env(mark: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|v| v == mark.as_bytes()) {
            continue;
        }
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|st| {
                st.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if !zombie {
            found.push(pid);
        }
    }
    found
}

#[tokio::test]
async fn a_hung_helper_is_killed_at_the_timeout() {
    let dir = std::env::temp_dir().join(format!("cocoon-reg-hung-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    // The helper starts a child that never ends, marked through its environment, and
    // waits for it.
    let mark = format!("COCOON_HUNG_HELPER={}", dir.display());
    install_helper(
        &dir,
        "hung",
        &format!("#!/bin/sh\nexport {mark}\nsleep 100000 &\nwait\n"),
    );
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, br#"{"credsStore":"hung"}"#).expect("write");
    let src = CredentialSource::DockerConfig {
        path: cfg_path,
        helper_dir: Some(dir.clone()),
        helper_timeout: Duration::from_millis(300),
    };
    let err = tokio::task::spawn_blocking(move || src.resolve("reg.example"))
        .await
        .expect("join")
        .expect_err("a hung helper must fail the resolution");
    assert!(
        matches!(&err, Error::HelperTimeout { helper, after }
                if helper == "hung" && *after == Duration::from_millis(300)),
        "{err:?}"
    );
    assert_eq!(err.class(), crate::ErrorClass::Local);
    assert!(!err.is_transient(), "not retried: it would hang again");
    let msg = err.to_string();
    assert!(
        msg.contains("docker-credential-hung") && msg.contains("300ms"),
        "{msg}"
    );
    // The helper and what it started are killed.
    cocoon_testenv::wait_until(
        "the helper's processes killed",
        Duration::from_secs(30),
        || {
            let left = live_with_env(&mark);
            async move { left.is_empty().then_some(()) }
        },
    )
    .await
    .expect("the helper and its child are killed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn realm_credentials_go_only_to_the_registry_host_and_scheme() {
    let u = |s: &str| url::Url::parse(s).expect("url");
    let rows = [
        // (registry origin, realm, decision)
        (
            "https://reg.example",
            "https://reg.example/token",
            RealmCredentials::Send,
        ),
        (
            "https://reg.example",
            "https://REG.example:8443/token",
            RealmCredentials::Send,
        ),
        (
            "http://127.0.0.1:5000",
            "http://127.0.0.1:5001/token",
            RealmCredentials::Send,
        ),
        (
            "http://reg.example",
            "https://reg.example/token",
            RealmCredentials::Send,
        ),
        (
            "https://reg.example",
            "http://reg.example/token",
            RealmCredentials::Downgrade,
        ),
        (
            "https://reg.example",
            "https://auth.example/token",
            RealmCredentials::OtherHost,
        ),
        (
            "https://reg.example",
            "https://reg.example.evil/token",
            RealmCredentials::OtherHost,
        ),
        (
            "http://127.0.0.1:5000",
            "http://localhost:5001/token",
            RealmCredentials::OtherHost,
        ),
        (
            "http://127.0.0.1:5000",
            "http://169.254.169.254/token",
            RealmCredentials::OtherHost,
        ),
        (
            "https://reg.example",
            "https://user@reg.example.evil/t",
            RealmCredentials::OtherHost,
        ),
    ];
    for (origin, realm, want) in rows {
        assert_eq!(
            RealmCredentials::decide(&u(origin), &u(realm)),
            want,
            "{origin} -> {realm}"
        );
    }
}

#[test]
fn kubernetes_credentials_go_only_to_the_configured_token_realm() {
    let u = |s: &str| url::Url::parse(s).expect("url");
    let allowed = u("https://token.cocoon-system.svc:5002/token");
    let rows = [
        ("https://token.cocoon-system.svc:5002/token", true),
        ("https://TOKEN.cocoon-system.svc:5002/token?service=x", true),
        ("https://token.cocoon-system.svc:5002/other", false),
        ("https://token.cocoon-system.svc/token", false),
        ("http://token.cocoon-system.svc:5002/token", false),
        ("https://token.cocoon-system.svc.evil:5002/token", false),
        ("https://u@token.cocoon-system.svc:5002/token", false),
        ("https://auth.docker.io/token", false),
    ];
    for (realm, want) in rows {
        assert_eq!(is_token_realm(&allowed, &u(realm)), want, "{realm}");
    }
}

#[test]
fn token_realm_setting_is_checked() {
    let ok = |v: &str| parse_token_realm(v).map(|u| u.to_string());
    assert_eq!(
        ok("https://t.example:5002/token").ok().as_deref(),
        Some("https://t.example:5002/token")
    );
    assert!(ok("http://127.0.0.1:5002/token").is_ok(), "loopback http");
    for bad in [
        "http://t.example/token",
        "ftp://t.example/token",
        "https://u:p@t.example/token",
        "https://t.example/token?x=1",
        "not a url",
    ] {
        let err = ok(bad).expect_err(bad).to_string();
        assert!(err.starts_with(ENV_TOKEN_REALM), "{bad}: {err}");
    }
}

#[test]
fn env_selects_kubernetes_token_auth_and_refuses_mixing_it() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(pk, _)| *pk == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let src = CredentialSource::from_env(&env(&[
        (ENV_TOKEN_REALM, "https://t.example/token"),
        (ENV_KUBERNETES_TOKEN_FILE, "/run/token"),
    ]))
    .expect("valid");
    match src {
        CredentialSource::KubernetesToken { realm, token_file } => {
            assert_eq!(realm.as_str(), "https://t.example/token");
            assert_eq!(token_file.as_deref(), Some(Path::new("/run/token")));
        }
        other => panic!("{other:?}"),
    }
    let err = CredentialSource::from_env(&env(&[
        (ENV_TOKEN_REALM, "https://t.example/token"),
        (ENV_USERNAME, "u"),
        (ENV_PASSWORD, "p"),
    ]))
    .expect_err("mixed");
    assert!(err.to_string().contains(ENV_USERNAME), "{err}");
}

#[test]
fn kubernetes_token_is_read_again_on_every_resolve_and_never_printed() {
    let dir = tempfile_dir("k8s-token");
    let file = dir.join("token");
    std::fs::write(&file, "first\n").expect("write");
    let src = CredentialSource::KubernetesToken {
        realm: url::Url::parse("https://t.example/token").expect("url"),
        token_file: Some(file.clone()),
    };
    let token = |c: Credentials| match c {
        Credentials::KubernetesToken { token, .. } => token,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        token(src.resolve("reg").expect("resolve")).as_deref(),
        Some("first")
    );
    std::fs::write(&file, "rotated").expect("write");
    let creds = src.resolve("reg").expect("resolve");
    assert!(!format!("{creds:?}").contains("rotated"), "{creds:?}");
    assert_eq!(token(creds).as_deref(), Some("rotated"));
    std::fs::remove_file(&file).expect("rm");
    let err = src.resolve("reg").expect_err("missing file");
    assert!(err.to_string().contains(ENV_KUBERNETES_TOKEN_FILE), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory under the system temp dir.
fn tempfile_dir(stem: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "cocoon-auth-{stem}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}
