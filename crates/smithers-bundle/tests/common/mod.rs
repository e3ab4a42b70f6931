//! Shared helpers for the integration tests: the real JavaScript package, run through
//! `shared/tools/smithers-js/smithers-bundle.mjs` (once, which installs it) and through the
//! batch driver `tests/js/batch.mjs` (many operations per Node process).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};
use smithers_bundle::{js_json, validate_bundle, write_bundle_with, WriteOptions, WriteParams};
use smithers_errors::CodedError;

/// Where the JavaScript side lives.
pub struct Js {
    pub tool: PathBuf,
    pub batch: PathBuf,
}

/// The JavaScript side, or `None` after printing `SKIP <reason>` (a failure under CI=true).
pub fn js() -> Option<&'static Js> {
    static JS: OnceLock<Result<Js, String>> = OnceLock::new();
    let found = JS.get_or_init(|| {
        let tool = std::env::var_os("SMITHERS_JS_TOOL")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../../shared/tools/smithers-js/smithers-bundle.mjs")
            });
        if !tool.is_file() {
            return Err(format!("JS tool not found at {}", tool.display()));
        }
        match Command::new("node").arg("--version").output() {
            Ok(o) if o.status.success() => {}
            _ => return Err("node is not installed".to_string()),
        }
        // One real run of the tool: it installs the package on first use, and proves the
        // tool itself works on this machine.
        let out = Command::new("node")
            .arg(&tool)
            .args(["resolve", "/tmp/root", "a/../b"])
            .output()
            .map_err(|e| format!("running the JS tool: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || text.trim() != "\"/tmp/root/b\"" {
            return Err(format!(
                "the JS tool does not work: status {}, stdout {text}, stderr {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let batch = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/batch.mjs");
        Ok(Js { tool, batch })
    });
    match found {
        Ok(js) => Some(js),
        Err(reason) => {
            smithers_test_support::skip_or_fail(&format!(
                "the JavaScript reference is unavailable: {reason}"
            ));
            None
        }
    }
}

/// One operation for the batch driver.
pub enum Op {
    Validate(PathBuf),
    /// Write `dir` from the spec file.
    Write(PathBuf, PathBuf),
}

/// Runs the operations in one Node process; one result per op, in the tool's format
/// (`{"ok": ...}` or `{"error": {"code", "message"}}`).
pub fn run_batch(js: &Js, ops: &[Op]) -> Vec<Value> {
    let list: Vec<Value> = ops
        .iter()
        .map(|op| match op {
            Op::Validate(d) => json!({"op": "validate", "dir": d}),
            Op::Write(d, s) => json!({"op": "write", "dir": d, "specFile": s}),
        })
        .collect();
    let ops_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ops_file.path(), serde_json::to_vec(&list).unwrap()).unwrap();
    let out = Command::new("node")
        .arg(&js.batch)
        .arg(ops_file.path())
        .output()
        .expect("run node");
    assert!(
        out.status.success(),
        "batch driver failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        // JSON.stringify can emit what serde_json refuses (a lone surrogate "\ud800"): such a
        // line is kept as {"raw": line}.
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| json!({ "raw": l })))
        .collect();
    assert_eq!(results.len(), ops.len());
    results
}

/// Runs the real tool once (for a cross-check of the batch driver).
pub fn run_tool(js: &Js, args: &[&str]) -> Value {
    let out = Command::new("node")
        .arg(&js.tool)
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Value = serde_json::from_str(text.trim()).unwrap();
    if v.get("error").is_some() {
        v
    } else {
        json!({ "ok": v })
    }
}

/// Our validation in the same format as the JS side.
pub fn ours_validate(dir: &Path) -> Value {
    match validate_bundle(dir) {
        Ok(b) => json!({ "ok": b.to_json() }),
        Err(e) => json!({"error": {"code": e.code().as_str(), "message": e.to_string()}}),
    }
}

/// Our write from a JSON spec file (parsed with serde_json, then the JS spec rules).
pub fn ours_write(dir: &Path, spec_file: &Path) -> Value {
    let text = std::fs::read_to_string(spec_file).unwrap();
    let spec: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return json!({"error": {"code": "INVALID_INPUT", "message": format!("spec must be valid JSON: {e}")}})
        }
    };
    // Not durable: the JS side does not fsync either, and syncfs on a busy shared host is slow.
    // (Durable writes are covered by write_rules.rs.)
    let r = WriteParams::from_js_spec(dir, &spec)
        .and_then(|p| write_bundle_with(&p, &WriteOptions { durable: false }));
    match r {
        Ok(_) => json!({ "ok": true }),
        Err(e) => json!({"error": {"code": e.code().as_str(), "message": e.to_string()}}),
    }
}

/// A result made comparable: JS lists patch files in walk order, we sort them; printed with
/// JS `JSON.stringify` rules (key order included).
pub fn canon(v: &Value) -> String {
    let mut v = v.clone();
    if let Some(files) = v
        .pointer_mut("/ok/patchFiles")
        .and_then(Value::as_array_mut)
    {
        files.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
    }
    js_json::to_string(&v)
}

/// Creates a file (and its parents) with the given bytes.
pub fn put(root: &Path, rel: &str, content: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

/// Every regular file under `root`, relative, with its bytes, sorted.
pub fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                pending.push(e.path());
            } else {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Every directory under `root`, relative, sorted.
pub fn dirs(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                out.push(
                    e.path()
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
                pending.push(e.path());
            }
        }
    }
    out.sort();
    out
}
