//! Text is text as git sees it: the review's reading of files carried as git binary patches.
//!
//! A file travels as a git binary patch when it is not UTF-8 ([`crate::is_binary_content`]):
//! patch files and the manifest's `diff` strings are UTF-8 text, and the binary patch carries
//! the bytes exactly, so `git apply` and our apply keep writing exactly what was reviewed.
//! Git itself calls such a file text (binary is a NUL in the first 8000 bytes, or the
//! project's `.gitattributes` saying so), so the review must show it as text too: a script
//! with one Latin-1 byte in a comment would otherwise be "Bin", with none of its lines shown
//! nor looked at for the review's warnings. Transport and review are kept apart on purpose:
//! changing the transport would reach every crate that stores, relays or applies patches,
//! while decoding for the review keeps accept byte-exact and touches only what is shown.
//!
//! So [`PatchReview::new`] decodes each binary patch the way apply resolves it: the old side
//! is the patch's own copy (a reverse literal, or a reverse delta over a forward literal) or
//! else the host's file, each taken only when it hashes to the blob id the patch was made
//! against; the new side is the forward hunk resolved against it, checked against the new id
//! as apply checks it. When git would call both sides text, the review shows their line diff
//! (the differ of text patches, so `+`/`-` counts are the ones text patches get), its bytes
//! made inert as all review text is (invalid UTF-8 as `\xNN`).
//!
//! Bounds: a side over [`crate::STREAM_THRESHOLD_BYTES`] is shown by size, as such a file is
//! carried (as a literal, like git past `core.bigFileThreshold`); and one review decodes at
//! most [`MAX_REVIEW_DECODED_BYTES`]. A file the review cannot read as text (past that bound,
//! or its base is not at hand) is named, with why, in
//! [`ReviewFindings::not_shown_as_text`](crate::ReviewFindings::not_shown_as_text): the
//! review never shows less than accept writes without saying so.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use crate::attributes::{Attributes, DiffAttr};
use crate::binary::BinaryHunk;
use crate::findings::RiskyPath;
use crate::model::{git_blob_oid, git_sniffs_binary, GitMode};
use crate::patch::{byte_hunks, ByteHunk, FilePatch, PatchBody};

/// Bytes (old and new sides together) one review decodes from binary patches: the most a
/// bundle's patches may hold (SANDBOX_MAX_BUNDLE_BYTES), so reading binary-carried text costs
/// no more than reviewing the same change carried as text patches. Deflate and deltas make a
/// small patch a large content, which is why the bound is on what is decoded.
pub const MAX_REVIEW_DECODED_BYTES: u64 = crate::limit::DEFAULT_MAX_STREAMED_HUNK_BYTES;

/// The largest side the review decodes: past it detection carries a file as a literal
/// without holding it, and the review shows it by size alike.
const MAX_SIDE_BYTES: u64 = crate::limit::STREAM_THRESHOLD_BYTES;

/// Patches as the review shows them: each one as it is, except a file carried as a git binary
/// patch whose content git calls text, shown as that text (see the module documentation).
/// [`PatchReview::stats`], [`PatchReview::findings`] and [`PatchReview::render`] all read
/// the same decoding, so the counts, the warnings and the diff agree.
#[derive(Debug)]
pub struct PatchReview<'a> {
    pub(crate) patches: &'a [FilePatch],
    /// Per patch, the line diff decoded from its binary patch, when it is text to git.
    pub(crate) texts: Vec<Option<Vec<ByteHunk>>>,
    /// Binary-carried files that could not be read as text, and why.
    pub(crate) unread: Vec<RiskyPath>,
}

/// What the review reads of the host tree.
struct Host {
    tree: Option<smithers_paths::Beneath>,
    attributes: Attributes,
}

impl<'a> PatchReview<'a> {
    /// Decodes `patches` for review. `root` is the host tree the patches apply to: its
    /// top-level `.gitattributes` says which paths are binary, and its files are the old
    /// sides that delta-only binary patches do not carry. Read through
    /// [`smithers_paths::Beneath`] (no link followed, bounded): the tree is untrusted. Without
    /// it, what the patches carry themselves is decoded.
    pub fn new(patches: &'a [FilePatch], root: Option<&Path>) -> PatchReview<'a> {
        PatchReview::with_budget(patches, root, MAX_REVIEW_DECODED_BYTES)
    }

    /// [`PatchReview::new`] decoding at most `budget` bytes.
    fn with_budget(patches: &'a [FilePatch], root: Option<&Path>, budget: u64) -> PatchReview<'a> {
        let tree = root.and_then(|r| smithers_paths::Beneath::open(r).ok());
        let attributes = tree.as_ref().map(Attributes::read).unwrap_or_default();
        let host = Host { tree, attributes };
        let mut budget = budget;
        let mut texts = Vec::with_capacity(patches.len());
        let mut unread = Vec::new();
        for p in patches {
            texts.push(match read_as_text(p, &host, &mut budget) {
                Ok(t) => t,
                Err(reason) => {
                    unread.push(RiskyPath {
                        path: p.path.clone(),
                        reason,
                    });
                    None
                }
            });
        }
        PatchReview {
            patches,
            texts,
            unread,
        }
    }
}

/// Whether a hunk's result is too large to decode for the review (a literal kept deflated is
/// one by construction).
fn too_large(h: &BinaryHunk) -> bool {
    matches!(h, BinaryHunk::Encoded(_)) || h.result_len() > MAX_SIDE_BYTES
}

/// The line diff of a binary patch whose sides git calls text; `Ok(None)`: shown as it is
/// (not a binary patch, binary to git, or too large); `Err`: text to git for all we know,
/// but not readable here, with why.
fn read_as_text(
    p: &FilePatch,
    host: &Host,
    budget: &mut u64,
) -> Result<Option<Vec<ByteHunk>>, String> {
    let PatchBody::Binary { forward, reverse } = &p.body else {
        return Ok(None);
    };
    // A symlink's target is no file to show as text (and not one detection carries binary).
    if p.old_mode == Some(GitMode::Symlink) || p.new_mode == Some(GitMode::Symlink) {
        return Ok(None);
    }
    let attr = host.attributes.diff(&p.path_bytes());
    if attr == DiffAttr::Binary || too_large(forward) || reverse.as_ref().is_some_and(too_large) {
        return Ok(None);
    }
    let binary = |c: &[u8]| attr != DiffAttr::Text && git_sniffs_binary(c);
    // A literal is already in memory: a real binary file is known without decoding anything.
    let literal_binary = |h: &BinaryHunk| matches!(h, BinaryHunk::Literal(d) if binary(d));
    if literal_binary(forward) || reverse.as_ref().is_some_and(literal_binary) {
        return Ok(None);
    }
    let over_budget = || {
        format!(
            "past the review's bound of {} MiB decoded from binary patches; its patch carries it exactly",
            MAX_REVIEW_DECODED_BYTES >> 20
        )
    };
    let declared = forward.result_len() + reverse.as_ref().map_or(0, BinaryHunk::result_len);
    if declared > *budget {
        return Err(over_budget());
    }
    let old = old_side(p, forward, reverse.as_ref(), host)?;
    let new: Cow<'_, [u8]> = match (p.new_mode, forward) {
        (None, _) => Cow::Borrowed(&[]),
        (Some(_), BinaryHunk::Literal(d)) => Cow::Borrowed(d),
        (Some(_), f) => Cow::Owned(f.resolve(&old).map_err(|e| {
            format!("its binary patch does not apply to its base ({e}); accept refuses it")
        })?),
    };
    if p.new_oid
        .as_deref()
        .is_some_and(|n| git_blob_oid(&new) != n)
    {
        return Err(
            "its binary patch does not make the content its index line names; accept refuses it"
                .into(),
        );
    }
    let cost = (old.len() + new.len()) as u64;
    if cost > *budget {
        return Err(over_budget());
    }
    *budget -= cost;
    if binary(&old) || binary(&new) {
        return Ok(None);
    }
    Ok(Some(byte_hunks(&old, &new)))
}

/// The content apply resolves the forward hunk against: empty for a new file; else the
/// patch's own copy or the host's file, whichever hashes to the id the patch was made
/// against, or the host's file taken back through the reverse hunk when it already holds
/// the result (with no id named, apply takes the host's file as it is, and so does this).
fn old_side<'p>(
    p: &FilePatch,
    forward: &'p BinaryHunk,
    reverse: Option<&'p BinaryHunk>,
    host: &Host,
) -> Result<Cow<'p, [u8]>, String> {
    if p.old_mode.is_none() {
        return Ok(Cow::Borrowed(&[]));
    }
    let Some(oid) = p.old_oid.as_deref() else {
        return host_file(p, host).map(Cow::Owned);
    };
    let own: Option<Cow<'p, [u8]>> = match (reverse, forward) {
        (Some(BinaryHunk::Literal(o)), _) => Some(Cow::Borrowed(o)),
        (Some(r @ BinaryHunk::Delta(_)), BinaryHunk::Literal(n)) => {
            r.resolve(n).ok().map(Cow::Owned)
        }
        _ => None,
    };
    if let Some(o) = own.filter(|o| git_blob_oid(o) == oid) {
        return Ok(o);
    }
    let o = host_file(p, host)?;
    let found = git_blob_oid(&o);
    if found == oid {
        return Ok(Cow::Owned(o));
    }
    // Already applied (a review read after accept): the host holds the result, and the
    // reverse hunk leads back from it.
    if let (Some(r), Some(n)) = (reverse, p.new_oid.as_deref()) {
        if found == n {
            if let Some(back) = r.resolve(&o).ok().filter(|b| git_blob_oid(b) == oid) {
                return Ok(Cow::Owned(back));
            }
        }
    }
    Err("the host's file is neither the one the change was made against nor its result; accept refuses it as a conflict".into())
}

/// The host's file at the patch's path, bounded and confined.
fn host_file(p: &FilePatch, host: &Host) -> Result<Vec<u8>, String> {
    use std::os::unix::ffi::OsStringExt;
    let Some(tree) = &host.tree else {
        return Err(
            "its old side is the host's file, not read here (the full review reads it)".into(),
        );
    };
    let rel = PathBuf::from(std::ffi::OsString::from_vec(p.path_bytes()));
    match tree.read_regular(&rel, MAX_SIDE_BYTES) {
        Ok(Some(bytes)) => Ok(bytes),
        _ => Err(format!(
            "its old side is the host's file, which could not be read (missing, not a regular file, or over {} MiB)",
            MAX_SIDE_BYTES >> 20
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(path: &str, content: &[u8]) -> FilePatch {
        FilePatch {
            path: path.into(),
            old_mode: None,
            new_mode: Some(GitMode::File),
            old_oid: None,
            new_oid: Some(git_blob_oid(content)),
            body: PatchBody::Binary {
                forward: BinaryHunk::Literal(content.to_vec()),
                reverse: Some(BinaryHunk::Literal(Vec::new())),
            },
        }
    }

    /// Past the bound, a file is named with why, and shown by size.
    #[test]
    fn decoding_is_bounded_and_says_so() {
        let text = [b"caf\xe9\n".repeat(100), b"end\n".to_vec()].concat();
        let nul = [vec![0u8; 10], text.clone()].concat();
        let patches = [
            added("binary.bin", &nul),
            added("a.txt", &text),
            added("b.txt", &text),
        ];
        // Room for one text: a real binary (a NUL in its literal) costs nothing.
        let r = PatchReview::with_budget(&patches, None, text.len() as u64 + 10);
        assert!(r.texts[0].is_none() && r.texts[1].is_some() && r.texts[2].is_none());
        assert_eq!(r.unread.len(), 1);
        assert_eq!(r.unread[0].path, "b.txt");
        assert!(r.unread[0].reason.contains("bound"), "{:?}", r.unread);
        assert!(r.stats()[2].binary.is_some());
        assert_eq!(PatchReview::new(&patches, None).unread, []);
    }

    /// A side larger than detection holds is shown by size, as detection carries it.
    #[test]
    fn a_huge_side_is_not_decoded() {
        let mut big = vec![b'a'; MAX_SIDE_BYTES as usize + 1];
        big[0] = 0xe9;
        let patches = [added("big.txt", &big), added("small.txt", b"caf\xe9\n")];
        let r = PatchReview::new(&patches, None);
        assert!(r.texts[0].is_none() && r.texts[1].is_some());
        assert!(r.unread.is_empty());
    }

    /// A result that is not what the index line names is not shown as if apply wrote it.
    #[test]
    fn a_result_that_does_not_match_its_id_is_named() {
        let mut p = added("x.txt", b"caf\xe9\n");
        p.new_oid = Some(git_blob_oid(b"other"));
        let r = PatchReview::new(std::slice::from_ref(&p), None);
        assert!(r.texts[0].is_none());
        assert!(
            r.unread[0].reason.contains("accept refuses it"),
            "{:?}",
            r.unread
        );
    }
}
