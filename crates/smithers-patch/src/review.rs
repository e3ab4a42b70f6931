//! Review rendering: a `git diff --stat`-like summary plus the (optionally coloured) diff.

use serde::{Deserialize, Serialize};

use crate::patch::{FilePatch, PatchBody};

/// Per-path statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileStat {
    pub path: String,
    pub added: usize,
    pub removed: usize,
    /// For binary changes: (old bytes, new bytes).
    pub binary: Option<(u64, u64)>,
}

/// Options of [`render_review`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ReviewOptions {
    /// Emit ANSI colours.
    pub color: bool,
}

/// Counts lines that start with `+` or `-` but not `+++` or `---` (the spec's
/// `totalDiffLines`).
pub fn total_diff_lines(patch_text: &str) -> usize {
    patch_text
        .lines()
        .filter(|l| {
            (l.starts_with('+') && !l.starts_with("+++"))
                || (l.starts_with('-') && !l.starts_with("---"))
        })
        .count()
}

/// Statistics per path (the sections of a type change are merged), in input order.
pub fn diff_stats(patches: &[FilePatch]) -> Vec<FileStat> {
    let mut out: Vec<FileStat> = Vec::new();
    for p in patches {
        let (added, removed) = p.line_stats();
        let binary = match &p.body {
            PatchBody::Binary { forward, reverse } => Some((
                reverse.as_ref().map_or(0, |r| r.result_len()),
                forward.result_len(),
            )),
            _ => None,
        };
        if let Some(s) = out.iter_mut().find(|s| s.path == p.path) {
            s.added += added;
            s.removed += removed;
            s.binary = match (s.binary, binary) {
                (Some((o, _)), Some((_, n))) => Some((o, n)),
                (a, b) => a.or(b),
            };
        } else {
            out.push(FileStat {
                path: p.path.clone(),
                added,
                removed,
                binary,
            });
        }
    }
    out
}

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[m";

/// Widest `+`/`-` bar of the stat block, like git on an 80-column terminal.
const BAR_WIDTH: usize = 40;

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The stat block, the summary line, then the unified diff of every patch.
pub fn render_review(patches: &[FilePatch], opts: &ReviewOptions) -> String {
    let c = |code: &'static str| if opts.color { code } else { "" };
    let stats = diff_stats(patches);
    let name_w = stats
        .iter()
        .map(|s| s.path.chars().count())
        .max()
        .unwrap_or(0);
    let max_change = stats.iter().map(|s| s.added + s.removed).max().unwrap_or(0);
    let num_w = max_change.to_string().len();
    let mut out = String::new();
    let (mut ins, mut del) = (0, 0);
    for s in &stats {
        ins += s.added;
        del += s.removed;
        let pad = name_w - s.path.chars().count();
        out.push_str(&format!(" {}{} | ", s.path, " ".repeat(pad)));
        if let Some((o, n)) = s.binary {
            out.push_str(&format!("Bin {o} -> {n} bytes\n"));
            continue;
        }
        let total = s.added + s.removed;
        let (mut a, mut d) = (s.added, s.removed);
        if max_change > BAR_WIDTH {
            a = (s.added * BAR_WIDTH).div_ceil(max_change);
            d = (s.removed * BAR_WIDTH).div_ceil(max_change);
        }
        out.push_str(&format!(
            "{total:>num_w$} {}{}{}{}{}{}\n",
            c(GREEN),
            "+".repeat(a),
            c(RESET),
            c(RED),
            "-".repeat(d),
            c(RESET)
        ));
    }
    let mut summary = format!(" {}", plural(stats.len(), "file changed", "files changed"));
    if ins > 0 || del == 0 {
        summary.push_str(&format!(
            ", {}",
            plural(ins, "insertion(+)", "insertions(+)")
        ));
    }
    if del > 0 || ins == 0 {
        summary.push_str(&format!(", {}", plural(del, "deletion(-)", "deletions(-)")));
    }
    out.push_str(&summary);
    out.push_str("\n\n");
    for p in patches {
        for line in p.render().split_inclusive('\n') {
            let colour = if line.starts_with("diff --git")
                || line.starts_with("index ")
                || line.starts_with("--- ")
                || line.starts_with("+++ ")
                || line.starts_with("new file mode")
                || line.starts_with("deleted file mode")
                || line.starts_with("old mode")
                || line.starts_with("new mode")
            {
                BOLD
            } else if line.starts_with("@@") {
                CYAN
            } else if line.starts_with('+') {
                GREEN
            } else if line.starts_with('-') {
                RED
            } else {
                ""
            };
            if opts.color && !colour.is_empty() {
                out.push_str(colour);
                out.push_str(line.trim_end_matches('\n'));
                out.push_str(RESET);
                out.push('\n');
            } else {
                out.push_str(line);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GitMode;
    use crate::patch::text_hunks;

    #[test]
    fn counts_diff_lines_not_headers() {
        let t = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n c\n";
        assert_eq!(total_diff_lines(t), 2);
    }

    #[test]
    fn review_has_stat_and_total() {
        let p = FilePatch {
            path: "src/lib.rs".into(),
            old_mode: Some(GitMode::File),
            new_mode: Some(GitMode::File),
            old_oid: None,
            new_oid: None,
            body: PatchBody::Text(text_hunks("a\nb\n", "a\nc\nd\n")),
        };
        let r = render_review(std::slice::from_ref(&p), &ReviewOptions { color: false });
        assert!(
            r.starts_with(" src/lib.rs | 3 ++-\n 1 file changed, 2 insertions(+), 1 deletion(-)\n"),
            "{r}"
        );
        let colored = render_review(&[p], &ReviewOptions { color: true });
        assert!(colored.contains("\x1b[32m+c\x1b[m"), "{colored}");
    }
}
