//! smithers-terminal: the one escaping layer for everything smithers-sandbox shows a person.
//!
//! A step's output, the files it wrote, their names, and whatever a database or a bundle under
//! the project says are all hostile. Written raw to a terminal they can erase a line
//! (`ESC [2K`, `CR`), move the cursor, set the clipboard or make links (OSC 52 / OSC 8), forge
//! lines with a newline in a file name, or reorder what is displayed (bidi overrides). Every
//! human rendering (the review, `run`'s live output and progress line, `show`, `events`, `ls`,
//! error messages) passes such text through [`escape`] (or [`escape_bytes`]) and every file name
//! through [`quote_path`], so what reaches the terminal is visible and inert. JSON output is not
//! passed through here: escaping it is JSON's job.
//!
//! What is escaped, and how (one visible form per character, so nothing is dropped):
//!
//! | characters | shown as |
//! |---|---|
//! | C0 controls U+0000–U+001F (ESC, CR, BS, ... and `\t`/`\n` unless kept) | caret notation, `^[`, `^M`, `^H` |
//! | DEL U+007F | `^?` |
//! | C1 controls U+0080–U+009F (8-bit CSI, OSC, ...) | `\u{9b}` |
//! | bidi embeddings, overrides, isolates and marks (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069) | `\u{202e}` |
//! | a byte that is not part of valid UTF-8 | `\xff` |
//!
//! With [`Inert::marked`] each escape is shown in reverse video (`ESC [7m` … `ESC [27m`, which
//! leaves any colour around it on), so the escape `^[` we print differs from the two characters
//! `^[` in the text. That is the only escape sequence this crate emits.
#![forbid(unsafe_code)]

pub mod escape_keys;
mod left;
pub mod vt;

/// Starts the reverse-video style of an escape (only with [`Inert::marked`]).
pub const MARK_ON: &str = "\x1b[7m";
/// Ends it, leaving colour and weight as they were.
pub const MARK_OFF: &str = "\x1b[27m";

/// How text is made inert.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inert {
    /// Keep `\t` as is: a tab only moves the cursor forward on the same line (diff body lines,
    /// relayed output lines).
    pub keep_tab: bool,
    /// Keep `\n` as is: for multi-line text whose every line is shown (never for a single-line
    /// field, where a newline would let the text forge the next line).
    pub keep_newline: bool,
    /// Show each escape in reverse video (for a terminal only; the caller decides, like
    /// colour).
    pub marked: bool,
}

impl Inert {
    /// One line, every control escaped (file names in messages, table cells, status lines).
    pub const LINE: Inert = Inert {
        keep_tab: false,
        keep_newline: false,
        marked: false,
    };
    /// The body of a line (a diff line, a relayed output line): tabs kept.
    pub const BODY: Inert = Inert {
        keep_tab: true,
        keep_newline: false,
        marked: false,
    };

    /// This style, with the escapes marked or not.
    pub const fn marked(self, marked: bool) -> Inert {
        Inert { marked, ..self }
    }
}

/// Whether `c` is a bidi control: embeddings, overrides, isolates and the invisible marks.
/// They reorder what a terminal displays (a line can read differently from its bytes, the
/// "Trojan Source" attack), and none of them is visible.
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

/// Whether `c` is escaped under `how`.
pub fn needs_escape(c: char, how: Inert) -> bool {
    match c {
        '\t' => !how.keep_tab,
        '\n' => !how.keep_newline,
        '\0'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        c => is_bidi_control(c),
    }
}

/// Whether `s` holds anything [`escape`] would change under `how`.
pub fn has_controls(s: &str, how: Inert) -> bool {
    s.chars().any(|c| needs_escape(c, how))
}

/// Whether `bytes` hold anything [`escape_bytes`] would change under `how` (invalid UTF-8
/// included).
pub fn bytes_have_controls(bytes: &[u8], how: Inert) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(s) => has_controls(s, how),
        Err(_) => true,
    }
}

/// The visible form of one escaped character.
fn push_visible(out: &mut String, c: char) {
    match c {
        '\0'..='\u{1f}' => {
            out.push('^');
            out.push(char::from(c as u8 + 0x40));
        }
        '\u{7f}' => out.push_str("^?"),
        c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
    }
}

/// Appends the inert form of `s` to `out`; returns how many characters were escaped.
pub fn escape_into(out: &mut String, s: &str, how: Inert) -> usize {
    let mut escaped = 0;
    let mut in_mark = false;
    for c in s.chars() {
        let esc = needs_escape(c, how);
        if how.marked && esc != in_mark {
            out.push_str(if esc { MARK_ON } else { MARK_OFF });
            in_mark = esc;
        }
        if esc {
            push_visible(out, c);
            escaped += 1;
        } else {
            out.push(c);
        }
    }
    if in_mark {
        out.push_str(MARK_OFF);
    }
    escaped
}

/// The inert form of `s`.
pub fn escape(s: &str, how: Inert) -> String {
    let mut out = String::with_capacity(s.len());
    escape_into(&mut out, s, how);
    out
}

/// [`escape`] under [`Inert::LINE`]: one line, nothing kept.
pub fn line(s: &str) -> String {
    escape(s, Inert::LINE)
}

/// Appends the inert form of bytes that may not be UTF-8: valid runs as [`escape_into`], each
/// invalid byte as `\xNN` (marked like any escape). Returns how many were escaped.
pub fn escape_bytes_into(out: &mut String, mut bytes: &[u8], how: Inert) -> usize {
    let mut escaped = 0;
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => return escaped + escape_into(out, s, how),
            Err(e) => {
                let (valid, rest) = bytes.split_at(e.valid_up_to());
                // `valid_up_to` is the length of the longest valid prefix.
                let valid = std::str::from_utf8(valid).unwrap_or_default();
                escaped += escape_into(out, valid, how);
                let bad = e.error_len().unwrap_or(rest.len());
                if how.marked {
                    out.push_str(MARK_ON);
                }
                for b in &rest[..bad] {
                    out.push_str(&format!("\\x{b:02x}"));
                }
                if how.marked {
                    out.push_str(MARK_OFF);
                }
                escaped += bad;
                bytes = &rest[bad..];
            }
        }
    }
}

/// The inert form of bytes that may not be UTF-8.
pub fn escape_bytes(bytes: &[u8], how: Inert) -> String {
    let mut out = String::with_capacity(bytes.len());
    escape_bytes_into(&mut out, bytes, how);
    out
}

/// Whether git would C-quote a name with these bytes (core.quotePath=true, its default):
/// control characters, `"`, `\`, DEL and every byte >= 0x80.
fn path_needs_quoting(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f || b >= 0x80)
}

/// A file name as git shows it (core.quotePath=true): as is, or in double quotes with C
/// escapes (`\n`, `\t`, `\"`, `\\`, ...) and an octal escape for every other control byte and
/// every byte >= 0x80 (`"t\303\251st"`). The result is printable ASCII whenever it is quoted,
/// so a name can neither break a line nor reorder one.
pub fn quote_path(path: &str) -> String {
    quote_path_bytes(path.as_bytes())
}

/// [`quote_path`] of a name that may not be UTF-8.
pub fn quote_path_bytes(path: &[u8]) -> String {
    if !path_needs_quoting(path) {
        // Unquoted names are printable ASCII without `"` or `\`.
        return path.iter().map(|&b| char::from(b)).collect();
    }
    let mut out = String::with_capacity(path.len() + 8);
    out.push('"');
    for &b in path {
        match b {
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0b => out.push_str("\\v"),
            0x0c => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b if !(0x20..0x7f).contains(&b) => out.push_str(&format!("\\{b:03o}")),
            b => out.push(char::from(b)),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every escape sequence a terminal would act on, and what we show instead.
    #[test]
    fn controls_become_visible_text() {
        let cases = [
            ("ok\x1b[2K\rforged", "ok^[[2K^Mforged"),
            ("\x1b]52;c;ZXZpbA==\x07", "^[]52;c;ZXZpbA==^G"),
            (
                "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\",
                "^[]8;;http://evil^[\\link^[]8;;^[\\",
            ),
            ("back\x08\x08space", "back^H^Hspace"),
            ("nul\0del\x7f", "nul^@del^?"),
            (
                "c1 csi \u{9b}31m osc \u{9d}",
                "c1 csi \\u{9b}31m osc \\u{9d}",
            ),
            ("a\u{202e}txt.exe\u{202c}", "a\\u{202e}txt.exe\\u{202c}"),
            (
                "iso\u{2066}x\u{2069} mark\u{200f}",
                "iso\\u{2066}x\\u{2069} mark\\u{200f}",
            ),
            ("two\nlines\tand tab", "two^Jlines^Iand tab"),
            ("plain text, é and 漢字 stay", "plain text, é and 漢字 stay"),
        ];
        for (input, want) in cases {
            assert_eq!(line(input), want, "{input:?}");
            assert!(!line(input).contains('\x1b'), "{input:?}");
        }
    }

    #[test]
    fn body_keeps_tabs_but_not_newlines_or_cr() {
        assert_eq!(escape("a\tb\r\n", Inert::BODY), "a\tb^M^J");
        let multi = Inert {
            keep_newline: true,
            ..Inert::BODY
        };
        assert_eq!(escape("a\tb\nc\x1b", multi), "a\tb\nc^[");
        assert!(!has_controls("a\tb", Inert::BODY));
        assert!(has_controls("a\tb", Inert::LINE));
        assert!(has_controls("x\u{2067}", Inert::BODY));
    }

    #[test]
    fn marked_escapes_are_in_reverse_video_and_nothing_else() {
        let out = escape("a\x1b[31mb\x07\x07c", Inert::LINE.marked(true));
        assert_eq!(out, "a\x1b[7m^[\x1b[27m[31mb\x1b[7m^G^G\x1b[27mc");
        // The only ESCs left are our own marks.
        let stripped = out.replace(MARK_ON, "").replace(MARK_OFF, "");
        assert!(!stripped.contains('\x1b'), "{stripped:?}");
        assert_eq!(
            escape("\u{9b}", Inert::LINE.marked(true)),
            "\x1b[7m\\u{9b}\x1b[27m"
        );
    }

    #[test]
    fn invalid_utf8_is_shown_byte_by_byte() {
        assert_eq!(
            escape_bytes(b"ok\xff\xfe then \xe2\x82 \x1b", Inert::LINE),
            "ok\\xff\\xfe then \\xe2\\x82 ^["
        );
        assert_eq!(
            escape_bytes("é\u{202e}".as_bytes(), Inert::LINE),
            "é\\u{202e}"
        );
        assert!(bytes_have_controls(b"\xc3", Inert::BODY));
        assert!(!bytes_have_controls("é".as_bytes(), Inert::BODY));
        let mut out = String::new();
        assert_eq!(escape_bytes_into(&mut out, b"\x80a\x1b", Inert::LINE), 2);
    }

    /// The forms git prints (checked with `git -c core.quotePath=true diff --stat`).
    #[test]
    fn paths_are_quoted_as_git_quotes_them() {
        assert_eq!(quote_path("src/lib.rs"), "src/lib.rs");
        assert_eq!(quote_path("with space.txt"), "with space.txt");
        assert_eq!(
            quote_path("evil\n file.txt | 1 +"),
            "\"evil\\n file.txt | 1 +\""
        );
        assert_eq!(quote_path("tést"), "\"t\\303\\251st\"");
        assert_eq!(quote_path("a\x1b[2Kb"), "\"a\\033[2Kb\"");
        assert_eq!(quote_path("q\"b\\s\t"), "\"q\\\"b\\\\s\\t\"");
        assert_eq!(quote_path("rlo\u{202e}"), "\"rlo\\342\\200\\256\"");
        assert_eq!(quote_path_bytes(b"bad\xff"), "\"bad\\377\"");
        for name in ["a\nb", "\x1b]52;c;x\x07", "\u{9b}x", "é"] {
            let q = quote_path(name);
            assert!(q.bytes().all(|b| (0x20..0x7f).contains(&b)), "{q:?}");
        }
    }
}
