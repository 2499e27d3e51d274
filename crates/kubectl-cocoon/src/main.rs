//! `kubectl-cocoon` entry point: parse (usage errors exit 2), run, map outcomes to exit codes.

use clap::{CommandFactory, FromArgMatches};
use kubectl_cocoon::cli::{Cli, display_name};
use kubectl_cocoon::error::{EXIT_ERROR, EXIT_OK, EXIT_USAGE};

/// Writing to a closed pipe (`kubectl cocoon completion bash | head -1`) ends the process
/// quietly, as it does kubectl and other Unix tools, instead of a panic in `println!`: Rust
/// ignores SIGPIPE by default, so the default disposition is restored.
fn restore_default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: runs first in `main`, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE and no handler is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() {
    restore_default_sigpipe();
    let argv0 = std::env::args().next().unwrap_or_default();
    let name = display_name(&argv0);
    let matches = match Cli::command().bin_name(name).try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            // Help and version go to stdout with 0; real usage errors exit 2.
            let code = if e.use_stderr() { EXIT_USAGE } else { EXIT_OK };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            std::process::exit(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: start the async runtime: {e}");
            std::process::exit(EXIT_ERROR);
        }
    };
    let code = match runtime.block_on(kubectl_cocoon::run(cli)) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}
