//! Review rendering: warnings (control characters, files that run on the host), a
//! `git diff --stat`-like summary, then the (optionally coloured) diff, all made inert through
//! `smithers_terminal` so that a change cannot hide or forge a line of its own review.

use serde::{Deserialize, Serialize};

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::findings::{ReviewFindings, RiskyPath};
use crate::patch::{FilePatch, LineKind, PatchBody};
use crate::reviewtext::PatchReview;

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

/// Statistics per path (the sections of a type change are merged), in input order; files
/// carried as git binary patches counted as the text git sees in them, as far as the patches
/// carry it ([`PatchReview::stats`] with the host tree reads the rest).
pub fn diff_stats(patches: &[FilePatch]) -> Vec<FileStat> {
    PatchReview::new(patches, None).stats()
}

impl PatchReview<'_> {
    /// Lines added and removed by section `i`, and its sizes (old, new) when it is shown as
    /// binary.
    fn section_stats(&self, i: usize) -> (usize, usize, Option<(u64, u64)>) {
        let p = &self.patches[i];
        if let Some(hunks) = &self.texts[i] {
            let kinds = hunks.iter().flat_map(|h| h.lines.iter().map(|(k, _)| *k));
            let (mut added, mut removed) = (0, 0);
            for k in kinds {
                match k {
                    LineKind::Add => added += 1,
                    LineKind::Remove => removed += 1,
                    LineKind::Context => {}
                }
            }
            return (added, removed, None);
        }
        let (added, removed) = p.line_stats();
        let binary = match &p.body {
            PatchBody::Binary { forward, reverse } => Some((
                reverse.as_ref().map_or(0, |r| r.result_len()),
                forward.result_len(),
            )),
            _ => None,
        };
        (added, removed, binary)
    }

    /// Statistics per path (the sections of a type change are merged), in input order, as
    /// `git diff --numstat` counts them.
    pub fn stats(&self) -> Vec<FileStat> {
        let mut out: Vec<FileStat> = Vec::new();
        // A path's stats are found through this index, not by a search of `out`: with a
        // search, 40k changed files took 12 s here (quadratic), now linear.
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, p) in self.patches.iter().enumerate() {
            let (added, removed, binary) = self.section_stats(i);
            if let Some(s) = index.get(p.path.as_str()).map(|&i| &mut out[i]) {
                s.added += added;
                s.removed += removed;
                s.binary = match (s.binary, binary) {
                    (Some((o, _)), Some((_, n))) => Some((o, n)),
                    (a, b) => a.or(b),
                };
            } else {
                index.insert(p.path.as_str(), out.len());
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
}

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const WARN: &str = "\x1b[1;33m";
const RESET: &str = "\x1b[m";

/// Widest `+`/`-` bar of the stat block, like git on an 80-column terminal.
const BAR_WIDTH: usize = 40;

/// The largest `.git/config` read for `core.hooksPath` (a real one is a few KiB).
const MAX_GIT_CONFIG_BYTES: u64 = 1 << 20;

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Left-out entries shown in a human review; the rest are counted (all are in `--json`).
const LEFT_OUT_SHOWN: usize = 20;

/// Where a [`RiskRule`] matches.
#[derive(Debug, Clone, Copy)]
enum Scope {
    /// `pattern` is the whole path (a file at the top of the tree).
    TopFile,
    /// Everything below the top-level directory `pattern`.
    TopDir,
    /// A file named `pattern` (one or more components) at any depth.
    AnyFile,
    /// Everything below a directory named `pattern` at any depth.
    AnyDir,
}

#[derive(Debug)]
struct RiskRule {
    pattern: &'static str,
    scope: Scope,
    reason: &'static str,
}

/// Files something on the host executes, or reads to decide what to execute, *without the
/// user asking for that file*: opening the folder in an editor, `cd` into it, `git commit`,
/// `git push`. Ordinary code (a `Makefile`, `package.json` scripts, tests, `setup.py`) is not
/// listed: it runs only when the user runs it, and reviewing it is what the diff is for.
/// Each entry says why it is here.
const RISK_RULES: &[RiskRule] = &[
    // git runs hooks on commit, checkout, merge, push; its config names programs it runs
    // (core.hooksPath, core.fsmonitor, core.pager, ...). Patches never write `.git/` (apply
    // refuses), so this only fires if that rule is ever broken; nested repositories too.
    RiskRule {
        pattern: ".git",
        scope: Scope::AnyDir,
        reason: "git metadata: git runs hooks and programs its config names",
    },
    // husky points core.hooksPath at `.husky/` (on `npm install`); its scripts run on commit.
    RiskRule {
        pattern: ".husky",
        scope: Scope::TopDir,
        reason: "git hooks (husky): run on commit and push",
    },
    // The conventional core.hooksPath directory.
    RiskRule {
        pattern: ".githooks",
        scope: Scope::TopDir,
        reason: "git hooks directory: run on commit and push once core.hooksPath names it",
    },
    // The pre-commit framework and lefthook run what these list on every commit once installed.
    RiskRule {
        pattern: ".pre-commit-config.yaml",
        scope: Scope::TopFile,
        reason: "pre-commit hooks: run on every commit",
    },
    RiskRule {
        pattern: "lefthook.yml",
        scope: Scope::TopFile,
        reason: "lefthook git hooks: run on commit and push",
    },
    RiskRule {
        pattern: ".lefthook.yml",
        scope: Scope::TopFile,
        reason: "lefthook git hooks: run on commit and push",
    },
    // An in-tree git config a setup script includes (`include.path`) can set core.hooksPath.
    RiskRule {
        pattern: ".gitconfig",
        scope: Scope::AnyFile,
        reason: "git config: can name hooks and programs git runs once included",
    },
    // VS Code runs tasks with `runOn: folderOpen` on opening the folder; settings name the
    // executables it starts (interpreters, linters, terminal env); launch configurations run
    // a preLaunchTask. Any depth: a subfolder can be opened as a workspace.
    RiskRule {
        pattern: ".vscode/tasks.json",
        scope: Scope::AnyFile,
        reason: "editor tasks: VS Code can run them on opening the folder",
    },
    RiskRule {
        pattern: ".vscode/settings.json",
        scope: Scope::AnyFile,
        reason: "editor settings: name programs VS Code and its extensions start",
    },
    RiskRule {
        pattern: ".vscode/launch.json",
        scope: Scope::AnyFile,
        reason: "editor launch configurations: run pre-launch tasks",
    },
    // JetBrains IDEs keep run configurations and startup tasks here.
    RiskRule {
        pattern: ".idea",
        scope: Scope::AnyDir,
        reason: "JetBrains project settings: run configurations and startup tasks",
    },
    // Dev containers run postCreate/postStart commands when the folder is opened in one.
    RiskRule {
        pattern: ".devcontainer",
        scope: Scope::TopDir,
        reason: "dev container: its commands run when the folder is opened",
    },
    // CI runs these on push, with the repository's secrets.
    RiskRule {
        pattern: ".github/workflows",
        scope: Scope::TopDir,
        reason: "CI workflow: runs on push with the repository's secrets",
    },
    RiskRule {
        pattern: ".github/actions",
        scope: Scope::TopDir,
        reason: "CI action used by workflows: runs on push",
    },
    RiskRule {
        pattern: ".gitlab-ci.yml",
        scope: Scope::TopFile,
        reason: "CI pipeline: runs on push",
    },
    RiskRule {
        pattern: ".circleci",
        scope: Scope::TopDir,
        reason: "CI pipeline: runs on push",
    },
    RiskRule {
        pattern: ".travis.yml",
        scope: Scope::TopFile,
        reason: "CI pipeline: runs on push",
    },
    RiskRule {
        pattern: "azure-pipelines.yml",
        scope: Scope::TopFile,
        reason: "CI pipeline: runs on push",
    },
    RiskRule {
        pattern: "bitbucket-pipelines.yml",
        scope: Scope::TopFile,
        reason: "CI pipeline: runs on push",
    },
    RiskRule {
        pattern: "Jenkinsfile",
        scope: Scope::TopFile,
        reason: "CI pipeline: runs on push",
    },
    RiskRule {
        pattern: ".buildkite",
        scope: Scope::TopDir,
        reason: "CI pipeline: runs on push",
    },
    // direnv runs `.envrc` on `cd` into the directory (once allowed); mise runs its hooks on
    // `cd` and, like asdf, `.tool-versions` picks which binary `node`, `python`, ... are
    // for every command run there.
    RiskRule {
        pattern: ".envrc",
        scope: Scope::AnyFile,
        reason: "direnv: runs on cd into the directory",
    },
    RiskRule {
        pattern: "mise.toml",
        scope: Scope::AnyFile,
        reason: "mise: its hooks and env run on cd into the directory",
    },
    RiskRule {
        pattern: ".mise.toml",
        scope: Scope::AnyFile,
        reason: "mise: its hooks and env run on cd into the directory",
    },
    RiskRule {
        pattern: ".tool-versions",
        scope: Scope::AnyFile,
        reason: "asdf/mise: picks the tool binaries every command there runs",
    },
];

fn rule_matches(rule: &RiskRule, path: &str) -> bool {
    let p = rule.pattern;
    let below = |dir: &str| {
        path.strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
    };
    match rule.scope {
        Scope::TopFile => path == p,
        Scope::TopDir => below(p),
        Scope::AnyFile => path == p || path.ends_with(&format!("/{p}")),
        Scope::AnyDir => below(p) || path.contains(&format!("/{p}/")),
    }
}

/// Why `path` runs on the host, if it does: the first matching rule, else a `core.hooksPath`
/// directory (tree-relative, from the host's or a patched git config) it lies in.
/// Why the host runs the file at `path` by itself (a hook, a CI workflow, `.envrc`, an
/// editor task...), or `None`: the rule the review's warnings use, for any list of paths
/// (a commit's files too).
pub fn runs_on_host(path: &str, hooks_dirs: &[String]) -> Option<String> {
    risk_of(path, hooks_dirs)
}

fn risk_of(path: &str, hooks_dirs: &[String]) -> Option<String> {
    if let Some(rule) = RISK_RULES.iter().find(|r| rule_matches(r, path)) {
        return Some(rule.reason.to_string());
    }
    hooks_dirs
        .iter()
        .find(|d| {
            d.is_empty()
                || path
                    .strip_prefix(d.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        })
        .map(|d| {
            format!(
                "git hook: in {}, which core.hooksPath names",
                smithers_terminal::quote_path(if d.is_empty() { "." } else { d })
            )
        })
}

/// The `core.hooksPath` values set in git config text, raw. Lines outside any section count
/// too (a patch hunk may not show the section header), so a fragment errs towards flagging.
pub fn hooks_paths_in_config(text: &str) -> Vec<String> {
    let mut section: Option<String> = None;
    let mut out = Vec::new();
    for raw in text.lines() {
        let line = raw.trim();
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.split([']', ' ', '"']).next().unwrap_or("");
            section = Some(name.to_ascii_lowercase());
            continue;
        }
        if section.as_deref().is_some_and(|s| s != "core") {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.trim().eq_ignore_ascii_case("hookspath") {
            out.push(config_value(value));
        }
    }
    out
}

/// A git config value: quoted (up to the closing quote) or bare (up to a comment).
fn config_value(value: &str) -> String {
    let v = value.trim();
    match v.strip_prefix('"') {
        Some(q) => q.split('"').next().unwrap_or("").to_string(),
        None => v.split(['#', ';']).next().unwrap_or("").trim().to_string(),
    }
}

/// A hooks path as a directory relative to the tree's top, if it is inside the tree: git
/// resolves a relative one against the top of the work tree; an absolute one counts when it
/// is below `root`. `~` paths and paths leaving the tree are outside what a patch can write.
pub fn tree_relative_hooks_dir(value: &str, root: Option<&Path>) -> Option<String> {
    let v = value.trim();
    if v.is_empty() || v.starts_with('~') {
        return None;
    }
    let rel = if v.starts_with('/') {
        let root = root?;
        Path::new(v).strip_prefix(root).ok()?.to_str()?.to_string()
    } else {
        v.to_string()
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in rel.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

/// The `core.hooksPath` directories the host's own `<root>/.git/config` names, tree-relative.
/// Read through [`smithers_paths::Beneath`] (no link followed, at most 1 MiB): the tree is
/// untrusted. A missing or unreadable config (or a `.git` file of a linked worktree) names
/// none; the patched config files are still checked by [`review_findings`].
pub fn host_hooks_dirs(root: &Path) -> Vec<String> {
    let Ok(beneath) = smithers_paths::Beneath::open(root) else {
        return Vec::new();
    };
    let Ok(Some(bytes)) = beneath.read_regular(Path::new(".git/config"), MAX_GIT_CONFIG_BYTES)
    else {
        return Vec::new();
    };
    hooks_paths_in_config(&String::from_utf8_lossy(&bytes))
        .iter()
        .filter_map(|v| tree_relative_hooks_dir(v, Some(root)))
        .collect()
}

/// Whether a patched file is a git config whose hooks path matters.
fn is_git_config(path: &str) -> bool {
    path == ".gitconfig"
        || path.ends_with("/.gitconfig")
        || path == ".git/config"
        || path.ends_with("/.git/config")
        || path == ".config/git/config"
}

/// A hunk line's text without its line ending (`\n`, or `\r\n`: a CR that ends a line hides
/// nothing and is not counted as a control character), and whether it had that CR.
fn split_line_end(text: &[u8]) -> (&[u8], bool) {
    let t = text.strip_suffix(b"\n").unwrap_or(text);
    match t.strip_suffix(b"\r") {
        Some(t) => (t, true),
        None => (t, false),
    }
}

/// Whether a line's bytes hold control characters. UTF-8 is judged as any text; a byte that
/// is not UTF-8 counts when it is a C1 control in the 8-bit character sets such files are
/// written in (0x80-0x9f: CSI, OSC, ... in ISO 8859, which a terminal set to one obeys), not
/// when it is a letter there (Latin-1 `\xe9`): shown escaped either way, but only the former
/// is something to warn about.
fn bytes_have_controls(line: &[u8], how: smithers_terminal::Inert) -> bool {
    line.utf8_chunks().any(|c| {
        smithers_terminal::has_controls(c.valid(), how)
            || c.invalid().iter().any(|b| (0x80..0xa0).contains(b))
    })
}

impl PatchReview<'_> {
    /// The text section `i` adds or keeps (context and added lines), for reading config out
    /// of it.
    fn new_side_text(&self, i: usize) -> String {
        let kept = |k: &LineKind| *k != LineKind::Remove;
        if let Some(hunks) = &self.texts[i] {
            let bytes: Vec<u8> = hunks
                .iter()
                .flat_map(|h| h.lines.iter())
                .filter(|(k, _)| kept(k))
                .flat_map(|(_, t)| t.iter().copied())
                .collect();
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        let PatchBody::Text(hunks) = &self.patches[i].body else {
            return String::new();
        };
        hunks
            .iter()
            .flat_map(|h| h.lines.iter())
            .filter(|l| kept(&l.kind))
            .map(|l| l.text.as_str())
            .collect()
    }

    /// Whether section `i`'s name, headings or changed lines hold control characters.
    fn has_controls(&self, i: usize) -> bool {
        use smithers_terminal::{has_controls, Inert};
        let p = &self.patches[i];
        if has_controls(&p.path, Inert::LINE) {
            return true;
        }
        if let Some(hunks) = &self.texts[i] {
            return hunks.iter().any(|h| {
                bytes_have_controls(&h.heading, Inert::BODY)
                    || h.lines
                        .iter()
                        .any(|(_, t)| bytes_have_controls(split_line_end(t).0, Inert::BODY))
            });
        }
        let PatchBody::Text(hunks) = &p.body else {
            return false;
        };
        hunks.iter().any(|h| {
            has_controls(&h.heading, Inert::BODY)
                || h.lines
                    .iter()
                    .any(|l| bytes_have_controls(split_line_end(l.text.as_bytes()).0, Inert::BODY))
        })
    }

    /// What the reviewer must be warned about: files with control characters, files that
    /// run on the host, and binary-carried files not shown as text. `host_hooks_dirs` are the
    /// tree-relative `core.hooksPath` directories of the host's repository
    /// ([`host_hooks_dirs`]); those set by patched git config files are added.
    pub fn findings(&self, host_hooks_dirs: &[String]) -> ReviewFindings {
        let mut hooks: Vec<String> = host_hooks_dirs.to_vec();
        for (i, p) in self.patches.iter().enumerate() {
            if is_git_config(&p.path) {
                hooks.extend(
                    hooks_paths_in_config(&self.new_side_text(i))
                        .iter()
                        .filter_map(|v| tree_relative_hooks_dir(v, None)),
                );
            }
        }
        let mut findings = ReviewFindings {
            not_shown_as_text: self.unread.clone(),
            ..ReviewFindings::default()
        };
        // Paths already named, so that a type change (two sections of one path) is named
        // once; sets, not searches of the lists: a step can make every one of 100k files a
        // finding.
        let mut with_controls: HashSet<&str> = HashSet::new();
        let mut judged: HashSet<&str> = HashSet::new();
        for (i, p) in self.patches.iter().enumerate() {
            if self.has_controls(i) && with_controls.insert(p.path.as_str()) {
                findings.control_characters.push(p.path.clone());
            }
            if !judged.insert(p.path.as_str()) {
                continue;
            }
            if let Some(reason) = risk_of(&p.path, &hooks) {
                findings.runs_on_host.push(RiskyPath {
                    path: p.path.clone(),
                    reason,
                });
            }
        }
        findings
    }
}

/// What the reviewer must be warned about ([`PatchReview::findings`] of the patches alone).
pub fn review_findings(patches: &[FilePatch], host_hooks_dirs: &[String]) -> ReviewFindings {
    PatchReview::new(patches, None).findings(host_hooks_dirs)
}

/// The warning lines of `findings`, as the review shows them above the stat block (one per
/// line, each ending in `\n`; empty when there is nothing to say). For other summaries of a
/// change waiting for review (`run`'s).
pub fn render_findings(findings: &ReviewFindings, color: bool) -> String {
    let c = |code: &'static str| if color { code } else { "" };
    let mut text = render_warnings(findings, &c);
    // render_warnings ends its block with a blank line, for the stat block below it.
    if text.ends_with("\n\n") {
        text.pop();
    }
    text
}

/// A change's path string as git shows it: quoted (core.quotePath) from its bytes, so a
/// name that is not UTF-8, held in its quoted form ([`crate::path_to_bytes`]), is not
/// quoted twice.
pub fn shown_path(path: &str) -> String {
    match crate::model::path_to_bytes(path) {
        Some(bytes) => smithers_terminal::quote_path_bytes(&bytes),
        None => smithers_terminal::quote_path(path),
    }
}

/// The warning lines shown above the review (none when there is nothing to say).
fn render_warnings(findings: &ReviewFindings, c: &dyn Fn(&'static str) -> &'static str) -> String {
    let mut out = String::new();
    if !findings.control_characters.is_empty() {
        let names: Vec<String> = findings
            .control_characters
            .iter()
            .map(|p| shown_path(p))
            .collect();
        out.push_str(&format!(
            "{}warning: control characters in this change, shown escaped (^X, \\u{{..}}, \\xNN), never sent to the terminal:{} {}\n",
            c(WARN),
            c(RESET),
            names.join(", ")
        ));
    }
    for r in &findings.runs_on_host {
        out.push_str(&format!(
            "{}warning: runs on the host:{} {} ({})\n",
            c(WARN),
            c(RESET),
            shown_path(&r.path),
            smithers_terminal::line(&r.reason)
        ));
    }
    if !findings.host_changed.is_empty() {
        let names: Vec<String> = findings
            .host_changed
            .iter()
            .map(|p| shown_path(p))
            .collect();
        out.push_str(&format!(
            "{}warning: changed on the host meanwhile:{} {} (the host edited these while the step ran; their diff below is against the host's newer version, so accept refuses them as conflicts)\n",
            c(WARN),
            c(RESET),
            names.join(", ")
        ));
    }
    for u in &findings.not_shown_as_text {
        out.push_str(&format!(
            "{}warning: shown by size only, not as text:{} {} ({})\n",
            c(WARN),
            c(RESET),
            shown_path(&u.path),
            smithers_terminal::line(&u.reason)
        ));
    }
    for l in findings.left_out.iter().take(LEFT_OUT_SHOWN) {
        out.push_str(&format!(
            "note: left out of the patches: {} ({})\n",
            shown_path(&l.path),
            smithers_terminal::line(&l.reason)
        ));
    }
    let more =
        findings.left_out.len().saturating_sub(LEFT_OUT_SHOWN) as u64 + findings.left_out_unlisted;
    if more > 0 {
        out.push_str(&format!(
            "note: and {more} more left out (all of them: --json, and the bundle's log)\n"
        ));
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// The stat block and the summary line; names quoted as git quotes them.
fn render_stats(stats: &[FileStat], c: &dyn Fn(&'static str) -> &'static str) -> String {
    let names: Vec<String> = stats.iter().map(|s| shown_path(&s.path)).collect();
    let name_w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let max_change = stats.iter().map(|s| s.added + s.removed).max().unwrap_or(0);
    let num_w = max_change.to_string().len();
    let mut out = String::new();
    let (mut ins, mut del) = (0, 0);
    for (s, name) in stats.iter().zip(&names) {
        ins += s.added;
        del += s.removed;
        let pad = name_w - name.chars().count();
        out.push_str(&format!(" {name}{} | ", " ".repeat(pad)));
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
    out.push('\n');
    out
}

impl PatchReview<'_> {
    /// Section `i` as git renders it: the patch itself, or for a binary-carried file shown
    /// as text, its header and the decoded hunks (bytes that need not be UTF-8).
    fn rendered(&self, i: usize) -> Vec<u8> {
        let p = &self.patches[i];
        let Some(hunks) = &self.texts[i] else {
            return p.render().into_bytes();
        };
        let mut out = p.render_header().into_bytes();
        if !hunks.is_empty() {
            out.extend_from_slice(p.file_labels().as_bytes());
            for h in hunks {
                h.render(&mut out);
            }
        }
        out
    }

    /// Section `i`'s diff, every line made inert. Lines are classified by position, not by
    /// how they look: the header is everything before the first hunk (or binary body), so an
    /// added line reading `+++ b/x` or `diff --git` is coloured and shown as the added line
    /// it is.
    fn render_diff(&self, i: usize, color: bool, out: &mut String) {
        use smithers_terminal::{escape_bytes_into, Inert};
        let mut in_header = true;
        for line in self.rendered(i).split_inclusive(|b| *b == b'\n') {
            if line.starts_with(b"@@") || line.starts_with(b"GIT binary patch") {
                in_header = false;
            }
            let (body, cr) = split_line_end(line);
            let colour = if in_header {
                BOLD
            } else if body.starts_with(b"@@") {
                CYAN
            } else if body.starts_with(b"+") {
                GREEN
            } else if body.starts_with(b"-") {
                RED
            } else {
                ""
            };
            let styled = color && !colour.is_empty();
            if styled {
                out.push_str(colour);
            }
            // Bytes that are not UTF-8 (a binary-carried file shown as text) as `\xNN`.
            escape_bytes_into(out, body, Inert::BODY.marked(color));
            if cr {
                // The CR of a CRLF line ending: shown, so the line's bytes are all visible.
                escape_bytes_into(out, b"\r", Inert::BODY.marked(color));
            }
            if styled {
                out.push_str(RESET);
            }
            out.push('\n');
        }
    }

    /// The warnings, the stat block, the summary line, then the unified diff of every patch.
    /// Everything from the patches is made inert (`smithers_terminal`): names quoted as git
    /// quotes them, control characters in content shown escaped. `findings` are the ones
    /// the caller computed ([`PatchReview::findings`], with the host's hooks directories and
    /// whatever else it adds).
    pub fn render(&self, opts: &ReviewOptions, findings: &ReviewFindings) -> String {
        let c = |code: &'static str| if opts.color { code } else { "" };
        let mut out = render_warnings(findings, &c);
        out.push_str(&render_stats(&self.stats(), &c));
        out.push('\n');
        for i in 0..self.patches.len() {
            self.render_diff(i, opts.color, &mut out);
        }
        out
    }
}

/// The warnings, the stat block, the summary line, then the unified diff of every patch
/// ([`PatchReview::render`] of the patches alone).
pub fn render_review(patches: &[FilePatch], opts: &ReviewOptions) -> String {
    let review = PatchReview::new(patches, None);
    review.render(opts, &review.findings(&[]))
}

/// [`render_review`] with findings the caller computed ([`review_findings`] with the host's
/// hooks directories).
pub fn render_review_with(
    patches: &[FilePatch],
    opts: &ReviewOptions,
    findings: &ReviewFindings,
) -> String {
    PatchReview::new(patches, None).render(opts, findings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{quote_git_path, GitMode};
    use crate::patch::{text_hunks, Hunk, HunkLine};

    fn modify(path: &str, old: &str, new: &str) -> FilePatch {
        FilePatch {
            path: path.into(),
            old_mode: Some(GitMode::File),
            new_mode: Some(GitMode::File),
            old_oid: None,
            new_oid: None,
            body: PatchBody::Text(text_hunks(old, new)),
        }
    }

    fn add(path: &str, new: &str) -> FilePatch {
        FilePatch {
            old_mode: None,
            ..modify(path, "", new)
        }
    }

    /// Every escape sequence in `s` is one of the review's own SGR codes.
    fn only_our_escapes(s: &str) -> bool {
        let mut rest = s.to_string();
        for ours in [
            WARN,
            BOLD,
            CYAN,
            GREEN,
            RED,
            RESET,
            smithers_terminal::MARK_ON,
            smithers_terminal::MARK_OFF,
        ] {
            rest = rest.replace(ours, "");
        }
        !rest.contains('\x1b') && !rest.contains('\u{9b}') && !rest.contains('\r')
    }

    #[test]
    fn counts_diff_lines_not_headers() {
        let t = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n c\n";
        assert_eq!(total_diff_lines(t), 2);
    }

    #[test]
    fn review_has_stat_and_total() {
        let p = modify("src/lib.rs", "a\nb\n", "a\nc\nd\n");
        let r = render_review(std::slice::from_ref(&p), &ReviewOptions { color: false });
        assert!(
            r.starts_with(" src/lib.rs | 3 ++-\n 1 file changed, 2 insertions(+), 1 deletion(-)\n"),
            "{r}"
        );
        let colored = render_review(&[p], &ReviewOptions { color: true });
        assert!(colored.contains("\x1b[32m+c\x1b[m"), "{colored}");
    }

    /// An added line that erases itself (`ESC[2K`, CR) and prints an innocent one, OSC 52
    /// (clipboard) and OSC 8 (link) sequences, 8-bit CSI and a bidi override: all reach the
    /// review as visible text, and the file is named in a warning.
    #[test]
    fn escape_sequences_in_content_are_shown_not_sent() {
        let evil = "ok\nrm -rf ~ \x1b[2K\r# harmless comment\n\x1b]52;c;ZXZpbA==\x07\n\
                    \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\n\u{9b}31m \u{202e}txt\n";
        // Hunks built by hand: this test is about rendering, whatever the differ does with a
        // lone CR.
        let lines: Vec<HunkLine> = std::iter::once(HunkLine {
            kind: LineKind::Context,
            text: "ok\n".into(),
        })
        .chain(evil.split_inclusive('\n').skip(1).map(|l| HunkLine {
            kind: LineKind::Add,
            text: l.into(),
        }))
        .collect();
        let p = FilePatch {
            body: PatchBody::Text(vec![Hunk {
                old_start: 1,
                old_len: 1,
                new_start: 1,
                new_len: lines.len(),
                heading: "fn \x1b]0;title\x07".into(),
                lines,
            }]),
            ..modify("src/a.sh", "ok\n", "ok\n")
        };
        for color in [false, true] {
            let r = render_review(std::slice::from_ref(&p), &ReviewOptions { color });
            assert!(only_our_escapes(&r), "{r:?}");
            // Marks and colours off, to read the text the reviewer sees.
            let r = r
                .replace(smithers_terminal::MARK_ON, "")
                .replace(smithers_terminal::MARK_OFF, "")
                .replace(GREEN, "")
                .replace(RESET, "");
            assert!(r.contains("rm -rf ~ "), "{r}");
            assert!(r.contains("^[[2K"), "{r}");
            assert!(r.contains("^M# harmless comment"), "{r}");
            assert!(r.contains("^[]52;c;ZXZpbA==^G"), "{r}");
            assert!(r.contains("\\u{9b}31m"), "{r}");
            assert!(r.contains("\\u{202e}txt"), "{r}");
            assert!(r.contains("@@ fn ^[]0;title^G"), "{r}");
            assert!(
                r.starts_with(&format!(
                    "{}warning: control characters in this change",
                    if color { WARN } else { "" }
                )),
                "{r}"
            );
            assert!(r.lines().next().unwrap().ends_with(" src/a.sh"), "{r}");
        }
        assert!(!render_review(&[p], &ReviewOptions { color: false }).contains('\x1b'));
    }

    /// A name with a newline and fake stat text stays on its own, quoted, line.
    #[test]
    fn a_forged_name_cannot_add_stat_lines() {
        let forged = "x\n file.txt | 1 +\n";
        let patches = [add(forged, "a\n"), add("real.txt", "b\n")];
        let r = render_review(&patches, &ReviewOptions { color: false });
        let stat: Vec<&str> = r
            .lines()
            .skip_while(|l| l.starts_with("warning") || l.is_empty())
            .take_while(|l| !l.is_empty())
            .collect();
        assert_eq!(
            stat,
            [
                " \"x\\n file.txt | 1 +\\n\" | 1 +",
                " real.txt               | 1 +",
                " 2 files changed, 2 insertions(+)"
            ],
            "{r}"
        );
        assert!(!r.lines().any(|l| l.starts_with(" file.txt")), "{r}");
        assert!(
            r.lines()
                .next()
                .unwrap()
                .ends_with(": \"x\\n file.txt | 1 +\\n\""),
            "{r}"
        );
    }

    /// An added line that looks like a header is coloured as the added line it is.
    #[test]
    fn lines_are_classified_by_position_not_look() {
        let p = add("f", "++ b/other\n");
        let r = render_review(&[p], &ReviewOptions { color: true });
        assert!(r.contains(&format!("{GREEN}+++ b/other{RESET}")), "{r:?}");
    }

    /// CRLF line endings are shown (`^M`) but are not a reason to warn.
    #[test]
    fn crlf_is_shown_without_a_warning() {
        let p = modify("w.txt", "a\r\n", "b\r\n");
        assert!(review_findings(std::slice::from_ref(&p), &[]).is_empty());
        let r = render_review(&[p], &ReviewOptions { color: false });
        assert!(r.contains("\n+b^M\n"), "{r}");
        assert!(!r.contains("warning"), "{r}");
    }

    #[test]
    fn files_the_host_runs_are_flagged_and_ordinary_code_is_not() {
        let flagged = [
            ".github/workflows/ci.yml",
            ".gitlab-ci.yml",
            ".circleci/config.yml",
            ".husky/pre-commit",
            ".githooks/pre-push",
            ".pre-commit-config.yaml",
            ".vscode/tasks.json",
            "web/.vscode/settings.json",
            ".vscode/launch.json",
            ".idea/workspace.xml",
            ".envrc",
            "sub/dir/.envrc",
            ".tool-versions",
            "mise.toml",
            ".devcontainer/devcontainer.json",
            "vendor/lib/.git/hooks/post-checkout",
        ];
        let plain = [
            "Makefile",
            "package.json",
            "src/main.rs",
            ".github/CODEOWNERS",
            "docs/.github/workflows/x.yml",
            ".vscode/extensions.json",
            "my.envrc",
            "husky/pre-commit",
        ];
        let patches: Vec<FilePatch> = flagged
            .iter()
            .chain(plain.iter())
            .map(|p| add(p, "x\n"))
            .collect();
        let f = review_findings(&patches, &[]);
        let got: Vec<&str> = f.runs_on_host.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(got, flagged);
        let r = render_review_with(&patches, &ReviewOptions { color: false }, &f);
        assert!(
            r.contains(
                "warning: runs on the host: .github/workflows/ci.yml (CI workflow: runs on push with the repository's secrets)\n"
            ),
            "{r}"
        );
        assert!(!r.contains("host: Makefile"), "{r}");
        // The same lines for another summary, without the blank line before the stat block.
        let w = render_findings(&f, false);
        assert_eq!(w.lines().count(), flagged.len(), "{w}");
        assert!(w.ends_with(")\n") && r.starts_with(&w), "{w}");
        assert_eq!(render_findings(&ReviewFindings::default(), true), "");
    }

    /// A hooks directory named by core.hooksPath, in the host's config or a patched one.
    #[test]
    fn core_hooks_path_directories_are_flagged() {
        let config = add(
            ".gitconfig",
            "[user]\n\tname = x\n[core]\n\thooksPath = \"./tools/hooks/\" # ours\n",
        );
        let hook = add("tools/hooks/pre-commit", "#!/bin/sh\n");
        let other = add("tools/hooksmith.rs", "x\n");
        let host = add("ci/git-hooks/post-merge", "x\n");
        let f = review_findings(&[config, hook, other, host], &["ci/git-hooks".into()]);
        let got: Vec<(&str, &str)> = f
            .runs_on_host
            .iter()
            .map(|r| (r.path.as_str(), r.reason.as_str()))
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].0, ".gitconfig");
        assert_eq!(
            got[1],
            (
                "tools/hooks/pre-commit",
                "git hook: in tools/hooks, which core.hooksPath names"
            )
        );
        assert_eq!(got[2].0, "ci/git-hooks/post-merge");
    }

    #[test]
    fn hooks_path_parsing() {
        assert_eq!(
            hooks_paths_in_config("[core]\n  HooksPath = .hooks ; c\n[alias]\n hooksPath = no\n"),
            [".hooks"]
        );
        assert_eq!(hooks_paths_in_config("\thooksPath=x/y\n"), ["x/y"]);
        let root = Path::new("/p/root");
        assert_eq!(
            tree_relative_hooks_dir("./a/b/", None).as_deref(),
            Some("a/b")
        );
        assert_eq!(
            tree_relative_hooks_dir("/p/root/h", Some(root)).as_deref(),
            Some("h")
        );
        assert_eq!(tree_relative_hooks_dir("/etc/hooks", Some(root)), None);
        assert_eq!(tree_relative_hooks_dir("../out", None), None);
        assert_eq!(tree_relative_hooks_dir("~/hooks", None), None);
    }

    #[test]
    fn host_hooks_dirs_reads_the_real_config_and_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        std::fs::write(
            dir.path().join(".git/config"),
            "[core]\n\tbare = false\n\thooksPath = .hooks\n",
        )
        .unwrap();
        assert_eq!(host_hooks_dirs(dir.path()), [".hooks"]);
        let linked = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path().join(".git"), linked.path().join(".git")).unwrap();
        assert!(host_hooks_dirs(linked.path()).is_empty());
    }

    /// The review quotes names exactly as the patch headers do.
    #[test]
    fn names_are_quoted_like_the_patch_headers() {
        for name in [
            "a b",
            "t\u{e9}st",
            "nl\nx",
            "esc\x1b[2K",
            "q\"\\",
            "\u{202e}x",
            "del\x7f",
        ] {
            assert_eq!(
                format!(
                    "\"a/{}",
                    &smithers_terminal::quote_path(name).trim_start_matches('"')
                ),
                if quote_git_path("a/", name).starts_with('"') {
                    quote_git_path("a/", name)
                } else {
                    format!("\"a/{name}")
                },
                "{name:?}"
            );
        }
    }
}
