//! The command line of `run` and the sandbox controls it asks for.

use clap::Args;
use serde_json::Value;
use smithers_errors::ErrorCode;
use smithers_runtime::{parse_cpu_limit, Controls};
use smithers_runtime_native::WORKSPACE_ENV;

use super::backend::{RuntimeChoice, WorkspaceChoice};
use super::context::StoreArgs;
use super::flags::{parse_duration_ms, parse_size_flag};
use crate::output::{coded_error, Coded};

/// How `run` relays the step's output (shown in `run --help`).
pub const OUTPUT_HELP: &str = "\
The step's output:
  Everything the step writes is relayed as it comes: its stdout to our stdout, its stderr to
  our stderr. To a pipe or a file it is written byte for byte as the step wrote it, all of
  it (binary output, bytes that are not UTF-8, a last line without a newline), whatever the
  caps below. To a terminal it is shown a line at a time with control characters and escape
  sequences (ESC, CR, backspace, OSC, C1 controls, bidi overrides) and bytes that are not
  UTF-8 as visible text (^[, ^M, \\u{9b}, \\xff, ...), so a step cannot redraw, retitle or write
  to your terminal or clipboard. While the progress line is shown (stderr is a terminal),
  the step's stdout shares the terminal unless our stdout is redirected.

What is kept:
  The bundle's log (logs/stream.ndjson, `logs ID`) keeps each stream up to --max-output
  bytes (default 1m) and --max-output-lines lines (default 100000); past a cap the log is
  cut and says how many bytes and lines it did not keep, while the step runs on, its output
  is still relayed whole, and its status is its own. --fail-on-output-cap stops the step at
  a cap instead (status failed, termination output). Bytes that are not UTF-8 are kept
  exactly (base64 in the log).";

/// Arguments of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// --root: the project mounted (copy-on-write) at /workspace, where accepted patches are
    /// applied; --db: the database (default <root>/.smithers/sandbox.db).
    #[command(flatten)]
    pub store: StoreArgs,
    /// The runtime.
    #[arg(long, value_enum, default_value = "bubblewrap")]
    pub runtime: RuntimeChoice,
    /// How /workspace presents the project (native runtime): overlay, copy, or auto (overlay
    /// where it can be mounted, else a copy, recorded as degraded).
    #[arg(long, value_enum, env = WORKSPACE_ENV, default_value = "auto")]
    pub workspace: WorkspaceChoice,
    /// Container image (docker runtime).
    #[arg(long, value_name = "IMG")]
    pub image: Option<String>,
    /// Share the host's whole network, its loopback services included: the unsafe choice
    /// (recorded in the enforcement report). Prefer --allow-host.
    #[arg(long)]
    pub allow_network: bool,
    /// Let the step reach NAME on PORTS (443 when omitted; e.g. 80,443 or 8000-8100),
    /// through the runtime's egress engine: DNS, HTTP(S) and SOCKS5 proxies and transparent
    /// capture, every decision recorded. `*.example.com` is the names below example.com.
    /// Repeatable.
    #[arg(long = "allow-host", value_name = "NAME[:PORTS]")]
    pub allow_host: Vec<String>,
    /// Let the step reach the IPv4 addresses of CIDR on PORTS (443 when omitted): an IP
    /// literal, or an allowed name that resolves there (a registry mirror or proxy in
    /// private space, which --allow-host alone refuses). Repeatable.
    #[arg(long = "allow-cidr", value_name = "CIDR[:PORTS]")]
    pub allow_cidr: Vec<String>,
    /// An egress policy file (JSON: allow and deny rules with ports, cidr rules, audit mode;
    /// see `smithers-sandbox egress check`). Combined with --allow-host.
    #[arg(long, value_name = "FILE")]
    pub egress_policy: Option<std::path::PathBuf>,
    /// Bring a host path in: HOST[:DEST][:ro|rw], read-only unless :rw, at the same path
    /// when DEST is left out (repeatable). Recorded in the enforcement report; a sensitive
    /// path (credentials, /etc, /run, a whole home) is refused without
    /// --allow-sensitive-mount, and a writable one over the project always.
    #[arg(long = "mount", value_name = "HOST[:DEST][:ro|rw]")]
    pub mount: Vec<String>,
    /// Allow --mount over sensitive host paths (credentials, system trees, daemons' sockets,
    /// a whole home): the step can then read (or write) them.
    #[arg(long)]
    pub allow_sensitive_mount: bool,
    /// The step's $HOME is the named home kept for you across runs and sessions (an agent's
    /// login, settings, caches), instead of an empty one: never your own home, never part of
    /// the patches. `home ls`, `home rm NAME`.
    #[arg(long, value_name = "NAME")]
    pub home: Option<String>,
    /// Bring a toolchain of this host in, read-only: rustup, pyenv, nvm or pipx
    /// (repeatable; see `run --help`).
    #[arg(long = "toolchain", value_name = "NAME", long_help = super::mounts::TOOLCHAIN_HELP)]
    pub toolchain: Vec<String>,
    /// Memory limit, e.g. 512m, 2g.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// CPU limit in cores, e.g. 0.5, 2.
    #[arg(long, value_name = "CORES")]
    pub cpus: Option<String>,
    /// Maximum number of processes/threads.
    #[arg(long, value_name = "N")]
    pub pids: Option<u32>,
    /// Cap on what the step may write to its workspace layer, e.g. 1g.
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    /// Wall-clock timeout, e.g. 30s, 10m, 1h, 500ms (a bare number is seconds).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Cap on what the bundle's log keeps of each output stream, e.g. 64m (default 1m); the
    /// step's output is relayed whole either way.
    #[arg(long, value_name = "SIZE")]
    pub max_output: Option<String>,
    /// Cap on the lines the bundle's log keeps of each output stream (default 100000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_output_lines: Option<u64>,
    /// Stop the step when a stream passes --max-output or --max-output-lines (termination
    /// `output`, status failed), instead of only cutting what the log keeps.
    #[arg(long)]
    pub fail_on_output_cap: bool,
    /// An environment variable for the step (repeatable). Values are never stored: the
    /// database records `[redacted]`.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// The step's input JSON (available inside at $SMITHERS_SANDBOX_REQUEST_PATH).
    #[arg(long, value_name = "JSON")]
    pub input: Option<String>,
    /// The run id (default: a new one). Sandboxes of one run share its event sequence.
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,
    /// The sandbox id (default: a new one).
    #[arg(long, value_name = "ID")]
    pub sandbox_id: Option<String>,
    /// With --run-id/--sandbox-id of an earlier sandbox that has ended: replace it (its
    /// bundle and review are discarded). Without it such ids are refused.
    #[arg(long)]
    pub replace: bool,
    /// Apply the step's patches without a review (reviewDiffs: false).
    #[arg(long, conflicts_with = "auto_accept")]
    pub no_review: bool,
    /// Request a review and accept it at once (autoAcceptDiffs: true).
    #[arg(long)]
    pub auto_accept: bool,
    /// Give the step a terminal of its own (a pseudo-terminal inside the sandbox) shown on
    /// yours: REPLs, full-screen programs and interactive agents work. What reaches your
    /// terminal is filtered: clipboard, title, report and device control sequences are kept
    /// out (and counted). Native runtime.
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// Your stdin goes to the step even when it is a terminal; with -t your terminal is put
    /// in raw mode and every key goes to the step's terminal (Ctrl-C and Ctrl-Z included),
    /// but `~.` at the start of a line, which ends the step (`~~` types a `~`).
    #[arg(short = 'i', long = "interactive")]
    pub interactive: bool,
    /// Give the step a placeholder in $NAME instead of the value of your $NAME (or of FILE,
    /// with NAME=@FILE@HOST): the egress engine swaps the value in only in HTTPS requests to
    /// HOST (allowed on 443 by this), and swaps it out of what they answer. The step trusts
    /// this run's own certificate authority for those hosts. Repeatable. Native runtime.
    #[arg(long = "secret", value_name = "NAME@HOST[,HOST…]")]
    pub secret: Vec<String>,
    /// The command to run inside, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn invalid(message: String) -> anyhow::Error {
    coded_error(ErrorCode::InvalidInput, message, Value::Null)
}

pub(crate) fn controls(args: &RunArgs) -> anyhow::Result<Controls> {
    let mut c = Controls {
        allow_network: args.allow_network,
        pids_limit: args.pids,
        ..Controls::default()
    };
    if let Some(m) = &args.memory {
        c.memory_limit_bytes = Some(parse_size_flag("--memory", m)?);
    }
    if let Some(cpus) = &args.cpus {
        c.cpu_limit = Some(parse_cpu_limit(cpus).coded()?);
    }
    if let Some(d) = &args.disk {
        c.disk_limit_bytes = Some(parse_size_flag("--disk", d)?);
    }
    if let Some(o) = &args.max_output {
        c.max_output_bytes = parse_size_flag("--max-output", o)?;
    }
    if let Some(n) = args.max_output_lines {
        c.max_output_lines = n;
    }
    c.fail_on_output_cap = args.fail_on_output_cap;
    if let Some(t) = &args.timeout {
        c.timeout_ms = Some(
            parse_duration_ms(t)
                .ok_or_else(|| invalid(format!("invalid --timeout {t:?} (e.g. 30s, 10m, 1h)")))?,
        );
    }
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| invalid(format!("--env {kv:?} must be KEY=VALUE")))?;
        c.env.insert(k.to_string(), v.to_string());
    }
    for m in &args.mount {
        c.volumes.push(super::mounts::parse_mount(m)?);
    }
    let mut toolchain_path = Vec::new();
    for name in &args.toolchain {
        let t = super::mounts::toolchain(name)?;
        c.volumes.extend(t.mounts);
        for (k, v) in t.env {
            // The caller's own --env wins.
            c.env.entry(k).or_insert(v);
        }
        toolchain_path.extend(t.path);
    }
    if !toolchain_path.is_empty() && !c.env.contains_key("PATH") {
        let mut path: Vec<String> = toolchain_path
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        path.push(smithers_runtime_native::DEFAULT_PATH.to_string());
        c.env.insert("PATH".into(), path.join(":"));
    }
    c.allow_sensitive_mounts = args.allow_sensitive_mount;
    c.home = args.home.clone();
    if c.home.is_some() && args.runtime.is_remote() {
        return Err(invalid(format!(
            "--home is kept on this machine, which a remote host (--runtime {}) cannot use",
            args.runtime.kind()
        )));
    }
    if args.runtime.is_remote() && !c.volumes.is_empty() {
        return Err(invalid(format!(
            "--mount and --toolchain name paths of this machine, which a remote host (--runtime {}) cannot mount",
            args.runtime.kind()
        )));
    }
    // A secret's hosts are allowed on 443 by its binding.
    c.secrets = (args.secret.iter())
        .map(|s| parse_secret(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut allow_host = args.allow_host.clone();
    for s in &c.secrets {
        allow_host.extend(s.hosts.iter().map(|h| format!("{h}:443")));
    }
    if let Some(policy) = super::egress::policy_of_flags(
        args.egress_policy.as_deref(),
        &allow_host,
        &args.allow_cidr,
    )? {
        if args.allow_network {
            return Err(invalid(
                "--allow-network shares the host's whole network, so --allow-host and --egress-policy would mean nothing: choose one".to_string(),
            ));
        }
        c.egress_policy = Some(policy.to_json());
    }
    Ok(c)
}

/// `NAME@HOST[,HOST…]` (the value: `$NAME` of this process) or `NAME=@FILE@HOST[,HOST…]`.
fn parse_secret(spec: &str) -> anyhow::Result<smithers_runtime::SecretBinding> {
    let bad = || {
        invalid(format!(
            "--secret {}: the form is NAME@HOST[,HOST…] or NAME=@FILE@HOST[,HOST…]",
            crate::output::inert(spec)
        ))
    };
    let (left, hosts) = spec.rsplit_once('@').ok_or_else(bad)?;
    let hosts: Vec<String> = (hosts.split(','))
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .collect();
    let (name, file) = match left.split_once("=@") {
        Some((name, file)) if !file.is_empty() => (name, Some(std::path::PathBuf::from(file))),
        Some(_) => return Err(bad()),
        None => (left, None),
    };
    if name.is_empty() || hosts.is_empty() {
        return Err(bad());
    }
    Ok(smithers_runtime::SecretBinding {
        name: name.to_string(),
        hosts,
        file,
    })
}
