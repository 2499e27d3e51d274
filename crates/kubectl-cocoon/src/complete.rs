//! Dynamic completion in cobra's protocol (`__complete`), used through the
//! `kubectl_complete-cocoon` shim: candidates one per line, then `:<directive>`.

use cocoon_api::contract::{annotations, labels};
use cocoon_api::crd::checkpoint::CocoonCheckpoint;
use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::cli::{HIBERNATION_PHASES, SET_PHASES};
use crate::conn::ConnFlags;
use crate::output::{OBJECT_FORMATS, TABLE_FORMATS, VERSION_FORMATS};

/// cobra directive: do not fall back to file completion.
pub const NO_FILE: u32 = 4;
/// cobra directive: error.
pub const ERROR: u32 = 1;

/// What the word being completed should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    Subcommands,
    /// Names with descriptions: a verb's subcommands or flags.
    Named(Vec<(String, String)>),
    Sets,
    Pods,
    /// Pods, plus `cocoonset/<name>` (for `wake`).
    PodsOrSets,
    Nodes,
    /// CocoonCheckpoint names (`fork`).
    Checkpoints,
    /// Sets, plus `checkpoint/<name>` (`describe`).
    SetsOrCheckpoints,
    Values(Vec<&'static str>),
    /// Like `Values`, typed as `--flag=VALUE` in one word.
    FlagValues(String, Vec<&'static str>),
    Nothing,
}

/// The parsed completion request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub want: Want,
    pub prefix: String,
    pub namespace: Option<String>,
    pub context: Option<String>,
    pub kubeconfig: Option<String>,
}

/// The command line's visible verbs (or a verb's subcommands), with the first sentence of
/// their help.
fn subcommands(path: &[&str]) -> Vec<(String, String)> {
    let Some(cmd) = command_at(path) else {
        return Vec::new();
    };
    cmd.get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .map(|c| (c.get_name().to_string(), short_about(c)))
        .collect()
}

fn short_about(c: &clap::Command) -> String {
    summary(&c.get_about().map(|a| a.to_string()).unwrap_or_default())
}

/// The one-line description completion shows for a verb: its about without parenthesised
/// asides, up to the first `:`, `;` or `, e.g.`.
fn summary(about: &str) -> String {
    let mut plain = String::new();
    let mut depth = 0usize;
    for ch in about.chars() {
        match ch {
            '(' => depth += 1,
            ')' if depth > 0 => depth -= 1,
            _ if depth == 0 => plain.push(ch),
            _ => {}
        }
    }
    let cut = [":", ";", ", e.g."]
        .iter()
        .filter_map(|sep| plain.find(sep))
        .min()
        .unwrap_or(plain.len());
    plain[..cut]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches('.')
        .trim_end()
        .to_string()
}

/// The clap command at `path` (empty: the top), with the global flags propagated.
fn command_at(path: &[&str]) -> Option<clap::Command> {
    let mut cmd = <crate::cli::Cli as clap::CommandFactory>::command();
    cmd.build();
    for name in path {
        cmd = cmd.find_subcommand(name)?.clone();
    }
    Some(cmd)
}

/// The long flags of the command at `path`, global ones included, with their help.
fn flags(path: &[&str]) -> Vec<(String, String)> {
    let Some(cmd) = command_at(path) else {
        return Vec::new();
    };
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let long = a.get_long()?;
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            Some((format!("--{long}"), help.trim_end_matches('.').to_string()))
        })
        .collect()
}

/// The phases `--until` (and `--for`) offer for a verb.
fn phases(sub: Option<&str>) -> Vec<&'static str> {
    match sub {
        Some("suspend" | "resume") => SET_PHASES.to_vec(),
        Some("hibernate") => HIBERNATION_PHASES.to_vec(),
        _ => {
            let mut all = HIBERNATION_PHASES.to_vec();
            all.extend(
                SET_PHASES
                    .iter()
                    .filter(|p| !HIBERNATION_PHASES.contains(p)),
            );
            all
        }
    }
}

/// The `-o` formats a verb offers (`jsonpath=` to be completed by hand).
fn output_formats(sub: Option<&str>) -> Vec<&'static str> {
    let formats = match sub {
        Some("status" | "get" | "list") => TABLE_FORMATS,
        Some("version" | "registry") => VERSION_FORMATS,
        _ => OBJECT_FORMATS,
    };
    formats
        .iter()
        .map(|f| if *f == "jsonpath" { "jsonpath=" } else { f })
        .collect()
}

/// The values of a flag, when it takes one from a fixed set.
fn flag_values(flag: &str, sub: Option<&str>) -> Option<Vec<&'static str>> {
    Some(match flag {
        "-o" | "--output" => output_formats(sub),
        "--color" => vec!["auto", "always", "never"],
        "--dry-run" => vec!["none", "client", "server"],
        // Every on/off flag takes `=true|false`.
        "--wait" | "--yes" | "-y" | "--follow" | "-f" | "--all-namespaces" | "-A"
        | "--no-headers" | "--watch" | "-w" | "--cancel" | "--client" | "--include-latest"
        | "--interactive" | "-i" => {
            vec!["true", "false"]
        }
        "--until" | "--for" => phases(sub),
        _ => return None,
    })
}

/// Flags that take a value (so the next word is not a positional).
const VALUE_FLAGS: &[&str] = &[
    "-n",
    "--namespace",
    "--context",
    "--kubeconfig",
    "--cluster",
    "--user",
    "-s",
    "--server",
    "--token",
    "--as",
    "--as-group",
    "--as-uid",
    "--certificate-authority",
    "--client-certificate",
    "--client-key",
    "--tls-server-name",
    "--request-timeout",
    "-o",
    "--output",
    "--color",
    "--timeout",
    "--failure-grace",
    "--until",
    "--to",
    "--slot",
    "--toolbox",
    "--tail",
    "--file",
    "-l",
    "--selector",
    "--for",
    "--field-manager",
    "--name",
    "--count",
    "--replicas",
];

/// Parses the words typed so far (the last one is being completed).
pub fn parse(words: &[String]) -> Request {
    let (prefix, done) = match words.split_last() {
        Some((last, rest)) => (last.clone(), rest),
        None => (String::new(), &[][..]),
    };
    let mut req = Request {
        want: Want::Nothing,
        prefix: prefix.clone(),
        namespace: None,
        context: None,
        kubeconfig: None,
    };
    let mut sub: Option<&str> = None;
    let mut first_positional: Option<&str> = None;
    let mut positionals = 0usize;
    let mut i = 0;
    let mut pending_flag: Option<&str> = None;
    while i < done.len() {
        let w = done[i].as_str();
        if let Some(flag) = pending_flag.take() {
            match flag {
                "-n" | "--namespace" => req.namespace = Some(w.to_string()),
                "--context" => req.context = Some(w.to_string()),
                "--kubeconfig" => req.kubeconfig = Some(w.to_string()),
                _ => {}
            }
        } else if let Some((flag, value)) = w.split_once('=').filter(|(f, _)| f.starts_with('-')) {
            match flag {
                "-n" | "--namespace" => req.namespace = Some(value.to_string()),
                "--context" => req.context = Some(value.to_string()),
                "--kubeconfig" => req.kubeconfig = Some(value.to_string()),
                _ => {}
            }
        } else if VALUE_FLAGS.contains(&w) {
            pending_flag = Some(w);
        } else if w.starts_with('-') {
        } else if sub.is_none() {
            sub = Some(w);
        } else {
            first_positional = first_positional.or(Some(w));
            positionals += 1;
        }
        i += 1;
    }
    // The verb whose flags apply: `registry gc` is one level down.
    let path: Vec<&str> = match (sub, first_positional) {
        (Some("registry"), Some(v)) => vec!["registry", v],
        (Some(s), _) => vec![s],
        (None, _) => Vec::new(),
    };
    req.want = if let Some(flag) = pending_flag {
        match flag {
            "--to" => Want::Nodes,
            f => flag_values(f, sub)
                .map(Want::Values)
                .unwrap_or(Want::Nothing),
        }
    } else if let Some((flag, value)) = prefix.split_once('=').filter(|(f, _)| f.starts_with('-')) {
        let want = flag_values(flag, sub)
            .map(|v| Want::FlagValues(format!("{flag}="), v))
            .unwrap_or(Want::Nothing);
        req.prefix = value.to_string();
        want
    } else if prefix.starts_with('-') {
        Want::Named(flags(&path))
    } else {
        match (sub, positionals) {
            (None, _) => Want::Subcommands,
            (Some("registry"), 0) => Want::Named(subcommands(&["registry"])),
            (Some("status" | "get" | "list" | "suspend" | "resume"), _) => Want::Sets,
            (Some("describe"), 0) => Want::SetsOrCheckpoints,
            (Some("migrate" | "unpin" | "report" | "logs"), 0) => Want::Sets,
            (Some("checkpoint"), 0) => Want::PodsOrSets,
            (Some("fork"), 0) => Want::Checkpoints,
            (Some("pin"), 0) => Want::Sets,
            (Some("pin"), 1) => Want::Nodes,
            (Some("hibernate"), _) => Want::Pods,
            (Some("wake"), _) => Want::PodsOrSets,
            (Some("completion"), 0) => Want::Values(vec!["bash", "zsh", "fish", "powershell"]),
            _ => Want::Nothing,
        }
    };
    req
}

/// Candidates for a request, given the names found in the cluster.
pub fn candidates(
    req: &Request,
    sets: &[String],
    pods: &[String],
    nodes: &[String],
    checkpoints: &[String],
    desc: bool,
) -> Vec<String> {
    let with = |name: &str, d: &str| {
        if desc && !d.is_empty() {
            format!("{name}\t{d}")
        } else {
            name.to_string()
        }
    };
    let mut out: Vec<String> = match &req.want {
        Want::Subcommands => subcommands(&[])
            .iter()
            .filter(|(n, _)| n.starts_with(&req.prefix))
            .map(|(n, d)| with(n, d))
            .collect(),
        Want::Named(named) => named
            .iter()
            .filter(|(n, _)| n.starts_with(&req.prefix))
            .map(|(n, d)| with(n, d))
            .collect(),
        Want::FlagValues(flag, v) => {
            return v
                .iter()
                .filter(|s| s.starts_with(&req.prefix))
                .map(|s| format!("{flag}{s}"))
                .collect();
        }
        Want::Sets => sets.to_vec(),
        Want::Pods => pods.to_vec(),
        Want::PodsOrSets => pods
            .iter()
            .cloned()
            .chain(sets.iter().map(|s| format!("cocoonset/{s}")))
            .collect(),
        Want::Nodes => nodes.to_vec(),
        Want::Checkpoints => checkpoints.to_vec(),
        Want::SetsOrCheckpoints => sets
            .iter()
            .cloned()
            .chain(checkpoints.iter().map(|c| format!("checkpoint/{c}")))
            .collect(),
        Want::Values(v) => v.iter().map(|s| s.to_string()).collect(),
        Want::Nothing => Vec::new(),
    };
    out.retain(|c| c.starts_with(&req.prefix));
    out
}

/// The command line the static completion scripts describe: every visible verb and flag, not
/// the hidden `__complete` protocol verbs.
pub fn static_command() -> clap::Command {
    let cmd = <crate::cli::Cli as clap::CommandFactory>::command();
    let visible: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .cloned()
        .collect();
    let mut out = clap::Command::new("kubectl-cocoon")
        .version(crate::version::LONG_VERSION)
        .args(cmd.get_arguments().cloned())
        .subcommands(visible);
    if let Some(a) = cmd.get_about() {
        out = out.about(a.clone());
    }
    out
}

/// Pods `hibernate` and `wake` can act on: those with a cocoon VM (or made by a CocoonSet).
pub fn is_cocoon_pod(p: &Pod) -> bool {
    p.annotations().contains_key(annotations::VM_NAME)
        || p.labels().contains_key(labels::COCOONSET_NAME)
}

/// Runs `__complete`: prints candidates and the directive; never fails loudly (debug on stderr).
pub async fn run(words: &[String], desc: bool, base: &ConnFlags) {
    let req = parse(words);
    let needs_cluster = matches!(
        req.want,
        Want::Sets
            | Want::Pods
            | Want::PodsOrSets
            | Want::Nodes
            | Want::Checkpoints
            | Want::SetsOrCheckpoints
    );
    let (mut sets, mut pods, mut nodes) = (Vec::new(), Vec::new(), Vec::new());
    let mut checkpoints = Vec::new();
    let mut directive = NO_FILE;
    if needs_cluster {
        // Flags typed among the words win over those given before `__complete`.
        let mut flags = base.clone();
        flags.namespace = req.namespace.clone().or(flags.namespace);
        flags.context = req.context.clone().or(flags.context);
        flags.kubeconfig = req.kubeconfig.clone().map(Into::into).or(flags.kubeconfig);
        flags.request_timeout = Some(std::time::Duration::from_secs(5));
        match flags.connect().await {
            Ok(conn) => {
                let client: Client = conn.client;
                let ns = conn.namespace;
                if matches!(req.want, Want::Checkpoints | Want::SetsOrCheckpoints) {
                    match Api::<CocoonCheckpoint>::namespaced(client.clone(), &ns)
                        .list(&ListParams::default())
                        .await
                    {
                        Ok(l) => checkpoints = l.items.iter().map(|c| c.name_any()).collect(),
                        Err(e) => eprintln!("__complete: list cocooncheckpoints: {e}"),
                    }
                }
                if matches!(
                    req.want,
                    Want::Sets | Want::PodsOrSets | Want::SetsOrCheckpoints
                ) {
                    match Api::<CocoonSet>::namespaced(client.clone(), &ns)
                        .list(&ListParams::default())
                        .await
                    {
                        Ok(l) => sets = l.items.iter().map(|s| s.name_any()).collect(),
                        Err(e) => eprintln!("__complete: list cocoonsets: {e}"),
                    }
                }
                if matches!(req.want, Want::Pods | Want::PodsOrSets) {
                    match Api::<Pod>::namespaced(client.clone(), &ns)
                        .list(&ListParams::default())
                        .await
                    {
                        Ok(l) => {
                            pods = l
                                .items
                                .iter()
                                .filter(|p| is_cocoon_pod(p))
                                .map(|p| p.name_any())
                                .collect()
                        }
                        Err(e) => eprintln!("__complete: list pods: {e}"),
                    }
                }
                if req.want == Want::Nodes {
                    match Api::<Node>::all(client.clone())
                        .list(&ListParams::default())
                        .await
                    {
                        Ok(l) => nodes = l.items.iter().map(|n| n.name_any()).collect(),
                        Err(e) => eprintln!("__complete: list nodes: {e}"),
                    }
                }
            }
            Err(e) => {
                eprintln!("__complete: {e}");
                directive |= ERROR;
            }
        }
    }
    for c in candidates(&req, &sets, &pods, &nodes, &checkpoints, desc) {
        println!("{c}");
    }
    println!(":{directive}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(words: &[&str]) -> Request {
        parse(&words.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn what_each_position_completes() {
        assert_eq!(req(&[""]).want, Want::Subcommands);
        assert_eq!(req(&["sus"]).want, Want::Subcommands);
        assert_eq!(req(&["suspend", ""]).want, Want::Sets);
        assert_eq!(req(&["suspend", "a", ""]).want, Want::Sets);
        assert_eq!(req(&["hibernate", "de"]).want, Want::Pods);
        assert_eq!(req(&["checkpoint", ""]).want, Want::PodsOrSets);
        assert_eq!(
            req(&["checkpoint", "demo-0", "--name", ""]).want,
            Want::Nothing
        );
        assert_eq!(req(&["fork", ""]).want, Want::Checkpoints);
        assert_eq!(req(&["fork", "--count", "3", "g"]).want, Want::Checkpoints);
        assert_eq!(req(&["describe", ""]).want, Want::SetsOrCheckpoints);
        let r = req(&["describe", "checkpoint/g"]);
        assert_eq!(
            candidates(&r, &["demo".into()], &[], &[], &["good".into()], false),
            ["checkpoint/good"]
        );
        let r = req(&["fork", ""]);
        assert_eq!(
            candidates(&r, &[], &[], &[], &["good".into()], false),
            ["good"]
        );
        assert_eq!(req(&["wake", ""]).want, Want::PodsOrSets);
        assert_eq!(req(&["pin", "demo", ""]).want, Want::Nodes);
        assert_eq!(req(&["migrate", "demo", "--to", ""]).want, Want::Nodes);
        assert_eq!(
            req(&["status", "-o", ""]).want,
            Want::Values(vec!["wide", "json", "yaml", "name", "jsonpath="])
        );
        assert_eq!(
            req(&["suspend", "-o", ""]).want,
            Want::Values(vec!["json", "yaml", "name", "jsonpath="])
        );
        assert_eq!(
            req(&["status", "--color", ""]).want,
            Want::Values(vec!["auto", "always", "never"])
        );
        // --dry-run takes its value after `=`; the next word is a name.
        assert_eq!(req(&["suspend", "--dry-run", ""]).want, Want::Sets);
        let r = req(&["suspend", "--dry-run=s"]);
        assert_eq!(
            candidates(&r, &[], &[], &[], &[], true),
            ["--dry-run=server"]
        );
        let r = req(&["suspend", "--wait="]);
        assert_eq!(
            candidates(&r, &[], &[], &[], &[], true),
            ["--wait=true", "--wait=false"]
        );
        for flag in ["-f", "--follow", "-A", "--no-headers", "-w", "--client"] {
            let r = req(&["logs", &format!("{flag}=f")]);
            assert_eq!(
                candidates(&r, &[], &[], &[], &[], true),
                [format!("{flag}=false")],
                "{flag}"
            );
        }
        // An on/off flag takes no separate value: the next word is a name.
        assert_eq!(req(&["logs", "-f", ""]).want, Want::Sets);
        assert_eq!(
            req(&["hibernate", "--until", ""]).want,
            Want::Values(HIBERNATION_PHASES.to_vec())
        );
        assert_eq!(
            req(&["resume", "--until", ""]).want,
            Want::Values(SET_PHASES.to_vec())
        );
        assert!(
            matches!(req(&["wait", "--for", ""]).want, Want::Values(v) if v.contains(&"Suspended") && v.contains(&"Hibernated"))
        );
        assert_eq!(req(&["version", ""]).want, Want::Nothing);
    }

    #[test]
    fn verb_descriptions_keep_their_meaning() {
        for (about, want) in [
            (
                "Wait (read-only) until targets reach a phase, e.g. cocoonset/NAME --for=Suspended.",
                "Wait until targets reach a phase",
            ),
            (
                "Show a member's guest log through the API server (pods/log).",
                "Show a member's guest log through the API server",
            ),
            (
                "Print a static completion script for bash, zsh, fish or powershell.",
                "Print a static completion script for bash, zsh, fish or powershell",
            ),
            (
                "Show CocoonSets: a table, or the computed view",
                "Show CocoonSets",
            ),
            (
                "Suspend CocoonSets; waits for Suspended",
                "Suspend CocoonSets",
            ),
        ] {
            assert_eq!(summary(about), want, "{about}");
        }
        let wait = subcommands(&[])
            .into_iter()
            .find(|(name, _)| name == "wait")
            .expect("wait verb");
        assert_eq!(wait.1, "Wait until targets reach a phase");
    }

    #[test]
    fn flags_and_registry_verbs_are_offered() {
        let r = req(&["suspend", "--ti"]);
        assert_eq!(candidates(&r, &[], &[], &[], &[], false), ["--timeout"]);
        let r = req(&["suspend", "--"]);
        let all = candidates(&r, &[], &[], &[], &[], false);
        for f in [
            "--wait",
            "--dry-run",
            "--field-manager",
            "--until",
            "--kubeconfig",
            "--namespace",
        ] {
            assert!(all.contains(&f.to_string()), "{f}: {all:?}");
        }
        let r = req(&["pin", "--"]);
        assert!(!candidates(&r, &[], &[], &[], &[], false).contains(&"--until".to_string()));
        let r = req(&["registry", ""]);
        assert_eq!(candidates(&r, &[], &[], &[], &[], false), ["gc"]);
        let r = req(&["registry", "gc", "--inc"]);
        assert_eq!(
            candidates(&r, &[], &[], &[], &[], false),
            ["--include-latest"]
        );
        let r = req(&["re"]);
        assert_eq!(
            candidates(&r, &[], &[], &[], &[], false),
            ["resume", "report", "registry"]
        );
        let r = req(&[""]);
        let verbs = candidates(&r, &[], &[], &[], &[], false);
        assert!(
            !verbs.iter().any(|v| v.starts_with("__") || v == "help"),
            "{verbs:?}"
        );
    }

    #[test]
    fn connection_flags_among_the_words_are_honoured() {
        let r = req(&[
            "-n",
            "team-a",
            "--context=prod",
            "suspend",
            "--kubeconfig",
            "/k",
            "",
        ]);
        assert_eq!(r.namespace.as_deref(), Some("team-a"));
        assert_eq!(r.context.as_deref(), Some("prod"));
        assert_eq!(r.kubeconfig.as_deref(), Some("/k"));
        assert_eq!(r.want, Want::Sets);
    }

    #[test]
    fn candidates_filter_by_prefix() {
        let r = req(&["wake", "d"]);
        let c = candidates(
            &r,
            &["demo".into()],
            &["demo-0".into(), "x".into()],
            &[],
            &[],
            true,
        );
        assert_eq!(c, ["demo-0"]);
        let r = req(&["wake", ""]);
        let c = candidates(&r, &["demo".into()], &["demo-0".into()], &[], &[], true);
        assert_eq!(c, ["demo-0", "cocoonset/demo"]);
        let r = req(&["su"]);
        assert_eq!(
            candidates(&r, &[], &[], &[], &[], true),
            ["suspend\tSuspend CocoonSets"]
        );
        assert_eq!(candidates(&r, &[], &[], &[], &[], false), ["suspend"]);
    }
}
