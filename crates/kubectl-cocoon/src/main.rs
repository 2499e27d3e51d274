//! `kubectl cocoon`: the lifecycle verbs for CocoonSets and CocoonHibernations.
//! The verbs arrive with the plugin issue; this entry point fixes the binary name.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "kubectl-cocoon", bin_name = "kubectl cocoon", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
