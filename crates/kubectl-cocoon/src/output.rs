//! Printing objects as JSON or YAML on stdout, and the colour decision of cli.md §3.

use std::io::IsTerminal;

use serde::Serialize;

use crate::cli::{ColorMode, OutputFormat};
use crate::error::CliError;

/// Prints one object (or list) in the requested format.
pub fn print_object<T: Serialize>(obj: &T, fmt: OutputFormat) -> Result<(), CliError> {
    match fmt {
        OutputFormat::Json | OutputFormat::Wide => {
            let text =
                serde_json::to_string_pretty(obj).map_err(|e| CliError::Api(e.to_string()))?;
            println!("{text}");
        }
        OutputFormat::Yaml => {
            let text = serde_saphyr::to_string(obj).map_err(|e| CliError::Api(e.to_string()))?;
            print!("{text}");
        }
    }
    Ok(())
}

/// `auto`: colour only when stdout is a TTY, `NO_COLOR` is unset and `TERM` is not `dumb`.
pub fn use_color(mode: ColorMode) -> bool {
    match mode {
        ColorMode::Always => true,
        ColorMode::Never => false,
        ColorMode::Auto => decide_auto(
            std::io::stdout().is_terminal(),
            std::env::var_os("NO_COLOR").is_some(),
            std::env::var("TERM").ok().as_deref(),
        ),
    }
}

/// The pure `auto` rule.
pub fn decide_auto(tty: bool, no_color: bool, term: Option<&str>) -> bool {
    tty && !no_color && term != Some("dumb")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_colour_rule() {
        assert!(decide_auto(true, false, Some("xterm")));
        assert!(!decide_auto(false, false, Some("xterm")));
        assert!(!decide_auto(true, true, Some("xterm")));
        assert!(!decide_auto(true, false, Some("dumb")));
        assert!(decide_auto(true, false, None));
    }
}
