//! `smithers-sandbox mcp` driven by the official MCP Python SDK's stdio client
//! (`tests/mcp/drive.py`): the handshake, the tool list (no accept unless allowed), a session
//! started, commands with byte-exact and bounded output, binary files written and read back,
//! a directory listed, another session out of reach, the diff, 100 commands, the stop that
//! opens the review. Then the review is checked here through the CLI.
//!
//! The SDK lives in a virtual environment `scripts/setup` makes
//! (`$SMITHERS_MCP_VENV`, default `~/.cache/smithers-mcp/venv`); without it, or without native
//! sandboxes, the test prints `SKIP <reason>` (and fails under `CI=true`).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

mod support;

use smithers_test_support::skip_or_fail;
use support::native::{bin, bin_path, sandboxes_usable};

fn sdk_python() -> Option<PathBuf> {
    let venv = std::env::var_os("SMITHERS_MCP_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/smithers-mcp/venv"))
        })?;
    let python = venv.join("bin/python");
    python.is_file().then_some(python)
}

#[test]
fn the_official_sdk_client_drives_a_session_through_the_mcp_server() {
    if !sandboxes_usable() {
        return;
    }
    let Some(python) = sdk_python() else {
        skip_or_fail(
            "the MCP Python SDK is not installed (scripts/setup makes ~/.cache/smithers-mcp/venv)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    let sessions = dir.path().join("sessions");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&sessions).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sessions, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(root.join("x.txt"), "x\n").unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/drive.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(bin_path())
        .arg(&root)
        .env("SMITHERS_RESIDENT_DIR", &sessions)
        .env_remove("SMITHERS_DB")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let last = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let summary: Value = serde_json::from_str(&last).unwrap();
    let id = summary["sessionId"].as_str().unwrap();
    // The agent's change waits for a person: the project is untouched until accept.
    assert!(!root.join("notes.txt").exists());
    let review = bin()
        .args(["--json", "review", "--root"])
        .arg(&root)
        .arg(id)
        .output()
        .unwrap();
    let review: Value = serde_json::from_slice(&review.stdout).unwrap();
    assert_eq!(review["review"]["state"], "pending", "{review}");
    assert_eq!(review["review"]["patchCount"], 2, "{review}");
}
