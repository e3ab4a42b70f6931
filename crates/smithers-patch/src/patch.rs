//! The patch model ([`FilePatch`]), built from detected changes and rendered as git-format
//! text exactly like `git diff --binary --full-index`.

use serde::{Deserialize, Serialize};
use similar::{Algorithm, ChangeTag, TextDiff};

use crate::binary::BinaryHunk;
use crate::detect::{ChangeKind, FileChange, FileVersion};
use crate::model::{path_to_bytes, quote_git_path_bytes, GitMode, ZERO_OID};

/// Lines of context around each hunk, git's default.
pub const CONTEXT_LINES: usize = 3;

/// One line of a text hunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LineKind {
    Context,
    Remove,
    Add,
}

/// A line and its kind. `text` keeps its trailing `\n`; a line without one is the last line of
/// a file that has no final newline (rendered with `\ No newline at end of file`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HunkLine {
    pub kind: LineKind,
    pub text: String,
}

/// One `@@ -old_start,old_len +new_start,new_len @@` hunk. Starts are as git prints them
/// (1-based; for an empty range, the line before it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hunk {
    pub old_start: usize,
    pub old_len: usize,
    pub new_start: usize,
    pub new_len: usize,
    /// The "function context" git prints after the second `@@` (may be empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub heading: String,
    pub lines: Vec<HunkLine>,
}

/// The content part of a file patch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PatchBody {
    /// No content change (mode-only change, or an empty file added/deleted).
    Empty,
    /// Text hunks.
    Text(Vec<Hunk>),
    /// A git binary patch: the forward hunk (old → new), and the reverse hunk (new → old) when
    /// the patch carries it (git always writes it; it is optional on input). Each is a literal
    /// or a delta against the other side.
    Binary {
        forward: BinaryHunk,
        reverse: Option<BinaryHunk>,
    },
}

/// One `diff --git` section: a change to one path. Renames and copies are not produced (and
/// refused when parsed); a type change is two sections (delete, then add), like git.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FilePatch {
    /// POSIX path relative to the root; a name that is not UTF-8 (or begins with `"`) is
    /// held in git's quoted form (see [`crate::path_from_bytes`]).
    pub path: String,
    /// `None`: the file is created.
    pub old_mode: Option<GitMode>,
    /// `None`: the file is deleted.
    pub new_mode: Option<GitMode>,
    /// Git blob id the change was made against (`None` for a creation, or when the patch has
    /// no `index` line: a mode-only change, whose content the sandbox did not touch).
    pub old_oid: Option<String>,
    /// Git blob id of the result (`None` for a deletion or without `index` line).
    pub new_oid: Option<String>,
    pub body: PatchBody,
}

/// The DiffBundle operation of a patch (spec section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Add,
    Modify,
    Delete,
}

impl FilePatch {
    /// The raw bytes of the file name (see [`crate::path_to_bytes`]). A malformed quoted
    /// form (not made by this crate) is taken literally; apply refuses it.
    pub fn path_bytes(&self) -> Vec<u8> {
        path_to_bytes(&self.path).unwrap_or_else(|| self.path.as_bytes().to_vec())
    }

    /// add / modify / delete.
    pub fn operation(&self) -> Operation {
        match (self.old_mode, self.new_mode) {
            (None, _) => Operation::Add,
            (_, None) => Operation::Delete,
            _ => Operation::Modify,
        }
    }

    /// Lines added and removed (binary patches count 0, like `git diff --numstat` shows `-`).
    pub fn line_stats(&self) -> (usize, usize) {
        let PatchBody::Text(hunks) = &self.body else {
            return (0, 0);
        };
        let mut add = 0;
        let mut del = 0;
        for l in hunks.iter().flat_map(|h| h.lines.iter()) {
            match l.kind {
                LineKind::Add => add += 1,
                LineKind::Remove => del += 1,
                LineKind::Context => {}
            }
        }
        (add, del)
    }

    /// Renders this section as git does (`git diff --binary --full-index`).
    pub fn render(&self) -> String {
        let mut out = self.render_header();
        match &self.body {
            PatchBody::Empty => {}
            PatchBody::Text(hunks) => {
                if hunks.is_empty() {
                    return out;
                }
                out.push_str(&self.file_labels());
                for h in hunks {
                    render_hunk(h, &mut out);
                }
            }
            PatchBody::Binary { forward, reverse } => {
                out.push_str("GIT binary patch\n");
                forward.render(&mut out);
                if let Some(r) = reverse {
                    r.render(&mut out);
                }
            }
        }
        out
    }

    /// The `--- a/...` and `+++ b/...` lines of a text diff (`/dev/null` for a missing side).
    pub(crate) fn file_labels(&self) -> String {
        let name = self.path_bytes();
        let a = quote_git_path_bytes("a/", &name);
        let b = quote_git_path_bytes("b/", &name);
        let minus = if self.old_mode.is_some() {
            a.as_str()
        } else {
            "/dev/null"
        };
        let plus = if self.new_mode.is_some() {
            b.as_str()
        } else {
            "/dev/null"
        };
        // Git appends a tab to a file label containing a space (diff.c), so that tools
        // splitting on whitespace still find the whole name.
        let tab = |l: &str| if l.contains(' ') { "\t" } else { "" };
        format!("--- {minus}{}\n+++ {plus}{}\n", tab(minus), tab(plus))
    }

    /// The section's lines before its content: `diff --git`, modes, `index`.
    pub(crate) fn render_header(&self) -> String {
        // The path string may hold a name that is not UTF-8 in its quoted form; git quotes
        // the raw bytes (with the prefix inside the quotes).
        let name = self.path_bytes();
        let a = quote_git_path_bytes("a/", &name);
        let b = quote_git_path_bytes("b/", &name);
        let mut out = format!("diff --git {a} {b}\n");
        match (self.old_mode, self.new_mode) {
            (None, Some(m)) => out.push_str(&format!("new file mode {m}\n")),
            (Some(m), None) => out.push_str(&format!("deleted file mode {m}\n")),
            (Some(o), Some(n)) if o != n => {
                out.push_str(&format!("old mode {o}\nnew mode {n}\n"));
            }
            _ => {}
        }
        if self.old_oid.is_some() || self.new_oid.is_some() {
            let o = self.old_oid.as_deref().unwrap_or(ZERO_OID);
            let n = self.new_oid.as_deref().unwrap_or(ZERO_OID);
            out.push_str(&format!("index {o}..{n}"));
            if let (Some(om), Some(nm)) = (self.old_mode, self.new_mode) {
                if om == nm {
                    out.push_str(&format!(" {om}"));
                }
            }
            out.push('\n');
        }
        out
    }
}

fn range(start: usize, len: usize) -> String {
    if len == 1 {
        format!("{start}")
    } else {
        format!("{start},{len}")
    }
}

fn render_hunk(h: &Hunk, out: &mut String) {
    out.push_str(&format!(
        "@@ -{} +{} @@",
        range(h.old_start, h.old_len),
        range(h.new_start, h.new_len)
    ));
    if !h.heading.is_empty() {
        out.push(' ');
        out.push_str(&h.heading);
    }
    out.push('\n');
    for l in &h.lines {
        out.push(match l.kind {
            LineKind::Context => ' ',
            LineKind::Remove => '-',
            LineKind::Add => '+',
        });
        out.push_str(&l.text);
        if !l.text.ends_with('\n') {
            out.push_str("\n\\ No newline at end of file\n");
        }
    }
}

/// Longest function-context heading, as git's xdiff (`char buf[80]`).
const MAX_HEADING_BYTES: usize = 80;

/// Git's default function-context rule (xdiff `def_ff`): the nearest line above the hunk
/// that starts with an ASCII letter, `_` or `$`, trailing whitespace trimmed, at most 80
/// bytes (cut back so as not to split a UTF-8 sequence).
fn heading_before<'a>(old_lines: &[&'a [u8]], first: usize) -> &'a [u8] {
    for line in old_lines[..first.min(old_lines.len())].iter().rev() {
        if line
            .first()
            .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_' || *c == b'$')
        {
            let mut end = line.len().min(MAX_HEADING_BYTES);
            // Not before a UTF-8 continuation byte: for UTF-8 text exactly `is_char_boundary`.
            while end < line.len() && (0x80..0xc0).contains(&line[end]) {
                end -= 1;
            }
            // C's isspace, as xdiff trims: ASCII whitespace and \v, not Unicode spaces
            // (a trailing no-break space stays, as in git's output).
            let mut cut = &line[..end];
            while let [rest @ .., last] = cut {
                if !(last.is_ascii_whitespace() || *last == 0x0b) {
                    break;
                }
                cut = rest;
            }
            return cut;
        }
    }
    &[]
}

/// A hunk over lines that need not be UTF-8: [`text_hunks`]' work, and the review's text of a
/// file carried as a git binary patch (see [`crate::PatchReview`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ByteHunk {
    pub old_start: usize,
    pub old_len: usize,
    pub new_start: usize,
    pub new_len: usize,
    pub heading: Vec<u8>,
    /// Each line with its `\n` (none on a last line without one).
    pub lines: Vec<(LineKind, Vec<u8>)>,
}

impl ByteHunk {
    /// This hunk as a [`Hunk`]; only for lines known to be UTF-8 (split at `\n` out of UTF-8
    /// text, the heading cut at a character boundary), else lossy.
    fn into_text(self) -> Hunk {
        let text = |b: Vec<u8>| {
            String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into())
        };
        Hunk {
            old_start: self.old_start,
            old_len: self.old_len,
            new_start: self.new_start,
            new_len: self.new_len,
            heading: text(self.heading),
            lines: self
                .lines
                .into_iter()
                .map(|(kind, t)| HunkLine {
                    kind,
                    text: text(t),
                })
                .collect(),
        }
    }

    /// The hunk as git renders it (`@@` line, then each line with its `+`/`-`/space and, for
    /// a last line without a newline, `\ No newline at end of file`).
    pub(crate) fn render(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(
            format!(
                "@@ -{} +{} @@",
                range(self.old_start, self.old_len),
                range(self.new_start, self.new_len)
            )
            .as_bytes(),
        );
        if !self.heading.is_empty() {
            out.push(b' ');
            out.extend_from_slice(&self.heading);
        }
        out.push(b'\n');
        for (kind, text) in &self.lines {
            out.push(match kind {
                LineKind::Context => b' ',
                LineKind::Remove => b'-',
                LineKind::Add => b'+',
            });
            out.extend_from_slice(text);
            if !text.ends_with(b"\n") {
                out.extend_from_slice(b"\n\\ No newline at end of file\n");
            }
        }
    }
}

/// Hunks turning `old` into `new`, with [`CONTEXT_LINES`] of context (Myers diff), over lines
/// split at `\n` only, as git splits them.
pub(crate) fn byte_hunks(old: &[u8], new: &[u8]) -> Vec<ByteHunk> {
    let old_lines: Vec<&[u8]> = old.split_inclusive(|b| *b == b'\n').collect();
    let new_lines: Vec<&[u8]> = new.split_inclusive(|b| *b == b'\n').collect();
    let diff = TextDiff::configure()
        .algorithm(Algorithm::Myers)
        .diff_slices(&old_lines, &new_lines);
    let mut hunks = Vec::new();
    for group in diff.grouped_ops(CONTEXT_LINES) {
        if group.is_empty() {
            continue;
        }
        // Ranges from the min/max over all ops: similar may give a leading Delete a
        // `new_index` past the following Equal's, so the first op's start is not reliable.
        let old_begin = group.iter().map(|o| o.old_range().start).min().unwrap_or(0);
        let old_end = group.iter().map(|o| o.old_range().end).max().unwrap_or(0);
        let new_begin = group.iter().map(|o| o.new_range().start).min().unwrap_or(0);
        let new_end = group.iter().map(|o| o.new_range().end).max().unwrap_or(0);
        let old_len = old_end - old_begin;
        let new_len = new_end - new_begin;
        let mut lines = Vec::new();
        for op in &group {
            for ch in diff.iter_changes(op) {
                let kind = match ch.tag() {
                    ChangeTag::Equal => LineKind::Context,
                    ChangeTag::Delete => LineKind::Remove,
                    ChangeTag::Insert => LineKind::Add,
                };
                lines.push((kind, ch.value().to_vec()));
            }
        }
        hunks.push(ByteHunk {
            old_start: if old_len == 0 {
                old_begin
            } else {
                old_begin + 1
            },
            old_len,
            new_start: if new_len == 0 {
                new_begin
            } else {
                new_begin + 1
            },
            new_len,
            heading: heading_before(&old_lines, old_begin).to_vec(),
            lines,
        });
    }
    hunks
}

/// Text hunks turning `old` into `new`, with [`CONTEXT_LINES`] of context (Myers diff).
///
/// Lines are split at `\n` only, as git does: `similar`'s own line splitting also ends a line
/// at a lone `\r`, which made a line `a\rb\n` two lines and rendered `a\r` as a line without
/// final newline, a patch neither our apply nor `git apply` accepts.
pub fn text_hunks(old: &str, new: &str) -> Vec<Hunk> {
    // One differ for text and for the review's bytes, so that both count lines alike.
    byte_hunks(old.as_bytes(), new.as_bytes())
        .into_iter()
        .map(ByteHunk::into_text)
        .collect()
}

fn as_text(v: &FileVersion) -> &str {
    // Callers only reach here for non-binary sides, which are valid UTF-8 by definition.
    std::str::from_utf8(&v.content).unwrap_or("")
}

fn body_for(old: Option<&FileVersion>, new: Option<&FileVersion>) -> PatchBody {
    if old.is_some_and(|v| v.encoded.is_some()) || new.is_some_and(|v| v.encoded.is_some()) {
        // A side too large to hold was made into its literal hunk when it was read: literals
        // both ways (a delta would need both contents in memory).
        let literal = |v: Option<&FileVersion>| match v {
            Some(FileVersion {
                encoded: Some(e), ..
            }) => BinaryHunk::Encoded(e.clone()),
            Some(v) => BinaryHunk::Literal(v.content.clone()),
            None => BinaryHunk::Literal(Vec::new()),
        };
        return PatchBody::Binary {
            forward: literal(new),
            reverse: Some(literal(old)),
        };
    }
    let binary = old.is_some_and(|v| v.is_binary) || new.is_some_and(|v| v.is_binary);
    let old_c: &[u8] = old.map_or(&[], |v| &v.content);
    let new_c: &[u8] = new.map_or(&[], |v| &v.content);
    if binary {
        return PatchBody::Binary {
            forward: BinaryHunk::best(old_c, new_c),
            reverse: Some(BinaryHunk::best(new_c, old_c)),
        };
    }
    if old_c.is_empty() && new_c.is_empty() {
        return PatchBody::Empty;
    }
    PatchBody::Text(text_hunks(old.map_or("", as_text), new.map_or("", as_text)))
}

fn add_patch(path: &str, v: &FileVersion) -> FilePatch {
    FilePatch {
        path: path.to_string(),
        old_mode: None,
        new_mode: Some(v.mode),
        old_oid: None,
        new_oid: Some(v.oid.clone()),
        body: body_for(None, Some(v)),
    }
}

fn delete_patch(path: &str, v: &FileVersion) -> FilePatch {
    FilePatch {
        path: path.to_string(),
        old_mode: Some(v.mode),
        new_mode: None,
        old_oid: Some(v.oid.clone()),
        new_oid: None,
        body: body_for(Some(v), None),
    }
}

/// The patch section(s) of one change: one, or two (delete + add) for a type change.
pub fn file_patches(change: &FileChange) -> Vec<FilePatch> {
    let p = change.path.as_str();
    match (change.kind, &change.old, &change.new) {
        (ChangeKind::Added, _, Some(n)) => vec![add_patch(p, n)],
        (ChangeKind::Deleted, Some(o), _) => vec![delete_patch(p, o)],
        (ChangeKind::TypeChanged, Some(o), Some(n)) => vec![delete_patch(p, o), add_patch(p, n)],
        (ChangeKind::ModeChanged, Some(o), Some(n)) => vec![FilePatch {
            path: p.to_string(),
            old_mode: Some(o.mode),
            new_mode: Some(n.mode),
            old_oid: None,
            new_oid: None,
            body: PatchBody::Empty,
        }],
        (_, Some(o), Some(n)) => vec![FilePatch {
            path: p.to_string(),
            old_mode: Some(o.mode),
            new_mode: Some(n.mode),
            old_oid: Some(o.oid.clone()),
            new_oid: Some(n.oid.clone()),
            body: body_for(Some(o), Some(n)),
        }],
        // A change whose sides contradict its kind cannot come out of detect_changes.
        (_, o, n) => {
            let mut v = Vec::new();
            if let Some(o) = o {
                v.push(delete_patch(p, o));
            }
            if let Some(n) = n {
                v.push(add_patch(p, n));
            }
            v
        }
    }
}

/// Renders several sections into one patch text.
pub fn render_patches(patches: &[FilePatch]) -> String {
    patches.iter().map(FilePatch::render).collect()
}

impl crate::detect::ChangeSet {
    /// Every change as patch sections (path order; a type change gives two), e.g. for
    /// [`crate::render_review`] or [`crate::apply_patches`] without a round trip through text.
    pub fn to_file_patches(&self) -> Vec<FilePatch> {
        self.changes.iter().flat_map(file_patches).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hunks_text(old: &str, new: &str) -> String {
        let fp = FilePatch {
            path: "f".into(),
            old_mode: Some(GitMode::File),
            new_mode: Some(GitMode::File),
            old_oid: None,
            new_oid: None,
            body: PatchBody::Text(text_hunks(old, new)),
        };
        fp.render()
    }

    #[test]
    fn hunk_headers_like_git() {
        let t = hunks_text("a\nb\nc\n", "a\nB\nc\n");
        assert!(t.contains("@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"), "{t}");
        let t = hunks_text("", "x\n");
        assert!(t.contains("@@ -0,0 +1 @@\n+x\n"), "{t}");
        let t = hunks_text("x", "y");
        assert!(
            t.contains(
                "@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+y\n\\ No newline at end of file\n"
            ),
            "{t}"
        );
    }

    /// A lone CR is part of its line (git splits at `\n` only); before the fix `similar`
    /// split there and rendered `-a\r` with a false "No newline at end of file".
    #[test]
    fn lone_cr_stays_inside_its_line() {
        let t = hunks_text("a\rb\nc\n", "a\rB\nc\n");
        assert!(t.contains("@@ -1,2 +1,2 @@\n-a\rb\n+a\rB\n c\n"), "{t:?}");
        assert!(!t.contains("No newline"), "{t:?}");
        let t = hunks_text("x\r", "y\r");
        assert!(
            t.contains("-x\r\n\\ No newline at end of file\n+y\r\n\\ No newline"),
            "{t:?}"
        );
    }

    #[test]
    fn far_apart_changes_make_two_hunks() {
        let old: String = (1..=20).map(|i| format!("line{i}\n")).collect();
        let new = old
            .replace("line2\n", "two\n")
            .replace("line18\n", "eighteen\n");
        let t = hunks_text(&old, &new);
        assert_eq!(t.matches("@@ -").count(), 2, "{t}");
        assert!(t.contains("@@ -1,5 +1,5 @@"), "{t}");
        assert!(t.contains("@@ -15,6 +15,6 @@ line14\n"), "{t}");
    }
}
