//! Unit tests of [`crate::settings`]: the table of every node-agent setting, the `--config`
//! file and its merge with the environment.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::config::{ConfigError, NodeConfig};
use super::settings::*;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_table_has_each_name_once_and_every_help_line() {
    let mut seen = BTreeSet::new();
    for s in SETTINGS {
        assert!(seen.insert(s.name), "{} is listed twice", s.name);
        assert!(!s.meaning.is_empty(), "{} has no meaning", s.name);
    }
    let help = help_text();
    for s in SETTINGS {
        let default = if s.default.is_empty() {
            "unset"
        } else {
            s.default
        };
        let line = format!("  {} [default: {default}]\n      {}\n", s.name, s.meaning);
        assert!(help.contains(&line), "--help lacks {line:?}");
    }
}

/// The names the agent's sources read: every string literal that looks like one of the
/// agent's variables, in the node agent, the runtime and registry crates it configures, and
/// the node section of the shared contract. Test modules and the table itself are skipped.
fn names_in_sources() -> BTreeSet<String> {
    const PREFIXES: &[&str] = &[
        "VK_",
        "OCI_REGISTRY",
        "SNAPSHOT_",
        "COCOON_",
        "GOOGLE_",
        "DOCKER_CONFIG",
        "KUBECONFIG",
        "HOME",
        "NOTIFY_SOCKET",
        "WATCHDOG_",
    ];
    let mut files = Vec::new();
    for dir in [
        "crates/cocoon-node/src",
        "crates/cocoon-kubelet/src",
        "crates/cocoon-node-registration/src",
        "crates/cocoon-runtime/src",
        "crates/cocoon-registry/src",
    ] {
        collect_rs(&workspace().join(dir), &mut files);
    }
    let mut names = BTreeSet::new();
    for file in files {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with("_tests.rs") || name == "settings.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        // Code only: unit tests sit in one `#[cfg(test)]` module at the end of a file.
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        for lit in code.split('"').skip(1).step_by(2) {
            let looks_like_var = lit.len() > 3
                && lit.contains('_')
                && lit
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && !lit.ends_with('_');
            if looks_like_var && PREFIXES.iter().any(|p| lit.starts_with(p)) {
                names.insert(lit.to_string());
            }
        }
    }
    // The contract's node section names each variable as a constant.
    let contract =
        std::fs::read_to_string(workspace().join("crates/cocoon-api/src/contract/env.rs"))
            .expect("read contract");
    let node = contract
        .split("pub mod node {")
        .nth(1)
        .expect("node section");
    for line in node.lines() {
        if let Some(rest) = line.trim().strip_prefix("pub const ")
            && !rest.starts_with("DEFAULT_")
            && let Some(value) = rest.split('"').nth(1)
        {
            names.insert(value.to_string());
        }
    }
    names
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `node --help` lists every variable the agent reads: a name used in the sources but missing
/// from the table fails here (and would read as unset through [`Settings`]).
#[test]
fn every_variable_the_sources_read_is_in_the_table() {
    let names = names_in_sources();
    assert!(
        names.len() > 60,
        "the scan finds the agent's variables: {names:?}"
    );
    let missing: Vec<&String> = names.iter().filter(|n| lookup(n).is_none()).collect();
    assert!(missing.is_empty(), "not in settings::SETTINGS: {missing:?}");
}

/// The same from the readers themselves: every name the configuration parse, the registry
/// access settings and the simulator look up is in the table.
#[test]
fn every_name_the_readers_ask_for_is_in_the_table() {
    let asked = RefCell::new(BTreeSet::new());
    let record = |k: &str| {
        asked.borrow_mut().insert(k.to_string());
        match k {
            "OCI_REGISTRY" => Some("127.0.0.1:5000".to_string()),
            _ => None,
        }
    };
    NodeConfig::from_lookup(record, || Some(Ipv4Addr::LOCALHOST)).expect("config");
    cocoon_registry::RegistryConfig::for_registry("127.0.0.1:5000")
        .expect("registry")
        .with_access_env(&record)
        .expect("access");
    cocoon_runtime::sim::SimConfig::from_env(PathBuf::from("/nonexistent"), record).expect("sim");
    let asked = asked.into_inner();
    assert!(asked.len() > 50, "{asked:?}");
    let missing: Vec<&String> = asked.iter().filter(|n| lookup(n).is_none()).collect();
    assert!(missing.is_empty(), "not in settings::SETTINGS: {missing:?}");
}

/// `node.env.example` mentions every setting an operator may put there.
#[test]
fn node_env_example_mentions_every_setting() {
    let text = std::fs::read_to_string(workspace().join("manifests/node/node.env.example"))
        .expect("read node.env.example");
    let words: BTreeSet<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    let missing: Vec<&str> = SETTINGS
        .iter()
        .filter(|s| s.source == Source::Any && !words.contains(s.name))
        .map(|s| s.name)
        .collect();
    assert!(missing.is_empty(), "node.env.example lacks {missing:?}");
}

fn parse(text: &str) -> Result<FileSettings, FileError> {
    FileSettings::parse(Path::new("/etc/cocoon/node.yaml"), text)
}

#[test]
fn the_file_takes_scalars_under_the_variable_names() {
    let f = parse(
        "VK_NODE_NAME: host-1\nVK_NODE_PODS: 12\nVK_ANONYMOUS_AUTH: false\n\
         VK_SIM_LATENCY_SCALE: 0.5\nVK_COCOON_NET_CONTROL_SOCKET:\nVK_NODE_POOL: \"007\"\n",
    )
    .expect("valid");
    let s = Settings::merge(Some(&f), env(&[]));
    for (k, v) in [
        ("VK_NODE_NAME", Some("host-1")),
        ("VK_NODE_PODS", Some("12")),
        ("VK_ANONYMOUS_AUTH", Some("false")),
        ("VK_SIM_LATENCY_SCALE", Some("0.5")),
        ("VK_COCOON_NET_CONTROL_SOCKET", Some("")),
        ("VK_NODE_POOL", Some("007")),
        ("VK_NODE_IP", None),
    ] {
        assert_eq!(s.get(k).as_deref(), v, "{k}");
    }
    assert_eq!(parse("").expect("empty"), parse("# nothing\n").expect("c"));
    let empty = Settings::merge(Some(&parse("").expect("empty")), env(&[]));
    assert!(SETTINGS.iter().all(|s| empty.get(s.name).is_none()));
}

#[test]
fn the_file_refuses_what_it_cannot_hold_naming_key_and_file() {
    let cases: &[(&str, &str)] = &[
        (
            "VK_NODE_NAM: x\n",
            "/etc/cocoon/node.yaml: unknown key \"VK_NODE_NAM\" (did you mean VK_NODE_NAME?)",
        ),
        (
            "vk_log_level: debug\n",
            "/etc/cocoon/node.yaml: unknown key \"vk_log_level\" (did you mean VK_LOG_LEVEL?)",
        ),
        (
            "node_name: x\n",
            "/etc/cocoon/node.yaml: unknown key \"node_name\" (did you mean VK_NODE_NAME?)",
        ),
        (
            "listen_port: 1\n",
            "/etc/cocoon/node.yaml: unknown key \"listen_port\"",
        ),
        (
            "NOTIFY_SOCKET: /run/x\n",
            "/etc/cocoon/node.yaml: NOTIFY_SOCKET is set by systemd or the login, not by the config file",
        ),
        (
            "VK_NETWORK_ALLOW: [a, b]\n",
            "/etc/cocoon/node.yaml: VK_NETWORK_ALLOW: want a string, number or boolean, got a list",
        ),
        (
            "VK_NODE_NAME: {a: 1}\n",
            "/etc/cocoon/node.yaml: VK_NODE_NAME: want a string, number or boolean, got a mapping",
        ),
    ];
    for (text, want) in cases {
        let err = parse(text).expect_err(text);
        assert_eq!(err.to_string(), *want, "{text:?}");
    }
    for text in [
        "- a\n- b\n",
        "VK_NODE_NAME: a\nVK_NODE_NAME: b\n",
        "VK_NODE_NAME: [\n",
    ] {
        let err = parse(text).expect_err(text);
        assert!(
            matches!(err, FileError::Yaml { .. })
                && err.to_string().starts_with("parse /etc/cocoon/node.yaml: "),
            "{text:?}: {err}"
        );
    }
    let missing = FileSettings::load(Path::new("/nonexistent/node.yaml")).expect_err("missing");
    assert!(
        missing
            .to_string()
            .starts_with("read /nonexistent/node.yaml: "),
        "{missing}"
    );
}

/// The environment overrides the file, even with an empty value; the file fills the rest; a
/// name outside the table is not a setting.
#[test]
fn the_environment_overrides_the_file() {
    let file = parse(
        "VK_NODE_NAME: from-file\nVK_NODE_POOL: file-pool\nVK_COCOON_NET_CONTROL_SOCKET: /run/x.sock\n",
    )
    .expect("valid");
    let s = Settings::merge(
        Some(&file),
        env(&[
            ("VK_NODE_POOL", "env-pool"),
            ("VK_COCOON_NET_CONTROL_SOCKET", ""),
            ("VK_NOT_A_SETTING", "x"),
        ]),
    );
    let cases: &[(&str, Option<&str>, bool)] = &[
        ("VK_NODE_NAME", Some("from-file"), true),
        ("VK_NODE_POOL", Some("env-pool"), false),
        ("VK_COCOON_NET_CONTROL_SOCKET", Some(""), false),
        ("VK_NOT_A_SETTING", None, false),
        ("VK_NODE_IP", None, false),
    ];
    for (name, value, from_file) in cases {
        assert_eq!(s.get(name).as_deref(), *value, "{name}");
        assert_eq!(
            s.file_of(name),
            from_file.then_some(Path::new("/etc/cocoon/node.yaml")),
            "{name}"
        );
    }
    // Without a file, the settings are the environment's.
    let only_env = Settings::capture(env(&[("VK_NODE_NAME", "n")]));
    assert_eq!(only_env.get("VK_NODE_NAME").as_deref(), Some("n"));
    assert_eq!(only_env.file_of("VK_NODE_NAME"), None);
}

/// The configuration parse reads the merged settings, and a bad value's error names the
/// variable at fault (which the binary pairs with the file it came from).
#[test]
fn the_config_parse_reads_merged_settings() {
    let file = parse("OCI_REGISTRY: 127.0.0.1:5000\nVK_NODE_NAME: file-node\nVK_NODE_PODS: 9\n")
        .expect("valid");
    let s = Settings::merge(Some(&file), env(&[("VK_NODE_PODS", "7")]));
    let c = NodeConfig::from_settings(&s, || Some(Ipv4Addr::LOCALHOST)).expect("config");
    assert_eq!(
        (c.node_name.as_str(), c.pods, c.oci_registry.as_str()),
        ("file-node", 7, "127.0.0.1:5000")
    );
    assert_eq!(c.settings, s, "kept for the later readers");

    let bad = parse("OCI_REGISTRY: r\nVK_RESERVE_PERCENT: 101\n").expect("valid");
    let s = Settings::merge(Some(&bad), env(&[]));
    let err = NodeConfig::from_settings(&s, || Some(Ipv4Addr::LOCALHOST)).expect_err("101");
    assert_eq!(err.var(), "VK_RESERVE_PERCENT");
    assert_eq!(
        s.file_of(err.var()),
        Some(Path::new("/etc/cocoon/node.yaml"))
    );
    for (err, var) in [
        (ConfigError::MissingRegistry, "OCI_REGISTRY"),
        (ConfigError::NoNodeIp, "VK_NODE_IP"),
        (ConfigError::Runtime("x".into()), "VK_RUNTIME"),
        (ConfigError::CloneBaseKeep("x".into()), "VK_CLONE_BASE_KEEP"),
    ] {
        assert_eq!(err.var(), var);
        assert!(lookup(var).is_some(), "{var}");
    }
}

#[test]
fn closest_suggests_only_near_names() {
    for (key, want) in [
        ("VK_NODE_NAM", Some("VK_NODE_NAME")),
        ("vk_node_name", Some("VK_NODE_NAME")),
        ("VK_RESERVE_PERCENTAGE", Some("VK_RESERVE_PERCENT")),
        ("OCI_REGISTY", Some("OCI_REGISTRY")),
        ("listen", None),
        ("VK_FOO", None),
    ] {
        assert_eq!(closest(key), want, "{key}");
    }
}
