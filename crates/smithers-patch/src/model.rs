//! Small shared pieces: git file modes, git blob hashes, binary detection, git's path quoting.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};

/// The all-zero object id git writes for "no file".
pub const ZERO_OID: &str = "0000000000000000000000000000000000000000";

/// How many leading bytes git inspects for a NUL to decide a file is binary.
const BINARY_SNIFF_LEN: usize = 8000;

/// The three file modes a git tree can record for a non-directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GitMode {
    /// `100644`
    #[serde(rename = "100644")]
    File,
    /// `100755`
    #[serde(rename = "100755")]
    Executable,
    /// `120000`
    #[serde(rename = "120000")]
    Symlink,
}

impl GitMode {
    /// The octal string git prints, e.g. `"100644"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            GitMode::File => "100644",
            GitMode::Executable => "100755",
            GitMode::Symlink => "120000",
        }
    }

    /// Parses git's octal form. `100664` (old git) is accepted as `100644`, as git does.
    pub fn parse(s: &str) -> Option<GitMode> {
        match s {
            "100644" | "100664" => Some(GitMode::File),
            "100755" => Some(GitMode::Executable),
            "120000" => Some(GitMode::Symlink),
            _ => None,
        }
    }

    /// The mode git records for a regular file with these permission bits: git only keeps the
    /// owner's execute bit.
    pub const fn from_regular_permissions(st_mode: u32) -> GitMode {
        if st_mode & 0o100 != 0 {
            GitMode::Executable
        } else {
            GitMode::File
        }
    }

    /// True for `120000`.
    pub const fn is_symlink(self) -> bool {
        matches!(self, GitMode::Symlink)
    }
}

impl fmt::Display for GitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The git blob object id (sha1 of `"blob <len>\0" + content`), 40 lowercase hex digits.
pub fn git_blob_oid(content: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", content.len()).as_bytes());
    h.update(content);
    hex(&h.finalize())
}

/// Lower-case hex of a digest, as git writes object ids.
pub(crate) fn hex(digest: &[u8]) -> String {
    let mut out = String::with_capacity(digest.len() * 2);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Whether content *travels* as a binary patch: when git calls it binary
/// ([`git_sniffs_binary`]), or when it is not valid UTF-8. The second is a matter of transport
/// only: patch files and the manifest's `diff` strings are JSON/UTF-8 text, and a git binary
/// patch carries such a file byte-exactly where a lossy text diff would not. The review does
/// not go by this: it decodes such a patch and shows the file as the text git sees
/// ([`crate::PatchReview`]).
pub fn is_binary_content(content: &[u8]) -> bool {
    git_sniffs_binary(content) || std::str::from_utf8(content).is_err()
}

/// Git's own test of content (xdiff's `buffer_is_binary`): a NUL in the first 8000 bytes.
/// Bytes that are not UTF-8 are text to git, and a NUL further in too.
pub fn git_sniffs_binary(content: &[u8]) -> bool {
    content[..content.len().min(BINARY_SNIFF_LEN)].contains(&0)
}

/// Whether git would C-quote this path (core.quotePath=true, the default): control
/// characters, `"`, `\` and every byte >= 0x80.
/// `prefix + path` the way git prints it in `diff --git`, `---` and `+++` lines: as-is, or
/// C-quoted (`"a/t\303\251st"`) when it holds special bytes. `path` is the literal name; for
/// a [`FilePatch`](crate::FilePatch) path use [`quote_git_path_bytes`] with
/// [`path_to_bytes`], which also covers names that are not UTF-8.
pub fn quote_git_path(prefix: &str, path: &str) -> String {
    quote_git_path_bytes(prefix, path.as_bytes())
}

/// [`quote_git_path`] for a name given as raw bytes (which need not be UTF-8): the result is
/// always valid UTF-8 (bytes >= 0x80 become octal escapes).
pub fn quote_git_path_bytes(prefix: &str, path: &[u8]) -> String {
    // git's core.quotePath quoting, the one the review shows names with too.
    let mut full = prefix.as_bytes().to_vec();
    full.extend_from_slice(path);
    smithers_terminal::quote_path_bytes(&full)
}

/// Reverses [`quote_git_path_bytes`] for a quoted token (with its surrounding quotes): the
/// raw bytes and the number of bytes of `s` consumed, or `None` when malformed.
pub fn unquote_git_path_bytes(s: &str) -> Option<(Vec<u8>, usize)> {
    let bytes = s.as_bytes();
    if bytes.first() != Some(&b'"') {
        return None;
    }
    let mut out: Vec<u8> = Vec::new();
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return Some((out, i + 1)),
            b'\\' => {
                let c = *bytes.get(i + 1)?;
                i += 2;
                match c {
                    b'a' => out.push(0x07),
                    b'b' => out.push(0x08),
                    b't' => out.push(b'\t'),
                    b'n' => out.push(b'\n'),
                    b'v' => out.push(0x0b),
                    b'f' => out.push(0x0c),
                    b'r' => out.push(b'\r'),
                    b'"' => out.push(b'"'),
                    b'\\' => out.push(b'\\'),
                    b'0'..=b'3' => {
                        let d2 = *bytes.get(i)?;
                        let d3 = *bytes.get(i + 1)?;
                        if !(b'0'..=b'7').contains(&d2) || !(b'0'..=b'7').contains(&d3) {
                            return None;
                        }
                        out.push((c - b'0') * 64 + (d2 - b'0') * 8 + (d3 - b'0'));
                        i += 2;
                    }
                    _ => return None,
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    None
}

/// The `path` string of a change or patch for a name given as raw bytes. A UTF-8 name is
/// itself, unless it begins with `"`; any other name (not UTF-8, or beginning with `"`) is
/// held in git's C-quoted form, quotes included (`"caf\351"`). The two forms cannot collide:
/// a quoted form always begins with `"`, and a name that does is always quoted. So every byte
/// sequence has one string, the string is valid UTF-8 (JSON, patch text), and
/// [`path_to_bytes`] gives the bytes back.
pub fn path_from_bytes(name: &[u8]) -> String {
    match std::str::from_utf8(name) {
        Ok(s) if !s.starts_with('"') => s.to_string(),
        _ => quote_git_path_bytes("", name),
    }
}

/// The raw bytes a `path` string names (see [`path_from_bytes`]); `None` for a string that
/// begins with `"` but is not exactly one well-formed quoted token.
pub fn path_to_bytes(path: &str) -> Option<Vec<u8>> {
    if !path.starts_with('"') {
        return Some(path.as_bytes().to_vec());
    }
    let (bytes, used) = unquote_git_path_bytes(path)?;
    (used == path.len()).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_oid_matches_git() {
        // `git hash-object /dev/null` and `printf 'hello\n' | git hash-object --stdin`.
        assert_eq!(
            git_blob_oid(b""),
            "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
        );
        assert_eq!(
            git_blob_oid(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }

    #[test]
    fn quoting_round_trips() {
        for p in [
            "plain/x.rs",
            "with space",
            "tést",
            "tab\there",
            "q\"uote",
            "back\\slash",
        ] {
            let q = quote_git_path("a/", p);
            if q.starts_with('"') {
                let (u, used) = unquote_git_path_bytes(&q).unwrap();
                assert_eq!(u, format!("a/{p}").into_bytes());
                assert_eq!(used, q.len());
            } else {
                assert_eq!(q, format!("a/{p}"));
            }
        }
        assert_eq!(quote_git_path("a/", "tést"), "\"a/t\\303\\251st\"");
    }

    #[test]
    fn path_strings_round_trip_every_name() {
        for name in [
            &b"plain/x.rs"[..],
            "tést/ü".as_bytes(),
            b"caf\xe9",
            b"dir\xff/x",
            b"\"starts with a quote",
            b"tab\there\nnewline",
            b"back\\slash",
        ] {
            let s = path_from_bytes(name);
            assert_eq!(path_to_bytes(&s).as_deref(), Some(name), "{s}");
        }
        assert_eq!(path_from_bytes("tést".as_bytes()), "tést");
        assert_eq!(path_from_bytes(b"caf\xe9"), "\"caf\\351\"");
        assert_eq!(path_from_bytes(b"\"q"), "\"\\\"q\"");
        assert_eq!(quote_git_path_bytes("a/", b"caf\xe9"), "\"a/caf\\351\"");
        // A string beginning with a quote must be one whole quoted token.
        assert_eq!(path_to_bytes("\"a\"b"), None);
        assert_eq!(path_to_bytes("\"unterminated"), None);
    }

    #[test]
    fn binary_detection() {
        assert!(!is_binary_content(b"text\n"));
        assert!(is_binary_content(b"a\0b"));
        assert!(is_binary_content(&[0xff, 0xfe, b'a']));
        assert!(!is_binary_content("héllo".as_bytes()));
        // Git's rule alone: a Latin-1 byte is text, a NUL only counts in the first 8000 bytes.
        assert!(!git_sniffs_binary(b"caf\xe9\n"));
        assert!(git_sniffs_binary(&[b"a".repeat(7999), vec![0]].concat()));
        assert!(!git_sniffs_binary(&[b"a".repeat(8000), vec![0]].concat()));
        assert!(!is_binary_content(&[b"a".repeat(8000), vec![0]].concat()));
    }

    #[test]
    fn modes() {
        assert_eq!(
            GitMode::from_regular_permissions(0o100755),
            GitMode::Executable
        );
        assert_eq!(GitMode::from_regular_permissions(0o100644), GitMode::File);
        assert_eq!(GitMode::from_regular_permissions(0o100654), GitMode::File);
        assert_eq!(GitMode::parse("120000"), Some(GitMode::Symlink));
        assert_eq!(GitMode::parse("040000"), None);
    }
}
