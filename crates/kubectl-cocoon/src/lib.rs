//! `kubectl cocoon`: lifecycle verbs over CocoonSets and CocoonHibernations. The plugin only
//! edits desired state and then waits on status; the operator does all orchestration.

pub mod before;
pub mod checkpoint;
pub mod cli;
pub mod complete;
pub mod conn;
pub mod describe;
pub mod dryrun;
pub mod duration;
pub mod error;
pub mod gc;
pub mod help;
pub mod jsonpath;
pub mod lifecycle;
pub mod logs;
pub mod multi;
pub mod output;
pub mod progress;
pub mod report;
pub mod status;
pub mod table;
pub mod targets;
pub mod user_agent;
pub mod version;
pub mod view;
pub mod wait;
pub mod waiter;

use cli::{Cli, Command};
use cocoon_api::crd::hibernation::Desire;
use error::CliError;

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let color = output::use_color(cli.color);
    match cli.command {
        Command::Completion { shell } => {
            let mut cmd = complete::static_command();
            clap_complete::generate(shell, &mut cmd, "kubectl-cocoon", &mut std::io::stdout());
            Ok(())
        }
        Command::Complete { words } => {
            complete::run(&words, true, &cli.conn).await;
            Ok(())
        }
        Command::CompleteNoDesc { words } => {
            complete::run(&words, false, &cli.conn).await;
            Ok(())
        }
        Command::Version { output, client } => {
            let client_version = version::CLIENT_VERSION.to_string();
            let operator = if client {
                None
            } else {
                match cli.conn.connect().await {
                    Ok(conn) => match version::operator_version(&conn.client).await {
                        Ok(v) => v,
                        Err(e) => {
                            eprintln!("warning: cannot read the operator version: {e}");
                            None
                        }
                    },
                    Err(e) => {
                        eprintln!("warning: {e}");
                        None
                    }
                }
            };
            let v = version::Versions {
                client: client_version.clone(),
                client_revision: version::CLIENT_REVISION.to_string(),
                operator: operator.clone(),
            };
            if let Some(fmt) = output {
                return output::print_object(&v, &fmt);
            }
            println!("Client Version: {client_version}");
            println!("Client Revision: {}", version::CLIENT_REVISION);
            if client {
                return Ok(());
            }
            println!(
                "Operator Version: {}",
                operator.as_deref().unwrap_or("unknown")
            );
            if let Some(w) = operator
                .as_deref()
                .and_then(|o| version::skew_warning(&client_version, o))
            {
                eprintln!("{w}");
            }
            Ok(())
        }
        command => {
            check_before_connecting(&command)?;
            let conn = cli.conn.connect().await?;
            let (client, ns) = (conn.client, conn.namespace);
            match command {
                Command::Status {
                    names,
                    selection,
                    output,
                    no_headers,
                    watch,
                } => {
                    let view = status::View {
                        output,
                        no_headers,
                        color,
                    };
                    status::status(&client, &ns, &names, &selection, &view, watch).await
                }
                Command::Describe { name } => describe::describe(&client, &ns, &name, color).await,
                Command::Suspend {
                    names,
                    selection,
                    until,
                    mut wait,
                } => {
                    wait.until = until;
                    lifecycle::set_suspend(&client, &ns, &names, &selection, true, &wait).await
                }
                Command::Resume {
                    names,
                    selection,
                    until,
                    mut wait,
                } => {
                    wait.until = until;
                    lifecycle::set_suspend(&client, &ns, &names, &selection, false, &wait).await
                }
                Command::Hibernate {
                    pods,
                    selection,
                    until,
                    mut wait,
                } => {
                    wait.until = until;
                    lifecycle::pods_and_sets(
                        &client,
                        &ns,
                        &pods,
                        &selection,
                        Desire::Hibernate,
                        &wait,
                    )
                    .await
                }
                Command::Wake {
                    targets,
                    selection,
                    until,
                    mut wait,
                } => {
                    wait.until = until;
                    lifecycle::pods_and_sets(
                        &client,
                        &ns,
                        &targets,
                        &selection,
                        Desire::Wake,
                        &wait,
                    )
                    .await
                }
                Command::Wait {
                    targets,
                    for_phase,
                    timeout,
                    failure_grace,
                    output,
                } => {
                    if let [target] = targets.as_slice()
                        && let Some(name) = checkpoint::describe_target(target)
                    {
                        let out = output.as_ref();
                        return checkpoint::wait(&client, &ns, name, &for_phase, timeout, out)
                            .await;
                    }
                    let opts = multi::Options {
                        timeout,
                        grace: failure_grace,
                        output,
                        no_wait: false,
                        after: before::After::default(),
                    };
                    lifecycle::wait(&client, &ns, &targets, &for_phase, opts).await
                }
                Command::Checkpoint { source, name, wait } => {
                    checkpoint::checkpoint(&client, &ns, &source, &name, &wait).await
                }
                Command::Fork {
                    checkpoint: ckpt,
                    count,
                    name,
                    replicas,
                    wait,
                } => {
                    checkpoint::fork(&client, &ns, &ckpt, count, name.as_deref(), replicas, &wait)
                        .await
                }
                Command::Migrate {
                    name,
                    to,
                    cancel,
                    wait,
                } => {
                    let change = match (to, cancel) {
                        (Some(node), false) => lifecycle::PinChange::To(node),
                        (None, true) => lifecycle::PinChange::Cancel,
                        _ => {
                            return Err(CliError::Usage(
                                "migrate needs --to NODE or --cancel".into(),
                            ));
                        }
                    };
                    lifecycle::pin(&client, &ns, &name, change, &wait).await
                }
                Command::Pin { name, node, wait } => {
                    lifecycle::pin(&client, &ns, &name, lifecycle::PinChange::To(node), &wait).await
                }
                Command::Unpin { name, wait } => {
                    lifecycle::pin(&client, &ns, &name, lifecycle::PinChange::Unpin, &wait).await
                }
                Command::Logs {
                    name,
                    slot,
                    toolbox,
                    follow,
                    tail,
                } => logs::run(&client, &ns, &name, slot, toolbox.as_deref(), follow, tail).await,
                Command::Report { name, file } => {
                    report::run(&client, &ns, &name, file.as_deref()).await
                }
                Command::Registry {
                    command:
                        cli::RegistryCommand::Gc {
                            registry,
                            include_latest,
                            yes,
                            interactive,
                            output,
                        },
                } => {
                    gc::run(
                        &client,
                        registry.as_deref(),
                        include_latest,
                        yes,
                        interactive,
                        output.as_ref(),
                    )
                    .await
                }
                Command::Completion { .. }
                | Command::Complete { .. }
                | Command::CompleteNoDesc { .. }
                | Command::Version { .. } => Ok(()),
            }
        }
    }
}

/// Usage checks that need no cluster: kubectl's refusal of `-A` with names, and `--until`
/// against the phases of each target's kind.
fn check_before_connecting(command: &Command) -> Result<(), CliError> {
    match command {
        Command::Status {
            names, selection, ..
        } if selection.all_namespaces && !names.is_empty() => {
            Err(CliError::Usage(cli::ACROSS_NAMESPACES_BY_NAME.to_string()))
        }
        Command::Suspend {
            names, selection, ..
        }
        | Command::Resume {
            names, selection, ..
        } => lifecycle::check_selection(names, selection, targets::Verb::Suspend),
        Command::Hibernate {
            pods, selection, ..
        } => lifecycle::check_selection(pods, selection, targets::Verb::Hibernate),
        Command::Wake {
            targets,
            selection,
            until,
            ..
        } => {
            lifecycle::check_selection(targets, selection, targets::Verb::Wake)?;
            for t in targets {
                let kind = match targets::parse_target(t, targets::Kind::Pod)? {
                    (targets::Kind::CocoonSet, _) => "cocoonset",
                    _ => "cocoonhibernation",
                };
                cli::check_until(until.as_deref(), kind).map_err(CliError::Usage)?;
            }
            Ok(())
        }
        Command::Wait {
            targets, for_phase, ..
        } => {
            if targets.is_empty() {
                return Err(CliError::Usage(cli::WAIT_NEEDS_A_TARGET.to_string()));
            }
            if let [t] = targets.as_slice()
                && checkpoint::describe_target(t).is_some()
            {
                return checkpoint::check_phase(for_phase);
            }
            for t in targets {
                let (kind, _) = targets::parse_target(t, targets::Kind::CocoonSet)?;
                targets::goal_for(targets::Verb::Wait, kind, Some(for_phase))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}
