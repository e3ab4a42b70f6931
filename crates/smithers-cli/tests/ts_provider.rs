//! The TypeScript provider (`clients/smithers-provider`, a Smithers `SandboxProvider` for
//! `smithers-sandbox serve`) runs its own test suite (`npm test`, node:test) against this very
//! binary: it starts `serve` on a free loopback port, runs steps in native sandboxes, and checks
//! the bundles with the real `@smithers-orchestrator/sandbox` package.
//!
//! Steps: `npm ci` (skipped when `node_modules` already holds the pinned dev dependencies),
//! `npm run build` (tsc), `npm test` with `SMITHERS_SANDBOX_BIN` set. Without node or npm the
//! test prints `SKIP`; under `CI=true` it fails. The suite itself applies the same rule to
//! native sandboxes and the reference package.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

// A directory of its own: a file directly in tests/ would be a test binary too.
#[path = "ts_provider/smithers_workflow.rs"]
mod smithers_workflow;
mod support;

fn has(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

fn package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/smithers-provider")
}

/// True when every pinned dev dependency is installed at its pinned version, so `npm ci`
/// (which needs the registry) can be skipped.
fn node_modules_current(dir: &Path) -> bool {
    let read =
        |p: PathBuf| -> Option<Value> { serde_json::from_slice(&std::fs::read(p).ok()?).ok() };
    let Some(manifest) = read(dir.join("package.json")) else {
        return false;
    };
    let Some(wanted) = manifest["devDependencies"].as_object() else {
        return false;
    };
    wanted.iter().all(|(name, version)| {
        read(dir.join("node_modules").join(name).join("package.json"))
            .is_some_and(|installed| installed["version"] == *version)
    })
}

fn npm(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new("npm")
        .args(args)
        .current_dir(dir)
        .env(
            "SMITHERS_SANDBOX_BIN",
            env!("CARGO_BIN_EXE_smithers-sandbox"),
        )
        .env("NO_COLOR", "1")
        .env_remove("SMITHERS_DB")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run npm {args:?}: {e}"));
    // Shown by `cargo test -- --nocapture`, and with the failure below.
    println!(
        "$ npm {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The provider's dev dependencies installed and `dist/` built, once for the tests of this
/// binary (which run in parallel); false (SKIP printed) without node or npm.
fn provider_built() -> bool {
    static BUILT: std::sync::Mutex<Option<bool>> = std::sync::Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(done) = *built {
        return done;
    }
    for program in ["node", "npm"] {
        if !has(program)
            && !smithers_test_support::skip_or_fail(&format!(
                "{program} is not installed (scripts/setup installs it)"
            ))
        {
            *built = Some(false);
            return false;
        }
    }
    let dir = package_dir();
    if !node_modules_current(&dir) {
        let out = npm(&dir, &["ci", "--no-audit", "--no-fund"]);
        assert!(out.status.success(), "npm ci failed (see the output above)");
    }
    let out = npm(&dir, &["run", "build"]);
    assert!(out.status.success(), "npm run build (tsc) failed");
    *built = Some(true);
    true
}

#[test]
fn typescript_provider_suite_passes_against_this_server() {
    if !provider_built() {
        return;
    }
    let dir = package_dir();
    let out = npm(&dir, &["test"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "npm test failed:\n{stdout}");
    // The suite must have run tests, not silently nothing.
    assert!(
        stdout.contains("# pass ") && !stdout.contains("# pass 0\n"),
        "npm test ran no test:\n{stdout}"
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        assert!(
            stdout.contains("# skipped 0"),
            "tests were skipped under CI=true:\n{stdout}"
        );
    }
}
