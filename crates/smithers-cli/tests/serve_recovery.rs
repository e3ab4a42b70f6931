//! A `serve` killed with SIGKILL forgets its hosted sandboxes; the next server on the same data
//! directory cleans up what they left (the native runtime's state, a step still running) and
//! says so, so that a client resuming its run can create the same `runId:sandboxId` again.
//! Before, the runtime refused that create as "out of order" until someone removed the state
//! by hand.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::native::sandboxes_usable;
use support::serve::{ServeChild, ServeOptions};

const TOKEN: &str = "recovery-token-0123456789abcdef";

/// One HTTP/1.1 request; (status, body).
fn call(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Pids of processes whose command line is exactly `sleep <marker>`.
fn sleeping(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c == format!("sleep\0{marker}\0").as_bytes())
        })
        .collect()
}

fn run_id() -> String {
    format!("run-resumed-{}", std::process::id())
}

fn create(addr: &str) -> (u16, Value) {
    let body = format!(r#"{{"runId":"{}","sandboxId":"step"}}"#, run_id());
    let (status, body) = call(addr, "POST", "/v1/sandboxes", &body);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

#[test]
fn a_killed_servers_sandboxes_are_cleaned_up_by_the_next_one() {
    if !sandboxes_usable() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let options = ServeOptions {
        token: TOKEN.into(),
        data_dir: data.path().to_path_buf(),
        ..Default::default()
    };
    let mut first = ServeChild::start(&options).unwrap();
    let addr = first.addr.to_string();
    let (status, created) = create(&addr);
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(
        call(&addr, "PUT", &format!("/v1/sandboxes/{id}/request"), "{}").0,
        200
    );
    let marker = format!("{}", 900 + std::process::id() % 97);
    let argv = format!(r#"{{"argv":["sh","-c","exec sleep {marker}"]}}"#);
    assert_eq!(
        call(&addr, "POST", &format!("/v1/sandboxes/{id}/execute"), &argv).0,
        202
    );
    let start = Instant::now();
    while sleeping(&marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the step never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // SIGKILL: no drain, no cleanup.
    // SAFETY: kill(2) on the pid of the server child this test started.
    unsafe { libc::kill(first.pid as libc::pid_t, libc::SIGKILL) };
    let _ = first.stop();
    assert!(
        data.path().join("sandboxes").join(&id).exists(),
        "the killed server left its sandbox"
    );

    let mut second = ServeChild::start(&options).unwrap();
    let said = second.stderr();
    assert!(
        said.contains(&format!(
            "removed hosted sandbox {id} ({}:step) left by a previous server: its processes and state cleaned up",
            run_id()
        )),
        "{said}"
    );
    assert!(!data.path().join("sandboxes").join(&id).exists());
    let start = Instant::now();
    while !sleeping(&marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the step still runs after recovery"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The resumed run can make its sandbox again.
    let addr = second.addr.to_string();
    let (status, again) = create(&addr);
    assert_eq!(status, 201, "{again}");

    // A server stopped gracefully removes what it still holds: nothing is left for the next.
    let state = format!("/dev/shm/smithers-sandbox-{}/{}+step", own_uid(), run_id());
    assert!(
        std::path::Path::new(&state).exists(),
        "the new sandbox's runtime state"
    );
    second.stop();
    let left: Vec<_> = std::fs::read_dir(data.path().join("sandboxes"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(
        !std::path::Path::new(&state).exists(),
        "{state} outlived its server"
    );
}

/// This process's uid, from /proc (the native runtime names its state directory by it).
fn own_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap()
}
