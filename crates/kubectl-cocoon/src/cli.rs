//! The command line: verbs, kubectl's connection flags, output and wait flags.

use std::time::Duration;

use clap::builder::PossibleValuesParser;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use crate::conn::ConnFlags;
use crate::help;
use crate::output::{OBJECT_FORMATS, TABLE_FORMATS, VERSION_FORMATS, formats};

pub use crate::output::OutputFormat;

/// Exit codes, shown at the end of `--help`.
pub const EXIT_CODES_HELP: &str = help::EXIT_CODES;

/// The phases a CocoonSet reports (`--until` of suspend, resume and `wake cocoonset/NAME`).
pub const SET_PHASES: &[&str] = &[
    "Pending",
    "Scaling",
    "Running",
    "Suspending",
    "Suspended",
    "Waking",
    "Migrating",
    "Failed",
];
/// The phases a CocoonHibernation reports (`--until` of hibernate and `wake POD`).
pub const HIBERNATION_PHASES: &[&str] = &[
    "Pending",
    "Hibernating",
    "Hibernated",
    "Waking",
    "Active",
    "Failed",
];

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-cocoon",
    version = crate::version::LONG_VERSION,
    about = "Lifecycle verbs for cocoon microVM agents: suspend, resume, hibernate, wake, migrate, status",
    after_help = help::TOP
)]
pub struct Cli {
    #[command(flatten)]
    pub conn: ConnFlags,
    /// Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never.
    #[arg(long, global = true, value_enum, default_value = "auto")]
    pub color: ColorMode,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum ColorMode {
    Auto,
    Always,
    Never,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DryRun {
    None,
    Client,
    Server,
}

/// Which objects a verb acts on.
#[derive(Args, Debug, Clone, Default)]
pub struct Selection {
    /// Act in all namespaces (-A, -A=true, --all-namespaces=false).
    #[arg(short = 'A', long, value_name = "BOOL", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    pub all_namespaces: bool,
    /// Label selector (e.g. -l team=a).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
}

/// How a lifecycle verb waits and writes.
#[derive(Args, Debug, Clone)]
pub struct WaitFlags {
    /// Wait for the phase to settle (the default); --wait=false returns right after the write.
    #[arg(long, value_name = "BOOL", default_value_t = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = ArgAction::Set)]
    pub wait: bool,
    /// Same as --wait=false.
    #[arg(long, conflicts_with = "wait")]
    pub no_wait: bool,
    /// Overall wait budget.
    #[arg(long, default_value = "10m", value_parser = crate::duration::parse_flag)]
    pub timeout: Duration,
    /// How long Failed must persist before it counts (the operator retries from Failed).
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse_flag)]
    pub failure_grace: Duration,
    /// The phase that counts as success: set from the verb's own `--until` (only the verbs
    /// that wait for a phase have one, each offering its kind's phases).
    #[arg(skip)]
    pub until: Option<String>,
    /// Print the final object: json, yaml, name or jsonpath=TEMPLATE.
    #[arg(short = 'o', long, value_name = "FORMAT", value_parser = formats(OBJECT_FORMATS))]
    pub output: Option<OutputFormat>,
    /// none, client (print the object as it would be, send nothing) or server (send with
    /// dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client.
    #[arg(long, value_enum, value_name = "MODE", default_value = "none", num_args = 0..=1,
          require_equals = true, default_missing_value = "client")]
    pub dry_run: DryRun,
    /// Name of the manager recorded in managedFields for every write.
    #[arg(long, value_name = "NAME", default_value = "kubectl-cocoon")]
    pub field_manager: String,
    /// Do not ask before acting on several objects (-y, -y=true, --yes=false).
    #[arg(short = 'y', long, value_name = "BOOL", default_value_t = false, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    pub yes: bool,
}

impl WaitFlags {
    /// Whether the verb waits after its write (`--wait`, unless `--wait=false` or `--no-wait`).
    pub fn waits(&self) -> bool {
        self.wait && !self.no_wait
    }
}

/// `wait` without a target.
pub const WAIT_NEEDS_A_TARGET: &str = "name at least one target (cocoonset/NAME or pod/NAME)";

/// kubectl's refusal of `get -A NAME`, word for word.
pub const ACROSS_NAMESPACES_BY_NAME: &str =
    "a resource cannot be retrieved by name across all namespaces";

/// Checks `--until PHASE` against the phases of the kind it waits on; `kind` is `cocoonset`
/// or `cocoonhibernation`.
pub fn check_until(until: Option<&str>, kind: &str) -> Result<(), String> {
    let Some(phase) = until else { return Ok(()) };
    let phases = if kind == "cocoonset" {
        SET_PHASES
    } else {
        HIBERNATION_PHASES
    };
    if phases.contains(&phase) {
        Ok(())
    } else {
        Err(format!(
            "invalid value '{phase}' for '--until <PHASE>': a {kind} has no such phase [possible values: {}]",
            phases.join(", ")
        ))
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show CocoonSets (all in the namespace, or the named ones with their members).
    #[command(alias = "get", alias = "list", after_help = help::STATUS)]
    Status {
        /// CocoonSets to show in detail (none: every set in the namespace, or those -l / -A select).
        #[arg(value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        selection: Selection,
        /// Output format: wide (members too), json, yaml (the computed view: each set with its
        /// members, VMs, nodes, lifecycle and hibernations), name or jsonpath=TEMPLATE.
        #[arg(short = 'o', long, value_name = "FORMAT", value_parser = formats(TABLE_FORMATS))]
        output: Option<OutputFormat>,
        /// Print tables without their header line (--no-headers=true|false).
        #[arg(long, value_name = "BOOL", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
        no_headers: bool,
        /// Watch: redraw on change (TTY) or stream one JSON object per change (-w=true|false).
        #[arg(short = 'w', long, value_name = "BOOL", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
        watch: bool,
    },
    /// Show a CocoonSet, a pod or a CocoonHibernation with its conditions and Events.
    ///
    /// NAME or cocoonset/NAME shows a set with its members; pod/NAME or
    /// cocoonhibernation/NAME a pod with its hibernation. Events are those of exactly these
    /// objects (involvedObject kind, name and uid).
    #[command(after_help = help::DESCRIBE)]
    Describe {
        /// NAME or cocoonset/NAME, pod/NAME or cocoonhibernation/NAME.
        #[arg(value_name = "TARGET")]
        name: String,
    },
    /// Wait (read-only) until targets reach a phase, e.g. cocoonset/NAME --for=Suspended.
    ///
    /// Targets: cocoonset/NAME (a bare NAME is a set) and pod/NAME, a pod through its
    /// CocoonHibernation (--for=Ready: Active and the pod Ready, i.e. its VM serves).
    /// Several targets are waited for together under one --timeout; --timeout 0 checks once.
    /// checkpoint/NAME (alone) waits for a CocoonCheckpoint phase (Ready, Failed, ...).
    #[command(after_help = help::WAIT)]
    Wait {
        /// cocoonset/NAME (or NAME), pod/NAME, cocoonhibernation/NAME; several allowed; or
        /// one checkpoint/NAME.
        #[arg(value_name = "TARGET")]
        targets: Vec<String>,
        /// The phase to wait for: Suspended, Running, …; for pods Hibernated, Active, Ready.
        #[arg(long = "for", value_name = "PHASE")]
        for_phase: String,
        /// Overall wait budget (0 checks once).
        #[arg(long, default_value = "10m", value_parser = crate::duration::parse_flag)]
        timeout: Duration,
        /// How long Failed must persist before it counts.
        #[arg(long, default_value = "30s", value_parser = crate::duration::parse_flag)]
        failure_grace: Duration,
        /// Print the final object(s); several as a List.
        #[arg(short = 'o', long, value_name = "FORMAT", value_parser = formats(OBJECT_FORMATS))]
        output: Option<OutputFormat>,
    },
    /// Suspend CocoonSets: hibernate every VM to the registry (spec.suspend=true).
    #[command(after_help = help::SUSPEND)]
    Suspend {
        /// CocoonSets to suspend (or select them with -l / -A).
        #[arg(value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        selection: Selection,
        /// The CocoonSet phase that counts as success instead of Suspended.
        #[arg(long, value_name = "PHASE", value_parser = PossibleValuesParser::new(SET_PHASES))]
        until: Option<String>,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Resume suspended CocoonSets (spec.suspend=false).
    #[command(after_help = help::RESUME)]
    Resume {
        /// CocoonSets to resume (or select them with -l / -A).
        #[arg(value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        selection: Selection,
        /// The CocoonSet phase that counts as success instead of Running.
        #[arg(long, value_name = "PHASE", value_parser = PossibleValuesParser::new(SET_PHASES))]
        until: Option<String>,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Hibernate pods through their CocoonHibernation (created if missing, named after the pod).
    #[command(after_help = help::HIBERNATE)]
    Hibernate {
        /// Cocoon pods to hibernate (each gets a CocoonHibernation of the same name).
        #[arg(value_name = "POD")]
        pods: Vec<String>,
        /// The CocoonHibernation phase that counts as success instead of Hibernated.
        #[arg(long, value_name = "PHASE", value_parser = PossibleValuesParser::new(HIBERNATION_PHASES))]
        until: Option<String>,
        #[command(flatten)]
        selection: Selection,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Wake hibernated pods (CocoonHibernation desire=Wake); `wake cocoonset/NAME` resumes a set.
    #[command(after_help = help::WAKE)]
    Wake {
        /// Pods (POD or pod/POD) to wake, or cocoonset/NAME to resume a set.
        #[arg(value_name = "TARGET")]
        targets: Vec<String>,
        /// The phase that counts as success: a CocoonHibernation phase for pods (default
        /// Active), a CocoonSet phase for cocoonset/NAME (default Running).
        #[arg(long, value_name = "PHASE")]
        until: Option<String>,
        #[command(flatten)]
        selection: Selection,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Save a running pod's (or a set's main agent's) VM to the registry as a CocoonCheckpoint.
    ///
    /// SOURCE is POD, pod/POD or cocoonset/NAME (the set's main agent). The VM keeps running.
    #[command(after_help = help::CHECKPOINT)]
    Checkpoint {
        /// POD, pod/POD or cocoonset/NAME.
        #[arg(value_name = "SOURCE")]
        source: String,
        /// The CocoonCheckpoint's name.
        #[arg(long, value_name = "CKPT")]
        name: String,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Start COUNT independent CocoonSets (PREFIX-1 … PREFIX-COUNT) from a checkpoint.
    #[command(after_help = help::FORK)]
    Fork {
        /// The CocoonCheckpoint to start from (this namespace).
        #[arg(value_name = "CKPT")]
        checkpoint: String,
        /// How many sets (1-100).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
        count: u32,
        /// Name prefix of the sets [default: CKPT].
        #[arg(long, value_name = "PREFIX")]
        name: Option<String>,
        /// Sub-agents of each set.
        #[arg(long, value_name = "R", default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
        replicas: i32,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Move a set's main agent to NODE (spec.nodeName); --cancel restores the previous pin.
    #[command(after_help = help::MIGRATE)]
    Migrate {
        /// The CocoonSet whose main agent moves.
        #[arg(value_name = "NAME")]
        name: String,
        /// The target node.
        #[arg(long, value_name = "NODE", required_unless_present = "cancel")]
        to: Option<String>,
        /// Restore the pin that was in place before the last migrate/pin (--cancel=true|false).
        #[arg(long, conflicts_with = "to", value_name = "BOOL", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
        cancel: bool,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Pin a set's main agent to NODE (same as migrate --to NODE).
    #[command(after_help = help::PIN)]
    Pin {
        /// The CocoonSet to pin.
        #[arg(value_name = "NAME")]
        name: String,
        /// The node its main agent must run on.
        #[arg(value_name = "NODE")]
        node: String,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Remove a set's pin (spec.nodeName).
    #[command(after_help = help::UNPIN)]
    Unpin {
        /// The CocoonSet to unpin.
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Show a member's guest log through the API server (pods/log).
    #[command(after_help = help::LOGS)]
    Logs {
        /// The CocoonSet whose member to read.
        #[arg(value_name = "NAME")]
        name: String,
        /// The agent slot (0 is the main agent, the default).
        #[arg(long, value_name = "N", conflicts_with = "toolbox")]
        slot: Option<i32>,
        /// A toolbox by name instead of an agent slot.
        #[arg(long, value_name = "TOOLBOX")]
        toolbox: Option<String>,
        /// Keep streaming new lines (-f, -f=true, --follow=false).
        #[arg(short = 'f', long, value_name = "BOOL", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
        follow: bool,
        /// Lines from the end of the log to show (the node agent's default when unset).
        #[arg(long, value_name = "LINES")]
        tail: Option<i64>,
    },
    /// Write a support bundle (tar.gz) of one CocoonSet, secrets redacted.
    #[command(after_help = help::REPORT)]
    Report {
        /// The CocoonSet to report on.
        #[arg(value_name = "NAME")]
        name: String,
        /// Where to write the bundle [default: ./cocoon-report-NS-NAME-TIME.tar.gz].
        #[arg(long, value_name = "PATH")]
        file: Option<std::path::PathBuf>,
    },
    /// Registry maintenance.
    #[command(after_help = help::REGISTRY)]
    Registry {
        #[command(subcommand)]
        command: RegistryCommand,
    },
    /// Print the plugin and operator versions.
    #[command(after_help = help::VERSION)]
    Version {
        /// Output format: json, yaml or jsonpath=TEMPLATE.
        #[arg(short = 'o', long, value_name = "FORMAT", value_parser = formats(VERSION_FORMATS))]
        output: Option<OutputFormat>,
        /// Print only the plugin's version and revision; do not contact the cluster
        /// (--client=true|false).
        #[arg(long, value_name = "BOOL", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
        client: bool,
    },
    /// Print a static completion script for bash, zsh, fish or powershell.
    #[command(after_help = help::COMPLETION)]
    Completion {
        /// The shell to print the script for.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Dynamic completion (cobra protocol), used by the kubectl_complete-cocoon shim.
    #[command(name = "__complete", hide = true, disable_help_flag = true)]
    Complete {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        words: Vec<String>,
    },
    /// Dynamic completion without descriptions.
    #[command(name = "__completeNoDesc", hide = true, disable_help_flag = true)]
    CompleteNoDesc {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        words: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum RegistryCommand {
    /// Delete :hibernate tags (and :latest with --include-latest) of VM repositories, and
    /// :checkpoint tags of checkpoint repositories, that no live CocoonSet, CocoonHibernation,
    /// CocoonCheckpoint or pod references. Dry run unless --yes.
    #[command(after_help = help::REGISTRY_GC)]
    Gc {
        /// Registry base (host[:port][/prefix]); defaults to OCI_REGISTRY.
        #[arg(long, env = "OCI_REGISTRY", value_name = "BASE")]
        registry: Option<String>,
        /// Also collect unreferenced :latest tags (kept after teardown by snapshotPolicy);
        /// --include-latest=true|false.
        #[arg(long, value_name = "BOOL", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
        include_latest: bool,
        /// Delete (without it, only list what would be deleted); -y=true, --yes=false.
        #[arg(short = 'y', long, value_name = "BOOL", default_value_t = false, num_args = 0..=1,
              require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
        yes: bool,
        /// Show what would be deleted, then ask (on stderr, answered on stdin) before
        /// deleting; -i=true, --interactive=false.
        #[arg(short = 'i', long, value_name = "BOOL", default_value_t = false, num_args = 0..=1,
              require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
        interactive: bool,
        /// Output format: json, yaml or jsonpath=TEMPLATE.
        #[arg(short = 'o', long, value_name = "FORMAT", value_parser = formats(VERSION_FORMATS))]
        output: Option<OutputFormat>,
    },
}

/// The program name to show: `kubectl cocoon` when run as a kubectl plugin.
pub fn display_name(argv0: &str) -> &'static str {
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    if base.starts_with("kubectl-") || base.starts_with("kubectl_") {
        "kubectl cocoon"
    } else {
        "kubectl-cocoon"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn name_follows_argv0() {
        assert_eq!(
            display_name("/usr/local/bin/kubectl-cocoon"),
            "kubectl cocoon"
        );
        assert_eq!(display_name("cocoon"), "kubectl-cocoon");
    }
}
