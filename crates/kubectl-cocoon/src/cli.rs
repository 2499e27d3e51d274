//! The command line: verbs, kubectl's connection flags, output and wait flags.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::conn::ConnFlags;

/// Exit codes, shown at the end of `--help`.
pub const EXIT_CODES_HELP: &str = "Exit codes:\n  0  success (also: already in the requested state)\n  1  error (API error, RBAC denial, not found)\n  2  usage error\n  3  the wait timed out\n  4  the wait reached Failed (after --failure-grace)\n  130  interrupted (Ctrl-C) while waiting; the write already happened\n\nSeveral targets are all written first, then waited for together under one --timeout;\nthe exit code is the worst of theirs (4 over 3 over 1).";

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-cocoon",
    version = crate::version::LONG_VERSION,
    about = "Lifecycle verbs for cocoon microVM agents: suspend, resume, hibernate, wake, migrate, status",
    after_help = EXIT_CODES_HELP,
    propagate_version = true
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
pub enum OutputFormat {
    Json,
    Yaml,
    Wide,
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
    /// Act in all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Label selector (e.g. -l team=a).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
}

/// How a lifecycle verb waits and writes.
#[derive(Args, Debug, Clone)]
pub struct WaitFlags {
    /// Return right after the write instead of waiting for the phase to settle.
    #[arg(long)]
    pub no_wait: bool,
    /// Wait (the default; the opposite of --no-wait).
    #[arg(long, conflicts_with = "no_wait")]
    pub wait: bool,
    /// Overall wait budget.
    #[arg(long, default_value = "10m", value_parser = crate::duration::parse_flag)]
    pub timeout: Duration,
    /// How long Failed must persist before it counts (the operator retries from Failed).
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse_flag)]
    pub failure_grace: Duration,
    /// The phase that counts as success instead of the verb's default.
    #[arg(long, value_name = "PHASE")]
    pub until: Option<String>,
    /// Print the final object.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
    /// none, client (print what would be sent) or server (send with dryRun=All).
    #[arg(long, value_enum, default_value = "none", num_args = 0..=1, default_missing_value = "client")]
    pub dry_run: DryRun,
    /// Do not ask before acting on several objects.
    #[arg(short = 'y', long)]
    pub yes: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show CocoonSets (all in the namespace, or the named ones with their members).
    #[command(alias = "get", alias = "list")]
    Status {
        names: Vec<String>,
        #[command(flatten)]
        selection: Selection,
        /// Output format.
        #[arg(short = 'o', long, value_enum)]
        output: Option<OutputFormat>,
        /// Watch: redraw on change (TTY) or stream one JSON object per change.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Show a CocoonSet, a pod or a CocoonHibernation with its conditions and Events.
    ///
    /// NAME or cocoonset/NAME shows a set with its members; pod/NAME or
    /// cocoonhibernation/NAME a pod with its hibernation. Events are those of exactly these
    /// objects (involvedObject kind, name and uid).
    Describe { name: String },
    /// Wait (read-only) until targets reach a phase, e.g. cocoonset/NAME --for=Suspended.
    ///
    /// Targets: cocoonset/NAME (a bare NAME is a set) and pod/NAME, a pod through its
    /// CocoonHibernation (--for=Ready: Active and the pod Ready, i.e. its VM serves).
    /// Several targets are waited for together under one --timeout; --timeout 0 checks once.
    Wait {
        /// cocoonset/NAME (or NAME), pod/NAME, cocoonhibernation/NAME; several allowed.
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
        #[arg(short = 'o', long, value_enum)]
        output: Option<OutputFormat>,
    },
    /// Suspend CocoonSets: hibernate every VM to the registry (spec.suspend=true).
    Suspend {
        names: Vec<String>,
        #[command(flatten)]
        selection: Selection,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Resume suspended CocoonSets (spec.suspend=false).
    Resume {
        names: Vec<String>,
        #[command(flatten)]
        selection: Selection,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Hibernate pods through their CocoonHibernation (created if missing, named after the pod).
    Hibernate {
        pods: Vec<String>,
        #[command(flatten)]
        selection: Selection,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Wake hibernated pods (CocoonHibernation desire=Wake); `wake cocoonset/NAME` resumes a set.
    Wake {
        targets: Vec<String>,
        #[command(flatten)]
        selection: Selection,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Move a set's main agent to NODE (spec.nodeName); --cancel restores the previous pin.
    Migrate {
        name: String,
        /// The target node.
        #[arg(long, value_name = "NODE", required_unless_present = "cancel")]
        to: Option<String>,
        /// Restore the pin that was in place before the last migrate/pin.
        #[arg(long, conflicts_with = "to")]
        cancel: bool,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Pin a set's main agent to NODE (same as migrate --to NODE).
    Pin {
        name: String,
        node: String,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Remove a set's pin (spec.nodeName).
    Unpin {
        name: String,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Registry maintenance.
    Registry {
        #[command(subcommand)]
        command: RegistryCommand,
    },
    /// Print the plugin and operator versions.
    Version {
        #[arg(short = 'o', long, value_enum)]
        output: Option<OutputFormat>,
        /// Print only the plugin's version and revision; do not contact the cluster.
        #[arg(long)]
        client: bool,
    },
    /// Print a static completion script for bash, zsh, fish or powershell.
    Completion { shell: clap_complete::Shell },
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
    /// Delete :hibernate tags (and :latest with --include-latest) that no live CocoonSet,
    /// CocoonHibernation or pod references. Dry run unless --yes.
    Gc {
        /// Registry base (host[:port][/prefix]); defaults to OCI_REGISTRY.
        #[arg(long, env = "OCI_REGISTRY", value_name = "BASE")]
        registry: Option<String>,
        /// Also collect unreferenced :latest tags (kept after teardown by snapshotPolicy).
        #[arg(long)]
        include_latest: bool,
        /// Delete (without it, only list what would be deleted).
        #[arg(short = 'y', long)]
        yes: bool,
        #[arg(short = 'o', long, value_enum)]
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
