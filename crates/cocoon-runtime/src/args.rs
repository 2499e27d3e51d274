//! Pure argument building for every `cocoon` invocation of §3.2, the capability model of §3.1
//! and the Kubernetes-quantity → bytes conversion `vm run` needs.
//!
//! Nothing here runs a process, so every rule of the spec's argument tables is a table test.
//!
//! # Argument safety (issue 26)
//!
//! Every VM name or id, snapshot name, image ref, network name and directory is checked
//! before it reaches an argv ([`check_arg`]), and positionals follow a `--` (the CLI's cobra
//! parser then takes them as arguments even when they look like flags), so no value a pod
//! carries can become an option of `cocoon`:
//! * VM names and ids: the runtime's VM-name rule `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`
//!   (runtime ids are 26-character base32 and fit it);
//! * snapshot names: the chosen rule of `contract.md` §2.4 ([`is_valid_snapshot_name`]);
//! * image refs (names, digests, `http(s)://` URLs) and network names: non-empty, no leading
//!   `-`, no whitespace or control character;
//! * `--from-dir`: absolute, no control character.
//!
//! `vm exec <id> -- <argv...>` keeps its form (its `--` separates the guest command); the id
//! is checked.

use std::collections::BTreeMap;

use super::error::{Result, RuntimeError};
use super::types::{CloneRequest, CloneSource, CpuPolicy, RunRequest};
use cocoon_api::contract::Backend;
use cocoon_api::naming::{is_valid_snapshot_name, is_valid_vm_name};

/// What a value passed to `cocoon` is, for [`check_arg`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// A VM name or runtime id.
    Vm,
    /// A host snapshot name (or id).
    Snapshot,
    /// An image ref, digest or `http(s)://` URL.
    Image,
    /// A CNI network (conflist) name.
    Network,
    /// A `--from-dir` directory.
    Dir,
}

impl ArgKind {
    fn what(self) -> &'static str {
        match self {
            ArgKind::Vm => "VM name",
            ArgKind::Snapshot => "snapshot name",
            ArgKind::Image => "image ref",
            ArgKind::Network => "network name",
            ArgKind::Dir => "directory",
        }
    }
}

/// A token that cannot be read as a flag or split: non-empty, no leading `-`, no whitespace
/// or control character.
fn plain_token(v: &str) -> bool {
    !v.is_empty() && !v.starts_with('-') && !v.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Checks `value` before it reaches an argv; `label` names the invocation in the error.
pub fn check_arg(label: &str, kind: ArgKind, value: &str) -> Result<()> {
    let ok = match kind {
        ArgKind::Vm => is_valid_vm_name(value),
        ArgKind::Snapshot => is_valid_snapshot_name(value),
        ArgKind::Image | ArgKind::Network => plain_token(value),
        ArgKind::Dir => value.starts_with('/') && !value.chars().any(char::is_control),
    };
    if ok {
        return Ok(());
    }
    let rule = match kind {
        ArgKind::Vm => "must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$",
        ArgKind::Snapshot => "must match ^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$",
        ArgKind::Image | ArgKind::Network => {
            "must be non-empty, not start with '-' and hold no whitespace or control character"
        }
        ArgKind::Dir => "must be absolute and hold no control character",
    };
    Err(RuntimeError::InvalidArgument(format!(
        "{label}: invalid {} {value:?}: {rule}; refused before running cocoon",
        kind.what()
    )))
}

/// `<verb...> <flags...> -- <positional>` after checking the positional.
fn with_positional(
    mut argv: Vec<String>,
    label: &str,
    kind: ArgKind,
    value: &str,
) -> Result<Vec<String>> {
    check_arg(label, kind, value)?;
    argv.push(s("--"));
    argv.push(value.to_owned());
    Ok(argv)
}

/// Optional features of the installed `cocoon` (§3.1 capability detection).
///
/// Detection (see [`Capabilities::from_help`]): the backend runs `cocoon vm clone --help` and
/// `cocoon vm --help` once at startup, then `cocoon vm <verb> --help` for each of `exec`,
/// `logs` and `net` that the `vm` help lists, and looks for the verb and flag names in the
/// texts. A verb counts only when it is listed as a command (an indented line starting with
/// its name) and its own help is not the `vm` group help (a release without the verb prints
/// the group help and exits 0). A flag counts only when a flag line lists it exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `vm clone --restore-mode`.
    pub restore_mode: bool,
    /// `vm clone --on-demand`: the boolean form of restore mode `ondemand` (v0.3.8).
    pub on_demand: bool,
    /// `--cpu-weight`, `--cpu-quota-us`, `--cpu-period-us`.
    pub cpu_policy: bool,
    /// `vm clone --from-dir`.
    pub from_dir: bool,
    /// `vm reconcile-stale-create`.
    pub reconcile_stale_create: bool,
    /// The `vm exec` verb.
    pub exec: bool,
    /// `vm exec -i` (stdin passed to the guest).
    pub exec_stdin: bool,
    /// The `vm logs` verb.
    pub logs: bool,
    /// `vm logs --tail`.
    pub logs_tail: bool,
    /// The `vm net` verb.
    pub net: bool,
    /// `vm net --nics`.
    pub net_nics: bool,
    /// The `vm stop` verb (with `--timeout`, which v0.3.8 and v0.5.x both have): the graceful
    /// shutdown before `vm rm --force` (issue 40).
    pub stop: bool,
}

/// The help texts capability detection reads; `None` for a verb help that was not read
/// (the verb is not listed) or could not be run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HelpTexts {
    /// `vm clone --help`.
    pub clone: String,
    /// `vm --help`.
    pub vm: String,
    /// `vm exec --help`.
    pub exec: Option<String>,
    /// `vm logs --help`.
    pub logs: Option<String>,
    /// `vm net --help`.
    pub net: Option<String>,
}

/// The verbs whose own help detection reads, when the `vm` help lists them.
pub const PROBED_VERBS: [&str; 3] = ["exec", "logs", "net"];

impl Capabilities {
    /// A current cocoon: every optional feature.
    pub const ALL: Capabilities = Capabilities {
        restore_mode: true,
        on_demand: true,
        cpu_policy: true,
        from_dir: true,
        reconcile_stale_create: true,
        exec: true,
        exec_stdin: true,
        logs: true,
        logs_tail: true,
        net: true,
        net_nics: true,
        stop: true,
    };
    /// Nothing optional and none of the probed verbs.
    pub const NONE: Capabilities = Capabilities {
        restore_mode: false,
        on_demand: false,
        cpu_policy: false,
        from_dir: false,
        reconcile_stale_create: false,
        exec: false,
        exec_stdin: false,
        logs: false,
        logs_tail: false,
        net: false,
        net_nics: false,
        stop: false,
    };
    /// The help could not be read: no optional feature, but the verbs of §3.2 (`exec -i`,
    /// `logs --tail`, `net --nics`) and `vm stop` are assumed, so their failures show the
    /// CLI's own error.
    pub const UNDETECTED: Capabilities = Capabilities {
        stop: true,
        exec: true,
        exec_stdin: true,
        logs: true,
        logs_tail: true,
        net: true,
        net_nics: true,
        ..Capabilities::NONE
    };

    /// Derives the capabilities from the help texts. The CPU policy counts only when all
    /// three flags are listed.
    pub fn from_help(help: &HelpTexts) -> Self {
        let clone = help.clone.as_str();
        // Listed, and its own help (when readable) is not the group help.
        let verb = |name: &str, text: &Option<String>| -> Option<Option<String>> {
            let own = text.as_deref().is_none_or(|t| !is_group_help(t));
            (lists_verb(&help.vm, name) && own).then(|| text.clone())
        };
        let exec = verb("exec", &help.exec);
        let logs = verb("logs", &help.logs);
        let net = verb("net", &help.net);
        let has = |text: &Option<Option<String>>, flag: &str| {
            text.as_ref()
                .and_then(Option::as_deref)
                .is_some_and(|t| lists_flag(t, flag))
        };
        Capabilities {
            restore_mode: lists_flag(clone, "--restore-mode"),
            on_demand: lists_flag(clone, "--on-demand"),
            cpu_policy: ["--cpu-weight", "--cpu-quota-us", "--cpu-period-us"]
                .iter()
                .all(|f| lists_flag(clone, f)),
            from_dir: lists_flag(clone, "--from-dir"),
            reconcile_stale_create: lists_verb(&help.vm, "reconcile-stale-create"),
            exec: exec.is_some(),
            exec_stdin: has(&exec, "-i"),
            logs: logs.is_some(),
            logs_tail: has(&logs, "--tail"),
            net: net.is_some(),
            net_nics: has(&net, "--nics"),
            stop: lists_verb(&help.vm, "stop"),
        }
    }
}

/// True when a help text lists `verb` as a command: an indented line whose first word is it,
/// inside a `...Commands:` section when the text has one (so that `cocoon` of the indented
/// usage line `  cocoon vm [command]` is no command).
pub fn lists_verb(help: &str, verb: &str) -> bool {
    let header = |l: &str| !l.starts_with(char::is_whitespace) && l.trim_end().ends_with(':');
    let commands = |l: &str| l.trim_end().ends_with("Commands:");
    let sectioned = help.lines().any(|l| header(l) && commands(l));
    let mut inside = !sectioned;
    for l in help.lines() {
        if header(l) {
            inside = !sectioned || commands(l);
        } else if inside
            && l.starts_with(char::is_whitespace)
            && l.split_whitespace().next() == Some(verb)
        {
            return true;
        }
    }
    false
}

/// True when a flag line (an indented line starting with `-`) of a help text names `flag`
/// exactly in its flag column, e.g. `-i` in `  -i, --interactive   keep stdin open` (the
/// description starts after the first run of two spaces and is not searched).
pub fn lists_flag(help: &str, flag: &str) -> bool {
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .map(|l| l.split("  ").next().unwrap_or(l))
        .any(|l| {
            l.split(|c: char| c.is_whitespace() || c == ',' || c == '=')
                .any(|w| w == flag)
        })
}

/// True when a text is a command *group* help (cobra's `Usage:` plus `Available Commands:`),
/// which a release prints, with exit status 0, for a verb it does not have.
pub fn is_group_help(text: &str) -> bool {
    text.contains("Usage:") && text.contains("Available Commands:")
}

/// An argv (without the binary) plus warnings about flags dropped for lack of a capability.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuiltArgs {
    /// Arguments after the binary.
    pub argv: Vec<String>,
    /// One line per omitted optional flag; the caller logs them.
    pub warnings: Vec<String>,
}

fn s(v: &str) -> String {
    v.to_owned()
}

fn push_flag(argv: &mut Vec<String>, flag: &str, value: impl ToString) {
    argv.push(s(flag));
    argv.push(value.to_string());
}

fn push_cpu_policy(out: &mut BuiltArgs, policy: &CpuPolicy, caps: &Capabilities) {
    if policy.is_empty() {
        return;
    }
    if !caps.cpu_policy {
        out.warnings.push(format!(
            "installed cocoon has no --cpu-weight/--cpu-quota-us/--cpu-period-us; CPU policy {policy:?} not applied"
        ));
        return;
    }
    for (flag, v) in [
        ("--cpu-weight", policy.weight),
        ("--cpu-quota-us", policy.quota_us),
        ("--cpu-period-us", policy.period_us),
    ] {
        if v > 0 {
            push_flag(&mut out.argv, flag, v);
        }
    }
}

/// How a clone's restore mode reaches the installed CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreModeFlag {
    /// `--restore-mode <mode>`.
    Valued,
    /// The boolean `--on-demand` (a release without `--restore-mode`, mode `ondemand`).
    OnDemand,
    /// Nothing: mode `copy` on a release with the boolean flag, whose default is a full load.
    Default,
    /// The release cannot express the mode: omitted with a warning.
    Dropped,
}

/// The rule for a non-empty restore mode: `--restore-mode` when listed; otherwise, where the
/// clone help lists the boolean `--on-demand`, `ondemand` maps to it and `copy` to its
/// default; anything else is dropped.
pub fn restore_mode_flag(mode: &str, caps: &Capabilities) -> RestoreModeFlag {
    match (caps.restore_mode, caps.on_demand, mode) {
        (true, _, _) => RestoreModeFlag::Valued,
        (false, true, "ondemand") => RestoreModeFlag::OnDemand,
        (false, true, "copy") => RestoreModeFlag::Default,
        _ => RestoreModeFlag::Dropped,
    }
}

/// `vm clone --output json [--name TO] [--network N] [--no-direct-io] [--pull]
/// [--restore-mode M] [--nics N] [--cpu-weight W] [--cpu-quota-us Q] [--cpu-period-us P]
/// (-- SNAPSHOT | --from-dir DIR)`, flags in exactly this order.
pub fn clone_args(req: &CloneRequest, caps: &Capabilities) -> Result<BuiltArgs> {
    let mut out = BuiltArgs {
        argv: vec![s("vm"), s("clone"), s("--output"), s("json")],
        warnings: Vec::new(),
    };
    let label = format!("cocoon vm clone {}", req.to);
    if !req.to.is_empty() {
        check_arg(&label, ArgKind::Vm, &req.to)?;
        push_flag(&mut out.argv, "--name", &req.to);
    }
    if !req.network.is_empty() {
        check_arg(&label, ArgKind::Network, &req.network)?;
        push_flag(&mut out.argv, "--network", &req.network);
    }
    if req.no_direct_io {
        out.argv.push(s("--no-direct-io"));
    }
    let from_dir = matches!(req.from, CloneSource::Dir(_));
    if req.pull || from_dir {
        out.argv.push(s("--pull"));
    }
    // Firecracker restores have neither restore modes nor hot-added NICs.
    let fc = req.is_firecracker();
    if !req.restore_mode.is_empty() && !fc {
        match restore_mode_flag(&req.restore_mode, caps) {
            RestoreModeFlag::Valued => {
                push_flag(&mut out.argv, "--restore-mode", &req.restore_mode);
            }
            RestoreModeFlag::OnDemand => out.argv.push(s("--on-demand")),
            RestoreModeFlag::Default => {}
            RestoreModeFlag::Dropped => out.warnings.push(format!(
                "installed cocoon has no --restore-mode; restore mode {:?} not applied",
                req.restore_mode
            )),
        }
    }
    if let Some(n) = req.nics.filter(|_| !fc) {
        push_flag(&mut out.argv, "--nics", n);
    }
    push_cpu_policy(&mut out, &req.cpu_policy, caps);
    match &req.from {
        CloneSource::Snapshot(name) => {
            if name.is_empty() {
                return Err(RuntimeError::Other(format!(
                    "cocoon vm clone {}: empty snapshot name",
                    req.to
                )));
            }
            out.argv = with_positional(out.argv, &label, ArgKind::Snapshot, name)?;
        }
        CloneSource::Dir(dir) => {
            if !caps.from_dir {
                return Err(RuntimeError::Unsupported(format!(
                    "cocoon vm clone {}: the installed cocoon does not support --from-dir",
                    req.to
                )));
            }
            let dir = dir.display().to_string();
            check_arg(&label, ArgKind::Dir, &dir)?;
            push_flag(&mut out.argv, "--from-dir", dir);
        }
    }
    Ok(out)
}

/// `vm run --output json [--name NAME] [--cpu N] [--cpu-weight W] [--cpu-quota-us Q]
/// [--cpu-period-us P] [--memory BYTES] [--storage BYTES] [--network N] [--windows] [--fc]
/// [--no-direct-io] -- IMAGE`.
pub fn run_args(req: &RunRequest, caps: &Capabilities) -> Result<BuiltArgs> {
    if req.image.is_empty() {
        return Err(RuntimeError::Other(format!(
            "cocoon vm run {}: empty image",
            req.name
        )));
    }
    let mut out = BuiltArgs {
        argv: vec![s("vm"), s("run"), s("--output"), s("json")],
        warnings: Vec::new(),
    };
    let label = format!("cocoon vm run {}", req.name);
    if !req.name.is_empty() {
        check_arg(&label, ArgKind::Vm, &req.name)?;
        push_flag(&mut out.argv, "--name", &req.name);
    }
    if req.cpu > 0 {
        push_flag(&mut out.argv, "--cpu", req.cpu);
    }
    push_cpu_policy(&mut out, &req.cpu_policy, caps);
    let memory = size_arg(&req.memory);
    if !memory.is_empty() {
        push_flag(&mut out.argv, "--memory", memory);
    }
    let storage = size_arg(&req.storage);
    if !storage.is_empty() {
        push_flag(&mut out.argv, "--storage", storage);
    }
    if !req.network.is_empty() {
        check_arg(&label, ArgKind::Network, &req.network)?;
        push_flag(&mut out.argv, "--network", &req.network);
    }
    if req.is_windows() {
        out.argv.push(s("--windows"));
    }
    if req.backend == Some(Backend::Firecracker) {
        out.argv.push(s("--fc"));
    }
    if req.no_direct_io {
        out.argv.push(s("--no-direct-io"));
    }
    out.argv = with_positional(out.argv, &label, ArgKind::Image, &req.image)?;
    Ok(out)
}

/// `vm exec [-i] [-e K=V ...] <id> -- <argv...>`; `-e` sorted by key (the map is ordered).
/// An empty id or argv is rejected before anything runs.
pub fn exec_args(
    id: &str,
    argv: &[String],
    env: &BTreeMap<String, String>,
    with_stdin: bool,
) -> Result<Vec<String>> {
    if id.is_empty() {
        return Err(RuntimeError::Other(s("cocoon vm exec: empty VM id")));
    }
    check_arg("cocoon vm exec", ArgKind::Vm, id)?;
    if argv.is_empty() {
        return Err(RuntimeError::Other(format!(
            "cocoon vm exec {id}: empty command"
        )));
    }
    let mut out = vec![s("vm"), s("exec")];
    if with_stdin {
        out.push(s("-i"));
    }
    for (k, v) in env {
        out.push(s("-e"));
        out.push(format!("{k}={v}"));
    }
    out.push(id.to_owned());
    out.push(s("--"));
    out.extend(argv.iter().cloned());
    Ok(out)
}

/// `vm inspect -- <id>`.
pub fn inspect_args(id: &str) -> Result<Vec<String>> {
    with_positional(
        vec![s("vm"), s("inspect")],
        "cocoon vm inspect",
        ArgKind::Vm,
        id,
    )
}

/// `vm list -o json`.
pub fn list_args() -> Vec<String> {
    vec![s("vm"), s("list"), s("-o"), s("json")]
}

/// `vm rm --force -- <id>`.
pub fn remove_args(id: &str) -> Result<Vec<String>> {
    let argv = vec![s("vm"), s("rm"), s("--force")];
    with_positional(argv, "cocoon vm rm", ArgKind::Vm, id)
}

/// `vm stop --timeout <secs> -- <id>`: the guest gets `secs` (at least 1: cocoon reads 0 as
/// its configured default) to shut down.
pub fn stop_args(id: &str, timeout_secs: u64) -> Result<Vec<String>> {
    let argv = vec![
        s("vm"),
        s("stop"),
        s("--timeout"),
        timeout_secs.max(1).to_string(),
    ];
    with_positional(argv, "cocoon vm stop", ArgKind::Vm, id)
}

/// `vm start -- <id>`.
pub fn start_args(id: &str) -> Result<Vec<String>> {
    with_positional(
        vec![s("vm"), s("start")],
        "cocoon vm start",
        ArgKind::Vm,
        id,
    )
}

/// `vm logs [--tail N] -- <id>`.
pub fn logs_args(id: &str, tail: Option<u64>) -> Result<Vec<String>> {
    let mut out = vec![s("vm"), s("logs")];
    if let Some(n) = tail {
        push_flag(&mut out, "--tail", n);
    }
    with_positional(out, "cocoon vm logs", ArgKind::Vm, id)
}

/// `vm net --nics <N> -- <id>`.
pub fn net_resize_args(id: &str, nics: u32) -> Result<Vec<String>> {
    let argv = vec![s("vm"), s("net"), s("--nics"), nics.to_string()];
    with_positional(argv, "cocoon vm net", ArgKind::Vm, id)
}

/// `snapshot save --name <name> -- <vmID>`.
pub fn snapshot_save_args(name: &str, vm_id: &str) -> Result<Vec<String>> {
    let label = "cocoon snapshot save";
    check_arg(label, ArgKind::Snapshot, name)?;
    let argv = vec![s("snapshot"), s("save"), s("--name"), name.to_owned()];
    with_positional(argv, label, ArgKind::Vm, vm_id)
}

/// `snapshot rm -- <name>`.
pub fn snapshot_rm_args(name: &str) -> Result<Vec<String>> {
    let argv = vec![s("snapshot"), s("rm")];
    with_positional(argv, "cocoon snapshot rm", ArgKind::Snapshot, name)
}

/// `snapshot inspect -- <name>`.
pub fn snapshot_inspect_args(name: &str) -> Result<Vec<String>> {
    let argv = vec![s("snapshot"), s("inspect")];
    with_positional(argv, "cocoon snapshot inspect", ArgKind::Snapshot, name)
}

/// `snapshot list -o json`.
pub fn snapshot_list_args() -> Vec<String> {
    vec![s("snapshot"), s("list"), s("-o"), s("json")]
}

/// `snapshot import --name <name>` (tar on stdin).
pub fn snapshot_import_args(name: &str) -> Result<Vec<String>> {
    check_arg("cocoon snapshot import", ArgKind::Snapshot, name)?;
    Ok(vec![
        s("snapshot"),
        s("import"),
        s("--name"),
        name.to_owned(),
    ])
}

/// `snapshot export -o - -- <name>` (tar on stdout).
pub fn snapshot_export_args(name: &str) -> Result<Vec<String>> {
    let argv = vec![s("snapshot"), s("export"), s("-o"), s("-")];
    with_positional(argv, "cocoon snapshot export", ArgKind::Snapshot, name)
}

/// `image pull [--force] -- <ref>`.
pub fn image_pull_args(image: &str, force: bool) -> Result<Vec<String>> {
    let mut out = vec![s("image"), s("pull")];
    if force {
        out.push(s("--force"));
    }
    with_positional(out, "cocoon image pull", ArgKind::Image, image)
}

/// `image inspect -- <name-or-digest>`.
pub fn image_inspect_args(name: &str) -> Result<Vec<String>> {
    let argv = vec![s("image"), s("inspect")];
    with_positional(argv, "cocoon image inspect", ArgKind::Image, name)
}

/// `image import -- <name>` (qcow2 or tar on stdin).
pub fn image_import_args(name: &str) -> Result<Vec<String>> {
    let argv = vec![s("image"), s("import")];
    with_positional(argv, "cocoon image import", ArgKind::Image, name)
}

/// `vm status --event --format json`.
pub fn watch_args() -> Vec<String> {
    vec![s("vm"), s("status"), s("--event"), s("--format"), s("json")]
}

/// `vm reconcile-stale-create -o json -- <id>`.
pub fn reconcile_stale_create_args(id: &str) -> Result<Vec<String>> {
    let argv = vec![s("vm"), s("reconcile-stale-create"), s("-o"), s("json")];
    with_positional(argv, "cocoon vm reconcile-stale-create", ArgKind::Vm, id)
}

/// `vm clone --help` (capability detection).
pub fn clone_help_args() -> Vec<String> {
    vec![s("vm"), s("clone"), s("--help")]
}

/// `vm --help` (capability detection).
pub fn vm_help_args() -> Vec<String> {
    vec![s("vm"), s("--help")]
}

/// `vm <verb> --help` (capability detection of `exec`, `logs`, `net`).
pub fn verb_help_args(verb: &str) -> Vec<String> {
    vec![s("vm"), verb.to_owned(), s("--help")]
}

/// The `--memory`/`--storage` value: a Quantity converted to a byte count, an unparsable (or
/// non-positive) string passed through trimmed, empty for empty.
pub fn size_arg(raw: &str) -> String {
    let raw = raw.trim();
    if raw.is_empty() {
        return String::new();
    }
    match quantity_bytes(raw) {
        Some(b) if b > 0 => b.to_string(),
        _ => raw.to_owned(),
    }
}

/// Kubernetes Quantity → integer value, rounded up (Go's `Quantity.Value()`): decimal number
/// with an optional binary-SI (`Ki`…`Ei`), decimal-SI (`n u m k M G T P E`) or exponent
/// (`e3`, `E-2`) suffix. `None` for anything that is not a quantity or overflows i64.
pub fn quantity_bytes(raw: &str) -> Option<i64> {
    let (negative, body) = match raw.as_bytes().first()? {
        b'-' => (true, &raw[1..]),
        b'+' => (false, &raw[1..]),
        _ => (false, raw),
    };
    let num_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(num_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return None;
    }
    // mantissa = digits / 10^frac_len, all in integers.
    let digits = format!("{int_part}{frac_part}");
    let mut numerator: i128 = digits.parse().ok()?;
    let mut denominator: i128 = 10i128.checked_pow(u32::try_from(frac_part.len()).ok()?)?;
    let binary = |p: u32| 1024i128.checked_pow(p);
    let (mul, div): (i128, i128) = match suffix {
        "" => (1, 1),
        "Ki" => (binary(1)?, 1),
        "Mi" => (binary(2)?, 1),
        "Gi" => (binary(3)?, 1),
        "Ti" => (binary(4)?, 1),
        "Pi" => (binary(5)?, 1),
        "Ei" => (binary(6)?, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().ok()?;
            let p = 10i128.checked_pow(e.unsigned_abs())?;
            if e >= 0 { (p, 1) } else { (1, p) }
        }
        _ => return None,
    };
    numerator = numerator.checked_mul(mul)?;
    denominator = denominator.checked_mul(div)?;
    // Round away from zero, as Quantity.Value() does.
    let mut value = numerator / denominator;
    if numerator % denominator != 0 {
        value += 1;
    }
    if negative {
        value = -value;
    }
    i64::try_from(value).ok()
}
