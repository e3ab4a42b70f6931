//! The summary `run` prints when its step is over: status, what did not hold, egress, the
//! log's notes, outputs, and the changes (file by file, or by directory when there are many).

use crate::output::say;

use serde_json::Value;

use super::changes;
use crate::output::inert;

/// What the summary says about how the step ran, besides its result.
pub(crate) struct StepNotes<'a> {
    /// The enforcement report (its rows that did not hold are printed).
    pub(crate) enforcement: Option<&'a Value>,
    /// The egress engine's summary.
    pub(crate) egress: Option<&'a Value>,
    /// The log's notes on the result and the output ([`changes::log_notes`]).
    pub(crate) log: &'a [Value],
    /// The step's commits, from the bundle's `changeNotes` (already read by the caller).
    pub(crate) commits: Option<&'a smithers_bundle::CommitSeries>,
}

pub(crate) fn print_summary(
    status: &str,
    termination: Option<&str>,
    exit_code: Option<i64>,
    outputs: Option<&Value>,
    bundle_path: &std::path::Path,
    changes: &[changes::FileChange],
    notes: StepNotes<'_>,
) {
    let StepNotes {
        enforcement,
        egress,
        log,
        commits,
    } = notes;
    let how = match (termination, exit_code) {
        (Some("exited"), Some(c)) => format!(" (exit {c})"),
        (Some(t), _) => format!(" ({})", inert(t)),
        _ => String::new(),
    };
    say!("status   {}{how}", inert(status));
    for line in not_held(enforcement) {
        say!("not held {line}");
    }
    for line in super::egress_summary::egress_lines(egress) {
        say!("{line}");
    }
    for line in log_lines(log) {
        say!("{line}");
    }
    match outputs {
        // The step's outputs as JSON, which leaves C1 and bidi characters raw: inert.
        Some(o) => say!("outputs  {}", inert(&o.to_string())),
        None => say!("outputs  -"),
    }
    say!("bundle   {}", inert(&bundle_path.display().to_string()));
    if let Some(series) = commits {
        say!(
            "commits  {} on {} (accept adds them on top of {})",
            series.commits.len(),
            inert(series.branch.as_deref().unwrap_or("a detached HEAD")),
            &series.base[..12.min(series.base.len())]
        );
        for c in &series.commits {
            say!("  {} {}", &c.oid[..12.min(c.oid.len())], inert(&c.subject));
        }
    }
    if changes.is_empty() {
        say!("patches  none");
    } else if changes.len() <= LIST_FILES_UP_TO {
        say!("patches");
        for line in changes::stat_lines(changes) {
            say!("  {line}");
        }
    } else {
        say!(
            "patches  {} files, by directory (each file: `review`, `run --json`)",
            changes.len()
        );
        for line in directory_summary(changes) {
            say!("  {line}");
        }
    }
}

/// Up to this many changed files, `run`'s summary lists each; past it, directories.
const LIST_FILES_UP_TO: usize = 50;

/// Directories shown in a summary by directory; the rest are one line.
const SUMMARY_DIRECTORIES: usize = 15;

/// Directory names that hold what tools make rather than what people write: a change there
/// is usually meant to be ignored.
const GENERATED_DIRS: &[&str] = &[
    "node_modules",
    "target",
    "dist",
    "build",
    ".venv",
    "venv",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".tox",
    ".next",
    ".nuxt",
    ".cache",
    ".gradle",
    ".terraform",
    "coverage",
    "vendor",
];

/// The directory a changed file is counted under in a summary: its path up to the first
/// generated directory (`packages/a/node_modules/`), else its top directory (`src/`); a file
/// at the top is its own entry.
fn summary_group(path: &str) -> &str {
    let mut end = 0;
    for (i, part) in path.match_indices('/') {
        let dir = &path[end..i];
        if GENERATED_DIRS.contains(&dir) {
            return &path[..=i];
        }
        end = i + part.len();
    }
    match path.find('/') {
        Some(i) => &path[..=i],
        None => path,
    }
}

/// `run`'s summary of many changed files: per directory (the largest first) its files, new
/// and deleted ones, and lines added and removed; the total; and, for a directory of what a
/// tool makes, the ignore rule that would have left it out of the change.
fn directory_summary(changes: &[changes::FileChange]) -> Vec<String> {
    #[derive(Default)]
    struct Group {
        files: usize,
        new: usize,
        deleted: usize,
        added: usize,
        removed: usize,
    }
    let mut groups: std::collections::HashMap<&str, Group> = Default::default();
    for c in changes {
        let g = groups.entry(summary_group(&c.path)).or_default();
        g.files += 1;
        g.new += usize::from(c.operation == "add");
        g.deleted += usize::from(c.operation == "delete");
        g.added += c.added;
        g.removed += c.removed;
    }
    let mut groups: Vec<(&str, Group)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.files.cmp(&a.1.files).then(a.0.cmp(b.0)));
    let names: Vec<String> = groups
        .iter()
        .take(SUMMARY_DIRECTORIES)
        .map(|(dir, _)| smithers_terminal::quote_path(dir))
        .collect();
    let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let mut lines = Vec::new();
    for ((_, g), name) in groups.iter().zip(&names) {
        let mut what = Vec::new();
        if g.new > 0 {
            what.push(format!("{} new", g.new));
        }
        if g.deleted > 0 {
            what.push(format!("{} deleted", g.deleted));
        }
        let what = if what.is_empty() {
            String::new()
        } else {
            format!(" ({})", what.join(", "))
        };
        lines.push(format!(
            "{name}{} {:>6} file{}{what}, +{} -{}",
            " ".repeat(width - name.chars().count()),
            g.files,
            if g.files == 1 { "" } else { "s" },
            g.added,
            g.removed
        ));
    }
    if groups.len() > SUMMARY_DIRECTORIES {
        let rest = &groups[SUMMARY_DIRECTORIES..];
        lines.push(format!(
            "... and {} more ({} files)",
            rest.len(),
            rest.iter().map(|(_, g)| g.files).sum::<usize>()
        ));
    }
    let (added, removed) = changes
        .iter()
        .fold((0, 0), |(a, r), c| (a + c.added, r + c.removed));
    lines.push(format!(
        "{} files changed, {added} insertion{}(+), {removed} deletion{}(-)",
        changes.len(),
        if added == 1 { "" } else { "s" },
        if removed == 1 { "" } else { "s" },
    ));
    // One hint per rule: `node_modules/` leaves out every directory of that name.
    let mut rules: Vec<&str> = Vec::new();
    for (dir, g) in &groups {
        let last = dir.strip_suffix('/').and_then(|d| d.rsplit('/').next());
        if let Some(last) = last.filter(|l| GENERATED_DIRS.contains(l) && g.new > 0) {
            if !rules.contains(&last) {
                rules.push(last);
                lines.push(format!(
                    "hint: {} holds what a tool made ({} new files): add {last}/ to .gitignore and such files stay out of the patches (listed as ignored)",
                    smithers_terminal::quote_path(dir),
                    g.new
                ));
            }
        }
    }
    lines
}

/// The log's notes for the step's summary: a refused result file, with why, and each stream
/// cut off at a cap, with the flag that raises it.
fn log_lines(log: &[Value]) -> Vec<String> {
    log.iter()
        .filter_map(|r| match r["type"].as_str()? {
            "resultRejected" => Some(format!(
                "result   not used: {} (outputs are null)",
                r["reason"].as_str().unwrap_or("?")
            )),
            "outputTruncated" => {
                let hint = match r["cap"].as_str() {
                    Some("bytes") => "raise it with --max-output",
                    Some("lines") => "raise it with --max-output-lines",
                    // A log of an older version.
                    _ => "the line cap of 100000 per stream was fixed",
                };
                let counts = match (r["notKeptBytes"].as_u64(), r["notKeptLines"].as_u64()) {
                    (Some(b), Some(l)) => format!(
                        "; {b} bytes ({l} lines) not kept in the bundle's log (all relayed)"
                    ),
                    _ => "; what was cut is not in the bundle".to_string(),
                };
                Some(format!(
                    "output   {}: {hint}{counts}",
                    r["message"].as_str().unwrap_or("cut off")
                ))
            }
            "logCut" => Some(format!(
                "log      {}",
                r["message"].as_str().unwrap_or("cut to fit the bundle")
            )),
            "egressRecordsDropped" => Some(format!(
                "egress   {} more decisions counted but not recorded (the record cap)",
                r["count"]
            )),
            _ => None,
        })
        .map(|l| inert(&l))
        .collect()
}

/// The protections of a step's enforcement report that did not hold (unavailable or
/// degraded), one line each: a limit this host could not give is said where the step's
/// result is, not only in `doctor`.
fn not_held(enforcement: Option<&Value>) -> Vec<String> {
    let rows = enforcement
        .and_then(|r| r["protections"].as_array())
        .into_iter()
        .flatten();
    rows.filter(|p| p["status"] == "unavailable" || p["status"] == "degraded")
        .map(|p| {
            inert(&format!(
                "{} ({}): {}",
                p["name"].as_str().unwrap_or("?"),
                p["status"].as_str().unwrap_or("?"),
                p["detail"].as_str().unwrap_or("")
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_changes_are_summarised_by_directory_with_the_ignore_rule() {
        let change = |path: &str, operation: &'static str| changes::FileChange {
            path: path.into(),
            operation,
            added: 2,
            removed: usize::from(operation == "modify"),
            binary: false,
            renamed: None,
        };
        let mut changes = vec![change("README.md", "modify"), change("src/a.rs", "modify")];
        for i in 0..120 {
            changes.push(change(&format!("node_modules/p{i}/index.js"), "add"));
            changes.push(change(&format!("web/node_modules/q{i}/x.js"), "add"));
        }
        assert_eq!(summary_group("node_modules/p1/index.js"), "node_modules/");
        assert_eq!(
            summary_group("web/node_modules/q/x.js"),
            "web/node_modules/"
        );
        assert_eq!(summary_group("src/deep/a.rs"), "src/");
        assert_eq!(summary_group("README.md"), "README.md");
        let lines = directory_summary(&changes);
        assert!(lines[0].starts_with("node_modules/ "), "{lines:#?}");
        assert!(
            lines[0].contains("120 files (120 new), +240 -0"),
            "{lines:#?}"
        );
        assert!(lines.iter().any(|l| l.starts_with("src/ ")), "{lines:#?}");
        assert!(
            lines.contains(&"242 files changed, 484 insertions(+), 2 deletions(-)".to_string()),
            "{lines:#?}"
        );
        let hints: Vec<&String> = lines.iter().filter(|l| l.starts_with("hint:")).collect();
        assert_eq!(hints.len(), 1, "{hints:#?}");
        assert!(
            hints[0].contains("add node_modules/ to .gitignore"),
            "{hints:#?}"
        );
    }
}
