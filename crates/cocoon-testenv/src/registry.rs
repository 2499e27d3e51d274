//! A local OCI registry (Debian's docker-registry 2.8.2) on a loopback port, anonymous, with
//! htpasswd basic auth, or with token auth (the distribution token spec, [`TokenAuth`]), usable
//! inside a `TestEnv` or on its own.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::paths;
use crate::process::{ChildProc, STOP_GRACE, free_ports, tail_file};
use crate::wait::{Probe, poll};

/// How long the registry gets to answer `GET /v2/`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Starting on a port another process grabbed is retried this many times.
const PORT_ATTEMPTS: usize = 3;

/// Basic-auth credentials the registry accepts (stored as a bcrypt htpasswd entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryAuth {
    pub username: String,
    pub password: String,
}

impl RegistryAuth {
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        RegistryAuth {
            username: username.into(),
            password: password.into(),
        }
    }
}

/// Token authentication (`auth.token` of the registry config): the registry challenges with
/// `Bearer realm=<realm>,service=<service>` and accepts JWTs of `issuer` for `service` signed by
/// a key whose certificate is in `rootcertbundle`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenAuth {
    pub realm: String,
    pub service: String,
    pub issuer: String,
    /// PEM file of the certificates whose keys may sign tokens.
    pub rootcertbundle: PathBuf,
}

/// A running registry process. Stopped on `shutdown` or drop.
#[derive(Debug)]
pub struct Registry {
    child: Option<ChildProc>,
    addr: String,
    dir: PathBuf,
    auth: Option<RegistryAuth>,
    token: Option<TokenAuth>,
    /// Set for `start_temp`: the registry owns (and removes) its directory.
    owns_dir: bool,
}

impl Registry {
    /// Starts a registry whose config, data and log live under `dir` (created; not removed).
    pub async fn start(dir: impl Into<PathBuf>, auth: Option<RegistryAuth>) -> Result<Registry> {
        let dir = dir.into();
        let logs = dir.join("logs");
        Self::start_in(&paths::default_registry_bin(), &dir, &logs, auth, true).await
    }

    /// Starts a registry in a fresh temporary directory that is removed on shutdown
    /// (kept when `TESTENV_KEEP` is set).
    pub async fn start_temp(auth: Option<RegistryAuth>) -> Result<Registry> {
        Self::start_temp_with(auth, true).await
    }

    /// [`Registry::start_temp`] of a registry that refuses every `DELETE` (405 `UNSUPPORTED`,
    /// `storage.delete.enabled: false`): it stands in for a credential with pull and push but
    /// no delete, which this registry cannot express per user (any htpasswd user may delete).
    pub async fn start_temp_without_delete(auth: Option<RegistryAuth>) -> Result<Registry> {
        Self::start_temp_with(auth, false).await
    }

    /// [`Registry::start_temp`] of a registry with token authentication: every request needs a
    /// token from `token.realm`.
    pub async fn start_temp_with_token(token: TokenAuth) -> Result<Registry> {
        Self::start_temp_inner(None, true, Some(token)).await
    }

    async fn start_temp_with(auth: Option<RegistryAuth>, delete: bool) -> Result<Registry> {
        Self::start_temp_inner(auth, delete, None).await
    }

    async fn start_temp_inner(
        auth: Option<RegistryAuth>,
        delete: bool,
        token: Option<TokenAuth>,
    ) -> Result<Registry> {
        let dir = crate::rundir::make_run_dir("cocoon-registry")?;
        if std::env::var_os("TESTENV_KEEP").is_some() {
            crate::rundir::mark_keep(&dir);
        }
        let logs = dir.join("logs");
        let bin = paths::default_registry_bin();
        let mut reg = Self::start_with(&bin, &dir, &logs, auth, delete, token).await;
        match &mut reg {
            Ok(r) => r.owns_dir = true,
            Err(_) => crate::rundir::remove_run_dir(&dir),
        }
        reg
    }

    /// Starts `bin` with data in `dir` and its log at `log_dir/registry.log`; `delete: false`
    /// refuses every `DELETE`.
    pub(crate) async fn start_in(
        bin: &Path,
        dir: &Path,
        log_dir: &Path,
        auth: Option<RegistryAuth>,
        delete: bool,
    ) -> Result<Registry> {
        Self::start_with(bin, dir, log_dir, auth, delete, None).await
    }

    async fn start_with(
        bin: &Path,
        dir: &Path,
        log_dir: &Path,
        auth: Option<RegistryAuth>,
        delete: bool,
        token: Option<TokenAuth>,
    ) -> Result<Registry> {
        paths::check_registry_bin(bin)?;
        for d in [dir, log_dir] {
            std::fs::create_dir_all(d)
                .map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
        }
        let htpasswd = match &auth {
            Some(a) => Some(write_htpasswd(dir, a)?),
            None => None,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_ports(1)?[0];
            let addr = format!("127.0.0.1:{port}");
            let config = dir.join("config.yml");
            let mut yaml = config_yaml(&dir.join("data"), &addr, htpasswd.as_deref(), delete)?;
            if let Some(t) = &token {
                yaml.push_str(&token_yaml(t)?);
            }
            std::fs::write(&config, yaml)
                .map_err(|e| Error::io(format!("writing {}", config.display()), e))?;
            let args: Vec<OsString> = vec!["serve".into(), config.into_os_string()];
            let child = ChildProc::spawn("registry", bin, &args, log_dir)?;
            let mut reg = Registry {
                child: Some(child),
                addr,
                dir: dir.to_path_buf(),
                auth: auth.clone(),
                token: token.clone(),
                owns_dir: false,
            };
            match reg.wait_ready().await {
                Ok(()) => {
                    tracing::info!(addr = %reg.addr, auth = reg.auth.is_some(), "registry ready");
                    return Ok(reg);
                }
                Err(e) if e.is_port_race() && attempt < PORT_ATTEMPTS => {
                    tracing::warn!(port, "registry lost its port; retrying");
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let url = format!("http://{}/v2/", self.addr);
        // With auth the registry answers 401 and a challenge; that proves it is serving.
        let want = if self.auth.is_some() || self.token.is_some() {
            401
        } else {
            200
        };
        let child = &mut self.child;
        poll("registry GET /v2/", READY_TIMEOUT, || {
            let exited = child.as_mut().and_then(|c| c.exited_error());
            let req = http.get(&url).send();
            async move {
                if let Some(e) = exited {
                    return Probe::Fail(e);
                }
                match req.await {
                    Ok(r) if r.status().as_u16() == want => Probe::Ready(()),
                    Ok(r) => Probe::NotYet(format!("status {}", r.status())),
                    Err(e) => Probe::NotYet(e.to_string()),
                }
            }
        })
        .await
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The credentials this registry requires, if any.
    pub fn auth(&self) -> Option<&RegistryAuth> {
        self.auth.as_ref()
    }

    /// The token authentication this registry requires, if any.
    pub fn token_auth(&self) -> Option<&TokenAuth> {
        self.token.as_ref()
    }

    /// The directory holding config, data and (for standalone registries) logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file holding blob `digest` (`sha256:<hex>`) in this registry's filesystem storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The storage directory of repository `repo` (filesystem driver layout).
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.dir
            .join("data/docker/registry/v2/repositories")
            .join(repo)
    }

    /// Process id, for resource accounting.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.pid())
    }

    /// The last `lines` lines of the registry log.
    pub fn log_tail(&self, lines: usize) -> String {
        match &self.child {
            Some(c) => tail_file(c.log_path(), lines),
            None => String::new(),
        }
    }

    /// Freezes the registry process (SIGSTOP): connections are still accepted by the kernel
    /// but never answered, which is what an overloaded or partitioned registry looks like to
    /// a client. [`Registry::resume`] thaws it.
    pub fn pause(&self) -> Result<()> {
        self.signal(libc::SIGSTOP)
    }

    /// Thaws a registry frozen by [`Registry::pause`] (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        self.signal(libc::SIGCONT)
    }

    fn signal(&self, sig: libc::c_int) -> Result<()> {
        let Some(pid) = self.pid() else {
            return Err(Error::Invalid {
                what: "registry".into(),
                detail: "not running".into(),
            });
        };
        // SAFETY: plain kill(2) on a pid this harness spawned and still owns.
        let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Error::Invalid {
                what: "registry".into(),
                detail: format!("signal {sig}: {}", std::io::Error::last_os_error()),
            })
        }
    }

    /// Stops the process (SIGTERM, then SIGKILL after the grace period).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.stop(STOP_GRACE);
        }
        if self.owns_dir {
            crate::rundir::remove_run_dir(&self.dir);
        }
    }

    /// An `Exited` error if the registry process has died.
    pub fn exited_error(&mut self) -> Option<Error> {
        self.child.as_mut().and_then(|c| c.exited_error())
    }

    /// Kills immediately, for process-exit cleanup.
    pub(crate) fn kill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            c.kill();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_htpasswd(dir: &Path, auth: &RegistryAuth) -> Result<PathBuf> {
    if auth.username.contains(':') || auth.username.contains('\n') {
        return Err(Error::Invalid {
            what: "registry username".into(),
            detail: "must not contain ':' or newlines".into(),
        });
    }
    // Cost 4 (the minimum): the registry checks the hash on every request, and these
    // credentials guard nothing.
    let hash = bcrypt::hash_with_result(&auth.password, 4)
        .map_err(|e| Error::Invalid {
            what: "registry password".into(),
            detail: e.to_string(),
        })?
        .format_for_version(bcrypt::Version::TwoY);
    let path = dir.join("htpasswd");
    std::fs::write(&path, format!("{}:{hash}\n", auth.username))
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    Ok(path)
}

/// The registry config: loopback only, deletes enabled, no upload purging, no blob
/// descriptor cache (it goes stale after deletes).
fn config_yaml(data: &Path, addr: &str, htpasswd: Option<&Path>, delete: bool) -> Result<String> {
    let q = |p: &Path| {
        serde_json::to_string(&p.to_string_lossy()).map_err(|e| Error::Invalid {
            what: "path".into(),
            detail: e.to_string(),
        })
    };
    let mut yaml = format!(
        "version: 0.1
log:
  level: warn
  fields: {{service: registry}}
storage:
  filesystem:
    rootdirectory: {data}
  delete:
    enabled: {delete}
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: {addr}
  headers:
    X-Content-Type-Options: [nosniff]
",
        data = q(data)?,
    );
    if let Some(h) = htpasswd {
        yaml.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: cocoon-testenv\n    path: {}\n",
            q(h)?
        ));
    }
    Ok(yaml)
}

/// The `auth.token` section (appended after [`config_yaml`], which then has no `auth`).
fn token_yaml(t: &TokenAuth) -> Result<String> {
    let q = |v: &str| {
        serde_json::to_string(v).map_err(|e| Error::Invalid {
            what: "registry token auth".into(),
            detail: e.to_string(),
        })
    };
    Ok(format!(
        "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
        q(&t.realm)?,
        q(&t.service)?,
        q(&t.issuer)?,
        q(&t.rootcertbundle.to_string_lossy())?,
    ))
}
