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

use super::{backend, context};
use crate::output::{inert, Coded};

const SERVE_HELP: &str = "\
The API is under /v1/ (OpenAPI at /v1/openapi.yaml); GET /health and GET /metrics need no
token. Clients authenticate with `Authorization: Bearer $SMITHERS_SANDBOX_TOKEN`; without a
token the server refuses to listen anywhere but a loopback address. SIGTERM or Ctrl-C drains:
no new steps, running ones get 30 s to finish and are then cancelled (with their bundles).
At most --max-connections connections are served at once (more wait in the accept backlog),
and one without a request in progress for --header-timeout-ms is closed.

Several clients: SMITHERS_SANDBOX_TOKENS=\"alice:<token>,bob:<token>\" or --tokens-file (one
name:token a line, # comments), besides SMITHERS_SANDBOX_TOKEN (named \"default\"). A sandbox
belongs to the token that created it; to any other token it does not exist (404).

Ceilings (a client asking more is refused, naming the flag; a step asking no timeout gets
--max-timeout, one asking no output cap gets 1 MiB or --max-output if smaller): no network
unless --allow-network (ports only those given with --allow-port), --max-memory 8g,
--max-cpus 4, --max-pids 4096, --max-disk 16g, --max-timeout 1h, --max-output 16m and
--max-output-lines 1000000 per stream (what a sandbox's log keeps: the step's output is relayed
whole, held back while the client is more than 16 MiB behind);
--max-sandboxes 256 held at once, --max-sandboxes-per-token 32; a sandbox not running that no
request touched for --idle-expiry 1h is removed; uploads at most --max-upload 1g on the wire,
--max-workspace 1g unpacked and --max-workspace-entries 100000 entries, checked while they
stream in. A ceiling of 0 (or --max-timeout 0) is refused: there is no \"unlimited\".";

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
    /// A file of client tokens, one `name:token` a line (`#` starts a comment); added to
    /// SMITHERS_SANDBOX_TOKEN and SMITHERS_SANDBOX_TOKENS.
    #[arg(long, value_name = "FILE")]
    tokens_file: Option<PathBuf>,
    /// Let clients ask for allowNetwork (the host's network). Off by default: such a create
    /// is refused (403).
    #[arg(long)]
    allow_network: bool,
    /// The host's egress policy (a JSON policy file, see `egress check`): a client's
    /// egressPolicy is confined to it (allowed only what both allow). Without it, a client's
    /// policy needs --allow-network.
    #[arg(long, value_name = "FILE")]
    egress_ceiling: Option<PathBuf>,
    /// A host port clients with network may publish (repeatable; needs --allow-network).
    #[arg(long = "allow-port", value_name = "PORT", requires = "allow_network")]
    allow_ports: Vec<u16>,
    /// Largest memory limit a client may ask, e.g. 8g.
    #[arg(long, value_name = "SIZE", default_value = "8g")]
    max_memory: String,
    /// Largest CPU limit a client may ask, in cores.
    #[arg(long, value_name = "CORES", default_value = "4")]
    max_cpus: String,
    /// Largest process/thread limit a client may ask.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    max_pids: u32,
    /// Largest disk limit a client may ask, e.g. 16g.
    #[arg(long, value_name = "SIZE", default_value = "16g")]
    max_disk: String,
    /// Longest timeout a client may ask; also the timeout of a step that asks none.
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    max_timeout: String,
    /// Largest output cap per stream a client may ask, e.g. 16m (what a sandbox's log keeps;
    /// the step's output is relayed whole).
    #[arg(long, value_name = "SIZE", default_value = "16m")]
    max_output: String,
    /// Most lines per stream a client may ask its log to keep.
    #[arg(long, value_name = "N", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_output_lines: u64,
    /// Most sandboxes held at once, over all tokens.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_sandboxes: u64,
    /// Most sandboxes one token holds at once.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_sandboxes_per_token: u64,
    /// Remove a sandbox that is not running and that no request touched for this long
    /// (created and never run, or finished and never downloaded or deleted); 0 never does.
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    idle_expiry: String,
    /// Sandboxes kept prepared ahead (a warm pool: namespaces made, root bound, waiting for a
    /// step), claimed by steps without network, egress policy, disk or CPU limit or volumes.
    #[arg(long, value_name = "N", env = "SMITHERS_SANDBOX_WARM", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=64))]
    warm: u64,
    /// Largest workspace upload on the wire (compressed), e.g. 1g.
    #[arg(long, value_name = "SIZE", default_value = "1g")]
    max_upload: String,
    /// Largest unpacked workspace (bytes of its files), e.g. 1g.
    #[arg(long, value_name = "SIZE", default_value = "1g")]
    max_workspace: String,
    /// Most entries in a workspace upload.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_workspace_entries: u64,

    /// Stop (gracefully) once the server has held no sandbox for this long, e.g. 5m; 0 never
    /// does. A fleet lease's server uses it, so that a lease whose client vanished, or a warm
    /// lease nobody claimed, gives its slot back.
    #[arg(long, value_name = "DURATION", default_value = "0")]
    exit_when_idle: String,
}

fn size(flag: &str, text: &str) -> anyhow::Result<u64> {
    super::flags::parse_size_flag(&format!("--{flag}"), text)
}

fn duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    super::flags::parse_duration_ms(text)
        .map(Duration::from_millis)
        .ok_or_else(|| anyhow::anyhow!("invalid --{flag} {text:?} (e.g. 30s, 10m, 1h)"))
}

/// The operator's ceilings and caps from the flags.
fn apply_ceilings(args: &ServeArgs, config: &mut ServerConfig) -> anyhow::Result<()> {
    let limits = &mut config.limits;
    let c = &mut limits.ceilings;
    c.allow_network = args.allow_network;
    c.egress = args
        .egress_ceiling
        .as_deref()
        .map(super::egress::read_policy)
        .transpose()?;
    c.allowed_ports = args.allow_ports.clone();
    c.max_memory_bytes = Some(size("max-memory", &args.max_memory)?);
    c.max_cpus = Some(
        smithers_runtime::parse_cpu_limit(&args.max_cpus)
            .map_err(|e| anyhow::anyhow!("--max-cpus {:?}: {e}", args.max_cpus))?,
    );
    c.max_pids = Some(args.max_pids);
    c.max_disk_bytes = Some(size("max-disk", &args.max_disk)?);
    c.max_timeout = duration("max-timeout", &args.max_timeout)?;
    if c.max_timeout.is_zero() {
        anyhow::bail!("--max-timeout must be greater than zero");
    }
    c.max_output_bytes = size("max-output", &args.max_output)?;
    c.max_output_lines = args.max_output_lines;
    limits.max_sandboxes = args.max_sandboxes as usize;
    limits.max_sandboxes_per_token = args.max_sandboxes_per_token as usize;
    let idle = duration("idle-expiry", &args.idle_expiry)?;
    limits.idle_expiry = (!idle.is_zero()).then_some(idle);
    limits.max_upload_bytes = size("max-upload", &args.max_upload)?;
    limits.max_workspace_bytes = size("max-workspace", &args.max_workspace)?;
    limits.max_workspace_entries = args.max_workspace_entries;
    if let Some(path) = &args.tokens_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --tokens-file {}", path.display()))?;
        let tokens = smithers_server::parse_tokens(&text)
            .map_err(|e| anyhow::anyhow!("--tokens-file {}: {e}", path.display()))?;
        config.tokens.extend(tokens);
    }
    Ok(())
}

/// Serves until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    let orchestrator = Arc::new(backend::orchestrator(&data_dir.join("sandbox.db"))?);
    let native = Arc::new(super::backend::native_runtime_warm(args.warm as usize)?);
    let mut config = ServerConfig::from_env(&data_dir).coded()?;
    apply_ceilings(args, &mut config)?;
    config.limits.orphan_timeout =
        (args.orphan_timeout_ms > 0).then(|| Duration::from_millis(args.orphan_timeout_ms));
    config.limits.sse_keepalive = Duration::from_millis(args.keepalive_ms);
    config.limits.header_read_timeout = Duration::from_millis(args.header_timeout_ms);
    config.limits.max_connections = args.max_connections as usize;
    let server = SandboxServer::new(config, native.clone())
        .coded()?
        .with_engine(native)
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
        // Hosted sandboxes a previous server on this data directory died without deleting.
        for r in server.recover().await {
            eprintln!(
                "removed hosted sandbox {} ({}) left by a previous server: {}",
                r.id,
                inert(r.name.as_deref().unwrap_or("unknown")),
                match (&r.note, r.cleaned_up) {
                    (None, true) => "its processes and state cleaned up".to_string(),
                    (Some(note), _) => inert(note),
                    (None, false) => "nothing to clean up".to_string(),
                }
            );
        }
        let listener =
            listen(args.listen).with_context(|| format!("listening on {}", args.listen))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "smithers-sandbox serving on http://{addr} (data in {})",
            data_dir.display()
        );
        let idle_exit = match args.exit_when_idle.trim() {
            "0" | "0s" | "0ms" | "0m" | "0h" => Duration::ZERO,
            text => duration("exit-when-idle", text)?,
        };
        let watched = server.clone();
        let stop = async move {
            tokio::select! {
                () = shutdown_signal() => {}
                () = idle_for(watched, idle_exit) => {
                    eprintln!("no sandbox held for {idle_exit:?}: stopping (--exit-when-idle)");
                }
            }
        };
        server.serve(listener, stop).await.coded()
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Resolves once `server` has held no sandbox for `idle` without a break (never for 0).
async fn idle_for(server: SandboxServer, idle: Duration) {
    if idle.is_zero() {
        return std::future::pending().await;
    }
    let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut empty_since = std::time::Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        if server.held() > 0 {
            empty_since = std::time::Instant::now();
        } else if empty_since.elapsed() >= idle {
            return;
        }
    }
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
