//! `cocoon-operator sim`: drives the simulated runtime under a running node agent through its
//! control socket (`<root>/control.sock`, see `cocoon_runtime::sim::socket`): crash or
//! delete VMs out of band, fail verbs, list VMs and call counts. Only an agent started with
//! `VK_RUNTIME=sim` serves the socket.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use cocoon_runtime::sim::socket::{self, Reply, Request};
use cocoon_runtime::sim::{CrashKind, Verb, VmRow};

/// Flags of `sim`.
#[derive(Args, Debug)]
pub struct SimArgs {
    /// The simulator root of the agent (its `VK_SIM_ROOT`).
    #[arg(long, env = "VK_SIM_ROOT", value_name = "DIR")]
    root: PathBuf,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    output: Output,
    #[command(subcommand)]
    command: SimCommand,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Subcommand, Debug, PartialEq, Eq)]
enum SimCommand {
    /// List the VMs (name, id, state, whether the simulated process is alive).
    List,
    /// Stop a VM out of band: record `stopped`, process gone.
    Stop {
        /// VM name or id.
        vm: String,
    },
    /// Crash a VM out of band: record `error`, process gone.
    Crash {
        /// VM name or id.
        vm: String,
    },
    /// Kill a VM's process out of band: the record still says running, so it reads
    /// `stopped (stale)`.
    Kill {
        /// VM name or id.
        vm: String,
    },
    /// Delete a VM out of band.
    Delete {
        /// VM name or id.
        vm: String,
    },
    /// Fail the next N calls of a runtime verb (e.g. `start`, `inspect`, `watch-events`).
    FailVerb {
        /// The verb.
        #[arg(value_parser = parse_verb)]
        verb: Verb,
        /// How many calls fail (at least 1).
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        n: u32,
        /// The error text (the runtime classifies it: `VM not found` reads as gone, for
        /// example). Default: `simulated failure of <verb>`.
        #[arg(long, value_name = "TEXT")]
        message: Option<String>,
        /// Only calls naming this VM name or id, snapshot name or image ref.
        #[arg(long, value_name = "NAME")]
        target: Option<String>,
    },
    /// Remove every injected failure.
    ClearFailures,
    /// Calls per verb so far (one verb, or every verb called).
    Calls {
        /// Only this verb (printed as 0 if never called).
        #[arg(value_parser = parse_verb)]
        verb: Option<Verb>,
    },
    /// End the agent's VM event streams (it reconnects after 2 s).
    CloseEventStreams,
    /// Make the guest print TEXT on its console (what `kubectl logs` reads), `--repeat` times;
    /// a newline ends it unless `--no-newline`.
    Print {
        /// VM name or id.
        vm: String,
        /// The text.
        text: String,
        /// How many times (the whole is at most 256 MiB).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        repeat: u64,
        /// Print TEXT without a newline after it (repeated, it makes one long line).
        #[arg(long)]
        no_newline: bool,
    },
    /// Make the guest busy (every vCPU in use: its CPU time grows, which is activity to idle
    /// suspend) or, with `--off`, idle again.
    Busy {
        /// VM name or id.
        vm: String,
        /// Idle again.
        #[arg(long)]
        off: bool,
    },
}

fn parse_verb(s: &str) -> Result<Verb, String> {
    s.parse::<Verb>().map_err(|e| e.to_string())
}

/// The control request of a command.
fn request_of(cmd: &SimCommand) -> Request {
    let crash = |vm: &str, kind| Request::Crash {
        vm: vm.to_owned(),
        kind,
    };
    match cmd {
        SimCommand::List => Request::List,
        SimCommand::Stop { vm } => crash(vm, CrashKind::Stopped),
        SimCommand::Crash { vm } => crash(vm, CrashKind::Error),
        SimCommand::Kill { vm } => crash(vm, CrashKind::KillProcess),
        SimCommand::Delete { vm } => Request::Delete { vm: vm.clone() },
        SimCommand::FailVerb {
            verb,
            n,
            message,
            target,
        } => Request::Fail {
            verb: *verb,
            times: *n,
            message: message.clone(),
            target: target.clone(),
        },
        SimCommand::ClearFailures => Request::ClearFailures,
        SimCommand::Calls { .. } => Request::Calls,
        SimCommand::CloseEventStreams => Request::CloseEventStreams,
        SimCommand::Busy { vm, off } => Request::Busy {
            vm: vm.clone(),
            busy: !off,
        },
        SimCommand::Print {
            vm,
            text,
            repeat,
            no_newline,
        } => Request::Print {
            vm: vm.clone(),
            text: if *no_newline {
                text.clone()
            } else {
                format!("{text}\n")
            },
            repeat: Some(*repeat),
        },
    }
}

fn table(rows: &[VmRow]) -> String {
    let head = ["NAME", "ID", "STATE", "ALIVE"];
    let cells: Vec<[String; 4]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.id.clone(),
                r.state.clone(),
                r.alive.to_string(),
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for c in &cells {
        for (w, v) in width.iter_mut().zip(c) {
            *w = (*w).max(v.len());
        }
    }
    let line = |c: [&str; 4]| {
        let mut out = String::new();
        for (i, (v, w)) in c.iter().zip(width).enumerate() {
            if i + 1 == c.len() {
                out.push_str(v);
            } else {
                out.push_str(&format!("{v:<w$}   "));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(head);
    for c in &cells {
        out.push_str(&line([&c[0], &c[1], &c[2], &c[3]]));
    }
    out
}

/// What a command prints for a reply.
fn render(cmd: &SimCommand, reply: &Reply, output: Output) -> anyhow::Result<String> {
    // `calls VERB` narrows the answer to that verb, in both formats.
    let narrowed = match (cmd, reply) {
        (SimCommand::Calls { verb: Some(v) }, Reply::Calls(all)) => {
            Some((*v, all.get(v).copied().unwrap_or(0)))
        }
        _ => None,
    };
    if output == Output::Json {
        let mut s = match narrowed {
            Some((v, n)) => {
                let mut one = serde_json::Map::new();
                one.insert(v.as_str().to_owned(), n.into());
                serde_json::to_string(&one)
            }
            None => serde_json::to_string(reply),
        }
        .context("encode the reply")?;
        s.push('\n');
        return Ok(s);
    }
    Ok(match (cmd, reply) {
        (_, Reply::Vms(rows)) => table(rows),
        (_, Reply::Vm(r)) => format!("vm {} ({}): {}\n", r.name, r.id, r.state),
        (SimCommand::Calls { .. }, Reply::Calls(all)) => match narrowed {
            Some((v, n)) => format!("{v} {n}\n"),
            None => all.iter().map(|(v, n)| format!("{v} {n}\n")).collect(),
        },
        (SimCommand::Delete { vm }, Reply::Done) => format!("deleted vm {vm}\n"),
        (
            SimCommand::FailVerb {
                verb, n, target, ..
            },
            Reply::Done,
        ) => match target {
            Some(t) => format!("the next {n} {verb} calls naming {t} fail\n"),
            None => format!("the next {n} {verb} calls fail\n"),
        },
        (SimCommand::ClearFailures, Reply::Done) => "failures cleared\n".to_owned(),
        (SimCommand::CloseEventStreams, Reply::Done) => "event streams closed\n".to_owned(),
        (SimCommand::Busy { vm, off }, Reply::Done) => {
            format!("vm {vm} is {}\n", if *off { "idle" } else { "busy" })
        }
        (SimCommand::Print { vm, repeat, .. }, Reply::Done) => {
            format!("vm {vm} printed {repeat} time(s)\n")
        }
        (_, other) => format!(
            "{}\n",
            serde_json::to_string(other).context("encode the reply")?
        ),
    })
}

/// Runs `sim`: one request to the agent, its answer on stdout.
pub fn main(args: SimArgs) -> anyhow::Result<()> {
    let reply = socket::request(&args.root, &request_of(&args.command))?;
    print!("{}", render(&args.command, &reply, args.output)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::collections::BTreeMap;

    /// `sim` mounted as in `main`.
    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Top {
        Sim(SimArgs),
    }

    fn parse(args: &[&str]) -> Result<SimArgs, String> {
        Cli::try_parse_from(
            ["cocoon-operator", "sim"]
                .into_iter()
                .chain(args.iter().copied()),
        )
        .map(|c| match c.command {
            Top::Sim(s) => s,
        })
        .map_err(|e| e.to_string())
    }

    #[test]
    fn commands_map_to_requests() {
        let cases: &[(&[&str], Request)] = &[
            (&["list"], Request::List),
            (
                &["stop", "vm-a"],
                Request::Crash {
                    vm: "vm-a".into(),
                    kind: CrashKind::Stopped,
                },
            ),
            (
                &["crash", "vm-a"],
                Request::Crash {
                    vm: "vm-a".into(),
                    kind: CrashKind::Error,
                },
            ),
            (
                &["kill", "vm-a"],
                Request::Crash {
                    vm: "vm-a".into(),
                    kind: CrashKind::KillProcess,
                },
            ),
            (&["delete", "id1"], Request::Delete { vm: "id1".into() }),
            (
                &["busy", "vm-a"],
                Request::Busy {
                    vm: "vm-a".into(),
                    busy: true,
                },
            ),
            (
                &["busy", "vm-a", "--off"],
                Request::Busy {
                    vm: "vm-a".into(),
                    busy: false,
                },
            ),
            (
                &["print", "vm-a", "hello"],
                Request::Print {
                    vm: "vm-a".into(),
                    text: "hello\n".into(),
                    repeat: Some(1),
                },
            ),
            (
                &["print", "vm-a", "x", "--repeat", "1000", "--no-newline"],
                Request::Print {
                    vm: "vm-a".into(),
                    text: "x".into(),
                    repeat: Some(1000),
                },
            ),
            (
                &[
                    "fail-verb",
                    "net-resize",
                    "3",
                    "--message",
                    "x",
                    "--target",
                    "vm-a",
                ],
                Request::Fail {
                    verb: Verb::NetResize,
                    times: 3,
                    message: Some("x".into()),
                    target: Some("vm-a".into()),
                },
            ),
            (&["calls", "start"], Request::Calls),
            (&["clear-failures"], Request::ClearFailures),
            (&["close-event-streams"], Request::CloseEventStreams),
        ];
        for (argv, want) in cases {
            let mut full = vec!["--root", "/tmp/r"];
            full.extend_from_slice(argv);
            let args = parse(&full).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            assert_eq!(args.root, PathBuf::from("/tmp/r"));
            assert_eq!(&request_of(&args.command), want, "{argv:?}");
        }
    }

    #[test]
    fn bad_arguments_name_what_is_wrong() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--root", "/r", "fail-verb", "reboot", "1"],
                "unknown verb \"reboot\"",
            ),
            (&["--root", "/r", "fail-verb", "start", "0"], "<N>"),
            (&["--root", "/r", "fail-verb", "start", "x"], "<N>"),
            (&["--root", "/r", "stop"], "<VM>"),
            (&["--root", "/r", "-o", "yaml", "list"], "--output"),
            (&["--root", "/r", "reboot"], "reboot"),
        ];
        for (argv, needle) in cases {
            let err = parse(argv).expect_err("rejected");
            assert!(err.contains(needle), "{argv:?}: {err}");
        }
        // VK_SIM_ROOT may stand in for --root, so only check when it is unset here.
        if std::env::var_os("VK_SIM_ROOT").is_none() {
            let err = parse(&["list"]).expect_err("no root");
            assert!(err.contains("--root <DIR>"), "{err}");
        }
    }

    #[test]
    fn replies_render_as_text_and_json() {
        let rows = Reply::Vms(vec![
            VmRow {
                name: "vm-long-name".into(),
                id: "abc".into(),
                state: "stopped (stale)".into(),
                alive: false,
            },
            VmRow {
                name: "b".into(),
                id: "0123456789".into(),
                state: "running".into(),
                alive: true,
            },
        ]);
        assert_eq!(
            render(&SimCommand::List, &rows, Output::Text).expect("render"),
            "NAME           ID           STATE             ALIVE\n\
             vm-long-name   abc          stopped (stale)   false\n\
             b              0123456789   running           true\n"
        );
        let calls = Reply::Calls(BTreeMap::from([(Verb::Run, 1), (Verb::Start, 2)]));
        let all = SimCommand::Calls { verb: None };
        let start = SimCommand::Calls {
            verb: Some(Verb::Start),
        };
        let stats = SimCommand::Calls {
            verb: Some(Verb::Stats),
        };
        assert_eq!(
            render(&all, &calls, Output::Text).expect("r"),
            "run 1\nstart 2\n"
        );
        assert_eq!(
            render(&start, &calls, Output::Text).expect("r"),
            "start 2\n"
        );
        assert_eq!(
            render(&stats, &calls, Output::Json).expect("r"),
            "{\"stats\":0}\n"
        );
        assert_eq!(
            render(&all, &calls, Output::Json).expect("r"),
            "{\"calls\":{\"run\":1,\"start\":2}}\n"
        );
        let fail = SimCommand::FailVerb {
            verb: Verb::Start,
            n: 2,
            message: None,
            target: None,
        };
        assert_eq!(
            render(&fail, &Reply::Done, Output::Text).expect("r"),
            "the next 2 start calls fail\n"
        );
    }
}
