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
    let cols = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            widths[i] = widths[i].max(cell.text.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<(String, Tone)>, out: &mut String| {
        let last = cells.len().saturating_sub(1);
        for (i, (text, tone)) in cells.into_iter().enumerate() {
            let pad = widths[i].saturating_sub(text.chars().count());
            let shown = if color { paint(&text, tone) } else { text };
            out.push_str(&shown);
            if i < last {
                out.push_str(&" ".repeat(pad + 3));
            }
        }
        out.push('\n');
    };
    line(
        headers
            .iter()
            .map(|h| (h.to_uppercase(), Tone::Plain))
            .collect(),
        &mut out,
    );
    for row in rows {
        let mut cells: Vec<(String, Tone)> = row
            .iter()
            .take(cols)
            .map(|c| (c.text.clone(), c.tone))
            .collect();
        while cells.len() < cols {
            cells.push((String::new(), Tone::Plain));
        }
        line(cells, &mut out);
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
