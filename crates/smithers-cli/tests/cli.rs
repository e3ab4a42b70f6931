//! The `smithers-sandbox` binary, run as a user would: exit codes, `--json`, help.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_smithers-sandbox"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn write_spec(dir: &std::path::Path, spec: &Value) -> Output {
    let mut child = bin()
        .args([
            "bundle",
            "write",
            dir.to_str().unwrap(),
            "--spec",
            "-",
            "--json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.to_string().as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn help_documents_the_exit_codes_everywhere() {
    for args in [vec!["--help"], vec!["bundle", "--help"]] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("Exit codes:") && text.contains("usage error"),
            "{args:?}: {text}"
        );
    }
    for sub in ["validate", "write", "show"] {
        let out = run(&["bundle", sub, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{sub}");
        assert!(String::from_utf8(out.stdout)
            .unwrap()
            .contains("Usage: smithers-sandbox bundle"));
    }
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&["bundle", "validate"]).status.code(), Some(2));
    assert_eq!(run(&["nope"]).status.code(), Some(2));
    assert_eq!(
        run(&["bundle", "write", "/tmp/x"]).status.code(),
        Some(2),
        "--spec is required"
    );
}

#[test]
fn write_validate_show_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    let spec = json!({
        "output": {"answer": 42, "big": 12345678901234567890u64},
        "status": "finished",
        "runId": "run-7",
        "patches": [{"path": "patches/0001.patch", "content": "--- a/f\n+++ b/f\n@@ -1 +1,2 @@\n-a\n+b\n+c\n"}],
        "artifacts": [{"path": "artifacts/report.txt", "content": "hello"}],
    });
    let out = write_spec(&dir, &spec);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(written["ok"], json!(true));

    let out = run(&["bundle", "validate", dir.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    // Numbers are printed as JavaScript prints them.
    assert!(text.contains("\"big\":12345678901234567000"), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["manifest"]["runId"], json!("run-7"));
    assert_eq!(v["patchFiles"], json!(["patches/0001.patch"]));
    assert_eq!(v["logsPath"], Value::Null);
    assert_eq!(v["bundlePath"], json!(dir.to_str().unwrap()));

    let out = run(&["bundle", "show", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Status     finished"), "{text}");
    assert!(text.contains("Run id     run-7"), "{text}");
    assert!(
        text.contains("patches/0001.patch") && text.contains("+2 -1"),
        "{text}"
    );
    assert!(text.contains("artifacts/report.txt"), "{text}");
}

#[test]
fn rejections_exit_1_with_the_code_as_json_or_text() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let out = run(&["bundle", "validate", missing.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], json!("INVALID_INPUT"));
    assert_eq!(v["message"], json!("Sandbox bundle is missing README.md"));
    assert_eq!(v["details"]["bundlePath"], json!(missing.to_str().unwrap()));

    let out = run(&["bundle", "validate", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("error [INVALID_INPUT]: Sandbox bundle is missing README.md"),
        "{err}"
    );

    // A write that breaks a limit names it, and writes nothing.
    let dir = tmp.path().join("deep");
    let mut deep = json!(1);
    for _ in 0..16 {
        deep = json!([deep]);
    }
    let out = write_spec(&dir, &json!({"status": "finished", "output": deep}));
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], json!("INVALID_INPUT"));
    assert_eq!(
        v["details"]["limit"],
        json!("SANDBOX_BUNDLE_OUTPUT_MAX_DEPTH")
    );
    assert!(!dir.exists());

    // An escaping patch path.
    let out = write_spec(
        &dir,
        &json!({"status": "finished", "patches": [{"path": "../x.patch", "content": ""}]}),
    );
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], json!("TOOL_PATH_ESCAPE"));

    // A spec that is not JSON.
    let spec = tmp.path().join("spec.json");
    std::fs::write(&spec, "{nope").unwrap();
    let out = run(&[
        "bundle",
        "write",
        dir.to_str().unwrap(),
        "--spec",
        spec.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], json!("INVALID_INPUT"));
}
