//! Inert output on a real terminal: the review of a hostile change and `run`'s live output of
//! a hostile step, run under `script` (util-linux) so that the binary sees a pty as its
//! stdout/stderr, exactly as a person's terminal. The bytes that reach the terminal must hold
//! no escape sequence but our own colour codes, and a forged file name must not look like a
//! stat line.
//!
//! Needs native sandboxes and `script`; prints `SKIP <reason>` without them (fails under
//! `CI=true`).

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod support;

use smithers_test_support::skip_or_fail;
use support::native::{bin, bin_path, sandboxes_usable};

/// Native sandboxes and `script` are available.
fn usable() -> bool {
    let script = Command::new("script").arg("--version").output();
    if !script.is_ok_and(|o| o.status.success()) {
        return skip_or_fail("util-linux `script` not found");
    }
    sandboxes_usable()
}

/// The bidi controls a terminal would reorder text by (kept here, not imported: the test
/// checks the escaping crate rather than trusting its list).
fn is_bidi(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs the binary with `args` on a pty (`script -qec`), colour allowed; returns the bytes the
/// terminal received, with the pty's `\r\n` turned back into `\n`.
fn on_terminal(args: &[&str]) -> Vec<u8> {
    let cmd = std::iter::once(bin_path())
        .chain(args.iter().copied())
        .map(sh_quote)
        .collect::<Vec<_>>()
        .join(" ");
    let out: Output = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env_remove("SMITHERS_DB")
        .env_remove("NO_COLOR")
        .env("COLUMNS", "200")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let mut bytes = Vec::with_capacity(out.stdout.len());
    let mut i = 0;
    while i < out.stdout.len() {
        if out.stdout[i..].starts_with(b"\r\n") {
            bytes.push(b'\n');
            i += 2;
        } else {
            bytes.push(out.stdout[i]);
            i += 1;
        }
    }
    bytes
}

/// The escape sequences in `bytes` that are not in `allowed`, and other terminal controls
/// (BEL, backspace, DEL, C1 controls, lone CR, bidi controls).
fn foreign_controls(bytes: &[u8], allowed: &[&[u8]]) -> Vec<String> {
    let text = std::str::from_utf8(bytes).expect("terminal output is UTF-8");
    let mut bad = Vec::new();
    let mut skip_to = 0;
    for (i, c) in text.char_indices() {
        if i < skip_to {
            continue;
        }
        let rest = &bytes[i..];
        if c == '\x1b' {
            match allowed.iter().find(|a| rest.starts_with(a)) {
                Some(a) => skip_to = i + a.len(),
                None => bad.push(format!(
                    "{:?} at {i}",
                    text[i..].chars().take(12).collect::<String>()
                )),
            }
            continue;
        }
        if matches!(c, '\x07' | '\x08' | '\x7f' | '\r' | '\u{80}'..='\u{9f}') || is_bidi(c) {
            bad.push(format!("{c:?} at {i}"));
        }
    }
    bad
}

/// `bytes` without any occurrence of `pat`.
fn remove_all(bytes: &[u8], pat: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(pat) {
            i += pat.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// The review's own SGR codes and the reverse-video marks of escapes.
const REVIEW_SGR: &[&[u8]] = &[
    b"\x1b[1;33m",
    b"\x1b[1m",
    b"\x1b[31m",
    b"\x1b[32m",
    b"\x1b[36m",
    b"\x1b[7m",
    b"\x1b[27m",
    b"\x1b[m",
];

/// Removes our SGR codes, leaving the text a person reads.
fn visible_text(bytes: &[u8]) -> String {
    let mut text = String::from_utf8(bytes.to_vec()).expect("terminal output is UTF-8");
    for sgr in REVIEW_SGR {
        text = text.replace(std::str::from_utf8(sgr).unwrap(), "");
    }
    text
}

/// The step: an added line that erases itself and prints an innocent one, OSC 52 (clipboard)
/// and OSC 8 (hyperlink) sequences and a bidi override in a file, a file whose name holds a
/// newline and a fake stat line, a CI workflow and an `.envrc`; on its stdout the same
/// sequences and a cursor move.
const HOSTILE_STEP: &str = r#"
printf 'echo ok\nrm -rf ~/ \033[2K\r# harmless comment\n' >> run.sh
printf 'clip \033]52;c;ZXZpbA==\007 link \033]8;;http://evil.example\033\\here\033]8;;\033\\ \342\200\256gnp.exe\n' > notes.txt
printf 'forged\n' > "$(printf 'x\n file.txt | 1 +')"
mkdir -p .github/workflows && printf 'on: push\n' > .github/workflows/ci.yml
printf 'export A=1\n' > .envrc
printf 'live \033]52;c;c3RlcA==\007 \033[5;7Hmoved \033]0;title\007\n'
printf 'err \033[2J\n' >&2
"#;

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("run.sh"), "echo ok\n").unwrap();
    dir
}

fn run_hostile(root: &Path) -> Value {
    let out = bin()
        .args(["run", "--json", "--root", root.to_str().unwrap()])
        .args(["--", "sh", "-c", HOSTILE_STEP])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(doc["status"], "review", "{doc}");
    doc
}

#[test]
fn review_on_a_terminal_shows_hostile_content_inert() {
    if !usable() {
        return;
    }
    let root = project();
    let doc = run_hostile(root.path());
    let id = doc["sandboxId"].as_str().unwrap();
    let bytes = on_terminal(&["review", id, "--root", root.path().to_str().unwrap()]);
    let bad = foreign_controls(&bytes, REVIEW_SGR);
    assert!(
        bad.is_empty(),
        "foreign controls {bad:?} in:\n{}",
        String::from_utf8_lossy(&bytes)
    );
    // Colour is on: this is a terminal.
    assert!(bytes.windows(5).any(|w| w == b"\x1b[32m"), "no colour");
    let text = visible_text(&bytes);
    // The hidden line is visible, with what tried to hide it.
    assert!(text.contains("+rm -rf ~/ ^[[2K^M"), "{text}");
    assert!(text.contains("^[]52;c;ZXZpbA==^G"), "{text}");
    assert!(text.contains("^[]8;;http://evil.example^[\\here"), "{text}");
    assert!(text.contains("\\u{202e}gnp.exe"), "{text}");
    // The forged name: one quoted stat line, nothing that reads as a stat line of its own.
    let quoted = "\"x\\n file.txt | 1 +\"";
    let stat: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(' ') && l.contains(" | "))
        .collect();
    assert!(
        stat.iter().any(|l| l
            .strip_prefix(&format!(" {quoted}"))
            .is_some_and(|rest| rest.trim_start() == "| 1 +")),
        "{stat:?}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with(" file.txt")),
        "a forged stat line:\n{text}"
    );
    assert_eq!(stat.len(), 5, "one stat line per file: {stat:?}");
    // The warnings name the files.
    let warning = text
        .lines()
        .find(|l| l.starts_with("warning: control characters"))
        .unwrap_or_else(|| panic!("no control-character warning:\n{text}"));
    for f in ["notes.txt", "run.sh", quoted] {
        assert!(warning.contains(f), "{warning}");
    }
    assert!(
        text.contains("warning: runs on the host: .github/workflows/ci.yml (CI workflow"),
        "{text}"
    );
    assert!(
        text.contains("warning: runs on the host: .envrc (direnv"),
        "{text}"
    );
    // --json stays exact JSON, with the findings and the raw bytes in `diff`.
    let out = bin()
        .args([
            "review",
            id,
            "--json",
            "--root",
            root.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let review: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(review["diff"]
        .as_str()
        .unwrap()
        .contains("\u{1b}]52;c;ZXZpbA==\u{7}"));
    let risky: Vec<&str> = review["findings"]["runsOnHost"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(risky, [".envrc", ".github/workflows/ci.yml"], "{review}");
    assert!(
        review["findings"]["controlCharacters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "x\n file.txt | 1 +"),
        "{review}"
    );
}

#[test]
fn run_on_a_terminal_relays_step_output_inert_and_to_a_pipe_as_written() {
    if !usable() {
        return;
    }
    let root = project();
    let root_arg = root.path().to_str().unwrap();
    let bytes = on_terminal(&["run", "--root", root_arg, "--", "sh", "-c", HOSTILE_STEP]);
    // The progress line's own codes: clear line, dim, reset.
    let ours: &[&[u8]] = &[b"\r\x1b[2K", b"\x1b[2m", b"\x1b[7m", b"\x1b[27m", b"\x1b[m"];
    // `\r\x1b[2K` (our status-line clear) is one unit: drop it before scanning for lone CRs.
    let without_ours = remove_all(&bytes, b"\r\x1b[2K");
    let bad = foreign_controls(&without_ours, ours);
    assert!(
        bad.is_empty(),
        "foreign controls {bad:?} in:\n{}",
        String::from_utf8_lossy(&bytes)
    );
    let text = String::from_utf8_lossy(&bytes)
        .replace("\x1b[7m", "")
        .replace("\x1b[27m", "");
    assert!(
        text.contains("live ^[]52;c;c3RlcA==^G ^[[5;7Hmoved ^[]0;title^G"),
        "{text}"
    );
    assert!(text.contains("err ^[[2J"), "{text}");
    // The summary quotes the forged name and repeats the review's warnings.
    assert!(text.contains("\"x\\n file.txt | 1 +\""), "{text}");
    assert!(
        text.contains("warning: runs on the host: .envrc (direnv"),
        "{text}"
    );
    assert!(text.contains("warning: control characters"), "{text}");

    // To a pipe the step's stdout is relayed as it wrote it.
    let root2 = project();
    let out = bin()
        .args(["run", "--root", root2.path().to_str().unwrap()])
        .args(["--", "sh", "-c", HOSTILE_STEP])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("live \x1b]52;c;c3RlcA==\x07 \x1b[5;7Hmoved"),
        "{stdout:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("err \x1b[2J"),
        "{:?}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `run --help` says what happens to the step's output on a terminal and in a pipe, and
/// what the caps bound.
#[test]
fn run_help_documents_how_output_is_relayed() {
    let out = bin().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("The step's output:"), "{help}");
    assert!(
        help.contains("To a terminal it is shown a line at a time with control characters"),
        "{help}"
    );
    assert!(
        help.contains("To a pipe or a file it is written byte for byte as the step wrote it"),
        "{help}"
    );
    assert!(help.contains("What is kept:"), "{help}");
    assert!(help.contains("--max-output-lines"), "{help}");
    assert!(
        help.contains("--fail-on-output-cap stops the step"),
        "{help}"
    );
}
