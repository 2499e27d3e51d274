//! Plain aligned columns like kubectl's (three spaces between columns, upper-case headers),
//! with optional colour whose escape codes never disturb the alignment.

use owo_colors::OwoColorize;

/// A cell's colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Plain,
    Good,
    Warn,
    Bad,
    Dim,
}

/// Colour for a phase word.
pub fn phase_tone(phase: &str) -> Tone {
    match phase {
        "Running" | "Active" | "Hibernated" | "Suspended" | "True" => Tone::Good,
        "Failed" | "False" => Tone::Bad,
        "" | "-" => Tone::Dim,
        _ => Tone::Warn,
    }
}

/// One table cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub text: String,
    pub tone: Tone,
}

impl Cell {
    pub fn plain(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            tone: Tone::Plain,
        }
    }
    pub fn toned(text: impl Into<String>, tone: Tone) -> Cell {
        Cell {
            text: text.into(),
            tone,
        }
    }
}

fn paint(text: &str, tone: Tone) -> String {
    match tone {
        Tone::Plain => format!("{text}\x1b[0m"),
        Tone::Good => text.green().to_string(),
        Tone::Warn => text.yellow().to_string(),
        Tone::Bad => text.red().to_string(),
        Tone::Dim => text.dimmed().to_string(),
    }
}

/// Renders rows under headers. With `color`, every cell carries an escape sequence (a plain
/// reset when it has no colour), so widths stay stable whatever the cell.
pub fn render(headers: &[&str], rows: &[Vec<Cell>], color: bool) -> String {
    render_with(headers, rows, color, true)
}

/// [`render`], with or without the header line (`--no-headers`). comfy-table lays the columns
/// out (`custom_styling` measures widths without the escape codes); the `NOTHING` preset with
/// a right padding of 3 gives kubectl's layout, and lines end without trailing blanks.
pub fn render_with(
    headers: &[&str],
    rows: &[Vec<Cell>],
    color: bool,
    show_headers: bool,
) -> String {
    let cols = headers.len();
    let shown = |text: &str, tone: Tone| {
        if color {
            paint(text, tone)
        } else {
            text.to_string()
        }
    };
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled);
    if show_headers {
        t.set_header(
            headers
                .iter()
                .map(|h| shown(&h.to_uppercase(), Tone::Plain)),
        );
    }
    for row in rows {
        let mut cells: Vec<String> = row
            .iter()
            .take(cols)
            .map(|c| shown(&c.text, c.tone))
            .collect();
        while cells.len() < cols {
            cells.push(shown("", Tone::Plain));
        }
        t.add_row(cells);
    }
    for col in t.column_iter_mut() {
        col.set_padding((0, 3));
    }
    if t.row_iter().next().is_none() && !show_headers {
        return String::new();
    }
    let mut out = String::new();
    for line in t.lines() {
        out.push_str(line.trim_end_matches(' '));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_like_kubectl() {
        let rows = vec![
            vec![
                Cell::plain("demo"),
                Cell::toned("Running", Tone::Good),
                Cell::plain("3/3"),
            ],
            vec![
                Cell::plain("a-much-longer-name"),
                Cell::toned("Suspending", Tone::Warn),
                Cell::plain("0/1"),
            ],
        ];
        let text = render(&["name", "phase", "ready"], &rows, false);
        assert_eq!(
            text,
            "NAME                 PHASE        READY\n\
             demo                 Running      3/3\n\
             a-much-longer-name   Suspending   0/1\n"
        );
    }

    #[test]
    fn no_headers_drops_only_the_header_line() {
        let rows = vec![vec![Cell::plain("demo"), Cell::plain("Running")]];
        assert_eq!(
            render_with(&["name", "phase"], &rows, false, false),
            "demo   Running\n"
        );
        assert_eq!(render_with(&["name"], &[], false, false), "");
    }

    #[test]
    fn short_rows_are_filled_and_unicode_widths_count_as_shown() {
        let rows = vec![
            vec![Cell::plain("zoë")],
            vec![Cell::plain("a"), Cell::plain("b")],
        ];
        assert_eq!(
            render(&["name", "x"], &rows, false),
            "NAME   X\nzoë\na      b\n"
        );
    }

    #[test]
    fn colour_keeps_every_cell_escaped_and_columns_aligned() {
        let rows = vec![vec![Cell::plain("x"), Cell::toned("Failed", Tone::Bad)]];
        let text = render(&["name", "phase"], &rows, true);
        let strip = |s: &str| {
            let mut out = String::new();
            let mut esc = false;
            for c in s.chars() {
                if c == '\x1b' {
                    esc = true;
                } else if esc {
                    if c == 'm' {
                        esc = false;
                    }
                } else {
                    out.push(c);
                }
            }
            out
        };
        assert_eq!(strip(&text), render(&["name", "phase"], &rows, false));
        assert!(text.lines().all(|l| l.contains('\x1b')));
    }
}
