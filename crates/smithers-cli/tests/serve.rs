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

fn request(addr: &str, method: &str, path: &str, token: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response
}

/// The operator's flags reach the server: a tokens file scopes sandboxes to their token, and
/// by default a client's allowNetwork is refused, as is a memory limit above --max-memory.
#[test]
fn serve_applies_operator_ceilings_and_token_scopes() {
    let data = tempfile::tempdir().unwrap();
    let alice = "alice-token-0123456789abcdef";
    let bob = "bob-token-0123456789abcdef00";
    let tokens = data.path().join("tokens");
    std::fs::write(&tokens, format!("# clients\nalice:{alice}\nbob:{bob}\n")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_smithers-sandbox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--max-memory", "1g"])
        .arg("--tokens-file")
        .arg(&tokens)
        .arg("--data-dir")
        .arg(data.path().join("data"))
        .env_remove("SMITHERS_SANDBOX_TOKEN")
        .env_remove("SMITHERS_SANDBOX_TOKENS")
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
    let create = |token: &str, id: &str, controls: &str| {
        request(
            &addr,
            "POST",
            "/v1/sandboxes",
            token,
            &format!(r#"{{"runId":"run-1","sandboxId":"{id}","controls":{controls}}}"#),
        )
    };
    let net = create(alice, "net", r#"{"allowNetwork":true}"#);
    assert!(net.starts_with("HTTP/1.1 403"), "{net}");
    assert!(net.contains("--allow-network"), "{net}");
    let big = create(alice, "big", r#"{"memoryLimitBytes":2147483648}"#);
    assert!(big.starts_with("HTTP/1.1 422"), "{big}");
    assert!(big.contains("--max-memory"), "{big}");
    let ok = create(alice, "ok", "{}");
    assert!(ok.starts_with("HTTP/1.1 201"), "{ok}");
    let id = ok
        .split("\"id\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("no id in {ok}"))
        .to_string();
    let theirs = get(&addr, &format!("/v1/sandboxes/{id}"), Some(bob));
    assert!(theirs.starts_with("HTTP/1.1 404"), "{theirs}");
    let listed = get(&addr, "/v1/sandboxes", Some(bob));
    assert!(listed.ends_with("[]"), "{listed}");
    let mine = get(&addr, &format!("/v1/sandboxes/{id}"), Some(alice));
    assert!(mine.starts_with("HTTP/1.1 200"), "{mine}");
    let gone = request(&addr, "DELETE", &format!("/v1/sandboxes/{id}"), alice, "");
    assert!(gone.starts_with("HTTP/1.1 204"), "{gone}");
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// A server without a token listens on loopback only, and answers only requests addressed to
/// a loopback name: a web page whose own name was pointed at 127.0.0.1 (DNS rebinding) gets
/// 403 from every `/v1` route, the MCP endpoint's too.
#[test]
fn a_server_without_a_token_answers_only_loopback_names() {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_smithers-sandbox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .env_remove("SMITHERS_SANDBOX_TOKEN")
        .env_remove("SMITHERS_SANDBOX_TOKENS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .split("serving on http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address printed: {line}"))
        .to_string();
    let port = addr.rsplit(':').next().unwrap().to_string();
    let ask = |host: &str, request: &str| {
        let mut s = TcpStream::connect(&addr).unwrap();
        write!(s, "{request}Host: {host}\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        response
    };
    let list = "GET /v1/sandboxes HTTP/1.1\r\n";
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let mcp = format!(
        "POST /v1/mcp HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        ping.len()
    );
    let rebound = format!("evil.example:{port}");
    for host in [addr.as_str(), &format!("localhost:{port}")] {
        let ok = ask(host, list);
        assert!(ok.starts_with("HTTP/1.1 200"), "{host}: {ok}");
    }
    let refused = ask(&rebound, list);
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(s, "{mcp}Host: {rebound}\r\nConnection: close\r\n\r\n{ping}").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
