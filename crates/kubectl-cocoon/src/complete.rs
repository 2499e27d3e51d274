//! Dynamic completion in cobra's protocol (`__complete`), used through the
//! `kubectl_complete-cocoon` shim: candidates one per line, then `:<directive>`.

use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::conn::ConnFlags;

/// cobra directive: do not fall back to file completion.
pub const NO_FILE: u32 = 4;
/// cobra directive: error.
pub const ERROR: u32 = 1;

/// What the word being completed should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    Subcommands,
    Sets,
    Pods,
    /// Pods, plus `cocoonset/<name>` (for `wake`).
    PodsOrSets,
    Nodes,
    Values(Vec<&'static str>),
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

const SUBCOMMANDS: &[(&str, &str)] = &[
    ("status", "Show CocoonSets"),
    ("describe", "Show one CocoonSet in detail"),
    ("suspend", "Suspend CocoonSets"),
    ("resume", "Resume suspended CocoonSets"),
    ("hibernate", "Hibernate pods"),
    ("wake", "Wake pods, or cocoonset/NAME"),
    ("migrate", "Move a set's main agent to a node"),
    ("pin", "Pin a set's main agent to a node"),
    ("unpin", "Remove a set's pin"),
    ("version", "Print versions"),
    ("completion", "Print a completion script"),
];

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
    "-l",
    "--selector",
    "--dry-run",
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
            positionals += 1;
        }
        i += 1;
    }
    req.want = if let Some(flag) = pending_flag {
        match flag {
            "-o" | "--output" => Want::Values(vec!["json", "yaml", "wide"]),
            "--color" => Want::Values(vec!["auto", "always", "never"]),
            "--dry-run" => Want::Values(vec!["none", "client", "server"]),
            "--to" => Want::Nodes,
            _ => Want::Nothing,
        }
    } else if prefix.starts_with('-') {
        Want::Nothing
    } else {
        match (sub, positionals) {
            (None, _) => Want::Subcommands,
            (Some("status" | "get" | "list" | "suspend" | "resume"), _) => Want::Sets,
            (Some("describe" | "migrate" | "unpin"), 0) => Want::Sets,
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
        Want::Subcommands => SUBCOMMANDS.iter().map(|(n, d)| with(n, d)).collect(),
        Want::Sets => sets.to_vec(),
        Want::Pods => pods.to_vec(),
        Want::PodsOrSets => pods
            .iter()
            .cloned()
            .chain(sets.iter().map(|s| format!("cocoonset/{s}")))
            .collect(),
        Want::Nodes => nodes.to_vec(),
        Want::Values(v) => v.iter().map(|s| s.to_string()).collect(),
        Want::Nothing => Vec::new(),
    };
    out.retain(|c| c.starts_with(&req.prefix));
    out
}

/// Runs `__complete`: prints candidates and the directive; never fails loudly (debug on stderr).
pub async fn run(words: &[String], desc: bool, base: &ConnFlags) {
    let req = parse(words);
    let needs_cluster = matches!(
        req.want,
        Want::Sets | Want::Pods | Want::PodsOrSets | Want::Nodes
    );
    let (mut sets, mut pods, mut nodes) = (Vec::new(), Vec::new(), Vec::new());
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
                if matches!(req.want, Want::Sets | Want::PodsOrSets) {
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
                        Ok(l) => pods = l.items.iter().map(|p| p.name_any()).collect(),
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
    for c in candidates(&req, &sets, &pods, &nodes, desc) {
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
        assert_eq!(req(&["wake", ""]).want, Want::PodsOrSets);
        assert_eq!(req(&["pin", "demo", ""]).want, Want::Nodes);
        assert_eq!(req(&["migrate", "demo", "--to", ""]).want, Want::Nodes);
        assert_eq!(
            req(&["status", "-o", ""]).want,
            Want::Values(vec!["json", "yaml", "wide"])
        );
        assert_eq!(
            req(&["status", "--color", ""]).want,
            Want::Values(vec!["auto", "always", "never"])
        );
        assert_eq!(
            req(&["suspend", "--dry-run", ""]).want,
            Want::Values(vec!["none", "client", "server"])
        );
        assert_eq!(req(&["version", ""]).want, Want::Nothing);
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
            true,
        );
        assert_eq!(c, ["demo-0"]);
        let r = req(&["wake", ""]);
        let c = candidates(&r, &["demo".into()], &["demo-0".into()], &[], true);
        assert_eq!(c, ["demo-0", "cocoonset/demo"]);
        let r = req(&["su"]);
        assert_eq!(
            candidates(&r, &[], &[], &[], true),
            ["suspend\tSuspend CocoonSets"]
        );
        assert_eq!(candidates(&r, &[], &[], &[], false), ["suspend"]);
    }
}
