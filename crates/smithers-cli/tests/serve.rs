//! `smithers-sandbox serve`: starts on a free loopback port, answers `/health` without a
//! token, refuses `/v1/` without the right one, closes a connection that sends nothing after
//! `--header-timeout-ms`, and exits 0 on SIGTERM. Also: it refuses to
//! listen on a non-loopback address without a token. Loopback only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

fn get(addr: &str, path: &str, token: Option<&str>) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serves_health_checks_tokens_and_drains_on_sigterm() {
    let data = tempfile::tempdir().unwrap();
    let token = "a-test-token-of-sufficient-length";
    let mut child = Command::new(env!("CARGO_BIN_EXE_smithers-sandbox"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--header-timeout-ms",
            "300",
        ])
        .args(["--max-connections", "16", "--data-dir"])
        .arg(data.path())
        .env("SMITHERS_SANDBOX_TOKEN", token)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut seen = String::new();
    for _ in 0..20 {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
        if let Some(rest) = line.split("serving on http://").nth(1) {
            addr = Some(rest.split_whitespace().next().unwrap().to_string());
            break;
        }
    }
    let addr = addr.unwrap_or_else(|| panic!("no address printed: {seen}"));

    let health = get(&addr, "/health", None);
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let denied = get(&addr, "/v1/sandboxes", Some("wrong-token-wrong-token"));
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
    assert!(denied.contains("\"code\""), "{denied}");
    let listed = get(&addr, "/v1/sandboxes", Some(token));
    assert!(listed.starts_with("HTTP/1.1 200"), "{listed}");

    // A connection that never sends a byte is closed by the server (the bound is far above
    // the 300 ms configured; only a server that never closes it misses it).
    let mut silent = TcpStream::connect(&addr).unwrap();
    silent
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 64];
    match silent.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the silent connection was not closed: {other:?}"),
    }

    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "serve did not exit cleanly on SIGTERM"
    );
}

#[test]
fn refuses_a_public_address_without_a_token() {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_smithers-sandbox"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(data.path())
        .env_remove("SMITHERS_SANDBOX_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("token"), "{err}");
}
