//! The shipped monitoring (issue 28 item 1, issue 36 item 2) against the real binaries: the
//! alert rules are valid (`promtool check rules`, built by scripts/promtool.sh, and a structural
//! check of every rule), every alert fires and stays quiet where its fixtures say
//! (`promtool test rules` on tests/prometheus-rules/, which must hold a firing and a quiet case
//! for each alert), the runbook links name the release tag, the chart's and the kustomize
//! component's copies of the rules and the dashboard agree, and every metric an alert expression
//! or a dashboard query names is one the binaries really export (or kube-state-metrics'): a real
//! `cocoon-operator run` and a real `cocoon-operator node` (simulated runtime) run against the
//! test environment's control plane, do a little work (a CocoonSet reconciled, a pod's VM
//! created), and both `/metrics` are scraped and compared by name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::taints;
use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
use cocoon_testenv::{Shared, create_namespace, delete_namespace, unique_name, wait_until};
use cocoon_testsupport::binaries::{LoggedChild, sim_node_command};
use cocoon_testsupport::{BoxError, vm_pod};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(120);
const BIN: &str = env!("CARGO_BIN_EXE_cocoon-operator");
/// Series Prometheus makes itself rather than scraping them.
const PROMETHEUS_OWN: [&str; 1] = ["up"];
/// kube-state-metrics series (its defaults, no allowlist needed) the node alerts read.
const KUBE_STATE_METRICS: [&str; 2] = ["kube_node_status_condition", "kube_node_spec_taint"];
/// Where the runbook links point: the README at the release tag of this version.
fn runbook_base() -> String {
    format!(
        "https://github.com/cocoonstack/cocoon/blob/v{}/README.md#",
        env!("CARGO_PKG_VERSION")
    )
}
/// The promtool unit tests of the rules (`*.test.yaml`).
const FIXTURES: &str = "tests/prometheus-rules";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("valid YAML")
}

/// The chart's rule file (the `groups:` promtool reads).
fn chart_rules() -> Value {
    yaml(&read("charts/cocoon/files/prometheus-rules.yaml"))
}

fn rules(groups: &Value) -> Vec<&Value> {
    groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .collect()
}

fn dashboard() -> Value {
    serde_json::from_str(&read("charts/cocoon/dashboards/cocoon.json")).expect("dashboard JSON")
}

/// Every PromQL expression of the dashboard's panels (rows included).
fn dashboard_exprs(d: &Value) -> Vec<String> {
    fn walk(panels: &Value, out: &mut Vec<String>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push(e.to_string());
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

/// PromQL words that are not metric names: keywords, aggregation operators and the set and
/// vector-matching operators (functions are recognised by the `(` that follows them).
const KEYWORDS: [&str; 27] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "inf",
    "nan",
];

/// The metric names a PromQL expression selects: identifiers (`[a-zA-Z_:][a-zA-Z0-9_:]*`)
/// outside label matchers `{...}`, ranges `[...]` and strings, not followed by `(` (a
/// function), not a keyword, not a label list after `by`/`without`/`on`/`ignoring`/
/// `group_left`/`group_right`, not part of a number (`5m`, `1e3`) and not a Grafana variable
/// (`$job`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // Set after a keyword whose parenthesised list holds label names.
    let mut label_list_next = false;
    let skip_until = |from: usize, close: char| -> usize {
        let mut j = from + 1;
        let mut quote: Option<char> = None;
        while j < chars.len() {
            let c = chars[j];
            match quote {
                Some(_) if c == '\\' => j += 1,
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '"' || c == '\'' || c == '`' => quote = Some(c),
                None if c == close => return j + 1,
                None => {}
            }
            j += 1;
        }
        j
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            i = skip_until(i, '}');
        } else if c == '[' {
            i = skip_until(i, ']');
        } else if c == '"' || c == '\'' || c == '`' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != c {
                if chars[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            i = j + 1;
        } else if c == '(' && label_list_next {
            label_list_next = false;
            i = skip_until(i, ')');
        } else if c.is_ascii_digit() || c == '.' {
            // A number or a duration: digits, letters, dots (and an exponent's sign).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c == '$' {
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            if [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word.as_str())
            {
                label_list_next = call;
            } else if !call && !KEYWORDS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The series names an exposition defines: a counter family `x` gives `x_total`, a histogram
/// `x_bucket`, `x_sum` and `x_count`, a gauge (or anything else) `x`; a family counts as soon
/// as its `# TYPE` line is there, with or without samples (a labelled family that saw nothing
/// yet prints only HELP and TYPE). Sample lines add their own names too.
fn exported_series(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    out.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        out.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    out.insert(name.to_string());
                }
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            out.insert(line[..end].to_string());
        }
    }
    out
}

#[test]
fn the_tokenizer_finds_metric_names_only() {
    let got = metric_names(
        r#"sum by (controller, le) (rate(cocoon_a_total{result="f{o}o", x=~"$job"}[5m] offset 1h))
           / on (instance) group_left(version) max without (pod) (cocoon_b) > 1e3
           and histogram_quantile(0.9, sum by (le) (rate(cocoon_c_bucket[$__rate_interval])))
           or time() - process_start_time_seconds{job=~"$job"} unless up == 0 or vector(1)"#,
    );
    let want: BTreeSet<String> = [
        "cocoon_a_total",
        "cocoon_b",
        "cocoon_c_bucket",
        "process_start_time_seconds",
        "up",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);

    let text = "# HELP a_x A.\n# TYPE a_x counter\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\n\
        # TYPE g gauge\ng 1\n# TYPE lab counter\n# EOF\n";
    let want: BTreeSet<String> = [
        "a_x_total",
        "h_bucket",
        "h_sum",
        "h_count",
        "g",
        "lab_total",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(exported_series(text), want);
}

#[test]
fn every_rule_has_an_alert_expr_for_severity_summary_and_runbook() {
    let groups = chart_rules();
    let rules = rules(&groups);
    assert!(rules.len() >= 6, "the starter set: {rules:?}");
    let readme = read("README.md").to_lowercase();
    let mut alerts = BTreeSet::new();
    for r in rules {
        let alert = r["alert"].as_str().expect("alert name");
        assert!(alerts.insert(alert.to_string()), "{alert} twice");
        assert!(
            r["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
            "{alert}: expr"
        );
        assert!(r["for"].as_str().is_some(), "{alert}: for");
        let severity = r["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("warning" | "critical" | "info")),
            "{alert}: labels.severity {severity:?}"
        );
        assert!(
            r["annotations"]["summary"].as_str().is_some(),
            "{alert}: summary"
        );
        let runbook = r["annotations"]["runbook_url"]
            .as_str()
            .expect("runbook_url");
        assert_eq!(
            runbook,
            format!("{}{}", runbook_base(), alert.to_lowercase()),
            "{alert}: runbook_url pinned to the release tag, anchored at its paragraph"
        );
        assert!(
            readme.contains(&format!("#### {}", alert.to_lowercase())),
            "{alert}: README has no runbook heading"
        );
    }
}

#[test]
fn the_component_and_the_chart_ship_the_same_rules_and_dashboard() {
    let component = yaml(&read("manifests/components/monitoring/prometheusrule.yaml"));
    assert_eq!(component["kind"], "PrometheusRule");
    assert_eq!(component["spec"], chart_rules());
    assert_eq!(
        read("manifests/components/monitoring/dashboards/cocoon.json"),
        read("charts/cocoon/dashboards/cocoon.json")
    );
}

/// The promtool binary: `COCOON_PROMTOOL` when set, else the one scripts/promtool.sh builds
/// into the cache (once) and prints.
fn promtool() -> PathBuf {
    if let Some(p) = std::env::var_os("COCOON_PROMTOOL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let script = root().join("scripts/promtool.sh");
    let out = std::process::Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} could not provide promtool (set COCOON_PROMTOOL):\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn promtool_accepts_the_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The component's spec as its own rule file (JSON is YAML), next to the chart's file.
    let component = yaml(&read("manifests/components/monitoring/prometheusrule.yaml"));
    let spec = dir.path().join("component-rules.yaml");
    std::fs::write(&spec, component["spec"].to_string()).expect("write");
    let out = std::process::Command::new(promtool())
        .args(["check", "rules"])
        .arg(root().join("charts/cocoon/files/prometheus-rules.yaml"))
        .arg(&spec)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool check rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The promtool unit-test files: every `*.test.yaml` of [`FIXTURES`], sorted.
fn fixture_files() -> Vec<PathBuf> {
    let dir = root().join(FIXTURES);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    files.sort();
    files
}

/// How often the fixtures evaluate an alert: cases expecting it to fire, and cases expecting
/// it quiet (no `exp_alerts`, or an empty list).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Cases {
    firing: usize,
    quiet: usize,
}

/// The cases of one promtool test file, by alert name.
fn cases_of(fixture: &Value, into: &mut BTreeMap<String, Cases>) {
    for test in fixture["tests"].as_array().into_iter().flatten() {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_string();
            let entry = into.entry(name).or_default();
            if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                entry.firing += 1;
            } else {
                entry.quiet += 1;
            }
        }
    }
}

/// What the fixtures lack: an alert of the rules with no firing or no quiet case, and a case
/// naming an alert the rules do not have (a typo would test nothing).
fn fixture_gaps(alerts: &BTreeSet<String>, cases: &BTreeMap<String, Cases>) -> Vec<String> {
    let mut gaps = Vec::new();
    for alert in alerts {
        let c = cases.get(alert).copied().unwrap_or_default();
        if c.firing == 0 {
            gaps.push(format!("{alert}: no case where it fires"));
        }
        if c.quiet == 0 {
            gaps.push(format!("{alert}: no case where it stays quiet"));
        }
    }
    for name in cases.keys().filter(|n| !alerts.contains(*n)) {
        gaps.push(format!("{name}: tested but not an alert of the rules"));
    }
    gaps
}

#[test]
fn fixture_gaps_names_every_missing_case() {
    let alerts: BTreeSet<String> = ["A", "B", "C"].into_iter().map(String::from).collect();
    let cases = BTreeMap::from([
        (
            "A".to_string(),
            Cases {
                firing: 1,
                quiet: 2,
            },
        ),
        (
            "B".to_string(),
            Cases {
                firing: 1,
                quiet: 0,
            },
        ),
        (
            "Typo".to_string(),
            Cases {
                firing: 1,
                quiet: 1,
            },
        ),
    ]);
    assert_eq!(
        fixture_gaps(&alerts, &cases),
        [
            "B: no case where it stays quiet",
            "C: no case where it fires",
            "C: no case where it stays quiet",
            "Typo: tested but not an alert of the rules",
        ]
    );
    let fixture = yaml(
        "tests:\n- alert_rule_test:\n  - {alertname: A, eval_time: 1m}\n  \
         - {alertname: A, eval_time: 2m, exp_alerts: []}\n  \
         - {alertname: A, eval_time: 3m, exp_alerts: [{exp_labels: {x: y}}]}\n",
    );
    let mut got = BTreeMap::new();
    cases_of(&fixture, &mut got);
    assert_eq!(
        got,
        BTreeMap::from([(
            "A".to_string(),
            Cases {
                firing: 1,
                quiet: 2
            }
        )])
    );
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_fixture() {
    let groups = chart_rules();
    let alerts: BTreeSet<String> = rules(&groups)
        .iter()
        .map(|r| r["alert"].as_str().expect("alert name").to_string())
        .collect();
    let files = fixture_files();
    assert!(!files.is_empty(), "no *.test.yaml in {FIXTURES}");
    let chart_file = root()
        .join("charts/cocoon/files/prometheus-rules.yaml")
        .canonicalize()
        .expect("the chart's rule file");
    let mut cases = BTreeMap::new();
    for file in &files {
        let fixture = yaml(&std::fs::read_to_string(file).expect("read fixture"));
        let rule_files: Vec<PathBuf> = fixture["rule_files"]
            .as_array()
            .expect("rule_files")
            .iter()
            .map(|f| {
                let dir = file.parent().expect("fixture dir");
                dir.join(f.as_str().expect("a path"))
                    .canonicalize()
                    .expect("rule file")
            })
            .collect();
        assert_eq!(
            rule_files,
            std::slice::from_ref(&chart_file),
            "{}: tests the chart's rule file",
            file.display()
        );
        cases_of(&fixture, &mut cases);
    }
    let gaps = fixture_gaps(&alerts, &cases);
    assert!(
        gaps.is_empty(),
        "{FIXTURES} lacks cases (each alert needs one firing and one quiet):\n{}",
        gaps.join("\n")
    );
}

#[test]
fn promtool_unit_tests_of_every_alert_pass() {
    let files = fixture_files();
    assert!(!files.is_empty(), "no *.test.yaml in {FIXTURES}");
    let out = std::process::Command::new(promtool())
        .args(["test", "rules"])
        .args(&files)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// README "Monitoring": on a Prometheus with `overrideHonorLabels` the CocoonSet's namespace
/// arrives as `exported_namespace`; the README's sed writes a copy of the rules grouping by it,
/// and that copy alerts per CocoonSet again (tests/prometheus-rules/exported-namespace.yaml:
/// two namespaces' sets of one name are not merged). The unmodified rules fail the same case.
#[test]
fn the_exported_namespace_copy_of_the_readme_alerts_per_cocoonset() {
    let readme = read("README.md");
    let sed_args = [
        "-e",
        "s/by (namespace, cocoonset)/by (exported_namespace, cocoonset)/",
        "-e",
        r"s/\$labels\.namespace/$labels.exported_namespace/g",
    ];
    assert!(
        readme.contains(&format!(
            "sed {} '{}' \\\n    {} '{}' \\",
            sed_args[0], sed_args[1], sed_args[2], sed_args[3]
        )),
        "the README shows this sed"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = dir.path().join("exported-namespace.yaml");
    std::fs::copy(
        root().join(FIXTURES).join("exported-namespace.yaml"),
        &fixture,
    )
    .expect("copy fixture");
    let copy = dir.path().join("cocoon-rules-exported-namespace.yaml");
    let run = |rules: &[u8]| {
        std::fs::write(&copy, rules).expect("write rules");
        std::process::Command::new(promtool())
            .args(["test", "rules"])
            .arg(&fixture)
            .output()
            .expect("run promtool")
    };
    let original = root().join("charts/cocoon/files/prometheus-rules.yaml");
    let sed = std::process::Command::new("sed")
        .args(sed_args)
        .arg(&original)
        .output()
        .expect("run sed");
    assert!(
        sed.status.success(),
        "sed: {}",
        String::from_utf8_lossy(&sed.stderr)
    );
    let rewritten = String::from_utf8(sed.stdout.clone()).expect("UTF-8");
    assert_eq!(
        rewritten
            .matches("by (exported_namespace, cocoonset)")
            .count(),
        read("charts/cocoon/files/prometheus-rules.yaml")
            .matches("by (namespace, cocoonset)")
            .count(),
        "every per-set grouping rewritten"
    );
    assert!(!rewritten.contains("$labels.namespace"), "{rewritten}");
    let out = run(&sed.stdout);
    assert!(
        out.status.success(),
        "promtool test rules on the rewritten copy:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&std::fs::read(&original).expect("read rules"));
    assert!(
        !out.status.success(),
        "the unmodified rules merge the two namespaces' sets, so the same case fails"
    );
}

/// scripts/release.sh refuses a tag the runbook links do not name, before it builds anything
/// (`RUSTC=/bin/false` makes any build attempt fail fast with another message).
#[test]
fn release_refuses_a_tag_the_runbook_links_do_not_name() {
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(root().join("scripts/release.sh"))
        .args(["--tag", "v999.0.0", "--out"])
        .arg(out_dir.path())
        .env("RUSTC", "/bin/false")
        .output()
        .expect("run release.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "release.sh accepted v999.0.0: {stderr}"
    );
    assert!(
        stderr.contains("runbook links") && stderr.contains("v999.0.0"),
        "refused for the runbook links: {stderr}"
    );
}

/// CocoonNodeNotReady picks the cocoon nodes by the provider taint every node agent writes on
/// its Node (contract §4; kube-state-metrics exports taints by default, unlike labels); the
/// scenario below checks a real agent's Node carries it.
#[test]
fn the_node_ready_alert_selects_the_provider_taint() {
    let groups = chart_rules();
    let rule = rules(&groups)
        .into_iter()
        .find(|r| r["alert"] == "CocoonNodeNotReady")
        .expect("CocoonNodeNotReady");
    let expr = rule["expr"].as_str().expect("expr");
    assert!(
        expr.contains(&format!(
            "kube_node_spec_taint{{key=\"{}\",value=\"{}\"}}",
            taints::PROVIDER_KEY,
            taints::PROVIDER_VALUE
        )),
        "{expr}"
    );
    assert!(
        expr.contains(r#"kube_node_status_condition{condition="Ready",status="true"} == 0"#),
        "{expr}"
    );
}

/// A child binary whose JSON log lines (stdout) are kept.
struct Logged(LoggedChild);

impl Logged {
    fn spawn(cmd: tokio::process::Command) -> Result<Self, BoxError> {
        Ok(Logged(LoggedChild::spawn(cmd)?))
    }

    /// `fields.<field>` of the first JSON log line whose message is `message`.
    fn field(&self, message: &str, field: &str) -> Option<String> {
        self.0.lines().iter().find_map(|line| {
            let v: Value = serde_json::from_str(line).ok()?;
            (v["fields"]["message"] == message)
                .then(|| v["fields"][field].as_str().map(String::from))
                .flatten()
        })
    }

    fn all_json(&self) -> bool {
        let l = self.0.lines();
        !l.is_empty()
            && l.iter()
                .all(|line| serde_json::from_str::<Value>(line).is_ok())
    }

    async fn stop(mut self) {
        let _ = self.0.child.start_kill();
        let _ = tokio::time::timeout(WAIT, self.0.child.wait()).await;
    }
}

/// `GET /metrics` over HTTP/1.0 (the server closes the connection after the answer).
async fn scrape(addr: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: metrics\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    let (head, text) = body.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then(|| text.to_string())
        .or_else(|| head.starts_with("HTTP/1.1 200").then(|| text.to_string()))
}

async fn wait_scrape(
    what: &str,
    addr: &str,
    ready: impl Fn(&str) -> bool,
) -> Result<String, BoxError> {
    Ok(wait_until(what, WAIT, || async {
        let text = scrape(addr).await?;
        ready(&text).then_some(text)
    })
    .await?)
}

fn operator(env: &Shared, ns: &str) -> Result<Logged, BoxError> {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("run")
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("OCI_REGISTRY", env.registry_addr())
        .env("POD_NAME", unique_name("metrics-op"))
        .env("POD_NAMESPACE", ns)
        .env("WATCH_NAMESPACE", ns)
        .env("METRICS_ADDR", "127.0.0.1:0")
        // The names are compared here; the secured listener has tests of its own
        // (cocoon-operator's metrics_auth.rs, rbac.rs, the helm test).
        .env("METRICS_SECURE", "false")
        .env("PROBE_ADDR", "127.0.0.1:0")
        .env("LEADER_ELECT", "true")
        .env("OPERATOR_LOG_FORMAT", "json");
    Logged::spawn(cmd)
}

fn node_agent(env: &Shared, node: &str, root: &Path) -> Result<Logged, BoxError> {
    std::fs::create_dir_all(root)?;
    let mut cmd = sim_node_command(
        BIN,
        env.kubeconfig_path(),
        env.registry_addr(),
        node,
        &unique_name("pool"),
        root,
    );
    cmd.env("VK_SIM_PERMISSIVE_PULL", "true")
        .env("VK_LOG_FORMAT", "json");
    Logged::spawn(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_metric_the_alerts_and_the_dashboard_use_is_exported() {
    cocoon_testenv::run_test(|env| async move {
        let admin = env.client()?;
        let ns = create_namespace(&admin, "metrics").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("metrics-node");
        let op = operator(env, &ns)?;
        let agent = node_agent(env, &node, &tmp.path().join("root"))?;
        let result = scenario(&admin, &ns, &node, &op, &agent).await;
        op.stop().await;
        agent.stop().await;
        delete_namespace(&admin, &ns).await?;
        let _ = env
            .kubectl()
            .args(["delete", "node", &node, "--ignore-not-found"])
            .output();
        result
    })
    .await;
}

async fn scenario(
    admin: &kube::Client,
    ns: &str,
    node: &str,
    op: &Logged,
    agent: &Logged,
) -> Result<(), BoxError> {
    let op_addr = wait_until("the operator's metrics address", WAIT, || async {
        op.field("cocoon-operator starting", "metrics")
    })
    .await?;
    let agent_addr = wait_until("the node agent's metrics address", WAIT, || async {
        agent.field("metrics listener started", "addr")
    })
    .await?;

    // A little work: a CocoonSet the operator reconciles (its pool has no node, so it stays
    // Pending) and a pod whose VM the agent creates.
    let sets: Api<CocoonSet> = Api::namespaced(admin.clone(), ns);
    let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
    spec.node_pool = unique_name("nowhere");
    sets.create(&PostParams::default(), &CocoonSet::new("watched", spec))
        .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    pods.create(&PostParams::default(), &vm_pod(ns, "vm-0", node, &[]))
        .await?;
    wait_until("the pod's VM running", WAIT, || async {
        let p = pods.get_opt("vm-0").await.ok().flatten()?;
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        (running && p.metadata.annotations.as_ref()?.contains_key(ann::VM_ID)).then_some(())
    })
    .await?;

    // The taint CocoonNodeNotReady selects cocoon nodes by is on the agent's Node.
    let node_obj = Api::<Node>::all(admin.clone()).get(node).await?;
    let tainted = node_obj
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.key == taints::PROVIDER_KEY && t.value.as_deref() == Some(taints::PROVIDER_VALUE)
            })
        });
    assert!(
        tainted,
        "the agent's Node carries the provider taint: {:?}",
        node_obj.spec
    );

    let version = env!("CARGO_PKG_VERSION");
    let op_text = wait_scrape("the operator's metrics after a pass", &op_addr, |t| {
        t.contains("\ncocoon_operator_leader 1\n")
            && t.contains("cocoon_operator_objects{kind=\"CocoonSet\"")
            && t.contains("cocoon_operator_reconcile_duration_seconds_count{")
            && t.contains(&format!(
                "cocoon_operator_build_info{{version=\"{version}\""
            ))
    })
    .await?;
    let agent_text = wait_scrape("the agent's metrics after a VM", &agent_addr, |t| {
        t.contains("\ncocoon_vk_vm_table_size 1\n") && t.contains("cocoon_vk_pod_lifecycle_total{")
    })
    .await?;
    assert!(op.all_json(), "OPERATOR_LOG_FORMAT=json: every line JSON");
    assert!(agent.all_json(), "VK_LOG_FORMAT=json: every line JSON");

    let mut exported = exported_series(&op_text);
    exported.extend(exported_series(&agent_text));
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "process_virtual_memory_bytes",
    ] {
        for (who, text) in [("operator", &op_text), ("agent", &agent_text)] {
            assert!(
                exported_series(text).contains(process),
                "{who} exports {process}"
            );
        }
    }

    let groups = chart_rules();
    let mut used: Vec<(String, String)> = rules(&groups)
        .iter()
        .map(|r| {
            (
                format!("alert {}", r["alert"].as_str().unwrap_or("?")),
                r["expr"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    used.extend(
        dashboard_exprs(&dashboard())
            .into_iter()
            .map(|e| ("dashboard".to_string(), e)),
    );
    assert!(used.len() > 20, "alerts and panels found: {}", used.len());
    let mut missing = Vec::new();
    let mut checked = BTreeSet::new();
    for (whose, expr) in &used {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{whose}: no metric in {expr}");
        for name in names {
            if PROMETHEUS_OWN.contains(&name.as_str())
                || KUBE_STATE_METRICS.contains(&name.as_str())
            {
                continue;
            }
            if !exported.contains(&name) {
                missing.push(format!("{whose}: {name}"));
            }
            checked.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "not exported by the binaries: {missing:#?}\n--- operator\n{op_text}\n--- agent\n{agent_text}"
    );
    eprintln!(
        "{} metric names used by {} alert and panel expressions, all exported",
        checked.len(),
        used.len()
    );
    Ok(())
}
