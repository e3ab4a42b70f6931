//! Running the CLI binary against native sandboxes, and whether this host can
//! (`smithers_test_support::skip_or_fail` otherwise).

use std::process::Command;

use serde_json::Value;
use smithers_test_support::skip_or_fail;

/// The binary under test.
pub fn bin_path() -> &'static str {
    env!("CARGO_BIN_EXE_smithers-sandbox")
}

/// The binary, with no inherited database and no colour.
pub fn bin() -> Command {
    let mut c = Command::new(bin_path());
    c.env_remove("SMITHERS_DB").env("NO_COLOR", "1");
    c
}

/// Native sandboxes (user, mount and pid namespaces) are enforced here, per `doctor`.
pub fn sandboxes_usable() -> bool {
    let out = bin().args(["doctor", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let ok = ["user-namespace", "mount-namespace", "pid-namespace"]
        .iter()
        .all(|name| {
            report["protections"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["name"] == **name && p["status"] == "enforced")
        });
    ok || skip_or_fail("native sandboxes unavailable")
}

/// Runs `git ARGS` in `dir` as the host's user (`Host <host@example.com>`), asserting it
/// succeeds; its stdout.
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.email=host@example.com", "-c", "user.name=Host"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}
