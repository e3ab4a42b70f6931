//! `smithers-sandbox doctor --runtime docker`: the Docker engine's section of the self check.

use std::process::Command;

fn doctor(docker_host: Option<&str>) -> (i32, serde_json::Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_smithers-sandbox"));
    cmd.args(["--json", "doctor", "--runtime", "docker"]);
    if let Some(h) = docker_host {
        cmd.env("DOCKER_HOST", h);
    }
    let out = cmd.output().expect("run smithers-sandbox");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

fn protection<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["protections"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no {name} row in {report}"))
}

#[test]
fn unreachable_engine_is_reported_with_the_fix() {
    let (code, report) = doctor(Some("unix:///nonexistent/smithers/docker.sock"));
    assert_eq!(code, 1);
    let engine = protection(&report, "engine");
    assert_eq!(engine["status"], "unavailable");
    assert!(engine["fix"]
        .as_str()
        .unwrap_or("")
        .contains("start the Docker engine"));
}

#[test]
fn running_engine_is_reported() {
    let socket = "/var/run/docker.sock";
    if !std::path::Path::new(socket).exists() {
        smithers_test_support::skip_or_fail(&format!(
            "no Docker engine at {socket} (scripts/docker-up.sh starts one)"
        ));
        return;
    }
    let (code, report) = doctor(Some(&format!("unix://{socket}")));
    assert_eq!(code, 0, "{report}");
    assert_eq!(protection(&report, "engine")["status"], "enforced");
    assert_eq!(protection(&report, "network")["status"], "enforced");
}
