//! `run --mount`, `--toolchain` and the step's own `$HOME` (issue 17): a host toolchain brought
//! in read-only builds a real crate; sensitive host paths are refused unless allowed; a
//! writable mount over the project is refused always; every mount is in the enforcement
//! report.

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use support::native::{bin, sandboxes_usable};

/// `run --json --root dir FLAGS -- sh -c SCRIPT`, with `$HOME` set to `home`.
fn run_json(dir: &Path, home: &Path, flags: &[&str], script: &str) -> (Output, Value) {
    let out = bin()
        .env("HOME", home)
        .args(["--json", "run", "--no-review", "--root"])
        .arg(dir)
        .args(flags)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, doc)
}

fn mounts_row(doc: &Value) -> Value {
    doc["enforcement"]["protections"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "host-mounts")
        .cloned()
        .unwrap_or(Value::Null)
}

fn rust_sysroot() -> String {
    let out = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc runs (the machine's toolchain builds these tests)");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_host_toolchain_mounted_read_only_builds_a_crate() {
    if !sandboxes_usable() {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(project.path().join("src")).unwrap();
    std::fs::write(
        project.path().join("Cargo.toml"),
        "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::write(
        project.path().join("src/main.rs"),
        "fn main() { println!(\"built in the sandbox\"); }\n",
    )
    .unwrap();
    let sysroot = rust_sysroot();
    let mount = format!("{sysroot}:/opt/rust");
    // cargo keeps its caches in the step's own $HOME; the build goes to /tmp, so the change
    // is only the lock file.
    let script = "set -e; echo \"home=$HOME\"; \
        CARGO_TARGET_DIR=/tmp/target cargo build --offline -q; /tmp/target/debug/hello; \
        test -d \"$HOME/.cargo\"; \
        if touch /opt/rust/written 2>/dev/null; then echo toolchain-writable; fi";
    let (out, doc) = run_json(
        project.path(),
        home.path(),
        &[
            "--mount",
            &mount,
            "--env",
            "PATH=/opt/rust/bin:/usr/bin:/bin",
        ],
        script,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(
        Path::new(doc["bundlePath"].as_str().unwrap_or("/nonexistent")).join("logs/stream.ndjson"),
    )
    .unwrap_or_default();
    assert_eq!(doc["exitCode"], 0, "{out:?}\n{log}");
    assert!(log.contains("built in the sandbox"), "{log}");
    assert!(log.contains("home=/home/sandbox"), "{log}");
    assert!(!log.contains("toolchain-writable"), "{log}");
    assert!(!Path::new(&sysroot).join("written").exists());
    let row = mounts_row(&doc);
    assert_eq!(row["status"], "enforced", "{row}");
    assert!(
        row["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("{sysroot} at /opt/rust (ro)")),
        "{row}"
    );
    assert!(!stdout.is_empty());
}

#[test]
fn the_rustup_toolchain_is_found_and_brought_in() {
    if !sandboxes_usable() {
        return;
    }
    let Some(home) = std::env::var_os("HOME") else {
        return;
    };
    if !Path::new(&home).join(".rustup").is_dir() && std::env::var_os("RUSTUP_HOME").is_none() {
        smithers_test_support::skip_optional("no rustup installation under $HOME");
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let (out, doc) = run_json(
        project.path(),
        Path::new(&home),
        &["--toolchain", "rustup"],
        "cargo --version && rustc --version",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let row = mounts_row(&doc);
    assert!(row["detail"].as_str().unwrap().contains(".rustup"), "{row}");
}

#[test]
fn sensitive_host_paths_are_refused_unless_allowed() {
    if !sandboxes_usable() {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let ssh = home.path().join(".ssh");
    std::fs::create_dir(&ssh).unwrap();
    std::fs::write(ssh.join("id_ed25519"), "PRIVATE KEY").unwrap();
    // A link with an innocent name is judged by what it points at.
    let innocent = home.path().join("tools");
    std::os::unix::fs::symlink(&ssh, &innocent).unwrap();
    for target in [
        ssh.display().to_string(),
        innocent.display().to_string(),
        home.path().display().to_string(),
        "/etc".to_string(),
        "~/.ssh".to_string(),
    ] {
        let (out, doc) = run_json(project.path(), home.path(), &["--mount", &target], "true");
        assert!(!out.status.success(), "{target}: {out:?}");
        let message = doc["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("--allow-sensitive-mount"),
            "{target}: {doc}"
        );
        assert!(
            !project.path().join(".smithers/sandboxes").exists()
                || std::fs::read_dir(project.path().join(".smithers/sandboxes"))
                    .unwrap()
                    .next()
                    .is_none(),
            "{target}: a refused mount still made a sandbox"
        );
    }
    // Allowed explicitly: the step reads it, and the report says so.
    let (out, doc) = run_json(
        project.path(),
        home.path(),
        &[
            "--mount",
            &format!("{}:/keys", ssh.display()),
            "--allow-sensitive-mount",
        ],
        "cat /keys/id_ed25519 > /dev/null",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    let row = mounts_row(&doc);
    assert_eq!(row["status"], "degraded", "{row}");
    assert!(row["detail"]
        .as_str()
        .unwrap()
        .contains("allowSensitiveMounts"));
}

#[test]
fn a_writable_mount_over_the_project_is_refused_and_one_elsewhere_is_written() {
    if !sandboxes_usable() {
        return;
    }
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(project.path().join("target")).unwrap();
    for target in [
        format!("{}:/p:rw", project.path().display()),
        format!("{}/target:/t:rw", project.path().display()),
    ] {
        let (out, doc) = run_json(
            project.path(),
            home.path(),
            &["--mount", &target, "--allow-sensitive-mount"],
            "true",
        );
        assert!(!out.status.success(), "{target}: {out:?}");
        assert!(
            doc["message"]
                .as_str()
                .unwrap_or_default()
                .contains("written only by an accepted review"),
            "{doc}"
        );
    }
    // Read-only, the project may be mounted (a second view of it, harmlessly).
    let (_, doc) = run_json(
        project.path(),
        home.path(),
        &["--mount", &format!("{}:/p", project.path().display())],
        "test -d /p/target",
    );
    assert_eq!(doc["exitCode"], 0, "{doc}");
    // A writable cache elsewhere is written directly, and the report says it is not reviewed.
    let cache = tempfile::tempdir().unwrap();
    let (out, doc) = run_json(
        project.path(),
        home.path(),
        &["--mount", &format!("{}:/cache:rw", cache.path().display())],
        "echo kept > /cache/entry",
    );
    assert_eq!(doc["exitCode"], 0, "{out:?}");
    assert_eq!(
        std::fs::read_to_string(cache.path().join("entry")).unwrap(),
        "kept\n"
    );
    let row = mounts_row(&doc);
    assert_eq!(row["status"], "degraded", "{row}");
    assert!(row["detail"]
        .as_str()
        .unwrap()
        .contains("not through the review"));
}
