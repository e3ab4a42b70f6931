//! Scenario 11 on a sandbox host: a session held by `smithers-sandbox serve` and driven over
//! HTTP as a remote agent drives it, through the MCP endpoint (`POST /v1/mcp`, one JSON-RPC
//! call per request) and the fork route (`POST /v1/sandboxes/{id}/fork`). Each request is a
//! new loopback connection (the worst case for a client; a kept connection saves its
//! handshake).
//!
//! The session's layer holds 10,000 changed files and 1 GiB written before its first
//! checkpoint, as in the local half (`forks`). Measured: a command (`true`) through the MCP
//! endpoint; a checkpoint (a small file written before each, untimed, so each is a real
//! layer flip) with how long the session's processes were held; a restore to the big
//! checkpoint; a fork from it, until the new session is live (its deletion untimed).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};

use crate::measure::{fmt_ms, Series};
use crate::report::{machine_line, Table};
use crate::whole_cli::cli_binary;

const TOKEN: &str = "bench-hosted-token-0123456789abcdef";
const FILES: usize = 10_000;
const BIG_BYTES: u64 = 1 << 30;

/// A `serve` child, stopped with SIGTERM (drained) when dropped.
struct Host {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Host {
    fn start(bin: &Path, data: &Path) -> anyhow::Result<Host> {
        let _ = std::fs::remove_dir_all(data);
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .env("SMITHERS_SANDBOX_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting serve")?;
        let mut stderr = std::io::BufReader::new(child.stderr.take().context("no stderr")?);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stderr, &mut line)?;
        let addr = line
            .split("serving on http://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .with_context(|| format!("serve said {line:?}"))?
            .parse()?;
        // Its later lines are drained, so that it never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Ok(Host { child, addr })
    }

    /// One request, its JSON answer (status checked).
    fn request(&self, method: &str, path: &str, body: &Value) -> anyhow::Result<Value> {
        let body = body.to_string();
        let mut s = TcpStream::connect(self.addr)?;
        s.set_nodelay(true)?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)?;
        let text = String::from_utf8_lossy(&answer);
        let (head, payload) = text.split_once("\r\n\r\n").context("no answer")?;
        anyhow::ensure!(
            head.starts_with("HTTP/1.1 20"),
            "{method} {path}: {head} {payload}"
        );
        Ok(serde_json::from_str(payload).unwrap_or(Value::Null))
    }

    /// One MCP tool call; its structured result (a tool's error is an error here).
    fn tool(&self, name: &str, args: Value) -> anyhow::Result<Value> {
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": name, "arguments": args}});
        let answer = self.request("POST", "/v1/mcp", &call)?;
        let result = &answer["result"];
        anyhow::ensure!(result["isError"] == json!(false), "{name}: {answer}");
        Ok(result["structuredContent"].clone())
    }
}

pub fn run(scratch: &Path, rounds: usize) -> anyhow::Result<String> {
    let bin = cli_binary()?;
    let host = Host::start(&bin, &scratch.join("hosted"))?;
    let started = host.tool("session_start", json!({}))?;
    let id = started["sessionId"].as_str().context("no id")?.to_string();
    let fill = format!(
        "mkdir f && i=0; while [ $i -lt {FILES} ]; do echo $i > f/$i; i=$((i+1)); done; \
         head -c {BIG_BYTES} /dev/zero > big"
    );
    host.tool(
        "session_exec",
        json!({"sessionId": id, "command": ["sh", "-c", fill]}),
    )?;
    let first = host.tool("session_checkpoint", json!({"sessionId": id}))?;
    let big = first["checkpoint"].as_str().context("no name")?.to_string();
    let mut exec = Series::new("session_exec of `true` (MCP over HTTP)");
    let mut checkpoint =
        Series::new("session_checkpoint (MCP over HTTP; a file written before each)");
    let mut held = Series::new("  of which the session's processes were held");
    let mut restore = Series::new("session_restore to the 1 GiB checkpoint (MCP over HTTP)");
    let mut fork = Series::new("fork from the 1 GiB checkpoint (POST …/fork, until live)");
    for round in 0..rounds {
        let t = Instant::now();
        host.tool(
            "session_exec",
            json!({"sessionId": id, "command": ["true"]}),
        )?;
        exec.samples.push(t.elapsed());
        host.tool(
            "session_write",
            json!({"sessionId": id, "path": "t", "content": round.to_string()}),
        )?;
        let t = Instant::now();
        let made = host.tool("session_checkpoint", json!({"sessionId": id}))?;
        checkpoint.samples.push(t.elapsed());
        held.samples.push(Duration::from_micros(
            made["heldUs"].as_u64().unwrap_or_default(),
        ));
        // Back to the big checkpoint: the stack stays two deep, as a session that
        // checkpoints and restores in a loop keeps it.
        let t = Instant::now();
        host.tool(
            "session_restore",
            json!({"sessionId": id, "checkpoint": big}),
        )?;
        restore.samples.push(t.elapsed());
        let t = Instant::now();
        let forked = host.request(
            "POST",
            &format!("/v1/sandboxes/{id}/fork"),
            &json!({"checkpoint": big}),
        )?;
        fork.samples.push(t.elapsed());
        let child = forked["sandbox"]["id"].as_str().context("no fork id")?;
        host.request("DELETE", &format!("/v1/sandboxes/{child}"), &json!({}))?;
    }
    let series = [exec, checkpoint, held, restore, fork];
    let mut table = Table::new(&["what", "p50", "p95", "samples"]);
    for s in &series {
        table.row(vec![
            s.name.clone(),
            fmt_ms(s.median()),
            fmt_ms(s.p95()),
            s.samples.len().to_string(),
        ]);
    }
    Ok(format!(
        "Machine: {}. One `smithers-sandbox serve` on loopback, a session over an empty \
         workspace whose layer then holds {FILES} files and 1 GiB written (first checkpoint \
         untimed); every request a new connection. {rounds} rounds.\n\n{}\n\
         Command: `cargo build --release -p smithers-cli -p smithers-bench && cargo run \
         --release -p smithers-bench -- hosted`\n",
        machine_line(),
        table.to_markdown()
    ))
}
