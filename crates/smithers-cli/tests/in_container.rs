//! The native runtime inside a Docker container (issue 14): with the engine's default options
//! it refuses at create, naming the exact flags; with those flags a step runs, is reviewed
//! and accepted inside the container.
//!
//! The container's root is an empty image with the host's system directories and the built
//! binaries bound read-only, so no registry is needed. Needs the Docker engine
//! (`scripts/docker-up.sh`); elsewhere it prints SKIP, under CI=true it fails.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use smithers_test_support::skip_or_fail;
use support::native::bin_path;

const IMAGE: &str = "smithers-test:empty";

/// The flags the runtime names; kept here so that a change of the message is a change of
/// this test.
const FLAGS: &[&str] = &[
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "systempaths=unconfined",
];

fn docker_ready() -> bool {
    let ok = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok || skip_or_fail("no Docker engine (scripts/docker-up.sh starts one)")
}

/// An empty image: everything the container sees is bound from the host.
fn empty_image() {
    let have = Command::new("docker")
        .args(["image", "inspect", IMAGE])
        .output()
        .unwrap();
    if have.status.success() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("empty.tar");
    let made = Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .args(["-T", "/dev/null"])
        .status()
        .unwrap();
    assert!(made.success());
    let imported = Command::new("docker")
        .arg("import")
        .arg(&tar)
        .arg(IMAGE)
        .output()
        .unwrap();
    assert!(imported.status.success(), "{imported:?}");
}

/// Runs `script` in a fresh container with `flags`, the host's system directories and the
/// binaries' directory (`/opt/smithers`) read-only.
fn in_container(flags: &[&str], script: &str) -> Output {
    let bin_dir = Path::new(bin_path()).parent().unwrap();
    let mut cmd = Command::new("docker");
    cmd.args(["run", "--rm", "--network", "none"]).args(flags);
    for dir in ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"] {
        if Path::new(dir).exists() {
            cmd.args(["-v", &format!("{dir}:{dir}:ro")]);
        }
    }
    cmd.args(["-v", &format!("{}:/opt/smithers:ro", bin_dir.display())])
        .args(["--tmpfs", "/tmp", "-w", "/tmp", "-e", "NO_COLOR=1"])
        .args([IMAGE, "/bin/sh", "-c", script]);
    let out = cmd.output().unwrap();
    println!(
        "$ docker run {} ...\n{}{}",
        flags.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

const PROJECT: &str = "mkdir p && cd p && echo one > a.txt && S=/opt/smithers/smithers-sandbox";

#[test]
fn default_options_are_refused_with_the_flags_that_work() {
    if !docker_ready() {
        return;
    }
    empty_image();
    let out = in_container(
        &[],
        &format!("{PROJECT}; $S doctor; echo doctor=$?; $S run -- true; echo run=$?"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("doctor=1"),
        "doctor says unusable: {stdout}"
    );
    assert!(
        !stdout.contains("run=0"),
        "the run must be refused: {stdout}"
    );
    assert!(
        stderr.contains("TASK_RUNTIME_UNAVAILABLE"),
        "refused at create, not failed at execute: {stderr}"
    );
    let flags = FLAGS.chunks(2).map(|f| f.join(" ")).collect::<Vec<_>>();
    for flag in &flags {
        assert!(
            stderr.contains(flag.as_str()),
            "the refusal names {flag}: {stderr}"
        );
        assert!(
            stdout.contains(flag.as_str()),
            "doctor names {flag}: {stdout}"
        );
    }
}

#[test]
fn with_the_named_flags_a_step_runs_and_is_accepted() {
    if !docker_ready() {
        return;
    }
    empty_image();
    let out = in_container(
        FLAGS,
        &format!(
            "{PROJECT}; $S doctor; echo doctor=$?; \
             $S run --json -- sh -c 'echo two > b.txt' > run.json; echo run=$?; cat run.json; \
             id=$(sed 's/.*\"sandboxId\":\"\\([^\"]*\\)\".*/\\1/' run.json); \
             $S accept \"$id\"; echo accept=$?; cat b.txt"
        ),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("doctor=0"), "{stdout}");
    assert!(stdout.contains("run=0"), "{stdout}");
    assert!(stdout.contains("\"stepStatus\":\"finished\""), "{stdout}");
    assert!(stdout.contains("accept=0"), "{stdout}");
    assert!(
        stdout.trim_end().ends_with("two"),
        "accepted inside: {stdout}"
    );
    // The container's cgroup file system is read-only: no limits, and the step says so.
    assert!(
        stdout.contains("\"name\":\"memory\",\"status\":\"unavailable\""),
        "{stdout}"
    );
}
