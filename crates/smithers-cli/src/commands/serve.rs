//! `smithers-sandbox serve`: this host as a sandbox server for remote clients (the `codeplane`
//! runtime, the TypeScript provider): the HTTP API of `smithers-server` over the native
//! runtime, with durable reviews through the orchestrator and the SQLite store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use smithers_server::{shutdown_signal, SandboxServer, ServerConfig};

use super::context;
use crate::output::Coded;

const SERVE_HELP: &str = "\
The API is under /v1/ (OpenAPI at /v1/openapi.yaml); GET /health and GET /metrics need no
token. Clients authenticate with `Authorization: Bearer $SMITHERS_SANDBOX_TOKEN`; without a
token the server refuses to listen anywhere but a loopback address. SIGTERM or Ctrl-C drains:
no new steps, running ones get 30 s to finish and are then cancelled (with their bundles).
At most --max-connections connections are served at once (more wait in the accept backlog),
and one without a request in progress for --header-timeout-ms is closed.";

/// Arguments of `serve`.
#[derive(Debug, clap::Args)]
#[command(after_help = SERVE_HELP)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the address is printed on stderr).
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: SocketAddr,
    /// Where uploaded workspaces, sandbox state and the review database live.
    #[arg(long, default_value = ".smithers-server")]
    data_dir: PathBuf,
    /// Cancel a running step no client has followed (no open event stream) for this many
    /// milliseconds: its client is gone. 0 never cancels (the step runs to its own timeout).
    #[arg(long, default_value_t = 120_000, value_name = "MS")]
    orphan_timeout_ms: u64,
    /// Interval of keep-alive comments on an idle event stream, in milliseconds (also how
    /// soon a vanished client's stream is noticed).
    #[arg(long, default_value_t = 15_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    keepalive_ms: u64,
    /// Close a connection that has no request in progress for this many milliseconds: the
    /// time to send a complete request head (slowloris), and the idle time of a keep-alive
    /// connection between requests.
    #[arg(long, default_value_t = 10_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_ms: u64,
    /// Most connections served at once; further ones wait in the accept backlog.
    #[arg(long, default_value_t = 1024, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: u64,
}

/// Serves until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    let orchestrator = Arc::new(context::orchestrator(&data_dir.join("sandbox.db"))?);
    let native = Arc::new(super::run::native_runtime()?);
    let mut config = ServerConfig::from_env(&data_dir);
    config.limits.orphan_timeout =
        (args.orphan_timeout_ms > 0).then(|| Duration::from_millis(args.orphan_timeout_ms));
    config.limits.sse_keepalive = Duration::from_millis(args.keepalive_ms);
    config.limits.header_read_timeout = Duration::from_millis(args.header_timeout_ms);
    config.limits.max_connections = args.max_connections as usize;
    let server = SandboxServer::new(config, native)
        .coded()?
        .with_orchestrator(orchestrator.clone())
        .coded()?;
    let rt = context::async_runtime()?;
    rt.block_on(async {
        for r in orchestrator.recover().await.coded()? {
            eprintln!(
                "recovered orphaned sandbox {}:{}: marked failed",
                r.run_id, r.sandbox_id
            );
        }
        let listener =
            listen(args.listen).with_context(|| format!("listening on {}", args.listen))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "smithers-sandbox serving on http://{addr} (data in {})",
            data_dir.display()
        );
        server.serve(listener, shutdown_signal()).await.coded()
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Connections the kernel holds for us until they are accepted (capped by
/// `net.core.somaxconn`). Above `--max-connections` clients wait there; tokio's default (128)
/// would have the SYNs of a burst dropped and retried by the clients after a second or more.
const LISTEN_BACKLOG: u32 = 1024;

fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As TcpListener::bind: a restarted server can rebind while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}
