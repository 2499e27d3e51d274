//! `cocoon-operator`: one binary, three modes. `run` reconciles the CRDs, `node` is the
//! per-host node agent, `crd` prints the CustomResourceDefinitions.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "cocoon-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Reconcile CocoonSet and CocoonHibernation resources.
    Run,
    /// Run the node agent for this host (virtual-kubelet style).
    Node,
    /// Print the CustomResourceDefinitions as YAML (or write one file per CRD).
    Crd {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { out_dir: None } => {
            print!("{}", cocoon_api::crd::render_all_yaml()?);
            Ok(())
        }
        Command::Crd { out_dir: Some(dir) } => {
            for (file, yaml) in cocoon_api::crd::render_files()? {
                let path = dir.join(&file);
                std::fs::write(&path, yaml).with_context(|| format!("write {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        Command::Run => anyhow::bail!("`run`: the controllers are not built yet"),
        Command::Node => anyhow::bail!("`node`: the node agent is not built yet"),
    }
}
