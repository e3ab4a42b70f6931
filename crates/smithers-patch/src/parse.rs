//! Parsing git-format patch text back into [`FilePatch`]es, so that an apply can run from the
//! bundle's patch files (the source of truth).
//!
//! Accepted: what `git diff --binary --full-index` writes for additions, deletions,
//! modifications and mode changes (text hunks, `literal` and `delta` binary hunks, C-quoted
//! names). Refused with a clear error: renames/copies, abbreviated object ids,
//! "Binary files differ" without data, and anything malformed.

use crate::binary::{check_sides, parse_hunks};
use crate::error::PatchError;
use crate::model::{path_from_bytes, unquote_git_path_bytes, GitMode, ZERO_OID};
use crate::patch::{FilePatch, Hunk, HunkLine, LineKind, PatchBody};

fn err(line: usize, reason: impl Into<String>) -> PatchError {
    PatchError::ParsePatch {
        line: line + 1,
        reason: reason.into(),
    }
}

fn strip_nl(l: &str) -> &str {
    l.strip_suffix('\n').unwrap_or(l)
}

/// Parses one name token (quoted or not) of a `diff --git` line; returns (name bytes, rest).
/// A quoted name may stand for bytes that are not UTF-8 (`"a/caf\351"`).
fn take_token(s: &str) -> Option<(Vec<u8>, &str)> {
    if s.starts_with('"') {
        let (name, used) = unquote_git_path_bytes(s)?;
        Some((name, &s[used..]))
    } else {
        let end = s.find(' ').unwrap_or(s.len());
        Some((s.as_bytes()[..end].to_vec(), &s[end..]))
    }
}

/// The path (as [`path_from_bytes`] holds it) named by `diff --git a/X b/X` (both names must
/// be equal: no renames).
fn parse_git_header(rest: &str) -> Option<String> {
    if rest.starts_with('"') {
        let (a, r) = take_token(rest)?;
        let r = r.strip_prefix(' ')?;
        let (b, r) = take_token(r)?;
        if !r.is_empty() {
            return None;
        }
        let a = a.strip_prefix(b"a/")?;
        let b = b.strip_prefix(b"b/")?;
        return (a == b).then(|| path_from_bytes(a));
    }
    // Unquoted names may contain spaces: with equal names the line is "a/X b/X".
    if rest.len() < 5 || (rest.len() - 5) % 2 != 0 {
        return None;
    }
    let k = (rest.len() - 5) / 2;
    let (a, b) = (rest.get(..2 + k)?, rest.get(2 + k..)?);
    let a = a.strip_prefix("a/")?;
    let b = b.strip_prefix(" b/")?;
    (a == b && !a.is_empty()).then(|| path_from_bytes(a.as_bytes()))
}

/// A `---`/`+++` label: `None` for /dev/null, else the name without its `a/`/`b/` prefix (as
/// [`path_from_bytes`] holds it).
fn parse_label(s: &str, prefix: &str) -> Option<Option<String>> {
    let name = if s.starts_with('"') {
        unquote_git_path_bytes(s)?.0
    } else {
        // Anything after a tab (git's tab after names with spaces, or a timestamp) is not
        // part of the name.
        s.split('\t').next()?.as_bytes().to_vec()
    };
    if name == b"/dev/null" {
        return Some(None);
    }
    Some(Some(path_from_bytes(name.strip_prefix(prefix.as_bytes())?)))
}

fn parse_mode(s: &str, line: usize) -> Result<GitMode, PatchError> {
    GitMode::parse(s.trim()).ok_or_else(|| err(line, format!("unsupported file mode {s:?}")))
}

fn parse_oid(s: &str, line: usize) -> Result<Option<String>, PatchError> {
    if s.len() != 40 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(err(
            line,
            format!(
                "object id {s:?} is not a full 40-hex id (patches must be made with --full-index)"
            ),
        ));
    }
    let s = s.to_ascii_lowercase();
    Ok(if s == ZERO_OID { None } else { Some(s) })
}

fn parse_range(s: &str) -> Option<(usize, usize)> {
    match s.split_once(',') {
        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
        None => Some((s.parse().ok()?, 1)),
    }
}

type HunkHeader = (usize, usize, usize, usize, String);

fn parse_hunk_header(l: &str) -> Option<HunkHeader> {
    let rest = l.strip_prefix("@@ -")?;
    let (old, rest) = rest.split_once(" +")?;
    let (new, heading) = rest.split_once(" @@")?;
    let (a, b) = parse_range(old)?;
    let (c, d) = parse_range(new)?;
    let heading = heading.strip_prefix(' ').unwrap_or(heading).to_string();
    Some((a, b, c, d, heading))
}

/// Parses a patch text (one or more `diff --git` sections).
pub fn parse_patch(text: &str) -> Result<Vec<FilePatch>, PatchError> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let n = lines.len();
    let mut i = 0;
    let mut out = Vec::new();
    while i < n {
        let line = strip_nl(lines[i]);
        if line.trim().is_empty() {
            i += 1;
            continue;
        }
        let Some(rest) = line.strip_prefix("diff --git ") else {
            return Err(err(i, format!("expected 'diff --git', found {line:?}")));
        };
        let header_line = i;
        let header_path = parse_git_header(rest);
        i += 1;
        let Headers {
            mut old_mode,
            mut new_mode,
            is_new,
            is_deleted,
            index_mode,
            oids,
        } = parse_extended_headers(&lines, &mut i)?;
        if is_new && is_deleted {
            return Err(err(header_line, "file is both new and deleted"));
        }
        if !is_new && !is_deleted && old_mode.is_none() && new_mode.is_none() {
            old_mode = index_mode;
            new_mode = index_mode;
        }
        if !is_new && old_mode.is_none() || !is_deleted && new_mode.is_none() {
            return Err(err(
                header_line,
                "cannot determine the file mode (no mode header and no mode on the index line)",
            ));
        }
        let mut path = header_path;
        let mut body = PatchBody::Empty;
        if i < n && strip_nl(lines[i]).starts_with("--- ") {
            body = parse_text_body(&lines, &mut i, is_new, is_deleted, &mut path)?;
        } else if i < n && strip_nl(lines[i]) == "GIT binary patch" {
            let (forward, reverse, next) =
                parse_hunks(&lines, i + 1).map_err(|(l, r)| err(l, r))?;
            i = next;
            body = PatchBody::Binary { forward, reverse };
        }
        let path = path.ok_or_else(|| err(header_line, "cannot determine the file name"))?;
        if path.is_empty() {
            return Err(err(header_line, "empty file name"));
        }
        let had_index = oids.is_some();
        let (old_oid, new_oid) = oids.unwrap_or((None, None));
        if let PatchBody::Binary { forward, reverse } = &body {
            if !had_index {
                return Err(err(header_line, "binary patch without an index line"));
            }
            check_sides(
                forward,
                reverse.as_ref(),
                old_oid.as_deref(),
                new_oid.as_deref(),
            )
            .map_err(|r| err(header_line, r))?;
        }
        out.push(FilePatch {
            path,
            old_mode: if is_new { None } else { old_mode },
            new_mode: if is_deleted { None } else { new_mode },
            old_oid,
            new_oid,
            body,
        });
    }
    if out.is_empty() {
        return Err(err(0, "no 'diff --git' section found"));
    }
    Ok(out)
}

/// What a section's extended header lines (between `diff --git` and the body) say.
struct Headers {
    old_mode: Option<GitMode>,
    new_mode: Option<GitMode>,
    is_new: bool,
    is_deleted: bool,
    /// The mode on the `index` line (a change that keeps the mode).
    index_mode: Option<GitMode>,
    /// The `index` line's (old, new) blob ids.
    oids: Option<(Option<String>, Option<String>)>,
}

/// Reads the extended header lines from `*i` up to the body (`---`, `@@`, `GIT binary patch`)
/// or the next section, leaving `*i` there.
fn parse_extended_headers(lines: &[&str], i: &mut usize) -> Result<Headers, PatchError> {
    let n = lines.len();
    let mut old_mode = None;
    let mut new_mode = None;
    let mut is_new = false;
    let mut is_deleted = false;
    let mut index_mode = None;
    let mut oids: Option<(Option<String>, Option<String>)> = None;
    while *i < n {
        let at = *i;
        let l = strip_nl(lines[at]);
        if l.starts_with("diff --git ")
            || l.starts_with("--- ")
            || l.starts_with("@@ ")
            || l == "GIT binary patch"
        {
            break;
        }
        if let Some(m) = l.strip_prefix("old mode ") {
            old_mode = Some(parse_mode(m, at)?);
        } else if let Some(m) = l.strip_prefix("new mode ") {
            new_mode = Some(parse_mode(m, at)?);
        } else if let Some(m) = l.strip_prefix("new file mode ") {
            new_mode = Some(parse_mode(m, at)?);
            is_new = true;
        } else if let Some(m) = l.strip_prefix("deleted file mode ") {
            old_mode = Some(parse_mode(m, at)?);
            is_deleted = true;
        } else if let Some(r) = l.strip_prefix("index ") {
            let (ids, mode) = match r.split_once(' ') {
                Some((ids, m)) => (ids, Some(parse_mode(m, at)?)),
                None => (r, None),
            };
            let (o, nn) = ids
                .split_once("..")
                .ok_or_else(|| err(at, "malformed index line"))?;
            oids = Some((parse_oid(o, at)?, parse_oid(nn, at)?));
            index_mode = mode;
        } else if l.starts_with("similarity index")
            || l.starts_with("dissimilarity index")
            || l.starts_with("rename ")
            || l.starts_with("copy ")
        {
            return Err(err(at, "renames and copies are not supported"));
        } else if l.starts_with("Binary files ") {
            return Err(err(
                at,
                "binary change without data (patches must be made with --binary)",
            ));
        } else {
            return Err(err(at, format!("unexpected header line {l:?}")));
        }
        *i += 1;
    }
    Ok(Headers {
        old_mode,
        new_mode,
        is_new,
        is_deleted,
        index_mode,
        oids,
    })
}

/// Reads a text body from `*i` (on its `---` line): the `---`/`+++` names, checked against the
/// mode headers and the `diff --git` name (`path`, set to the name they give), and its hunks.
fn parse_text_body(
    lines: &[&str],
    i: &mut usize,
    is_new: bool,
    is_deleted: bool,
    path: &mut Option<String>,
) -> Result<PatchBody, PatchError> {
    let n = lines.len();
    let minus = parse_label(&strip_nl(lines[*i])[4..], "a/")
        .ok_or_else(|| err(*i, "malformed '---' line"))?;
    *i += 1;
    let plus_line = lines.get(*i).map(|l| strip_nl(l)).unwrap_or("");
    let plus = plus_line
        .strip_prefix("+++ ")
        .and_then(|s| parse_label(s, "b/"))
        .ok_or_else(|| err(*i, "expected '+++' line"))?;
    *i += 1;
    if minus.is_none() != is_new || plus.is_none() != is_deleted {
        return Err(err(
            *i - 2,
            "'---'/'+++' lines disagree with the mode headers",
        ));
    }
    let named = plus
        .or(minus)
        .ok_or_else(|| err(*i - 2, "both sides are /dev/null"))?;
    if path.as_ref().is_some_and(|p| *p != named) {
        return Err(err(*i - 2, "renames are not supported (names differ)"));
    }
    *path = Some(named);
    let mut hunks = Vec::new();
    while *i < n && strip_nl(lines[*i]).starts_with("@@ ") {
        hunks.push(parse_hunk(lines, i)?);
    }
    if hunks.is_empty() {
        return Err(err(*i, "'---'/'+++' lines without hunks"));
    }
    Ok(PatchBody::Text(hunks))
}

/// Reads one hunk from `*i` (on its `@@` line), exactly as many lines as its header counts
/// (and a `\ No newline at end of file` marker after any of them).
fn parse_hunk(lines: &[&str], i: &mut usize) -> Result<Hunk, PatchError> {
    let n = lines.len();
    let hl = *i;
    let (a, b, c, d, heading) =
        parse_hunk_header(strip_nl(lines[*i])).ok_or_else(|| err(*i, "malformed hunk header"))?;
    *i += 1;
    let (mut old_left, mut new_left) = (b, d);
    let mut hlines: Vec<HunkLine> = Vec::new();
    while old_left > 0 || new_left > 0 || (*i < n && lines[*i].starts_with('\\')) {
        let Some(raw) = lines.get(*i) else {
            return Err(err(hl, "hunk is truncated"));
        };
        let (kind, text) = match raw.as_bytes().first() {
            Some(b' ') => (LineKind::Context, &raw[1..]),
            Some(b'-') => (LineKind::Remove, &raw[1..]),
            Some(b'+') => (LineKind::Add, &raw[1..]),
            // Some editors strip the single space of an empty context line.
            Some(b'\n') => (LineKind::Context, &raw[..]),
            Some(b'\\') => {
                let last = hlines
                    .last_mut()
                    .ok_or_else(|| err(*i, "'\\ No newline' before any line"))?;
                if last.text.ends_with('\n') {
                    last.text.pop();
                }
                *i += 1;
                continue;
            }
            _ => return Err(err(*i, "unexpected line inside hunk")),
        };
        if !text.ends_with('\n') {
            return Err(err(*i, "patch ends inside a hunk line (missing newline)"));
        }
        match kind {
            LineKind::Context if old_left > 0 && new_left > 0 => {
                old_left -= 1;
                new_left -= 1;
            }
            LineKind::Remove if old_left > 0 => old_left -= 1,
            LineKind::Add if new_left > 0 => new_left -= 1,
            _ => return Err(err(*i, "hunk has more lines than its header says")),
        }
        hlines.push(HunkLine {
            kind,
            text: text.to_string(),
        });
        *i += 1;
    }
    Ok(Hunk {
        old_start: a,
        old_len: b,
        new_start: c,
        new_len: d,
        heading,
        lines: hlines,
    })
}
