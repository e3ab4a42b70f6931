//! The Ray cluster of `scripts/ray/cluster.sh` (a head and two workers with two sandbox slots
//! each, in network namespaces), as the fleet tests find it: its Jobs API URL and token from
//! the script's state directory, the script itself to kill, cut off and restart a node.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use smithers_runtime_ray::{RayOptions, RayRuntime};

/// The cluster's state directory (the script's `$SMITHERS_RAY_STATE`).
pub fn state_dir() -> PathBuf {
    std::env::var_os("SMITHERS_RAY_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/smithers-ray-cluster"))
}

pub const ADDRESS: &str = "http://10.88.0.10:8265";

/// The workers, by name and address.
pub const WORKERS: [(&str, &str); 2] = [("w1", "10.88.0.11"), ("w2", "10.88.0.12")];

pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ray/cluster.sh")
}

/// The cluster's token, when a cluster is up.
pub fn token() -> Option<String> {
    std::fs::read_to_string(state_dir().join("token"))
        .ok()
        .map(|t| t.trim().to_string())
}

/// Runs `cluster.sh ARGS`, asserting it succeeds.
pub fn cluster(args: &[&str]) {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster.sh {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the cluster answers with all four slots; prints SKIP (fails under CI) otherwise.
/// A busy head may miss one request, so the cluster gets a bounded while to answer; if it
/// never does, the reason says whether its head still runs and what its log ends with.
pub fn usable() -> bool {
    let Some(token) = token() else {
        return smithers_test_support::skip_or_fail(
            "no Ray cluster (start one with scripts/ray/cluster.sh up; CI does)",
        );
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = slots(&token);
        if answer == Ok(4) {
            return true;
        }
        if Instant::now() >= deadline {
            return match answer {
                Ok(n) => smithers_test_support::skip_or_fail(&format!(
                    "the Ray cluster offers {n} sandbox slots, not 4 (scripts/ray/cluster.sh down; up)"
                )),
                Err(e) => smithers_test_support::skip_or_fail(&format!(
                    "the Ray cluster does not answer: {e}\n{}",
                    head_diagnosis()
                )),
            };
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Whether the head's `ray start` still runs (per `cluster.sh pids`, which checks the pid's
/// start time, not only that the pid exists), and the end of its log.
fn head_diagnosis() -> String {
    let pids = Command::new("bash")
        .arg(script())
        .args(["pids", "head"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0);
    let log = std::fs::read_to_string(state_dir().join("head.log")).unwrap_or_default();
    let mut tail: Vec<&str> = log.lines().rev().take(15).collect();
    tail.reverse();
    format!(
        "the head {}; head.log ends:\n{}",
        if pids > 0 { "runs" } else { "is gone" },
        tail.join("\n")
    )
}

/// The sandbox slots of the live nodes, per the cluster's own node table.
pub fn slots(token: &str) -> Result<u64, String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!("{ADDRESS}/api/v0/nodes?detail=1"))
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "curl {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("unreadable: {e}"))?;
    Ok(v["data"]["result"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["state"] == "ALIVE")
        .map(|n| n["resources_total"]["sandbox_slot"].as_f64().unwrap_or(0.0) as u64)
        .sum())
}

/// Waits until the cluster offers all its slots again (after a node was restarted).
pub fn wait_whole(timeout: Duration) {
    let token = token().expect("cluster token");
    let deadline = Instant::now() + timeout;
    loop {
        if slots(&token) == Ok(4) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster did not come back whole within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The Ray jobs the cluster knows, as `(submission id, status)`.
pub fn jobs() -> Vec<(String, String)> {
    let token = token().expect("cluster token");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!("{ADDRESS}/api/jobs/"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .map(|j| {
            (
                j["submission_id"].as_str().unwrap_or("").to_string(),
                j["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The product binary this test run built, as the nodes run it: installed into the cluster's
/// install directory (`cluster.sh install-bin`), which every node sees at one path, as real
/// nodes have it installed. The build's own path may be one the nodes do not see (a checkout
/// under /tmp: each node has a private /tmp).
pub fn serve_bin() -> String {
    static INSTALLED: OnceLock<String> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let out = Command::new("bash")
                .arg(script())
                .args(["install-bin", super::native::bin_path()])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "cluster.sh install-bin {}: {}",
                super::native::bin_path(),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .clone()
}

/// The runtime's options for this cluster: the product binary as the nodes' `serve` (installed
/// for them, [`serve_bin`]), a short orphan timeout.
pub fn options() -> RayOptions {
    let mut o = RayOptions::new(ADDRESS, token());
    o.serve_binary = serve_bin();
    o.orphan_timeout = Duration::from_secs(5);
    o.watch_interval = Duration::from_millis(250);
    o
}

pub fn runtime() -> RayRuntime {
    RayRuntime::new(options()).expect("ray runtime")
}

/// The environment the CLI needs to use this cluster.
pub fn cli_env(cmd: &mut Command) -> &mut Command {
    cmd.env("RAY_ADDRESS", ADDRESS)
        .env("RAY_AUTH_TOKEN", token().unwrap_or_default())
        .env("SMITHERS_RAY_SERVE_BIN", serve_bin())
        .env("SMITHERS_RAY_ORPHAN_TIMEOUT_MS", "5000")
}

/// Processes of this machine whose command line holds `marker` (a sandbox's step is a process
/// of this machine too, whatever namespaces it is in).
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmdline).contains(marker) {
                found.push(pid);
            }
        }
    }
    found
}
