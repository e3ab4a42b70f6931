//! Compatibility with the REAL JavaScript package (`@smithers-orchestrator/sandbox` 0.32),
//! run through `shared/tools/smithers-js`. Without node or the tool these tests print
//! `SKIP <reason>`; under CI=true they fail instead.
//!
//! What is checked:
//! - bundles written by JS and by us from the same spec: README.md byte for byte, same file
//!   tree, and each validates identically in JS and here (same manifest, patch list, size);
//! - a table of invalid bundles: rejected by both, same code, same message;
//! - a table of invalid write specs: rejected by both, same code and message, and we wrote
//!   nothing;
//! - the deliberate differences (spec §2 and the crate docs), each asserted explicitly.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::{json, Value};
use smithers_bundle::{SANDBOX_MAX_BUNDLE_BYTES, SANDBOX_MAX_README_BYTES};

fn spec_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(format!("{name}.spec.json"));
    fs::write(&p, text).unwrap();
    p
}

/// Write specs both sides must accept, as raw JSON text (so number literals are exactly
/// what JS's JSON.parse sees).
fn valid_write_specs(log: &Path) -> Vec<(&'static str, String)> {
    let astral_at_limit = "😀".repeat(32_768);
    let nested16 = format!("{}{}", "[".repeat(16), "]".repeat(16));
    let nested_obj16 = format!("{}1{}", "{\"k\":".repeat(15), "}".repeat(15));
    let arr512 = serde_json::to_string(&vec![1; 512]).unwrap();
    let long_key = "k".repeat(70_000);
    let many_patches: Vec<Value> = (0..1000)
        .map(
            |i| json!({"path": format!("patches/{i:04}.patch"), "content": format!("+line {i}\n")}),
        )
        .collect();
    vec![
        (
            "basic",
            r#"{"output": {"answer": 42, "text": "héllo wörld ✓ 😀", "list": [1, "two", null, true, {"x": []}]},
                "status": "finished", "runId": "run-123",
                "patches": [{"path": "patches/0001.patch", "content": "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"},
                            {"path": "patches/nested/dir/0002.patch", "content": "+x\n"}],
                "artifacts": [{"path": "artifacts/report.txt", "content": "report"},
                              {"path": "artifacts/ünï/😀.txt", "content": "ü"}]}"#
                .to_string(),
        ),
        ("failed-no-output", r#"{"status": "failed"}"#.to_string()),
        ("cancelled-null-output", r#"{"status": "cancelled", "output": null, "patches": []}"#.to_string()),
        ("scalar-output", r#"{"status": "finished", "output": "just a string"}"#.to_string()),
        (
            "large-numbers",
            r#"{"status": "finished", "output": [12345678901234567890, 123456789012345678901234, 1e21, 1e-7, -0, 0.1, 9007199254740993, 1.7976931348623157e308, 5e-324, 1E+2, -1.5e-10, 100000000000000000000]}"#
                .to_string(),
        ),
        (
            "js-key-order",
            r#"{"status": "finished", "output": {"b": 1, "10": 2, "a": 3, "2": 4, "01": 5, "4294967295": 6, "4294967294": 7, "-1": 8}}"#
                .to_string(),
        ),
        (
            "escapes",
            r#"{"status": "finished", "output": {"s": "q\" b\\ \b\f\n\r\t \u0000 \u001f \u007f \u2028 \u2029 / \ud83d\ude00"}}"#
                .to_string(),
        ),
        ("astral-string-at-limit", format!(r#"{{"status": "finished", "output": {{"s": "{astral_at_limit}"}}}}"#)),
        ("depth-16-arrays", format!(r#"{{"status": "finished", "output": {nested16}}}"#)),
        ("depth-16-objects", format!(r#"{{"status": "finished", "output": {nested_obj16}}}"#)),
        ("array-512", format!(r#"{{"status": "finished", "output": {{"a": {arr512}}}}}"#)),
        ("long-object-key", format!(r#"{{"status": "finished", "output": {{"{long_key}": 1}}}}"#)),
        (
            "stream-log",
            format!(r#"{{"status": "finished", "streamLogPath": {}}}"#, json!(log.to_string_lossy())),
        ),
        (
            "stream-log-missing",
            r#"{"status": "finished", "streamLogPath": "/nonexistent/smithers/log.ndjson"}"#.to_string(),
        ),
        (
            "diff-bundle",
            r#"{"status": "finished", "patches": [{"path": "patches/a.patch", "content": "+a\n"}],
                "diffBundle": {"seq": 3, "baseRef": "abc123", "patches": [
                  {"path": "a", "operation": "modify", "diff": "+a\n"},
                  {"path": "img.png", "operation": "add", "diff": "", "binaryContent": "iVBORw0KGgo="},
                  {"path": "gone", "operation": "delete", "diff": "-x\n"}]}}"#
                .to_string(),
        ),
        (
            "dot-relative-paths",
            r#"{"status": "finished", "patches": [{"path": "./patches/x.patch", "content": ""}, {"path": "patches/sub/../y.patch", "content": "y"}]}"#
                .to_string(),
        ),
        ("unknown-keys-ignored", r#"{"status": "finished", "extra": {"ignored": true}}"#.to_string()),
        (
            "patches-1000",
            json!({"status": "finished", "patches": many_patches}).to_string(),
        ),
    ]
}

#[test]
fn bundles_written_by_either_side_are_identical_and_validate_identically() {
    let Some(js) = js() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("stream.ndjson");
    fs::write(
        &log,
        "{\"type\":\"a\"}\n{\"type\":\"b\",\"t\":\"é\"}\n{\"type\":\"c\"}\n",
    )
    .unwrap();
    let specs = valid_write_specs(&log);

    let mut ops = Vec::new();
    let mut pairs = Vec::new();
    for (name, text) in &specs {
        let spec = spec_file(tmp.path(), name, text);
        let js_dir = tmp.path().join("js").join(name);
        let rs_dir = tmp.path().join("rs").join(name);
        ops.push(Op::Write(js_dir.clone(), spec.clone()));
        let ours = ours_write(&rs_dir, &spec);
        assert_eq!(ours, json!({"ok": true}), "{name}: our write");
        pairs.push((name, js_dir, rs_dir));
    }
    let written = run_batch(js, &ops);
    for ((name, _, _), r) in pairs.iter().zip(&written) {
        assert_eq!(r, &json!({"ok": true}), "{name}: JS write");
    }

    let mut ops = Vec::new();
    for (_, js_dir, rs_dir) in &pairs {
        ops.push(Op::Validate(js_dir.clone()));
        ops.push(Op::Validate(rs_dir.clone()));
    }
    let validated = run_batch(js, &ops);
    for (i, (name, js_dir, rs_dir)) in pairs.iter().enumerate() {
        let js_readme = fs::read(js_dir.join("README.md")).unwrap();
        let rs_readme = fs::read(rs_dir.join("README.md")).unwrap();
        assert!(
            js_readme == rs_readme,
            "{name}: README.md differs\n JS: {}\n us: {}",
            String::from_utf8_lossy(&js_readme)
                .chars()
                .take(2000)
                .collect::<String>(),
            String::from_utf8_lossy(&rs_readme)
                .chars()
                .take(2000)
                .collect::<String>()
        );
        assert_eq!(tree(js_dir), tree(rs_dir), "{name}: file trees differ");
        assert_eq!(
            dirs(js_dir),
            dirs(rs_dir),
            "{name}: directory layout differs"
        );

        let js_on_js = &validated[2 * i];
        let js_on_rs = &validated[2 * i + 1];
        assert!(
            js_on_js.get("ok").is_some(),
            "{name}: JS rejects its own bundle: {js_on_js}"
        );
        assert!(
            js_on_rs.get("ok").is_some(),
            "{name}: JS rejects our bundle: {js_on_rs}"
        );
        assert_eq!(
            canon(js_on_js),
            canon(&ours_validate(js_dir)),
            "{name}: validating the JS-written bundle"
        );
        assert_eq!(
            canon(js_on_rs),
            canon(&ours_validate(rs_dir)),
            "{name}: validating our bundle"
        );
    }
}

#[test]
fn the_batch_driver_agrees_with_the_tool() {
    let Some(js) = js() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good");
    let spec = spec_file(
        tmp.path(),
        "s",
        r#"{"status": "finished", "output": {"n": 1}, "patches": [{"path": "patches/a.patch", "content": "+a\n"}]}"#,
    );
    let via_tool = run_tool(
        js,
        &["write", good.to_str().unwrap(), spec.to_str().unwrap()],
    );
    assert_eq!(via_tool, json!({"ok": {"ok": true}}));
    let bad = tmp.path().join("bad");
    fs::create_dir(&bad).unwrap();
    for dir in [&good, &bad] {
        let tool = run_tool(js, &["validate", dir.to_str().unwrap()]);
        let batch = run_batch(js, &[Op::Validate(dir.to_path_buf())]).remove(0);
        assert_eq!(canon(&tool), canon(&batch));
        assert_eq!(canon(&tool), canon(&ours_validate(dir)));
    }
}

/// How to build one bundle of the table.
type Build = Box<dyn Fn(&Path)>;

fn readme(text: &'static str) -> Build {
    Box::new(move |d: &Path| put(d, "README.md", text.as_bytes()))
}

fn with(text: &'static str, extra: impl Fn(&Path) + 'static) -> Build {
    Box::new(move |d: &Path| {
        put(d, "README.md", text.as_bytes());
        extra(d);
    })
}

const OK: &str = r#"{"status": "finished", "patches": []}"#;

fn sparse(path: &Path, len: u64) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::File::create(path).unwrap().set_len(len).unwrap();
}

fn fifo(path: &Path) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Bundles whose validation must give the same result in both: (name, build, expected code
/// or None when valid).
fn validation_table() -> Vec<(&'static str, Build, Option<&'static str>)> {
    vec![
        (
            "no-readme",
            Box::new(|d: &Path| put(d, "patches/a.patch", b"")),
            Some("INVALID_INPUT"),
        ),
        (
            "readme-symlink",
            with(OK, |d| {
                fs::rename(d.join("README.md"), d.join("real.json")).unwrap();
                symlink("real.json", d.join("README.md")).unwrap();
            }),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "readme-dangling-symlink",
            Box::new(|d: &Path| {
                fs::create_dir_all(d).unwrap();
                symlink("/nonexistent", d.join("README.md")).unwrap();
            }),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "readme-is-dir",
            Box::new(|d: &Path| fs::create_dir_all(d.join("README.md")).unwrap()),
            Some("INVALID_INPUT"),
        ),
        (
            "readme-is-fifo",
            Box::new(|d: &Path| fifo(&d.join("README.md"))),
            Some("INVALID_INPUT"),
        ),
        (
            "readme-too-large",
            Box::new(|d: &Path| sparse(&d.join("README.md"), SANDBOX_MAX_README_BYTES + 1)),
            Some("INVALID_INPUT"),
        ),
        (
            "readme-exactly-at-limit",
            Box::new(|d: &Path| {
                let mut text = OK.as_bytes().to_vec();
                text.resize(SANDBOX_MAX_README_BYTES as usize, b' ');
                put(d, "README.md", &text);
            }),
            None,
        ),
        ("readme-empty", readme(""), Some("INVALID_INPUT")),
        (
            "readme-js-whitespace",
            readme("\u{feff} \n\t\u{a0}\u{2028}\u{3000}"),
            Some("INVALID_INPUT"),
        ),
        (
            "readme-bom-then-json",
            readme("\u{feff}{\"status\":\"finished\"}"),
            None,
        ),
        (
            "readme-invalid-json",
            readme("{\"status\": finished}"),
            Some("INVALID_INPUT"),
        ),
        (
            "readme-trailing-garbage",
            readme("{\"status\": \"finished\"} x"),
            Some("INVALID_INPUT"),
        ),
        ("readme-null", readme("null"), Some("INVALID_INPUT")),
        ("readme-number", readme("42"), Some("INVALID_INPUT")),
        (
            "readme-string",
            readme("\"finished\""),
            Some("INVALID_INPUT"),
        ),
        ("readme-false", readme("false"), Some("INVALID_INPUT")),
        (
            "readme-array",
            readme("[{\"status\": \"finished\"}]"),
            Some("INVALID_INPUT"),
        ),
        ("status-missing", readme("{}"), Some("INVALID_INPUT")),
        (
            "status-wrong",
            readme("{\"status\": \"done\"}"),
            Some("INVALID_INPUT"),
        ),
        (
            "status-case",
            readme("{\"status\": \"Finished\"}"),
            Some("INVALID_INPUT"),
        ),
        (
            "status-null",
            readme("{\"status\": null}"),
            Some("INVALID_INPUT"),
        ),
        (
            "normalised-fields",
            readme(
                r#"{"outputs": [1], "status": "failed", "runId": 7, "patches": ["patches/a.patch", 3, null, {}], "diffBundle": "no"}"#,
            ),
            None,
        ),
        (
            "duplicate-keys-last-wins",
            readme(r#"{"status": "failed", "outputs": 1, "status": "cancelled"}"#),
            None,
        ),
        (
            "invalid-utf8-in-readme",
            Box::new(|d: &Path| {
                put(
                    d,
                    "README.md",
                    b"{\"status\":\"finished\",\"outputs\":\"a\xff\xfeb\"}",
                )
            }),
            None,
        ),
        (
            "symlink-artifact",
            with(OK, |d| {
                fs::create_dir_all(d.join("artifacts")).unwrap();
                symlink("/etc/passwd", d.join("artifacts/passwd")).unwrap();
            }),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "symlink-dir-in-patches",
            with(OK, |d| {
                fs::create_dir_all(d.join("patches")).unwrap();
                symlink("/etc", d.join("patches/etc")).unwrap();
            }),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "symlink-log",
            with(OK, |d| {
                put(d, "logs/real.ndjson", b"{}\n");
                symlink("real.ndjson", d.join("logs/stream.ndjson")).unwrap();
            }),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "dangling-symlink-deep",
            with(OK, |d| {
                fs::create_dir_all(d.join("artifacts/a/b/c")).unwrap();
                symlink("../../../../..", d.join("artifacts/a/b/c/up")).unwrap();
            }),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "bundle-too-large",
            with(OK, |d| {
                let readme_len = fs::metadata(d.join("README.md")).unwrap().len();
                sparse(
                    &d.join("artifacts/big.bin"),
                    SANDBOX_MAX_BUNDLE_BYTES - readme_len + 1,
                );
            }),
            Some("INVALID_INPUT"),
        ),
        (
            "bundle-exactly-at-limit",
            with(OK, |d| {
                let readme_len = fs::metadata(d.join("README.md")).unwrap().len();
                sparse(
                    &d.join("artifacts/big.bin"),
                    SANDBOX_MAX_BUNDLE_BYTES - readme_len,
                );
            }),
            None,
        ),
        (
            "patch-files-1001",
            with(OK, |d| {
                for i in 0..1001 {
                    put(d, &format!("patches/{i:04}.patch"), b"");
                }
            }),
            Some("INVALID_INPUT"),
        ),
        (
            "patch-files-1000-and-others",
            with(OK, |d| {
                for i in 0..1000 {
                    put(d, &format!("patches/d{}/{i:04}.patch", i % 7), b"+\n");
                }
                put(d, "patches/notes.txt", b"not a patch");
                put(d, "artifacts/x.patch", b"outside patches/");
                put(d, "x.patch", b"top level");
            }),
            None,
        ),
        (
            "manifest-patch-parent-escape",
            readme(r#"{"status": "finished", "patches": ["../x.patch"]}"#),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "manifest-patch-absolute-outside",
            readme(r#"{"status": "finished", "patches": ["/etc/passwd"]}"#),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "manifest-patch-readme",
            readme(r#"{"status": "finished", "patches": ["README.md"]}"#),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "manifest-patch-empty",
            readme(r#"{"status": "finished", "patches": [""]}"#),
            Some("TOOL_PATH_INVALID"),
        ),
        (
            "manifest-patch-dir-itself",
            readme(r#"{"status": "finished", "patches": ["patches"]}"#),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "manifest-patch-dir-dot",
            readme(r#"{"status": "finished", "patches": ["patches/."]}"#),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "manifest-patch-prefix-sibling",
            readme(r#"{"status": "finished", "patches": ["patchesx/a.patch"]}"#),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "manifest-patch-via-dotdot",
            readme(r#"{"status": "finished", "patches": ["patches/../artifacts/a.patch"]}"#),
            Some("TOOL_PATH_ESCAPE"),
        ),
        (
            "manifest-patch-normalised-inside",
            readme(
                r#"{"status": "finished", "patches": ["patches/x/../a.patch", "./patches/b.patch"]}"#,
            ),
            None,
        ),
        (
            "fifo-artifact-ignored",
            with(OK, |d| fifo(&d.join("artifacts/pipe"))),
            None,
        ),
        (
            "logs-is-dir",
            with(OK, |d| {
                fs::create_dir_all(d.join("logs/stream.ndjson")).unwrap()
            }),
            None,
        ),
        (
            "logs-present",
            with(OK, |d| put(d, "logs/stream.ndjson", b"{\"a\":1}\n")),
            None,
        ),
        (
            "unicode-names",
            with(
                r#"{"status": "finished", "patches": ["patches/ü/😀.patch"]}"#,
                |d| {
                    put(d, "patches/ü/😀.patch", b"+\n");
                    put(d, "artifacts/日本.txt", b"x");
                },
            ),
            None,
        ),
        ("no-dirs-at-all", readme(OK), None),
    ]
}

#[test]
fn invalid_and_edge_bundles_get_the_same_verdict() {
    let Some(js) = js() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let table = validation_table();
    let mut ops = Vec::new();
    let mut dirs = Vec::new();
    for (name, build, _) in &table {
        let d = tmp.path().join(name);
        fs::create_dir_all(&d).unwrap();
        build(&d);
        ops.push(Op::Validate(d.clone()));
        dirs.push(d);
    }
    ops.push(Op::Validate(tmp.path().join("does-not-exist")));
    dirs.push(tmp.path().join("does-not-exist"));
    let js_results = run_batch(js, &ops);
    let names: Vec<&str> = table
        .iter()
        .map(|t| t.0)
        .chain(["does-not-exist"])
        .collect();
    let expected: Vec<Option<&str>> = table
        .iter()
        .map(|t| t.2)
        .chain([Some("INVALID_INPUT")])
        .collect();
    for (((name, dir), js_r), want) in names.iter().zip(&dirs).zip(&js_results).zip(&expected) {
        let ours = ours_validate(dir);
        assert_eq!(canon(js_r), canon(&ours), "{name}: JS and ours differ");
        match want {
            Some(code) => assert_eq!(ours["error"]["code"], json!(code), "{name}: {ours}"),
            None => assert!(
                ours.get("ok").is_some(),
                "{name}: expected valid, got {ours}"
            ),
        }
    }
}

/// Write specs both must reject the same way; ours must leave no directory behind.
fn invalid_write_specs(big_log: &Path) -> Vec<(&'static str, String, &'static str)> {
    let over = |n: usize| {
        serde_json::to_string(&vec![json!({"path": "patches/a.patch", "content": ""}); n]).unwrap()
    };
    let astral_past = format!("{}a", "😀".repeat(32_768));
    vec![
        ("runid-too-long", format!(r#"{{"status": "finished", "runId": "{}"}}"#, "r".repeat(257)), "INVALID_INPUT"),
        ("runid-astral-too-long", format!(r#"{{"status": "finished", "runId": "{}"}}"#, "😀".repeat(129)), "INVALID_INPUT"),
        ("runid-not-string", r#"{"status": "finished", "runId": 5}"#.to_string(), "INVALID_INPUT"),
        ("patches-1001", format!(r#"{{"status": "finished", "patches": {}}}"#, over(1001)), "INVALID_INPUT"),
        ("artifacts-1001", format!(r#"{{"status": "finished", "artifacts": {}}}"#, over(1001)), "INVALID_INPUT"),
        ("patches-not-array", r#"{"status": "finished", "patches": "x"}"#.to_string(), "INVALID_INPUT"),
        ("depth-17", format!(r#"{{"status": "finished", "output": {}1{}}}"#, "[".repeat(16), "]".repeat(16)), "INVALID_INPUT"),
        ("depth-17-objects", format!(r#"{{"status": "finished", "output": {}1{}}}"#, "{\"k\":".repeat(16), "}".repeat(16)), "INVALID_INPUT"),
        ("astral-string-past-limit", format!(r#"{{"status": "finished", "output": {{"a": [1, {{"s": "{astral_past}"}}]}}}}"#), "INVALID_INPUT"),
        ("array-513", format!(r#"{{"status": "finished", "output": {{"a": [{}]}}}}"#, serde_json::to_string(&vec![0; 513]).unwrap()), "INVALID_INPUT"),
        ("depth-before-string", format!(r#"{{"status": "finished", "output": {{"s": "{astral_past}", "d": {}1{}}}}}"#, "[".repeat(15), "]".repeat(15)), "INVALID_INPUT"),
        ("non-finite-number", r#"{"status": "finished", "output": {"n": 1e400}}"#.to_string(), "INVALID_INPUT"),
        ("patch-path-too-long", format!(r#"{{"status": "finished", "patches": [{{"path": "patches/{}", "content": ""}}]}}"#, "p".repeat(1020)), "INVALID_INPUT"),
        ("artifact-path-too-long", format!(r#"{{"status": "finished", "artifacts": [{{"path": "artifacts/{}", "content": ""}}]}}"#, "a".repeat(1020)), "INVALID_INPUT"),
        ("patch-path-not-string", r#"{"status": "finished", "patches": [{"path": 5, "content": ""}]}"#.to_string(), "INVALID_INPUT"),
        ("estimated-too-large", format!(r#"{{"status": "finished", "streamLogPath": {}}}"#, json!(big_log.to_string_lossy())), "INVALID_INPUT"),
        ("patch-path-escapes", r#"{"status": "finished", "patches": [{"path": "patches/ok.patch", "content": ""}, {"path": "../escape.patch", "content": "x"}]}"#.to_string(), "TOOL_PATH_ESCAPE"),
        ("patch-path-absolute", r#"{"status": "finished", "patches": [{"path": "/tmp/smithers-escape.patch", "content": "x"}]}"#.to_string(), "TOOL_PATH_ESCAPE"),
        ("patch-path-empty", r#"{"status": "finished", "patches": [{"path": "", "content": "x"}]}"#.to_string(), "TOOL_PATH_INVALID"),
        ("artifact-path-escapes", r#"{"status": "finished", "artifacts": [{"path": "artifacts/../../x", "content": "x"}]}"#.to_string(), "TOOL_PATH_ESCAPE"),
    ]
}

#[test]
fn invalid_write_specs_are_rejected_alike_and_we_write_nothing() {
    let Some(js) = js() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let big_log = tmp.path().join("big.ndjson");
    sparse(&big_log, SANDBOX_MAX_BUNDLE_BYTES + 1);
    let table = invalid_write_specs(&big_log);
    let mut ops = Vec::new();
    let mut ours = Vec::new();
    for (name, text, _) in &table {
        let spec = spec_file(tmp.path(), name, text);
        ops.push(Op::Write(tmp.path().join("js").join(name), spec.clone()));
        let rs_dir = tmp.path().join("rs").join(name);
        ours.push(ours_write(&rs_dir, &spec));
        assert!(
            !rs_dir.exists(),
            "{name}: we left {} behind",
            rs_dir.display()
        );
    }
    let js_results = run_batch(js, &ops);
    for (((name, _, code), js_r), ours) in table.iter().zip(&js_results).zip(&ours) {
        assert_eq!(js_r["error"]["code"], json!(code), "{name}: JS gave {js_r}");
        assert_eq!(ours["error"]["code"], json!(code), "{name}: we gave {ours}");
        if *name == "non-finite-number" {
            // JS: JSON.parse gives Infinity, rejected by the bounds ("must contain only finite
            // numbers"); serde_json cannot hold it, so our spec parser rejects the spec.
            assert_eq!(
                js_r["error"]["message"],
                json!("output must contain only finite numbers.")
            );
            continue;
        }
        assert_eq!(js_r["error"]["message"], ours["error"]["message"], "{name}");
    }
    // The long bundlePath rule needs a long directory name.
    let long_dir = tmp
        .path()
        .join("l".repeat(200))
        .join("m".repeat(200))
        .join("n".repeat(200))
        .join("o".repeat(200))
        .join("p".repeat(200))
        .join("q".repeat(30));
    let spec = spec_file(tmp.path(), "long-dir", OK);
    let js_r = run_batch(js, &[Op::Write(long_dir.clone(), spec.clone())]).remove(0);
    let ours = ours_write(&long_dir, &spec);
    assert_eq!(js_r["error"], ours["error"]);
    assert_eq!(
        ours["error"]["message"],
        json!("bundlePath exceeds the maximum length of 1024 characters.")
    );
}

/// The documented differences, asserted so that a change on either side is noticed.
#[test]
fn deliberate_differences() {
    let Some(js) = js() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();

    // 1. Component-wise confinement: `patches/..x.patch` is a legal name for us, not for JS.
    let dotdot_file = t.join("dotdot-file");
    put(&dotdot_file, "README.md", OK.as_bytes());
    put(&dotdot_file, "patches/..x.patch", b"+\n");
    let dotdot_entry = t.join("dotdot-entry");
    put(
        &dotdot_entry,
        "README.md",
        br#"{"status": "finished", "patches": ["patches/..x.patch"]}"#,
    );
    // 2. Numbers JS turns into Infinity, lone surrogates, nesting past serde_json's 128.
    let inf = t.join("infinity");
    put(
        &inf,
        "README.md",
        br#"{"status": "finished", "outputs": 1e400}"#,
    );
    let lone = t.join("lone-surrogate");
    put(
        &lone,
        "README.md",
        br#"{"status": "finished", "outputs": "\ud800"}"#,
    );
    let deep = t.join("deep");
    put(
        &deep,
        "README.md",
        format!(
            r#"{{"status": "finished", "outputs": {}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        )
        .as_bytes(),
    );
    // 3. Writes JS accepts and its own validator then rejects; we refuse them up front.
    let bad_status = spec_file(t, "bad-status", r#"{"status": "bogus"}"#);
    let outside = spec_file(
        t,
        "outside",
        r#"{"status": "finished", "patches": [{"path": "artifacts/x.patch", "content": "+\n"}]}"#,
    );
    let chunk = "x".repeat(60_000);
    let huge_readme = spec_file(
        t,
        "huge-readme",
        &json!({"status": "finished", "output": vec![chunk.clone(); 90]}).to_string(),
    );
    let huge_diff = spec_file(
        t,
        "huge-diff",
        &json!({"status": "finished", "output": {"ok": true},
                "diffBundle": {"seq": 1, "baseRef": "b", "patches": [{"path": "a", "operation": "add", "diff": "y".repeat(6_000_000)}]}})
        .to_string(),
    );
    let null_run_id = spec_file(t, "null-run-id", r#"{"status": "finished", "runId": null}"#);
    let content_not_string = spec_file(
        t,
        "content-not-string",
        r#"{"status": "finished", "patches": [{"path": "patches/a.patch", "content": 5}]}"#,
    );

    // 4. A NUL byte in a manifest patch entry: lexically fine for JS, refused by
    //    smithers-paths (the kernel would cut the name short).
    let nul = t.join("nul");
    put(
        &nul,
        "README.md",
        br#"{"status": "finished", "patches": ["patches/a\u0000.patch"]}"#,
    );

    let jsw = |n: &str| t.join("js").join(n);
    let rsw = |n: &str| t.join("rs").join(n);
    let ops = vec![
        Op::Validate(dotdot_file.clone()),
        Op::Validate(dotdot_entry.clone()),
        Op::Validate(inf.clone()),
        Op::Validate(lone.clone()),
        Op::Validate(deep.clone()),
        Op::Write(jsw("bad-status"), bad_status.clone()),
        Op::Validate(jsw("bad-status")),
        Op::Write(jsw("outside"), outside.clone()),
        Op::Validate(jsw("outside")),
        Op::Write(jsw("huge-readme"), huge_readme.clone()),
        Op::Validate(jsw("huge-readme")),
        Op::Write(jsw("huge-diff"), huge_diff.clone()),
        Op::Validate(jsw("huge-diff")),
        Op::Write(jsw("null-run-id"), null_run_id.clone()),
        Op::Validate(jsw("null-run-id")),
        Op::Write(jsw("content-not-string"), content_not_string.clone()),
        Op::Validate(nul.clone()),
    ];
    let r = run_batch(js, &ops);

    for (i, dir) in [&dotdot_file, &dotdot_entry].into_iter().enumerate() {
        assert_eq!(
            r[i]["error"]["code"],
            json!("TOOL_PATH_ESCAPE"),
            "JS rejects {}",
            dir.display()
        );
        assert_eq!(
            r[i]["error"]["message"],
            json!("Sandbox patch path escapes bundle root: patches/..x.patch")
        );
        assert!(
            ours_validate(dir).get("ok").is_some(),
            "we accept {}",
            dir.display()
        );
    }
    assert_eq!(
        ours_validate(&dotdot_file)["ok"]["patchFiles"],
        json!(["patches/..x.patch"])
    );

    assert_eq!(
        r[2]["ok"]["manifest"]["outputs"],
        Value::Null,
        "JS: Infinity, printed as null"
    );
    let raw = r[3]["raw"]
        .as_str()
        .expect("JS prints the lone surrogate, serde_json cannot read it");
    assert!(
        raw.starts_with(r#"{"ok":{"manifest":{"outputs":"\ud800""#),
        "JS accepts a lone surrogate: {raw}"
    );
    // (serde_json cannot read JS's answer either: it nests past 128 too.)
    let raw = r[4]["raw"].as_str().expect("JS's answer nests 200 deep");
    assert!(
        raw.starts_with(r#"{"ok":{"manifest":{"outputs":[[[["#),
        "JS accepts deep nesting: {raw}"
    );
    for dir in [&inf, &lone, &deep] {
        assert_eq!(
            ours_validate(dir)["error"]["message"],
            json!("Sandbox bundle README.md must contain valid JSON."),
            "{}",
            dir.display()
        );
    }

    // Bad status: JS writes, JS's validator rejects; we refuse to write.
    assert_eq!(r[5], json!({"ok": true}));
    assert_eq!(r[6]["error"]["code"], json!("INVALID_INPUT"));
    let ours = ours_write(&rsw("bad-status"), &bad_status);
    assert_eq!(ours["error"]["code"], json!("INVALID_INPUT"));
    assert!(!rsw("bad-status").exists());

    // A patch outside patches/: same error, but at write time and with nothing written.
    assert_eq!(r[7], json!({"ok": true}));
    let ours = ours_write(&rsw("outside"), &outside);
    assert_eq!(ours["error"], r[8]["error"]);
    assert!(!rsw("outside").exists());

    // README over 5 MiB: same error, at write time.
    assert_eq!(r[9], json!({"ok": true}));
    let ours = ours_write(&rsw("huge-readme"), &huge_readme);
    assert_eq!(ours["error"], r[10]["error"]);
    assert_eq!(
        ours["error"]["message"],
        json!("Sandbox bundle README.md exceeds 5242880 bytes")
    );
    assert!(!rsw("huge-readme").exists());

    // A diffBundle that does not fit: JS writes an invalid bundle, we drop the diffBundle.
    assert_eq!(r[11], json!({"ok": true}));
    assert_eq!(
        r[12]["error"]["message"],
        json!("Sandbox bundle README.md exceeds 5242880 bytes")
    );
    assert_eq!(
        ours_write(&rsw("huge-diff"), &huge_diff),
        json!({"ok": true})
    );
    let v = ours_validate(&rsw("huge-diff"));
    assert_eq!(
        v["ok"]["manifest"],
        json!({"outputs": {"ok": true}, "status": "finished", "patches": []})
    );

    // runId null: JS writes `"runId": null`, we omit the key; both validate to the same.
    assert_eq!(r[13], json!({"ok": true}));
    assert!(fs::read_to_string(jsw("null-run-id").join("README.md"))
        .unwrap()
        .contains("\"runId\": null"));
    assert_eq!(
        ours_write(&rsw("null-run-id"), &null_run_id),
        json!({"ok": true})
    );
    assert!(!fs::read_to_string(rsw("null-run-id").join("README.md"))
        .unwrap()
        .contains("runId"));
    assert_eq!(
        r[14]["ok"]["manifest"],
        ours_validate(&rsw("null-run-id"))["ok"]["manifest"]
    );

    // Non-string content: a Node TypeError (not a Smithers code) in JS, INVALID_INPUT here.
    assert_eq!(r[15]["error"]["code"], json!("ERR_INVALID_ARG_TYPE"));
    assert!(
        r[16]["ok"].is_object(),
        "JS accepts a NUL in a patch entry: {}",
        r[16]
    );
    assert_eq!(
        ours_validate(&nul)["error"]["code"],
        json!("TOOL_PATH_INVALID")
    );

    let ours = ours_write(&rsw("content-not-string"), &content_not_string);
    assert_eq!(
        ours["error"],
        json!({"code": "INVALID_INPUT", "message": "patch.content must be a string."})
    );
}
