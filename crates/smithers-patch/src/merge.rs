//! Applying text hunks: exactly (the base matches the recorded hash) or relocated onto a host
//! file that changed elsewhere (a three-way merge whose base is what the hunks carry).
//!
//! The relocated form is what `git apply --3way` falls back to without the base blob, and what
//! `patch` does without fuzz: each hunk's preimage (context + removed lines) must be found
//! verbatim in the host file after the previous hunk, at exactly one place: a preimage that
//! fits at two or more places is a conflict (which copy the step edited cannot be known).
//! Context is never reduced, so host edits within 3 lines of a sandbox edit are a conflict,
//! exactly where diff3 would report one too.

use crate::patch::{Hunk, LineKind, CONTEXT_LINES};

/// Why hunks do not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HunkFailure {
    /// 1-based hunk number.
    pub hunk: usize,
    /// The hunk's preimage fits at more than one place (relocating mode): picking one would
    /// be a guess, so it is a conflict.
    pub ambiguous: bool,
}

fn preimage(h: &Hunk) -> Vec<&str> {
    h.lines
        .iter()
        .filter(|l| l.kind != LineKind::Add)
        .map(|l| l.text.as_str())
        .collect()
}

fn postimage(h: &Hunk) -> impl Iterator<Item = &str> {
    h.lines
        .iter()
        .filter(|l| l.kind != LineKind::Remove)
        .map(|l| l.text.as_str())
}

/// Applies `hunks` to `text`. `exact`: every hunk must sit where its header says (used when
/// the base hash matched). Otherwise each hunk may move to the one place it fits.
pub(crate) fn apply_hunks(text: &str, hunks: &[Hunk], exact: bool) -> Result<String, HunkFailure> {
    apply_hunks_inner(text, hunks, exact, false).map(|(t, _)| t)
}

/// The start of a conflict block: the host's lines follow.
pub(crate) const MARK_HOST: &str = "<<<<<<< host\n";
/// Between the host's lines and the sandbox's.
pub(crate) const MARK_SPLIT: &str = "=======\n";
/// The end of a conflict block, after the sandbox's lines.
pub(crate) const MARK_SANDBOX: &str = ">>>>>>> sandbox\n";

/// Relocates `hunks` onto `text` like [`apply_hunks`] (not exact), but a hunk that fits
/// nowhere (or in more than one place) becomes a conflict block in git's marker style at the
/// place it was expected: the host's lines there, then the sandbox's version of them. Returns
/// the text and how many blocks were written. Nothing of either side is lost; a person
/// resolves the blocks.
pub(crate) fn apply_hunks_marking(text: &str, hunks: &[Hunk]) -> Option<(String, usize)> {
    // `None`: hunks inconsistent in themselves (never from parsed patch text): a conflict.
    apply_hunks_inner(text, hunks, false, true).ok()
}

/// Two-way conflict blocks between `host` and `sandbox` (whose common base is lost): lines the
/// two share are kept, each run where they differ becomes one block. The count of blocks.
pub(crate) fn mark_differences(host: &str, sandbox: &str) -> (String, usize) {
    let hunks = crate::patch::text_hunks(host, sandbox);
    let lines: Vec<&str> = host.split_inclusive('\n').collect();
    let mut out = String::with_capacity(host.len() + sandbox.len());
    let mut cursor = 0usize;
    let mut blocks = 0usize;
    for h in &hunks {
        let start = if h.old_len == 0 {
            h.old_start
        } else {
            h.old_start.saturating_sub(1)
        };
        for l in &lines[cursor.min(lines.len())..start.min(lines.len())] {
            out.push_str(l);
        }
        cursor = start;
        let mut i = 0;
        while i < h.lines.len() {
            if h.lines[i].kind == LineKind::Context {
                out.push_str(&h.lines[i].text);
                cursor += 1;
                i += 1;
                continue;
            }
            let (mut ours, mut theirs) = (String::new(), String::new());
            while i < h.lines.len() && h.lines[i].kind != LineKind::Context {
                match h.lines[i].kind {
                    LineKind::Remove => {
                        ours.push_str(&h.lines[i].text);
                        cursor += 1;
                    }
                    _ => theirs.push_str(&h.lines[i].text),
                }
                i += 1;
            }
            push_block(&mut out, &ours, &theirs);
            blocks += 1;
        }
    }
    for l in &lines[cursor.min(lines.len())..] {
        out.push_str(l);
    }
    (out, blocks)
}

/// One conflict block; a side whose last line has no newline gets one, so that the markers
/// stay on lines of their own.
fn push_block(out: &mut String, host: &str, sandbox: &str) {
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(MARK_HOST);
    out.push_str(host);
    if !host.is_empty() && !host.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(MARK_SPLIT);
    out.push_str(sandbox);
    if !sandbox.is_empty() && !sandbox.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(MARK_SANDBOX);
}

fn apply_hunks_inner(
    text: &str,
    hunks: &[Hunk],
    exact: bool,
    mark: bool,
) -> Result<(String, usize), HunkFailure> {
    use std::borrow::Cow;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut out: Vec<Cow<'_, str>> = Vec::with_capacity(lines.len() + 16);
    let mut blocks = 0usize;
    // Where each distinct line occurs (built once, only when hunks must be relocated): a
    // hunk's candidate places are those of its first preimage line, so relocating costs the
    // occurrences of that line, not a scan of the file per hunk.
    let mut occurrences: std::collections::HashMap<&str, Vec<usize>> = Default::default();
    if !exact {
        for (i, l) in lines.iter().enumerate() {
            occurrences.entry(l).or_default().push(i);
        }
    }
    let mut cursor = 0usize; // next unconsumed host line
    let mut offset: isize = 0; // where hunks landed relative to their headers so far
    for (i, h) in hunks.iter().enumerate() {
        let fail = HunkFailure {
            hunk: i + 1,
            ambiguous: false,
        };
        let pre = preimage(h);
        if pre.len() != h.old_len {
            return Err(fail);
        }
        let nominal = if h.old_len == 0 {
            h.old_start
        } else {
            h.old_start.saturating_sub(1)
        };
        let leading = h
            .lines
            .iter()
            .take_while(|l| l.kind == LineKind::Context)
            .count();
        let trailing = h
            .lines
            .iter()
            .rev()
            .take_while(|l| l.kind == LineKind::Context)
            .count();
        // git apply's anchoring rules: a hunk at the start of the file must match there, a
        // hunk without trailing context must match at the end.
        // (With full context the file edge is incidental, so only a hunk whose context was cut
        // short by the edge is anchored to it.)
        let match_beginning = h.old_start <= 1 && leading < CONTEXT_LINES;
        let match_end = trailing == 0;
        let fits = |pos: usize| {
            pos >= cursor
                && pos
                    .checked_add(pre.len())
                    .is_some_and(|end| end <= lines.len())
                && lines[pos..pos + pre.len()] == pre[..]
                && (!match_beginning || pos == 0)
                && (!match_end || pos + pre.len() == lines.len())
        };
        // Header numbers come from the patch text: saturating arithmetic, never a wrap.
        let expected = (isize::try_from(nominal).unwrap_or(isize::MAX))
            .saturating_add(offset)
            .max(0) as usize;
        let found = if exact {
            (nominal == expected && fits(nominal)).then_some(nominal)
        } else if pre.is_empty() && !lines.is_empty() && !match_end && leading == 0 {
            // Nothing to anchor a pure insertion on in a file that changed: conflict.
            None
        } else {
            // The one position after the previous hunk where the preimage fits. Two or more:
            // the host file repeats this context, and which copy the step meant cannot be
            // known (the nearest is not necessarily it), so that is a conflict, never a guess.
            let candidates: Box<dyn Iterator<Item = usize>> = match pre.first() {
                Some(first) => {
                    let at = occurrences.get(first).map_or(&[][..], Vec::as_slice);
                    let from = at.partition_point(|&p| p < cursor);
                    Box::new(at[from..].iter().copied())
                }
                // A pure insertion fits only where its anchors say (file start or end).
                None => Box::new(cursor..=lines.len()),
            };
            let mut places = candidates.filter(|&p| fits(p));
            match (places.next(), places.next()) {
                (Some(p), None) => Some(p),
                (Some(_), Some(_)) if !mark => {
                    return Err(HunkFailure {
                        ambiguous: true,
                        ..fail
                    })
                }
                (Some(_), Some(_)) => None,
                (None, _) => None,
            }
        };
        let Some(pos) = found else {
            if !mark {
                return Err(fail);
            }
            // A conflict block where the hunk was expected: the host's lines there (as many
            // as the hunk would have replaced), then the sandbox's version.
            let pos = expected.clamp(cursor, lines.len());
            let end = (pos + pre.len()).min(lines.len());
            out.extend(lines[cursor..pos].iter().map(|l| Cow::Borrowed(*l)));
            // A host line before the block without its newline (the file's last) gets one.
            let mut block = match out.last() {
                Some(l) if !l.ends_with('\n') => "\n".to_string(),
                _ => String::new(),
            };
            push_block(
                &mut block,
                &lines[pos..end].concat(),
                &postimage(h).collect::<String>(),
            );
            out.push(Cow::Owned(block));
            blocks += 1;
            cursor = end;
            continue;
        };
        out.extend(lines[cursor..pos].iter().map(|l| Cow::Borrowed(*l)));
        out.extend(postimage(h).map(Cow::Borrowed));
        cursor = pos + pre.len();
        offset = (pos as isize).saturating_sub(isize::try_from(nominal).unwrap_or(isize::MAX));
    }
    out.extend(lines[cursor..].iter().map(|l| Cow::Borrowed(*l)));
    Ok((out.concat(), blocks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::text_hunks;

    fn numbered(n: usize) -> String {
        (1..=n).map(|i| format!("line {i}\n")).collect()
    }

    /// Header numbers are the patch's: absurd ones are a failed hunk, never an overflow.
    #[test]
    fn absurd_hunk_positions_fail_without_overflow() {
        let old = numbered(5);
        let new = old.replace("line 3\n", "THREE\n");
        let mut h = text_hunks(&old, &new);
        h[0].old_start = usize::MAX - 1;
        assert!(apply_hunks(&old, &h, true).is_err());
        // Relocation finds the one real place (the context is unique).
        assert_eq!(apply_hunks(&old, &h, false).unwrap(), new);
        assert!(apply_hunks_marking(&old, &h).is_some());
    }

    #[test]
    fn exact_application_reproduces_new() {
        let old = numbered(40);
        let new = old.replace("line 5\n", "FIVE\n").replace("line 30\n", "");
        let h = text_hunks(&old, &new);
        assert_eq!(apply_hunks(&old, &h, true).unwrap(), new);
    }

    #[test]
    fn relocates_when_host_inserted_lines_elsewhere() {
        let old = numbered(40);
        let new = old.replace("line 30\n", "THIRTY\n");
        let h = text_hunks(&old, &new);
        let host = format!("header\nheader2\n{old}");
        assert!(apply_hunks(&host, &h, true).is_err());
        let merged = apply_hunks(&host, &h, false).unwrap();
        assert_eq!(merged, format!("header\nheader2\n{new}"));
    }

    #[test]
    fn conflicting_host_edit_fails() {
        let old = numbered(40);
        let new = old.replace("line 30\n", "THIRTY\n");
        let h = text_hunks(&old, &new);
        let host = old.replace("line 29\n", "host edit\n");
        assert_eq!(
            apply_hunks(&host, &h, false),
            Err(HunkFailure {
                hunk: 1,
                ambiguous: false
            })
        );
    }

    /// The host file now holds the hunk's context twice (a block duplicated after the step
    /// began): the edit could belong to either copy, so relocation refuses instead of picking
    /// the nearer one.
    #[test]
    fn ambiguous_relocation_is_a_conflict() {
        let block = "fn f() {\n    a();\n    a2();\n    a3();\n    b();\n    c();\n    c2();\n    c3();\n}\n";
        let old = format!("head\n{block}tail\n");
        let new = old.replace("    b();\n", "    B();\n");
        let h = text_hunks(&old, &new);
        let host = format!("head\n{block}{block}tail\n");
        assert_eq!(
            apply_hunks(&host, &h, false),
            Err(HunkFailure {
                hunk: 1,
                ambiguous: true
            })
        );
        // The same context once, moved: still relocated.
        let host = format!("new top\nhead\n{block}tail\n");
        assert_eq!(
            apply_hunks(&host, &h, false).unwrap(),
            format!("new top\n{new}")
        );
    }

    #[test]
    fn start_and_end_anchoring() {
        let old = "a\nb\nc\n";
        let new = "a\nb\nc\nd\n";
        let h = text_hunks(old, new);
        // Appending at the end must still append at the end of a host file that grew at the
        // front, and must not apply in the middle of one that grew at the end.
        assert_eq!(
            apply_hunks("z\na\nb\nc\n", &h, false).unwrap(),
            "z\na\nb\nc\nd\n"
        );
        assert!(apply_hunks("a\nb\nc\nx\n", &h, false).is_err());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::model::GitMode;
    use crate::parse::parse_patch;
    use crate::patch::{text_hunks, FilePatch, PatchBody};
    use proptest::prelude::*;

    /// Files made of few distinct lines (so diffs have real matches), maybe without a final
    /// newline.
    fn text() -> impl Strategy<Value = String> {
        (
            proptest::collection::vec(
                proptest::sample::select(vec![
                    "a", "b", "c", "fn x() {", "}", "", " ", "é", "\r", "a\rb", "c\r",
                ]),
                0..40,
            ),
            any::<bool>(),
        )
            .prop_map(|(lines, final_nl)| {
                let mut s = lines.join("\n");
                if final_nl && !s.is_empty() {
                    s.push('\n');
                }
                s
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn hunks_rebuild_new_and_round_trip_through_text(old in text(), new in text()) {
            let hunks = text_hunks(&old, &new);
            prop_assert_eq!(apply_hunks(&old, &hunks, true).unwrap(), new.clone());
            // Relocating mode must agree when nothing moved, unless a hunk's preimage occurs
            // more than once in `old` (then relocation refuses to guess).
            match apply_hunks(&old, &hunks, false) {
                Ok(t) => prop_assert_eq!(t, new.clone()),
                Err(f) => {
                    prop_assert!(f.ambiguous, "{:?}", f);
                    let pre = preimage(&hunks[f.hunk - 1]);
                    let lines: Vec<&str> = old.split_inclusive('\n').collect();
                    let fits = lines.windows(pre.len().max(1)).filter(|w| w[..] == pre[..]);
                    prop_assert!(pre.is_empty() || fits.count() > 1);
                }
            }
            if old == new {
                return Ok(());
            }
            let fp = FilePatch {
                path: "dir/f i.txt".into(),
                old_mode: Some(GitMode::File),
                new_mode: Some(GitMode::Executable),
                old_oid: Some(crate::model::git_blob_oid(old.as_bytes())),
                new_oid: Some(crate::model::git_blob_oid(new.as_bytes())),
                body: PatchBody::Text(hunks),
            };
            let text = fp.render();
            let parsed = parse_patch(&text).unwrap();
            prop_assert_eq!(parsed.len(), 1);
            prop_assert_eq!(&parsed[0], &fp);
        }

        /// Any name (bytes, not necessarily UTF-8) renders to valid patch text and parses back
        /// to the same path string, in the `diff --git` line and in the `---`/`+++` labels.
        #[test]
        fn every_name_round_trips_through_patch_text(
            name in proptest::collection::vec(
                proptest::sample::select(vec![
                    b'a', b' ', b'/', b'"', b'\\', b'\t', b'\n', b'\r', 0x01, 0x7f, 0x80, 0xc3,
                    0xa9, 0xff, b'b', b'.',
                ]),
                1..12,
            )
        ) {
            let path = crate::model::path_from_bytes(&name);
            prop_assert_eq!(crate::model::path_to_bytes(&path), Some(name.clone()));
            for body in [
                PatchBody::Empty,
                PatchBody::Text(text_hunks("", "x\n")),
            ] {
                let added = matches!(body, PatchBody::Text(_));
                let fp = FilePatch {
                    path: path.clone(),
                    old_mode: (!added).then_some(GitMode::File),
                    new_mode: Some(GitMode::Executable),
                    old_oid: None,
                    new_oid: added.then(|| crate::model::git_blob_oid(b"x\n")),
                    body,
                };
                let parsed = parse_patch(&fp.render());
                prop_assert!(parsed.is_ok(), "{:?}: {:?}", fp.render(), parsed);
                prop_assert_eq!(&parsed.unwrap()[0].path, &path);
            }
        }

        #[test]
        fn parser_never_panics(s in "(diff --git a/x b/x\n|index |@@ -1,2 \\+1 @@\n|[-+ ]x\n|GIT binary patch\n|literal 3\n|\\\\ No newline at end of file\n|--- a/x\n|\\+\\+\\+ b/x\n|new file mode 100644\n|.{0,10}\n){0,12}") {
            let _ = parse_patch(&s);
        }
    }
}
