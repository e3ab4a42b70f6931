//! `run --runtime codeplane`: the same command against a `smithers-sandbox serve` host (a
//! child process here) at $CODEPLANE_API_URL: the project is uploaded, the step runs there,
//! and its change comes back for review and applies here (issue 17). Without the host's URL
//! it is refused before anything is created, naming what to set.

mod support;

use std::process::Stdio;

use support::native::{bin, sandboxes_usable};
use support::serve::{ServeChild, ServeOptions};

const TOKEN: &str = "run-codeplane-token-0123456789";

#[test]
fn a_step_runs_on_a_sandbox_host_and_its_change_applies_here() {
    if !sandboxes_usable() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let server = ServeChild::start(&ServeOptions {
        token: TOKEN.into(),
        data_dir: data.path().join("data"),
        args: Vec::new(),
        env: Vec::new(),
        wrapper: Vec::new(),
    })
    .unwrap();
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("kept.txt"), "before\n").unwrap();
    let out = bin()
        .args(["run", "--json", "--runtime", "codeplane", "--root"])
        .arg(project.path())
        .args([
            "--",
            "sh",
            "-c",
            "echo after >> kept.txt; echo made > new.txt",
        ])
        .env("CODEPLANE_API_URL", server.url())
        .env("CODEPLANE_API_KEY", TOKEN)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "run --json: {e}; stderr: {stderr}\nserver: {}",
            server.stderr()
        )
    });
    assert_eq!(doc["runtime"], "codeplane", "{doc}");
    assert_eq!(doc["status"], "review", "{doc}");
    let mut paths: Vec<&str> = doc["patches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["path"].as_str())
        .collect();
    paths.sort_unstable();
    assert_eq!(paths, ["kept.txt", "new.txt"], "{doc}");
    // Nothing here changed until the review is accepted.
    assert_eq!(
        std::fs::read_to_string(project.path().join("kept.txt")).unwrap(),
        "before\n"
    );
    let accepted = bin()
        .args(["accept", doc["sandboxId"].as_str().unwrap(), "--root"])
        .arg(project.path())
        .output()
        .unwrap();
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(project.path().join("kept.txt")).unwrap(),
        "before\nafter\n"
    );
    assert_eq!(
        std::fs::read_to_string(project.path().join("new.txt")).unwrap(),
        "made\n"
    );
}

#[test]
fn without_a_host_it_is_refused_before_anything_is_created() {
    let project = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["run", "--runtime", "codeplane", "--root"])
        .arg(project.path())
        .args(["--", "true"])
        .env_remove("CODEPLANE_API_URL")
        .env_remove("CODEPLANE_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("CODEPLANE_API_URL"), "{stderr}");
    assert!(
        !project.path().join(".smithers").exists(),
        "state was created"
    );
}
