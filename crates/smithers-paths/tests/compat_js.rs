//! `resolve` against the real JavaScript `resolveSandboxPath` (0.32), run by
//! `../shared/tools/smithers-js/smithers-bundle.mjs`. Same result or same error code for every
//! input, except the one deliberate difference: a root of `/` (the original's string-prefix
//! test `startsWith(root + "/")` rejects everything beneath `/`).

use std::path::{Path, PathBuf};
use std::process::Command;

use smithers_errors::CodedError;
use smithers_paths::resolve;
use smithers_test_support::skip_or_fail;

fn js_tool() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("SMITHERS_JS_TOOL") {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/tools/smithers-js/smithers-bundle.mjs");
    p.exists().then_some(p)
}

fn js_resolve(tool: &Path, root: &str, input: &str) -> Result<String, String> {
    let out = Command::new("node")
        .arg(tool)
        .args(["resolve", root, input])
        .output()
        .expect("run node");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "node printed non-JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    match v.get("error") {
        Some(err) => Err(err["code"].as_str().unwrap_or("").to_string()),
        None => Ok(v.as_str().expect("resolved path string").to_string()),
    }
}

#[test]
fn resolve_matches_the_javascript_package() {
    let Some(tool) = js_tool() else {
        skip_or_fail("the smithers-js tool (../shared/tools/smithers-js) is not present");
        return;
    };
    if Command::new("node").arg("--version").output().is_err() {
        skip_or_fail("node is not installed");
        return;
    }
    let cases: &[(&str, &str)] = &[
        ("/root/dir", "a/b"),
        ("/root/dir", "./a/../b"),
        ("/root/dir", "."),
        ("/root/dir", "../x"),
        ("/root/dir", "a/../../x"),
        ("/root/dir", "/root/dir/abs"),
        ("/root/dir", "/root/dirx/sibling"),
        ("/root/dir", "/etc/passwd"),
        ("/root/dir", "..x"),
        ("/root/dir", "a//b/"),
        ("/root/dir/", "a"),
        ("/root/dir", ""),
        ("/root/dir", "/root/dir/../dir/y"),
        ("/root/dir", "ü/日本/🎉"),
    ];
    // Run the node processes in parallel: each start costs a few hundred milliseconds.
    let handles: Vec<_> = cases
        .iter()
        .map(|&(root, input)| {
            let tool = tool.clone();
            std::thread::spawn(move || js_resolve(&tool, root, input))
        })
        .collect();
    for ((root, input), handle) in cases.iter().zip(handles) {
        let js = handle.join().unwrap();
        let ours = resolve(Path::new(root), input)
            .map(|p| p.to_str().unwrap().to_string())
            .map_err(|e| e.code().as_str().to_string());
        assert_eq!(ours, js, "resolve({root:?}, {input:?})");
    }

    // The deliberate difference: root "/".
    let js = js_resolve(&tool, "/", "etc");
    assert_eq!(
        js,
        Err("TOOL_PATH_ESCAPE".to_string()),
        "the original rejects everything under /"
    );
    assert_eq!(
        resolve(Path::new("/"), "etc").unwrap(),
        PathBuf::from("/etc")
    );
}
