//! `check-metrics`: the chart's `helm test`. Reads the operator's metrics Service and the pods
//! its selector picks, and fetches `/metrics` from every Ready one on the Service's target port
//! directly (the endpoints the Service routes to), requiring `cocoon_operator_build_info` of this
//! binary's own version (the hook runs the release's image). It needs no cluster DNS and no
//! Service proxy (kube-proxy): only the API (`get` the Service, `list` pods in the namespace) and
//! a pod network path to the operator's pods, which a NetworkPolicy must admit. Reading the
//! pods (rather than EndpointSlices) lets a failure name each selected pod and what it lacks.
//! `/metrics` is secured (TokenReview and SubjectAccessReview): the check presents its own
//! bearer token (the pod's service-account token, or `--token-file`), whose user needs the
//! `cocoon-metrics-reader` ClusterRole (the chart binds it to the hook's ServiceAccount).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The metric every operator exports from start (`metrics.md`).
const BUILD_INFO: &str = "cocoon_operator_build_info";
/// Cap on one `/metrics` answer: the operator's is a few tens of KiB.
const MAX_BODY: u64 = 8 << 20;
/// Budget for one endpoint's connect + answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between rounds while no pod is ready or one does not answer yet.
const RETRY: Duration = Duration::from_secs(2);

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The metrics Service.
    #[arg(long, value_name = "SERVICE")]
    service: String,
    /// The Service's namespace (default: this pod's, from its service-account mount).
    #[arg(long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// The Service port's name.
    #[arg(long, value_name = "NAME", default_value = "metrics")]
    port_name: String,
    /// How long to wait until Ready selected pods all answer (Go duration, e.g. 60s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    timeout: String,
    /// Accept an operator of another version than this binary's.
    #[arg(long)]
    any_version: bool,
    /// The bearer token presented to `/metrics`, read from this file each round (default: the
    /// token of the Kubernetes client configuration: in a pod, its service-account token).
    #[arg(long, value_name = "PATH")]
    token_file: Option<std::path::PathBuf>,
}

/// Where the bearer token for `/metrics` comes from.
#[derive(Debug, Clone)]
enum TokenSource {
    /// A file re-read each round (projected tokens rotate).
    File(std::path::PathBuf),
    /// A fixed token of the client configuration.
    Fixed(String),
    /// None: `/metrics` is asked without credentials.
    None,
}

impl TokenSource {
    fn of(args: &CheckArgs, config: &kube::Config) -> Self {
        use secrecy::ExposeSecret as _;
        if let Some(f) = &args.token_file {
            return TokenSource::File(f.clone());
        }
        if let Some(f) = &config.auth_info.token_file {
            return TokenSource::File(f.into());
        }
        match &config.auth_info.token {
            Some(t) => TokenSource::Fixed(t.expose_secret().to_owned()),
            None => TokenSource::None,
        }
    }

    fn read(&self) -> Result<Option<String>, String> {
        match self {
            TokenSource::File(path) => std::fs::read_to_string(path)
                .map(|t| Some(t.trim().to_owned()))
                .map_err(|e| format!("read the token file {}: {e}", path.display())),
            TokenSource::Fixed(t) => Ok(Some(t.clone())),
            TokenSource::None => Ok(None),
        }
    }
}

/// One address:port the Service routes to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    pub addr: String,
    pub port: u16,
    /// The pod behind it.
    pub pod: String,
}

impl Target {
    fn host_port(&self) -> String {
        if self.addr.contains(':') {
            format!("[{}]:{}", self.addr, self.port)
        } else {
            format!("{}:{}", self.addr, self.port)
        }
    }

    fn describe(&self) -> String {
        format!("{} (pod {})", self.host_port(), self.pod)
    }
}

/// The Service's selector as a label selector string; refused when it selects nothing.
pub fn selector_of(svc: &Service) -> Result<String, String> {
    let selector: BTreeMap<String, String> = svc
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    if selector.is_empty() {
        return Err("has no selector".into());
    }
    Ok(selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(","))
}

/// Where the Service's port `port_name` routes on the pods it selects: every Ready pod that is
/// not being deleted, at its IPs, on the target port (a number, or a container port name looked
/// up in each pod). Sorted. A Ready pod without the named container port is an error.
pub fn targets(svc: &Service, pods: &[Pod], port_name: &str) -> Result<Vec<Target>, String> {
    let port = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(port_name))
        .ok_or_else(|| format!("has no port named {port_name:?}"))?;
    let target = port
        .target_port
        .clone()
        .unwrap_or(IntOrString::Int(port.port));
    let mut out = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let status = pod.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if !ready {
            continue;
        }
        let number = match &target {
            IntOrString::Int(n) => Some(*n),
            IntOrString::String(want) => pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(want.as_str()))
                .map(|p| p.container_port),
        };
        let port = number
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("pod {name} has no container port {target:?}"))?;
        let mut ips: Vec<String> = status
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .map(|ip| ip.ip.clone())
            .collect();
        if ips.is_empty() {
            ips.extend(status.and_then(|s| s.pod_ip.clone()));
        }
        for addr in ips {
            out.push(Target {
                addr,
                port,
                pod: name.clone(),
            });
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// What one `/metrics` answer says about the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildInfo {
    /// The `cocoon_operator_build_info{...} 1` line and its `version` label.
    Found { line: String, version: String },
    /// No such sample.
    Missing,
}

/// Finds the build-info sample in a Prometheus text exposition.
pub fn build_info(text: &str) -> BuildInfo {
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(BUILD_INFO) else {
            continue;
        };
        let Some(labels) = rest.strip_prefix('{') else {
            continue;
        };
        let version = labels
            .split_once("version=\"")
            .and_then(|(_, v)| v.split_once('"'))
            .map(|(v, _)| v.to_string())
            .unwrap_or_default();
        return BuildInfo::Found {
            line: line.to_string(),
            version,
        };
    }
    BuildInfo::Missing
}

/// The verdict on one endpoint's answer: its build-info line, or why it fails the check.
pub fn judge(text: &str, want_version: Option<&str>) -> Result<String, String> {
    match build_info(text) {
        BuildInfo::Missing => Err(format!("no {BUILD_INFO} sample in /metrics")),
        BuildInfo::Found { line, version } => match want_version {
            Some(want) if version != want => Err(format!(
                "{BUILD_INFO} reports version {version:?}, this check is version {want:?} \
                 (--any-version accepts it)"
            )),
            _ => Ok(line),
        },
    }
}

/// Splits an HTTP/1.0 answer into status code and body.
fn parse_response(raw: &[u8]) -> Result<(u16, String), String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "answer has no end of headers".to_string())?;
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {:?}", head.lines().next().unwrap_or("")))?;
    Ok((status, body.to_string()))
}

/// `GET /metrics` over HTTP/1.0 (the answer is the whole body up to EOF, never chunked),
/// presenting `token` as a bearer token.
async fn fetch(target: &Target, token: Option<&str>) -> Result<String, String> {
    let work = async {
        let mut conn = TcpStream::connect(target.host_port())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let authorization = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "GET /metrics HTTP/1.0\r\nHost: {}\r\nUser-Agent: cocoon-operator-check\r\n{authorization}\r\n",
            target.host_port()
        );
        conn.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("send: {e}"))?;
        let mut raw = Vec::new();
        conn.take(MAX_BODY + 1)
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if raw.len() as u64 > MAX_BODY {
            return Err(format!("answer larger than {MAX_BODY} bytes"));
        }
        let (status, body) = parse_response(&raw)?;
        match status {
            200 => {}
            401 => {
                return Err(format!(
                    "HTTP 401 (the operator's /metrics needs a bearer token it can review{})",
                    if token.is_none() {
                        "; this check has none"
                    } else {
                        ""
                    }
                ));
            }
            403 => {
                return Err(format!(
                    "HTTP 403 ({}: bind the cocoon-metrics-reader ClusterRole to this check's \
                     user)",
                    body.trim()
                ));
            }
            _ => return Err(format!("HTTP {status}")),
        }
        Ok(body)
    };
    tokio::time::timeout(FETCH_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {FETCH_TIMEOUT:?}")))
}

/// The namespace of the pod this runs in, from its service-account mount.
fn own_namespace() -> Option<String> {
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

pub fn main(args: CheckArgs) -> anyhow::Result<()> {
    let timeout = cocoon_operator::config::parse_go_duration(&args.timeout).map_err(|e| {
        anyhow::anyhow!(
            "--timeout: {:?} is not a duration like 60s or 2m ({e:?})",
            args.timeout
        )
    })?;
    let Some(namespace) = args.namespace.clone().or_else(own_namespace) else {
        bail!("--namespace: not given and no service-account namespace file to default to");
    };
    tokio::runtime::Runtime::new()
        .context("start the async runtime")?
        .block_on(check(args, namespace, timeout))
}

async fn check(args: CheckArgs, namespace: String, timeout: Duration) -> anyhow::Result<()> {
    let config = kube::Config::infer()
        .await
        .context("connect to the Kubernetes API (KUBECONFIG or in-cluster)")?;
    let tokens = TokenSource::of(&args, &config);
    let client = kube::Client::try_from(cocoon_operator::user_agent::kube_config(config))
        .context("connect to the Kubernetes API")?;
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let want = (!args.any_version).then_some(env!("CARGO_PKG_VERSION"));
    let deadline = tokio::time::Instant::now() + timeout;
    let what = format!("Service {namespace}/{}", args.service);
    loop {
        let problem = match round(&services, &pods, &args, &tokens, want).await {
            Ok(lines) => {
                println!("{what}: {} ready pods answer", lines.len());
                for l in lines {
                    println!("  {l}");
                }
                return Ok(());
            }
            Err(problem) => problem,
        };
        if tokio::time::Instant::now() + RETRY > deadline {
            bail!(
                "{what}: {problem} (gave up after --timeout {})",
                args.timeout
            );
        }
        eprintln!("{what}: {problem}; retrying");
        tokio::time::sleep(RETRY).await;
    }
}

/// `: a (Ready, no IP), b (not Ready)` for an error message; empty for no pods.
fn pod_states(pods: &[Pod]) -> String {
    let states: Vec<String> = pods
        .iter()
        .map(|p| {
            let name = p.metadata.name.as_deref().unwrap_or("?");
            let status = p.status.as_ref();
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let ip = status.and_then(|s| s.pod_ip.as_deref()).unwrap_or("no IP");
            let deleting = if p.metadata.deletion_timestamp.is_some() {
                ", being deleted"
            } else {
                ""
            };
            let ready = if ready { "Ready" } else { "not Ready" };
            format!("{name} ({ready}, {ip}{deleting})")
        })
        .collect();
    if states.is_empty() {
        String::new()
    } else {
        format!(": {}", states.join(", "))
    }
}

/// One look: the build-info line of every target, or what is wrong.
async fn round(
    services: &Api<Service>,
    pods: &Api<Pod>,
    args: &CheckArgs,
    tokens: &TokenSource,
    want: Option<&str>,
) -> Result<Vec<String>, String> {
    let token = tokens.read()?;
    let svc = services
        .get(&args.service)
        .await
        .map_err(|e| format!("get: {e}"))?;
    let selector = selector_of(&svc)?;
    let selected = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("list its pods ({selector}): {e}"))?;
    let targets = targets(&svc, &selected.items, &args.port_name)?;
    if targets.is_empty() {
        return Err(format!(
            "no ready pod for port {:?} ({} pods match {selector}{})",
            args.port_name,
            selected.items.len(),
            pod_states(&selected.items)
        ));
    }
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for t in &targets {
        match fetch(t, token.as_deref())
            .await
            .and_then(|body| judge(&body, want))
        {
            Ok(line) => lines.push(format!("{}: {line}", t.describe())),
            Err(e) => failed.push(format!("{}: {e}", t.describe())),
        }
    }
    if failed.is_empty() {
        Ok(lines)
    } else {
        Err(failed.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, PodCondition, PodIP, PodSpec, PodStatus, ServicePort, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn svc(target: Option<IntOrString>) -> Service {
        Service {
            spec: Some(ServiceSpec {
                selector: Some([("app".to_string(), "op".to_string())].into()),
                ports: Some(vec![
                    ServicePort {
                        name: Some("probe".into()),
                        port: 81,
                        ..Default::default()
                    },
                    ServicePort {
                        name: Some("metrics".into()),
                        port: 8080,
                        target_port: target,
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A pod `name` at `ips`, Ready or not, with container port `metrics` = 9090.
    fn pod(name: &str, ips: &[&str], ready: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "manager".into(),
                ports: Some(vec![ContainerPort {
                    name: Some("metrics".into()),
                    container_port: 9090,
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            ..Default::default()
        });
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..Default::default()
            }]),
            pod_ips: Some(ips.iter().map(|ip| PodIP { ip: (*ip).into() }).collect()),
            ..Default::default()
        });
        p
    }

    fn t(addr: &str, port: u16, pod: &str) -> Target {
        Target {
            addr: addr.into(),
            port,
            pod: pod.into(),
        }
    }

    #[test]
    fn targets_are_the_ready_selected_pods_on_the_target_port() {
        let mut deleting = pod("d", &["10.0.0.4"], "True");
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        let pods = [
            pod("b", &["10.0.0.2"], "True"),
            pod("a", &["10.0.0.1", "fd00::1"], "True"),
            pod("c", &["10.0.0.3"], "False"),
            deleting,
        ];
        let named = svc(Some(IntOrString::String("metrics".into())));
        assert_eq!(
            targets(&named, &pods, "metrics"),
            Ok(vec![
                t("10.0.0.1", 9090, "a"),
                t("10.0.0.2", 9090, "b"),
                t("fd00::1", 9090, "a"),
            ])
        );
        assert_eq!(t("fd00::1", 9090, "a").host_port(), "[fd00::1]:9090");
        // A numeric target port, or none (the Service port itself).
        let numbered = svc(Some(IntOrString::Int(7000)));
        assert_eq!(
            targets(&numbered, &pods[..1], "metrics"),
            Ok(vec![t("10.0.0.2", 7000, "b")])
        );
        assert_eq!(
            targets(&svc(None), &pods[..1], "metrics"),
            Ok(vec![t("10.0.0.2", 8080, "b")])
        );
        // A Ready pod without an IP is not reachable.
        assert_eq!(
            targets(&named, &[pod("n", &[], "True")], "metrics"),
            Ok(vec![])
        );
        // No Ready pod: nothing to check (the caller retries, then fails).
        assert_eq!(targets(&named, &pods[2..], "metrics"), Ok(vec![]));
        // A pod without the named container port, a Service without the port.
        let other = svc(Some(IntOrString::String("web".into())));
        let e = targets(&other, &pods[..1], "metrics").unwrap_err();
        assert!(e.contains("pod b has no container port"), "{e}");
        let e = targets(&named, &pods, "scrape").unwrap_err();
        assert_eq!(e, "has no port named \"scrape\"");
    }

    #[test]
    fn a_service_without_a_selector_is_refused() {
        assert_eq!(selector_of(&svc(None)), Ok("app=op".to_string()));
        let mut bare = svc(None);
        bare.spec.as_mut().unwrap().selector = None;
        assert_eq!(selector_of(&bare), Err("has no selector".to_string()));
    }

    #[test]
    fn the_build_info_sample_decides() {
        let text = "# HELP cocoon_operator_build_info Build.\n\
                    # TYPE cocoon_operator_build_info gauge\n\
                    cocoon_operator_build_info_extra{version=\"9\"} 1\n\
                    cocoon_operator_build_info{version=\"1.2.3\",revision=\"abc\"} 1\n";
        let line = "cocoon_operator_build_info{version=\"1.2.3\",revision=\"abc\"} 1";
        assert_eq!(judge(text, Some("1.2.3")), Ok(line.to_string()));
        assert_eq!(judge(text, None), Ok(line.to_string()));
        let wrong = judge(text, Some("1.2.4")).unwrap_err();
        assert!(
            wrong.contains("\"1.2.3\"") && wrong.contains("--any-version"),
            "{wrong}"
        );
        let none = judge("up 1\n# cocoon_operator_build_info{}\n", None).unwrap_err();
        assert!(
            none.contains("no cocoon_operator_build_info sample"),
            "{none}"
        );
    }

    #[test]
    fn responses_split_into_status_and_body() {
        assert_eq!(
            parse_response(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nup 1\n"),
            Ok((200, "up 1\n".to_string()))
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 404 Not Found\r\n\r\n"),
            Ok((404, String::new()))
        );
        assert!(parse_response(b"HTTP/1.0 200 OK\r\n").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
    }
}
