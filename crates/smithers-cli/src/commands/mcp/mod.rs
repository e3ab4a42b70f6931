//! `smithers-sandbox mcp`: an MCP server (JSON-RPC 2.0 over stdio, one message per line) whose
//! tools drive sessions: start one, run commands in it, read and write its files, list a
//! directory, show its change, stop it. An agent drives a sandbox through it; the review stays
//! a person's: accepting a change is a tool only when the operator says so
//! (`--allow-accept`).
//!
//! Everything a client sends is hostile: a message is bounded ([`MAX_MESSAGE`]), every
//! argument is checked against its tool's schema by hand before use, an agent reaches only the
//! sessions this server started, and output and files move bounded, byte-exact (text when the
//! bytes are UTF-8, base64 otherwise, never re-encoded lossily).

mod capture;
mod tools;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use smithers_mcp::args::MAX_MESSAGE;
use smithers_mcp::protocol;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The project the sessions work on (default: the project of the current directory).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Offer `session_accept`: an agent may apply a stopped session's change to the project.
    #[arg(long)]
    pub allow_accept: bool,
    /// A host an agent's session may be given (`NAME[:PORTS]`, as run's --allow-host;
    /// repeatable): `session_start`'s `allowHosts` must be among these. None by default: the
    /// agent's sessions reach no network.
    #[arg(long = "allow-host", value_name = "NAME[:PORTS]")]
    pub allow_host: Vec<String>,
}

/// What the server tells a client at the handshake.
const INSTRUCTIONS: &str = "Sandboxed sessions over one project: start a session, run commands and edit files in it (the project is untouched), look at its change with session_diff, and stop it: its change then waits for a person's review.";

pub fn run(args: &McpArgs) -> anyhow::Result<ExitCode> {
    let root = match &args.root {
        Some(r) => {
            std::fs::canonicalize(r).map_err(|e| anyhow::anyhow!("--root {}: {e}", r.display()))?
        }
        None => super::context::find_project_root(&std::env::current_dir()?),
    };
    let mut server =
        tools::Server::new(root, args.allow_accept).with_hosts(args.allow_host.clone());
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    // The same for the server's life (what it offers is the operator's flags).
    let tools = server.list();
    loop {
        let line = match read_message(&mut input) {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(too_long) => {
                write_message(
                    &stdout,
                    &protocol::error(serde_json::Value::Null, -32600, &too_long),
                )?;
                continue;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let about = protocol::About {
            tools: &tools,
            instructions: INSTRUCTIONS,
        };
        let reply = match protocol::read(&line, about) {
            protocol::Message::Reply(reply) => reply,
            protocol::Message::Nothing => continue,
            protocol::Message::Call { id, name, args } => {
                protocol::reply(id, server.call(&name, &args))
            }
        };
        write_message(&stdout, &reply)?;
    }
    server.stop_all();
    Ok(ExitCode::SUCCESS)
}

/// One line, bounded: `Err` for a line over [`MAX_MESSAGE`] (skipped whole), `None` at the end.
fn read_message(input: &mut impl BufRead) -> Result<Option<Vec<u8>>, String> {
    let mut line = Vec::new();
    let mut over = false;
    loop {
        let buf = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Ok(None),
        };
        if buf.is_empty() {
            return Ok((!line.is_empty() && !over).then_some(line));
        }
        let (chunk, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if !over && line.len() + chunk.len() <= MAX_MESSAGE {
            line.extend_from_slice(chunk);
        } else {
            over = true;
            line.clear();
        }
        let used = done.unwrap_or(buf.len());
        input.consume(used);
        if done.is_some() {
            return match over {
                true => Err(format!("a message is over {MAX_MESSAGE} bytes")),
                false => Ok(Some(line)),
            };
        }
    }
}

fn write_message(stdout: &std::io::Stdout, message: &serde_json::Value) -> anyhow::Result<()> {
    let mut out = stdout.lock();
    let mut text = message.to_string();
    text.push('\n');
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}
