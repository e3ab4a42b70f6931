//! `smithers-sandbox mcp` driven by the official MCP Python SDK's stdio client
//! (`tests/mcp/drive.py`): the handshake, the tool list (no accept unless allowed), a session
//! started, commands with byte-exact and bounded output, binary files written and read back,
//! a directory listed, another session out of reach, the diff, 100 commands, the stop that
//! opens the review. Then the review is checked here through the CLI.
//!
//! The SDK lives in a virtual environment `scripts/setup` makes
//! (`$SMITHERS_MCP_VENV`, default `~/.cache/smithers-mcp/venv`); without it, or without native
//! sandboxes, the test prints `SKIP <reason>` (and fails under `CI=true`).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

mod support;

use smithers_test_support::skip_or_fail;
use support::native::{bin, bin_path, sandboxes_usable};

fn sdk_python() -> Option<PathBuf> {
    let venv = std::env::var_os("SMITHERS_MCP_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/smithers-mcp/venv"))
        })?;
    let python = venv.join("bin/python");
    python.is_file().then_some(python)
}

#[test]
fn the_official_sdk_client_drives_a_session_through_the_mcp_server() {
    if !sandboxes_usable() {
        return;
    }
    let Some(python) = sdk_python() else {
        skip_or_fail(
            "the MCP Python SDK is not installed (scripts/setup makes ~/.cache/smithers-mcp/venv)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    let sessions = dir.path().join("sessions");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&sessions).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sessions, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(root.join("x.txt"), "x\n").unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/drive.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(bin_path())
        .arg(&root)
        .env("SMITHERS_RESIDENT_DIR", &sessions)
        .env_remove("SMITHERS_DB")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let last = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let summary: Value = serde_json::from_str(&last).unwrap();
    let id = summary["sessionId"].as_str().unwrap();
    // The agent's change waits for a person: the project is untouched until accept.
    assert!(!root.join("notes.txt").exists());
    let review = bin()
        .args(["--json", "review", "--root"])
        .arg(&root)
        .arg(id)
        .output()
        .unwrap();
    let review: Value = serde_json::from_slice(&review.stdout).unwrap();
    assert_eq!(review["review"]["state"], "pending", "{review}");
    assert_eq!(review["review"]["patchCount"], 2, "{review}");
}

/// `serve`'s MCP endpoint (`POST /v1/mcp`) driven by the SDK's streamable-HTTP client
/// (`tests/mcp/drive_http.py`): a client without the token refused; a session over an empty
/// workspace; byte-exact, bounded output and files; a listing; checkpoint and restore; two
/// commands at once; 100 commands; another token sees nothing; the stop collects the
/// session's bundle, which the host then serves as a run's.
#[test]
fn the_official_sdk_client_drives_a_hosted_session_over_streamable_http() {
    if !sandboxes_usable() {
        return;
    }
    let Some(python) = sdk_python() else {
        skip_or_fail(
            "the MCP Python SDK is not installed (scripts/setup makes ~/.cache/smithers-mcp/venv)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let token = "mcp-agent-token-0123456789abcdef";
    let other = "mcp-other-token-0123456789abcdef";
    let options = support::serve::ServeOptions {
        token: token.into(),
        data_dir: dir.path().join("data"),
        env: vec![("SMITHERS_SANDBOX_TOKENS".into(), format!("other:{other}"))],
        ..Default::default()
    };
    let server = support::serve::ServeChild::start(&options).unwrap();
    let url = format!("{}/v1/mcp", server.url());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/drive_http.py");
    let out = Command::new(&python)
        .arg(&script)
        .args([&url, token, other])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK client failed:\n{}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    let last = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let summary: Value = serde_json::from_str(&last).unwrap();
    // The SDK failed without the token; on the wire that is a 401, and a web page of
    // another origin is refused even with it.
    assert!(summary["refusedWithoutToken"].is_string(), "{summary}");
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let bare = http_post(&server.addr, "/v1/mcp", &[], ping);
    assert!(bare.starts_with("HTTP/1.1 401"), "{bare}");
    let auth = format!("Authorization: Bearer {token}");
    let page = http_post(
        &server.addr,
        "/v1/mcp",
        &[&auth, "Origin: http://evil.example"],
        ping,
    );
    assert!(page.starts_with("HTTP/1.1 403"), "{page}");
    let fine = http_post(&server.addr, "/v1/mcp", &[&auth], ping);
    assert!(fine.starts_with("HTTP/1.1 200"), "{fine}");
    // The stopped session is a completed sandbox of the agent's token, its bundle served.
    let id = summary["sessionId"].as_str().unwrap();
    let info = http_get(&server.addr, &format!("/v1/sandboxes/{id}"), token);
    assert!(info.starts_with("HTTP/1.1 200"), "{info}");
    assert!(info.contains("\"state\":\"completed\""), "{info}");
    let bundle = http_get(&server.addr, &format!("/v1/sandboxes/{id}/bundle"), token);
    assert!(
        bundle.starts_with("HTTP/1.1 200"),
        "{}",
        &bundle[..200.min(bundle.len())]
    );
    let theirs = http_get(&server.addr, &format!("/v1/sandboxes/{id}"), other);
    assert!(theirs.starts_with("HTTP/1.1 404"), "{theirs}");
    // The fork whose parent was deleted collected its own bundle; the parent's directory
    // (its shipped workspace) stays while the fork is held, and goes with it.
    let fork = summary["fork"].as_str().unwrap();
    let parent = summary["deletedParent"].as_str().unwrap();
    let bundle = http_get(&server.addr, &format!("/v1/sandboxes/{fork}/bundle"), token);
    assert!(
        bundle.starts_with("HTTP/1.1 200"),
        "{}",
        &bundle[..200.min(bundle.len())]
    );
    let sandboxes = options.data_dir.join("sandboxes");
    assert!(sandboxes.join(parent).is_dir());
    let gone = http_delete(&server.addr, &format!("/v1/sandboxes/{fork}"), token);
    assert!(gone.starts_with("HTTP/1.1 204"), "{gone}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sandboxes.join(parent).exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        !sandboxes.join(parent).exists(),
        "the shared workspace outlived its last fork"
    );
    assert!(!sandboxes.join(fork).exists());
}

/// A GET with a bearer token over one HTTP/1.1 connection, the answer whole (lossy text).
fn http_get(addr: &std::net::SocketAddr, path: &str, token: &str) -> String {
    let head = format!("GET {path} HTTP/1.1\r\nAuthorization: Bearer {token}\r\n");
    exchange(addr, &head, "")
}

fn http_delete(addr: &std::net::SocketAddr, path: &str, token: &str) -> String {
    let head = format!("DELETE {path} HTTP/1.1\r\nAuthorization: Bearer {token}\r\n");
    exchange(addr, &head, "")
}

/// A JSON POST with `headers` (whole lines), the answer whole.
fn http_post(addr: &std::net::SocketAddr, path: &str, headers: &[&str], body: &str) -> String {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    exchange(addr, &head, body)
}

fn exchange(addr: &std::net::SocketAddr, head: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "{head}Host: {addr}\r\nConnection: close\r\n\r\n{body}").unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}
