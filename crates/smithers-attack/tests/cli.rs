//! The attack tool's own contract, checked on the host with harmless attempts only: one JSON
//! line per attempt, `ok` meaning "got through", errno reported, usage errors exit 2.

use std::process::Command;

use serde_json::Value;

fn run(args: &[&str]) -> (Vec<Value>, i32) {
    let out = Command::new(env!("CARGO_BIN_EXE_smithers-attack"))
        .args(args)
        .output()
        .expect("run smithers-attack");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    (lines, out.status.code().unwrap_or(-1))
}

#[test]
fn one_line_per_attempt_with_errno() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    let missing = dir.path().join("missing/f");
    let (lines, code) = run(&[
        "write-file",
        file.to_str().unwrap(),
        "needle-text",
        "+",
        "read-file",
        file.to_str().unwrap(),
        "rev:txet-eldeen",
        "+",
        "read-file",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["attempt"], "write-file");
    assert_eq!(lines[0]["ok"], true);
    assert_eq!(lines[1]["ok"], true);
    assert_eq!(
        lines[1]["contains_needle"], true,
        "rev: needles are reversed"
    );
    assert_eq!(lines[2]["ok"], false);
    assert_eq!(lines[2]["errno"], 2);
}

#[test]
fn find_proc_sees_a_marked_process_but_not_itself() {
    let marker = format!("attack-cli-test-{}", std::process::id());
    let mut victim = Command::new(env!("CARGO_BIN_EXE_smithers-attack"))
        .args(["sleep", &marker, "60"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the ready line so the victim has really started.
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(victim.stdout.as_mut().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert!(ready.contains("\"ready\":true"), "{ready}");
    let reversed: String = marker.chars().rev().collect();
    let (lines, _) = run(&["find-proc", &format!("rev:{reversed}")]);
    victim.kill().unwrap();
    victim.wait().unwrap();
    let pids = lines[0]["pids"].as_array().unwrap();
    assert_eq!(pids, &[Value::from(victim.id().to_string())]);
}

#[test]
fn daemonize_leaves_marked_processes_behind() {
    let marker = format!("attack-cli-daemon-{}", std::process::id());
    // The daemons keep stdout open (as a hostile step would), so read the one line instead of
    // waiting for EOF.
    let mut main = Command::new(env!("CARGO_BIN_EXE_smithers-attack"))
        .args(["daemonize", &marker, "60"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(main.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(main.wait().unwrap().success());
    let d: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(d["ok"], true, "{d}");
    let reversed: String = marker.chars().rev().collect();
    let (found, _) = run(&["find-proc", &format!("rev:{reversed}")]);
    let pids: Vec<String> = found[0]["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    for pid in &pids {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    assert!(
        pids.contains(&d["background"].to_string()),
        "{pids:?} vs {d}"
    );
    assert!(pids.contains(&d["daemon"].to_string()), "{pids:?} vs {d}");
}

#[test]
fn unknown_attempts_are_usage_errors() {
    let (lines, code) = run(&["no-such-attempt"]);
    assert_eq!(code, 2);
    assert_eq!(lines[0]["ok"], false);
    assert!(lines[0]["usage"].is_string());
}

#[test]
fn resolve_never_queries_where_a_route_exists() {
    let (lines, _) = run(&["net-info", "+", "resolve", "example.com"]);
    if lines[0]["ok"] == true {
        assert_eq!(lines[1]["skipped"], true, "{}", lines[1]);
    } else {
        assert_eq!(
            lines[1]["ok"], false,
            "no route, yet resolved: {}",
            lines[1]
        );
    }
}
