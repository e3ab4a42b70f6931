//! `smithers-sandbox run`: one step through the orchestrator's lifecycle (concurrency gate,
//! rows and events in the SQLite store, create → ship → execute → collect → validate →
//! review → cleanup), on the native runtime (`bubblewrap`) or docker.
//!
//! While it runs: a progress display on a terminal (stage, elapsed time, the latest output
//! line, with the output scrolling above), plain lines otherwise, nothing but the final
//! document under `--json`. The step's output is relayed as [`OUTPUT_HELP`] says: inert on a
//! terminal, as is to a pipe or file. Ctrl-C cancels the step (its whole process tree is killed; the
//! sandbox ends `cancelled` with its bundle kept); a second Ctrl-C exits at once.

use crate::output::{say, say_raw};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};
use smithers_orchestrator::{Heartbeat, SandboxOutcome, SandboxRequest, StepContext};
use smithers_runtime::{
    parse_cpu_limit, parse_memory_limit, CancellationToken, Controls, OutputEvent, OutputSink,
    OutputStream, RuntimeKind, StepCommand,
};
use smithers_runtime_native::{
    InitCommand, NativeOptions, NativeRuntime, WorkspaceMode, WORKSPACE_ENV,
};

use super::context::{self, StoreArgs};
use super::review::decision_hints;
use super::run_row;
use crate::output::{coded_error, color_allowed, inert, render_text, Coded, EXIT_REJECTED};

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

/// Which runtime runs the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeChoice {
    /// The native namespace sandbox (named after the original's bubblewrap backend).
    Bubblewrap,
    /// A container through the Docker Engine API (needs --image and a running engine).
    Docker,
    /// A remote sandbox host (`smithers-sandbox serve`) at $CODEPLANE_API_URL with the token
    /// $CODEPLANE_API_KEY; the project is uploaded, its changes come back as patches.
    Codeplane,
    /// A fleet on Ray: the step's lease (a Ray job holding a `sandbox_slot`) runs
    /// `smithers-sandbox serve` on the node Ray chose, at $RAY_ADDRESS (the Jobs API) with
    /// $RAY_AUTH_TOKEN; $SMITHERS_RAY_POOL picks a pool of nodes.
    Ray,
}

impl RuntimeChoice {
    /// A runtime that runs the step on another machine (paths of this one mean nothing there).
    fn is_remote(self) -> bool {
        matches!(self, RuntimeChoice::Codeplane | RuntimeChoice::Ray)
    }

    fn kind(self) -> RuntimeKind {
        match self {
            RuntimeChoice::Bubblewrap => RuntimeKind::Bubblewrap,
            RuntimeChoice::Docker => RuntimeKind::Docker,
            RuntimeChoice::Codeplane => RuntimeKind::Codeplane,
            RuntimeChoice::Ray => RuntimeKind::Ray,
        }
    }
}

/// How the native runtime presents the project at /workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkspaceChoice {
    /// overlayfs where this host can mount it in a user namespace, else a copy (recorded as
    /// degraded in the enforcement report and the bundle's log).
    Auto,
    /// overlayfs only (copy-on-write); refused where it cannot be mounted.
    Overlay,
    /// A copy of the project, made at ship and compared with the project at collect.
    Copy,
}

impl WorkspaceChoice {
    pub fn mode(self) -> WorkspaceMode {
        match self {
            WorkspaceChoice::Auto => WorkspaceMode::Auto,
            WorkspaceChoice::Overlay => WorkspaceMode::Overlay,
            WorkspaceChoice::Copy => WorkspaceMode::Copy,
        }
    }
}

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
    /// The command to run inside, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn invalid(message: String) -> anyhow::Error {
    coded_error(ErrorCode::InvalidInput, message, Value::Null)
}

/// Set once a write to our stdout failed (the reader went away: `run ... | head`).
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One line to our stdout (see [`bytes_to_stdout`]).
fn to_stdout(line: &str) {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    bytes_to_stdout(&bytes);
}

/// Bytes to our stdout, as they are. A reader that went away (EPIPE) does not end the run:
/// the step goes on to its bundle and review (which a killed CLI would lose), later output is
/// dropped, and the end of the run says so on stderr.
fn bytes_to_stdout(bytes: &[u8]) {
    use std::sync::atomic::Ordering;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if out.write_all(bytes).and_then(|()| out.flush()).is_err() {
        STDOUT_GONE.store(true, Ordering::Relaxed);
    }
}

/// Bytes to our stderr, as they are.
fn bytes_to_stderr(bytes: &[u8]) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes).and_then(|()| err.flush());
}

/// Says, on stderr, that our stdout's reader went away before the end (see
/// [`bytes_to_stdout`]).
fn note_stdout_gone() {
    if STDOUT_GONE.load(std::sync::atomic::Ordering::Relaxed) {
        say!(
            "note: stdout was closed by its reader; what the bundle's log kept of the step's output is in it (logs/stream.ndjson)"
        );
    }
}

/// Ids are never reused: a sandbox of that run and id in the database, or its directory in
/// the project (a bundle and review a new run would overwrite), is refused, naming both.
fn refuse_reused_ids(
    ctx: &context::Ctx,
    root: &std::path::Path,
    run_id: &str,
    sandbox_id: &str,
    replace: bool,
) -> anyhow::Result<()> {
    // Checked before they become a path (the request checks them again).
    let dir = root.join(context::sandbox_rel_dir(run_id, sandbox_id)?);
    let row = ctx.store().get_sandbox(run_id, sandbox_id).coded()?;
    let on_disk = std::fs::symlink_metadata(&dir).is_ok();
    if row.is_none() && !on_disk {
        return Ok(());
    }
    // `--replace`: asked for, so not silent; only over a sandbox that has ended (one in
    // review is decided first: accept or reject).
    let settled = row.as_ref().is_none_or(|r| r.status.is_terminal());
    if replace && settled {
        return Ok(());
    }
    let what = match &row {
        Some(r) => format!(
            "exists in {} (status {})",
            ctx.db_path.display(),
            r.status.as_str()
        ),
        None => format!("has a directory at {}", dir.display()),
    };
    Err(coded_error(
        ErrorCode::InvalidInput,
        inert(&format!(
            "sandbox {sandbox_id} of run {run_id} {what}: ids are never reused (its bundle and review would be overwritten); choose other ids, leave --run-id/--sandbox-id out, or, once it has ended (a review decided), pass --replace to discard it"
        )),
        json!({ "runId": run_id, "sandboxId": sandbox_id }),
    ))
}

/// A size flag's value in bytes: a number with a unit (`512m`, `2g`, `1.5g`, `100k`, `4096b`),
/// at least one byte. A bare number is refused rather than read as bytes (`--memory 512`
/// would be a 512-byte limit, which nobody means), and every error names the flag.
pub fn parse_size_flag(flag: &str, text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let has_unit = t.chars().last().is_some_and(|c| c.is_ascii_alphabetic());
    if !has_unit {
        let hint = if t.chars().all(|c| c.is_ascii_digit()) && !t.is_empty() && t != "0" {
            format!(" (did you mean {t}m? or {t}b for bytes)")
        } else {
            String::new()
        };
        return Err(invalid(format!(
            "{flag} {text:?} needs a unit: b, k, m, g or t, e.g. 512m, 2g{hint}"
        )));
    }
    parse_memory_limit(t).map_err(|_| {
        invalid(format!(
            "{flag} {text:?} is not a size of at least one byte (e.g. 512m, 2g, 100k)"
        ))
    })
}

/// Parses `30s`, `10m`, `1h`, `500ms` or a bare number of seconds into milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let factor = match unit.trim() {
        "ms" => 1.0,
        "" | "s" => 1000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return None,
    };
    let ms = value * factor;
    (ms.is_finite() && ms >= 1.0 && ms < u64::MAX as f64).then_some(ms as u64)
}

fn controls(args: &RunArgs) -> anyhow::Result<Controls> {
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
    if args.runtime.is_remote() && !c.volumes.is_empty() {
        return Err(invalid(format!(
            "--mount and --toolchain name paths of this machine, which a remote host (--runtime {}) cannot mount",
            args.runtime.kind()
        )));
    }
    if let Some(policy) = super::egress::policy_of_flags(
        args.egress_policy.as_deref(),
        &args.allow_host,
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

/// The runtime the CLI uses: this very executable with the hidden init subcommand, so the
/// init is always of the same build as the runtime that sends it a plan (a
/// `smithers-sandbox-init` left next to us by an older build would not understand it), unless
/// `$SMITHERS_SANDBOX_INIT` names another. The init's start costs little either way: each
/// sandbox's init is forked from the runtime's zygote. `warm`: sandboxes kept prepared ahead
/// (`serve --warm`; 0, for `run`'s one step, keeps none).
pub fn native_runtime_warm(warm: usize) -> anyhow::Result<NativeRuntime> {
    native_runtime_options(workspace_from_env()?, warm)
}

/// The workspace mode `$SMITHERS_SANDBOX_WORKSPACE` names (`auto` when unset).
pub fn workspace_from_env() -> anyhow::Result<WorkspaceMode> {
    match std::env::var(WORKSPACE_ENV) {
        Err(_) => Ok(WorkspaceMode::Auto),
        Ok(v) => WorkspaceMode::parse(v.trim()).ok_or_else(|| {
            invalid(format!(
                "${WORKSPACE_ENV} must be auto, overlay or copy, not {v:?}"
            ))
        }),
    }
}

/// The runtime of a project the resident service keeps open: `warm` sandboxes prepared, and
/// refilled once each step is over (the service says so after answering its client), so
/// that preparing the next never takes CPU from the step a user is waiting for.
pub fn native_runtime_resident(
    workspace: WorkspaceMode,
    warm: usize,
) -> anyhow::Result<NativeRuntime> {
    native_runtime_built(workspace, warm, true)
}

/// [`native_runtime`] with an explicit workspace mode.
pub fn native_runtime_with(workspace: WorkspaceMode) -> anyhow::Result<NativeRuntime> {
    native_runtime_options(workspace, 0)
}

fn native_runtime_options(workspace: WorkspaceMode, warm: usize) -> anyhow::Result<NativeRuntime> {
    native_runtime_built(workspace, warm, false)
}

fn native_runtime_built(
    workspace: WorkspaceMode,
    warm: usize,
    warm_refill_after_step: bool,
) -> anyhow::Result<NativeRuntime> {
    let init = if std::env::var_os(smithers_runtime_native::INIT_ENV).is_some() {
        InitCommand::locate().map_err(|e| anyhow::anyhow!(e))?
    } else {
        InitCommand::current_exe_subcommand().context("locating the current executable")?
    };
    Ok(NativeRuntime::new(NativeOptions {
        init: Some(init),
        workspace,
        default_memory_limit: default_memory_from_env()?,
        disk_reserve_bytes: disk_reserve_from_env()?,
        warm,
        warm_refill_after_step,
        ..NativeOptions::default()
    }))
}

/// Environment variable by which a host's operator sets the free space a step without
/// `--disk` must leave on the disk of its workspace layer (`2g`; `0` turns the guard off):
/// 1 GiB by default.
pub const DISK_RESERVE_ENV: &str = "SMITHERS_SANDBOX_DISK_RESERVE";

fn disk_reserve_from_env() -> anyhow::Result<u64> {
    match std::env::var(DISK_RESERVE_ENV) {
        Err(_) => Ok(smithers_runtime_native::DEFAULT_DISK_RESERVE_BYTES),
        Ok(v) if v.trim() == "0" => Ok(0),
        Ok(v) => parse_memory_limit(v.trim())
            .map_err(|e| invalid(format!("${DISK_RESERVE_ENV} must be a size or 0: {e}"))),
    }
}

/// Environment variable by which a host's operator sets the memory limit of a step that
/// asks for none (`4g`, `512m`; `none` for no default): by default half the host's RAM, at
/// most 8 GiB.
pub const DEFAULT_MEMORY_ENV: &str = "SMITHERS_SANDBOX_DEFAULT_MEMORY";

fn default_memory_from_env() -> anyhow::Result<Option<u64>> {
    match std::env::var(DEFAULT_MEMORY_ENV) {
        Err(_) => Ok(smithers_runtime_native::default_memory_limit()),
        Ok(v) if v.trim() == "none" => Ok(None),
        Ok(v) => Ok(Some(parse_memory_limit(v.trim()).map_err(|e| {
            invalid(format!("${DEFAULT_MEMORY_ENV} must be a size or none: {e}"))
        })?)),
    }
}

/// A new id: a prefix, the time in ms (sortable), then bits of the sub-millisecond clock mixed
/// with the pid (so a run id and a sandbox id made together differ, and two processes starting
/// in the same millisecond do too).
pub fn new_id(prefix: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mix = (u64::from(now.subsec_nanos())
        ^ u64::from(std::process::id()).wrapping_mul(0x9e37_79b9))
    .wrapping_mul(0x2545_f491_4f6c_dd1d)
        >> 44;
    format!("{prefix}-{:x}-{mix:05x}", now.as_millis() as u64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing while running (the final JSON document only).
    Quiet,
    /// Stage changes as lines on stderr; the step's stdout/stderr to ours.
    Plain,
    /// A status line redrawn at the bottom of the terminal (stderr), output scrolling above.
    Tty,
}

#[derive(Debug, Default)]
struct DisplayState {
    stage: String,
    last_line: String,
    termination: Option<String>,
    exit_code: Option<i64>,
    /// The step's enforcement report, from the `child-finished` heartbeat.
    enforcement: Option<Value>,
    /// What the egress engine decided, from the same heartbeat (with a policy only).
    egress: Option<Value>,
    cancelling: bool,
    status_drawn: bool,
    done: bool,
    /// The step's output on its way to a terminal: the line not yet ended, per stream.
    partial: [Vec<u8>; 2],
    /// Bytes of each stream a remote host could not relay (gaps in what we wrote).
    lost: [u64; 2],
}

/// The live view of one step.
struct Display {
    mode: Mode,
    /// Where each relayed line goes and how it is written.
    relay: Relay,
    started: Instant,
    state: Mutex<DisplayState>,
}

/// How one relayed stream is written: raw or inert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineOut {
    /// Written as the step wrote it (a pipe or a file: the user wants the bytes).
    Raw,
    /// Made inert a line at a time (a terminal), escapes marked in reverse video when
    /// `marked`.
    Inert { marked: bool },
}

/// Which of our streams are terminals, decided once at start.
#[derive(Debug, Clone, Copy)]
struct Relay {
    stdout_tty: bool,
    stderr_tty: bool,
    marked: bool,
}

impl Relay {
    fn detect() -> Relay {
        Relay {
            stdout_tty: std::io::stdout().is_terminal(),
            stderr_tty: std::io::stderr().is_terminal(),
            marked: color_allowed(),
        }
    }

    fn for_tty(&self, tty: bool) -> LineOut {
        if tty {
            LineOut::Inert {
                marked: self.marked,
            }
        } else {
            LineOut::Raw
        }
    }
}

/// The text written to a terminal for one relayed line (without its newline): inert, with
/// bytes that are not UTF-8 as `\xNN`.
fn relayed(line: &[u8], marked: bool) -> String {
    smithers_terminal::escape_bytes(line, smithers_terminal::Inert::BODY.marked(marked))
}

/// Longest line held back for a terminal: a longer one is shown in pieces.
const MAX_HELD_LINE: usize = 64 * 1024;

/// The complete lines of `pending` after `bytes` are added (each without its newline), the
/// rest left in `pending`; at `end`, the rest too.
fn complete_lines(pending: &mut Vec<u8>, bytes: &[u8], end: bool) -> Vec<Vec<u8>> {
    pending.extend_from_slice(bytes);
    let mut lines = Vec::new();
    let mut start = 0;
    loop {
        let rest = &pending[start..];
        match rest.iter().position(|b| *b == b'\n') {
            Some(pos) if pos <= MAX_HELD_LINE => {
                lines.push(rest[..pos].to_vec());
                start += pos + 1;
            }
            _ if rest.len() > MAX_HELD_LINE => {
                lines.push(rest[..MAX_HELD_LINE].to_vec());
                start += MAX_HELD_LINE;
            }
            _ => break,
        }
    }
    pending.drain(..start);
    if end && !pending.is_empty() {
        lines.push(std::mem::take(pending));
    }
    lines
}

const SPINNER: &[char] = &['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

impl Display {
    fn new(mode: Mode, relay: Relay) -> Self {
        Display {
            mode,
            relay,
            started: Instant::now(),
            state: Mutex::new(DisplayState {
                stage: "initializing".into(),
                ..DisplayState::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DisplayState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn width() -> usize {
        std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
            .filter(|w| *w >= 20)
            .unwrap_or(80)
    }

    /// Redraws the status line (TTY mode; the caller holds the lock).
    fn draw(&self, st: &mut DisplayState, err: &mut impl Write) {
        if st.done {
            return;
        }
        let tick = (self.started.elapsed().as_millis() / 100) as usize % SPINNER.len();
        let stage = if st.cancelling {
            "cancelling (Ctrl-C again to exit now)".to_string()
        } else {
            inert(&st.stage)
        };
        let mut line = format!(
            "{} {stage} · {:.1}s",
            SPINNER[tick],
            self.started.elapsed().as_secs_f64()
        );
        if !st.last_line.is_empty() {
            line.push_str(" · ");
            line.push_str(&st.last_line);
        }
        let line: String = line.chars().take(Self::width() - 1).collect();
        let _ = write!(err, "\r\x1b[2K\x1b[2m{line}\x1b[m");
        let _ = err.flush();
        st.status_drawn = true;
    }

    fn clear(st: &mut DisplayState, err: &mut impl Write) {
        if st.status_drawn {
            let _ = write!(err, "\r\x1b[2K");
            st.status_drawn = false;
        }
    }

    fn heartbeat(&self, hb: &Heartbeat) {
        let mut st = self.lock();
        if hb.stage == "child-finished" {
            st.termination = hb
                .data
                .get("termination")
                .and_then(Value::as_str)
                .map(str::to_string);
            st.exit_code = hb.data.get("exitCode").and_then(Value::as_i64);
            st.enforcement = hb.data.get("enforcement").cloned();
            st.egress = hb.data.get("egress").filter(|v| !v.is_null()).cloned();
        }
        if st.stage == hb.stage {
            return;
        }
        st.stage = hb.stage.to_string();
        match self.mode {
            Mode::Quiet => {}
            Mode::Plain => say!("[{:>7.2}s] {}", self.elapsed(), inert(hb.stage)),
            Mode::Tty => {
                let mut err = std::io::stderr().lock();
                self.draw(&mut st, &mut err);
            }
        }
    }

    /// Relays bytes of the step's output (see [`OUTPUT_HELP`]).
    fn output(&self, stream: OutputStream, bytes: &[u8]) {
        let mut st = self.lock();
        let is_err = stream == OutputStream::Stderr;
        let tty = if is_err {
            self.relay.stderr_tty
        } else {
            self.relay.stdout_tty
        };
        match (self.mode, self.relay.for_tty(tty)) {
            (Mode::Quiet, _) => {}
            (_, LineOut::Raw) if is_err => bytes_to_stderr(bytes),
            (Mode::Plain, LineOut::Raw) => bytes_to_stdout(bytes),
            (Mode::Tty, LineOut::Raw) => {
                // Our stdout is redirected: it gets the step's stdout as written.
                bytes_to_stdout(bytes);
                if let Some(last) = last_line(bytes) {
                    st.last_line = last;
                }
                let mut err = std::io::stderr().lock();
                self.draw(&mut st, &mut err);
            }
            (mode, LineOut::Inert { marked }) => {
                let lines = complete_lines(&mut st.partial[stream as usize], bytes, false);
                self.show_lines(&mut st, mode, is_err, &lines, marked);
            }
        }
    }

    /// Shows complete lines of a stream on a terminal, inert: the step's stderr (and, with
    /// the progress line, its stdout too) on our stderr, above the progress line.
    fn show_lines(
        &self,
        st: &mut DisplayState,
        mode: Mode,
        is_err: bool,
        lines: &[Vec<u8>],
        marked: bool,
    ) {
        if lines.is_empty() {
            return;
        }
        let mut text = String::new();
        for line in lines {
            text.push_str(&relayed(line, marked));
            text.push('\n');
        }
        if mode == Mode::Plain {
            if is_err {
                bytes_to_stderr(text.as_bytes());
            } else {
                bytes_to_stdout(text.as_bytes());
            }
            return;
        }
        // The status line shows the last one too: one line, nothing kept, no marks (it is dim).
        if let Some(last) = lines.iter().rev().find_map(|l| last_line(l)) {
            st.last_line = last;
        }
        let mut err = std::io::stderr().lock();
        Self::clear(st, &mut err);
        let _ = err.write_all(text.as_bytes());
        self.draw(st, &mut err);
    }

    /// A remote host could not relay `bytes` of `stream`: said at the end.
    fn lost(&self, stream: OutputStream, bytes: u64) {
        self.lock().lost[stream as usize] += bytes;
    }

    fn tick(&self) {
        if self.mode == Mode::Tty {
            let mut st = self.lock();
            let mut err = std::io::stderr().lock();
            self.draw(&mut st, &mut err);
        }
    }

    fn cancelling(&self) {
        let mut st = self.lock();
        st.cancelling = true;
        match self.mode {
            Mode::Quiet => {}
            Mode::Plain => say!(
                "[{:>7.2}s] cancelling (Ctrl-C again to exit now)",
                self.elapsed()
            ),
            Mode::Tty => {
                let mut err = std::io::stderr().lock();
                self.draw(&mut st, &mut err);
            }
        }
    }

    fn finish(&self) {
        let mut st = self.lock();
        // The last line of a stream shown on a terminal, if the step did not end it.
        for (stream, is_err) in [(OutputStream::Stdout, false), (OutputStream::Stderr, true)] {
            let lines = complete_lines(&mut st.partial[stream as usize], &[], true);
            let tty = if is_err {
                self.relay.stderr_tty
            } else {
                self.relay.stdout_tty
            };
            if let (false, LineOut::Inert { marked }) =
                (self.mode == Mode::Quiet, self.relay.for_tty(tty))
            {
                self.show_lines(&mut st, self.mode, is_err, &lines, marked);
            }
        }
        let mut err = std::io::stderr().lock();
        Self::clear(&mut st, &mut err);
        st.done = true;
        let _ = err.flush();
        drop(err);
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let lost = st.lost[stream as usize];
            if lost > 0 {
                say!(
                    "note: {lost} bytes of the step's {} did not reach us (the host no longer held them); what its log kept is in the bundle",
                    stream.as_str()
                );
            }
        }
    }
}

/// The last non-empty line of `bytes`, inert and trimmed, for the progress line.
fn last_line(bytes: &[u8]) -> Option<String> {
    let line = bytes
        .split(|b| *b == b'\n')
        .rev()
        .find(|l| l.iter().any(|b| !b.is_ascii_whitespace()))?;
    let text = String::from_utf8_lossy(&line[..line.len().min(512)]);
    Some(inert(text.trim()))
}

struct Sink(Arc<Display>);

impl OutputSink for Sink {
    fn event(&self, event: OutputEvent) {
        match event {
            // Every byte the step wrote: relayed.
            OutputEvent::Output { stream, bytes, .. } => self.0.output(stream, &bytes),
            OutputEvent::OutputLost { stream, bytes, .. } => self.0.lost(stream, bytes),
            // The lines the log keeps: the bytes above are what we relay.
            OutputEvent::Stdout { .. } | OutputEvent::Stderr { .. } => {}
            // Summarised after the step; each is in the bundle's log.
            OutputEvent::Heartbeat { .. } | OutputEvent::Egress { .. } => {}
        }
    }
}

/// Our stdin for the step when it is a pipe or a file (`echo x | run -- wc`, `run -- sh <
/// script`): streamed into the command's stdin by the native runtime as it reads. A terminal
/// or `/dev/null` is not passed (the step reads EOF): a step has no terminal, and reading the
/// user's keystrokes into it unasked would surprise. Docker and codeplane carry no stream, so
/// there a piped stdin is left out and said so.
fn step_stdin(runtime: RuntimeChoice, json_out: bool) -> smithers_runtime::StepStdin {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    let piped = std::fs::metadata("/proc/self/fd/0").is_ok_and(|m| {
        let t = m.file_type();
        t.is_fifo() || t.is_file() || t.is_socket()
    });
    if !piped {
        return smithers_runtime::StepStdin::default();
    }
    if runtime != RuntimeChoice::Bubblewrap {
        if !json_out {
            say!(
                "note: stdin is not passed to the step: the {} runtime carries no stdin stream (the step reads EOF)",
                runtime.kind()
            );
        }
        return smithers_runtime::StepStdin::default();
    }
    // Read through a descriptor of its own, not std's buffered stdin: what the step leaves
    // unread must not stay in a buffer of this process (the resident service serves the next
    // client from it).
    match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => smithers_runtime::StepStdin::from_reader(std::fs::File::from(fd)),
        Err(_) => smithers_runtime::StepStdin::from_reader(std::io::stdin()),
    }
}

/// How `run` learns of the user's Ctrl-C.
pub enum Interrupts {
    /// Its own SIGINT: the first cancels the step, the second exits at once.
    Signals,
    /// The resident service's client: it relays the first, and exits at the second itself
    /// (the service goes on with the cleanup).
    Client(smithers_resident::server::Interrupts),
}

/// Runs `run` in this process.
pub fn run(args: &RunArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    run_with(args, json_out, Interrupts::Signals, None).map(ExitCode::from)
}

/// Runs `run` for a client of the resident service (whose stdio and working directory are
/// this process's for the time), in a project the service keeps open.
pub fn run_served(
    args: &RunArgs,
    json_out: bool,
    interrupts: smithers_resident::server::Interrupts,
    cache: &mut context::ContextCache,
) -> anyhow::Result<u8> {
    run_with(args, json_out, Interrupts::Client(interrupts), Some(cache))
}

fn run_with(
    args: &RunArgs,
    json_out: bool,
    interrupts: Interrupts,
    cache: Option<&mut context::ContextCache>,
) -> anyhow::Result<u8> {
    let controls = controls(args)?;
    // Said before anything is created: where the host or the cluster is, or what to set.
    match args.runtime {
        RuntimeChoice::Codeplane => {
            smithers_runtime_remote::RemoteOptions::from_env().coded()?;
        }
        RuntimeChoice::Ray => {
            smithers_runtime_ray::RayOptions::from_env().coded()?;
        }
        RuntimeChoice::Bubblewrap | RuntimeChoice::Docker => {}
    }
    let root = args.store.root_dir()?;
    // The controls are checked before anything is created (a refused mount makes no row,
    // no sandbox); the runtime checks them again at create.
    smithers_runtime::SandboxConfig {
        run_id: "check".into(),
        sandbox_id: "check".into(),
        runtime: args.runtime.kind(),
        root_dir: root.clone(),
        image: None,
        controls: controls.clone(),
    }
    .validate()
    .coded()?;
    let input: Value = match &args.input {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| invalid(format!("--input is not valid JSON: {e}")))?,
        None => json!({}),
    };
    if args.runtime == RuntimeChoice::Docker && args.image.is_none() {
        return Err(invalid(
            "--runtime docker needs --image IMG (a local image)".to_string(),
        ));
    }
    // A native step's sandbox is made on the other core while the store opens and the
    // step is recorded (a step a warm sandbox cannot serve starts cold at create, as before).
    // (The resident service's projects have a warm pool instead.)
    let prestart = (args.runtime == RuntimeChoice::Bubblewrap).then_some(&controls);
    // A process may run more than one `run` (the resident service): a reader that went
    // away was the last client's.
    STDOUT_GONE.store(false, std::sync::atomic::Ordering::SeqCst);
    let served = cache.is_some();
    let ctx = match cache {
        None => context::CtxHandle::Own(context::open_with(
            &args.store,
            json_out,
            args.workspace.mode(),
            prestart,
        )?),
        Some(cache) => cache.get(&args.store, json_out, args.workspace.mode())?,
    };
    let run_id = args.run_id.clone().unwrap_or_else(|| new_id("run"));
    let sandbox_id = args.sandbox_id.clone().unwrap_or_else(|| new_id("sbx"));
    refuse_reused_ids(&ctx, &root, &run_id, &sandbox_id, args.replace)?;
    let mut req = SandboxRequest::new(&run_id, &sandbox_id, &root);
    req.runtime = Some(args.runtime.kind());
    // Run from a subdirectory of the project, the step starts in the same place in
    // /workspace (a path that is not UTF-8 cannot be said to the runtime: the top then).
    let cwd = args
        .store
        .subdir_of_cwd(&root)
        .and_then(|rel| rel.to_str().map(|rel| format!("/workspace/{rel}")));
    req.command = Some(StepCommand {
        argv: args.command.clone(),
        cwd,
        stdin: step_stdin(args.runtime, json_out),
    });
    req.input = input;
    req.image = args.image.clone();
    req.controls = controls;
    req.review_diffs = !args.no_review;
    req.auto_accept_diffs = args.auto_accept;

    let mode = if json_out {
        Mode::Quiet
    } else if std::io::stderr().is_terminal() {
        Mode::Tty
    } else {
        Mode::Plain
    };
    let display = Arc::new(Display::new(mode, Relay::detect()));
    if mode != Mode::Quiet {
        say!(
            "sandbox {}:{} ({}) over {}",
            inert(&run_id),
            inert(&sandbox_id),
            args.runtime.kind(),
            inert(&root.display().to_string())
        );
    }
    let cancel = CancellationToken::new();
    let hb_display = display.clone();
    let step_ctx = StepContext {
        heartbeat: Some(Arc::new(move |hb: &Heartbeat| hb_display.heartbeat(hb))),
        cancel: cancel.clone(),
        output: Some(Arc::new(Sink(display.clone()))),
    };

    // A row of Smithers' own run table, so its tools list this run (`smithers ps`).
    run_row::begin(
        &ctx,
        &run_id,
        &sandbox_id,
        &root,
        args.runtime.kind().as_str(),
    );
    let orchestrator = ctx.orchestrator.clone();
    let result = ctx.rt().block_on(async {
        let on_ctrl_c = cancel.clone();
        let ctrl_display = display.clone();
        let ctrl_c = match interrupts {
            Interrupts::Signals => Some(tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    on_ctrl_c.cancel();
                    ctrl_display.cancelling();
                    if tokio::signal::ctrl_c().await.is_ok() {
                        ctrl_display.finish();
                        say!("interrupted again: exiting without waiting for cleanup");
                        std::process::exit(130);
                    }
                }
            })),
            Interrupts::Client(from_client) => {
                from_client.on_interrupt(move || {
                    if !on_ctrl_c.is_cancelled() {
                        on_ctrl_c.cancel();
                        ctrl_display.cancelling();
                    }
                });
                None
            }
        };
        let tick_display = display.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                tick_display.tick();
            }
        });
        // Served, the step's answer does not wait for its sandbox's cleanup: the service
        // starts it once it has answered, and awaits it before its next step on this project.
        let r = if served {
            let (r, finishing) = orchestrator.execute_then_finish(&req, &step_ctx).await;
            ctx.finishing(finishing);
            r
        } else {
            orchestrator.execute(&req, &step_ctx).await
        };
        ticker.abort();
        if let Some(ctrl_c) = ctrl_c {
            ctrl_c.abort();
        }
        r
    });
    display.finish();
    note_stdout_gone();
    run_row::settle(&ctx, &run_id, &result);
    // The step's rows are committed but, with `synchronous = NORMAL`, not yet synced: make
    // them durable before reporting (the store's drop does it too, but cannot say it failed).
    if let Err(e) = ctx.store().sync_wal() {
        say!(
            "warning: the store's last changes may not survive a power loss: {}",
            inert(&e.to_string())
        );
    }
    let (termination, exit_code, enforcement, egress) = {
        let st = display.lock();
        (
            st.termination.clone(),
            st.exit_code,
            st.enforcement.clone(),
            st.egress.clone(),
        )
    };
    let hints = decision_hints(&sandbox_id, &args.store.hint_flags(&root));
    let base = json!({
        "runId": run_id,
        "sandboxId": sandbox_id,
        "runtime": args.runtime.kind().as_str(),
        "rootDir": root,
        "db": ctx.db_path,
        "termination": termination,
        "exitCode": exit_code,
        "recovered": context::recovered_json(ctx.recovered()),
        "enforcement": enforcement,
    });
    let mut doc = base;
    if let Some(e) = &egress {
        doc["egress"] = e.clone();
    }
    let code = match result {
        Err(err) => {
            let report = err.report();
            let bundle_path = ctx
                .store()
                .get_sandbox(&run_id, &sandbox_id)
                .ok()
                .flatten()
                .and_then(|r| r.bundle_path);
            if json_out {
                doc["status"] = json!("failed");
                doc["bundlePath"] = json!(bundle_path);
                doc["outputs"] = Value::Null;
                doc["patches"] = json!([]);
                doc["review"] = Value::Null;
                doc["error"] = report.to_json();
                to_stdout(&doc.to_string());
            } else {
                say!("{}", render_text(&report));
                say!("status   failed");
                if let Some(b) = bundle_path {
                    say!("bundle   {}", inert(&b));
                }
            }
            return Ok(EXIT_REJECTED);
        }
        Ok(SandboxOutcome::Cancelled { bundle_path }) => {
            if json_out {
                doc["status"] = json!("cancelled");
                doc["bundlePath"] = json!(bundle_path);
                doc["outputs"] = Value::Null;
                doc["patches"] = json!([]);
                doc["review"] = Value::Null;
                to_stdout(&doc.to_string());
            } else {
                say!("status   cancelled (nothing was applied)");
                if let Some(b) = bundle_path {
                    say!("bundle   {}", inert(&b.display().to_string()));
                }
            }
            130
        }
        Ok(SandboxOutcome::Completed(done)) => {
            // Read again only when there are patches to show (the lifecycle inspected the
            // bundle: its notes are in the outcome).
            let (patches, notes) = if done.patch_files.is_empty() {
                (Vec::new(), done.change_notes.clone())
            } else {
                context::bundle_contents(&done.bundle_path).unwrap_or_default()
            };
            let changes = context::changes(&patches);
            let review_state = if args.auto_accept && done.applied_patches > 0 {
                json!("applied")
            } else {
                Value::Null
            };
            let log_notes = context::log_notes(&done.bundle_path);
            if json_out {
                doc["status"] = json!(done.status);
                doc["bundlePath"] = json!(done.bundle_path);
                doc["logNotes"] = json!(log_notes);
                doc["outputs"] = done.outputs.clone().unwrap_or(Value::Null);
                doc["patches"] = json!(changes
                    .iter()
                    .map(context::FileChange::to_json)
                    .collect::<Vec<_>>());
                doc["appliedPatches"] = json!(done.applied_patches);
                doc["review"] = review_state;
                doc["changeNotes"] = context::change_notes_json(&notes);
                to_stdout(&doc.to_string());
            } else {
                print_summary(
                    &done.status,
                    termination.as_deref(),
                    exit_code,
                    done.outputs.as_ref(),
                    &done.bundle_path,
                    &changes,
                    StepNotes {
                        enforcement: enforcement.as_ref(),
                        egress: egress.as_ref(),
                        log: &log_notes,
                        commits: notes.commits.as_ref(),
                    },
                );
                if done.applied_patches > 0 {
                    say!(
                        "applied  {} patch file(s) to {}",
                        done.applied_patches,
                        inert(&root.display().to_string())
                    );
                }
            }
            status_exit(&done.status, termination.as_deref(), exit_code)
        }
        Ok(SandboxOutcome::AwaitingReview(pending)) => {
            let (patches, notes) =
                context::bundle_contents(&pending.bundle_path).unwrap_or_default();
            let changes = context::changes(&patches);
            let log_notes = context::log_notes(&pending.bundle_path);
            if json_out {
                doc["logNotes"] = json!(log_notes);
                doc["status"] = json!("review");
                doc["stepStatus"] = json!(pending.status);
                doc["bundlePath"] = json!(pending.bundle_path);
                doc["changeNotes"] = context::change_notes_json(&notes);
                doc["outputs"] = pending.outputs.clone().unwrap_or(Value::Null);
                doc["patches"] = json!(changes
                    .iter()
                    .map(context::FileChange::to_json)
                    .collect::<Vec<_>>());
                doc["review"] = json!({
                    "state": "pending",
                    "patchCount": pending.patch_count,
                    "totalDiffLines": pending.total_diff_lines,
                    "commands": hints,
                });
                to_stdout(&doc.to_string());
            } else {
                print_summary(
                    &pending.status,
                    termination.as_deref(),
                    exit_code,
                    pending.outputs.as_ref(),
                    &pending.bundle_path,
                    &changes,
                    StepNotes {
                        enforcement: enforcement.as_ref(),
                        egress: egress.as_ref(),
                        log: &log_notes,
                        commits: notes.commits.as_ref(),
                    },
                );
                say!(
                    "review   pending: {} patch file(s), {} changed line(s), NOT applied yet",
                    pending.patch_count,
                    pending.total_diff_lines
                );
                // The review's warnings, so that nobody accepts from this summary unwarned.
                let mut findings = smithers_patch::review_findings(
                    &patches,
                    &smithers_patch::host_hooks_dirs(&root),
                );
                context::add_change_notes(&mut findings, &notes);
                say_raw!("{}", smithers_patch::render_findings(&findings, false));
                for h in &hints {
                    say!("  {}", inert(h));
                }
            }
            status_exit(&pending.status, termination.as_deref(), exit_code)
        }
    };
    Ok(code)
}

/// What the summary says about how the step ran, besides its result.
struct StepNotes<'a> {
    /// The enforcement report (its rows that did not hold are printed).
    enforcement: Option<&'a Value>,
    /// The egress engine's summary.
    egress: Option<&'a Value>,
    /// The log's notes on the result and the output ([`context::log_notes`]).
    log: &'a [Value],
    /// The step's commits, from the bundle's `changeNotes` (already read by the caller).
    commits: Option<&'a smithers_bundle::CommitSeries>,
}

fn print_summary(
    status: &str,
    termination: Option<&str>,
    exit_code: Option<i64>,
    outputs: Option<&Value>,
    bundle_path: &std::path::Path,
    changes: &[context::FileChange],
    notes: StepNotes<'_>,
) {
    let StepNotes {
        enforcement,
        egress,
        log,
        commits,
    } = notes;
    let how = match (termination, exit_code) {
        (Some("exited"), Some(c)) => format!(" (exit {c})"),
        (Some(t), _) => format!(" ({})", inert(t)),
        _ => String::new(),
    };
    say!("status   {}{how}", inert(status));
    for line in not_held(enforcement) {
        say!("not held {line}");
    }
    for line in super::egress_summary::egress_lines(egress) {
        say!("{line}");
    }
    for line in log_lines(log) {
        say!("{line}");
    }
    match outputs {
        // The step's outputs as JSON, which leaves C1 and bidi characters raw: inert.
        Some(o) => say!("outputs  {}", inert(&o.to_string())),
        None => say!("outputs  -"),
    }
    say!("bundle   {}", inert(&bundle_path.display().to_string()));
    if let Some(series) = commits {
        say!(
            "commits  {} on {} (accept adds them on top of {})",
            series.commits.len(),
            inert(series.branch.as_deref().unwrap_or("a detached HEAD")),
            &series.base[..12.min(series.base.len())]
        );
        for c in &series.commits {
            say!("  {} {}", &c.oid[..12.min(c.oid.len())], inert(&c.subject));
        }
    }
    if changes.is_empty() {
        say!("patches  none");
    } else if changes.len() <= LIST_FILES_UP_TO {
        say!("patches");
        for line in context::stat_lines(changes) {
            say!("  {line}");
        }
    } else {
        say!(
            "patches  {} files, by directory (each file: `review`, `run --json`)",
            changes.len()
        );
        for line in directory_summary(changes) {
            say!("  {line}");
        }
    }
}

/// Up to this many changed files, `run`'s summary lists each; past it, directories.
const LIST_FILES_UP_TO: usize = 50;

/// Directories shown in a summary by directory; the rest are one line.
const SUMMARY_DIRECTORIES: usize = 15;

/// Directory names that hold what tools make rather than what people write: a change there
/// is usually meant to be ignored.
const GENERATED_DIRS: &[&str] = &[
    "node_modules",
    "target",
    "dist",
    "build",
    ".venv",
    "venv",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".tox",
    ".next",
    ".nuxt",
    ".cache",
    ".gradle",
    ".terraform",
    "coverage",
    "vendor",
];

/// The directory a changed file is counted under in a summary: its path up to the first
/// generated directory (`packages/a/node_modules/`), else its top directory (`src/`); a file
/// at the top is its own entry.
fn summary_group(path: &str) -> &str {
    let mut end = 0;
    for (i, part) in path.match_indices('/') {
        let dir = &path[end..i];
        if GENERATED_DIRS.contains(&dir) {
            return &path[..=i];
        }
        end = i + part.len();
    }
    match path.find('/') {
        Some(i) => &path[..=i],
        None => path,
    }
}

/// `run`'s summary of many changed files: per directory (the largest first) its files, new
/// and deleted ones, and lines added and removed; the total; and, for a directory of what a
/// tool makes, the ignore rule that would have left it out of the change.
fn directory_summary(changes: &[context::FileChange]) -> Vec<String> {
    #[derive(Default)]
    struct Group {
        files: usize,
        new: usize,
        deleted: usize,
        added: usize,
        removed: usize,
    }
    let mut groups: std::collections::HashMap<&str, Group> = Default::default();
    for c in changes {
        let g = groups.entry(summary_group(&c.path)).or_default();
        g.files += 1;
        g.new += usize::from(c.operation == "add");
        g.deleted += usize::from(c.operation == "delete");
        g.added += c.added;
        g.removed += c.removed;
    }
    let mut groups: Vec<(&str, Group)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.files.cmp(&a.1.files).then(a.0.cmp(b.0)));
    let names: Vec<String> = groups
        .iter()
        .take(SUMMARY_DIRECTORIES)
        .map(|(dir, _)| smithers_terminal::quote_path(dir))
        .collect();
    let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let mut lines = Vec::new();
    for ((_, g), name) in groups.iter().zip(&names) {
        let mut what = Vec::new();
        if g.new > 0 {
            what.push(format!("{} new", g.new));
        }
        if g.deleted > 0 {
            what.push(format!("{} deleted", g.deleted));
        }
        let what = if what.is_empty() {
            String::new()
        } else {
            format!(" ({})", what.join(", "))
        };
        lines.push(format!(
            "{name}{} {:>6} file{}{what}, +{} -{}",
            " ".repeat(width - name.chars().count()),
            g.files,
            if g.files == 1 { "" } else { "s" },
            g.added,
            g.removed
        ));
    }
    if groups.len() > SUMMARY_DIRECTORIES {
        let rest = &groups[SUMMARY_DIRECTORIES..];
        lines.push(format!(
            "... and {} more ({} files)",
            rest.len(),
            rest.iter().map(|(_, g)| g.files).sum::<usize>()
        ));
    }
    let (added, removed) = changes
        .iter()
        .fold((0, 0), |(a, r), c| (a + c.added, r + c.removed));
    lines.push(format!(
        "{} files changed, {added} insertion{}(+), {removed} deletion{}(-)",
        changes.len(),
        if added == 1 { "" } else { "s" },
        if removed == 1 { "" } else { "s" },
    ));
    // One hint per rule: `node_modules/` leaves out every directory of that name.
    let mut rules: Vec<&str> = Vec::new();
    for (dir, g) in &groups {
        let last = dir.strip_suffix('/').and_then(|d| d.rsplit('/').next());
        if let Some(last) = last.filter(|l| GENERATED_DIRS.contains(l) && g.new > 0) {
            if !rules.contains(&last) {
                rules.push(last);
                lines.push(format!(
                    "hint: {} holds what a tool made ({} new files): add {last}/ to .gitignore and such files stay out of the patches (listed as ignored)",
                    smithers_terminal::quote_path(dir),
                    g.new
                ));
            }
        }
    }
    lines
}

/// The log's notes for the step's summary: a refused result file, with why, and each stream
/// cut off at a cap, with the flag that raises it.
fn log_lines(log: &[Value]) -> Vec<String> {
    log.iter()
        .filter_map(|r| match r["type"].as_str()? {
            "resultRejected" => Some(format!(
                "result   not used: {} (outputs are null)",
                r["reason"].as_str().unwrap_or("?")
            )),
            "outputTruncated" => {
                let hint = match r["cap"].as_str() {
                    Some("bytes") => "raise it with --max-output",
                    Some("lines") => "raise it with --max-output-lines",
                    // A log of an older version.
                    _ => "the line cap of 100000 per stream was fixed",
                };
                let counts = match (r["notKeptBytes"].as_u64(), r["notKeptLines"].as_u64()) {
                    (Some(b), Some(l)) => format!(
                        "; {b} bytes ({l} lines) not kept in the bundle's log (all relayed)"
                    ),
                    _ => "; what was cut is not in the bundle".to_string(),
                };
                Some(format!(
                    "output   {}: {hint}{counts}",
                    r["message"].as_str().unwrap_or("cut off")
                ))
            }
            "logCut" => Some(format!(
                "log      {}",
                r["message"].as_str().unwrap_or("cut to fit the bundle")
            )),
            "egressRecordsDropped" => Some(format!(
                "egress   {} more decisions counted but not recorded (the record cap)",
                r["count"]
            )),
            _ => None,
        })
        .map(|l| inert(&l))
        .collect()
}

/// The protections of a step's enforcement report that did not hold (unavailable or
/// degraded), one line each: a limit this host could not give is said where the step's
/// result is, not only in `doctor`.
fn not_held(enforcement: Option<&Value>) -> Vec<String> {
    let rows = enforcement
        .and_then(|r| r["protections"].as_array())
        .into_iter()
        .flatten();
    rows.filter(|p| p["status"] == "unavailable" || p["status"] == "degraded")
        .map(|p| {
            inert(&format!(
                "{} ({}): {}",
                p["name"].as_str().unwrap_or("?"),
                p["status"].as_str().unwrap_or("?"),
                p["detail"].as_str().unwrap_or("")
            ))
        })
        .collect()
}

/// 0 for a finished step; the step's own exit code when it failed with one; 124 for a
/// timeout (like timeout(1)); 1 otherwise.
fn status_exit(status: &str, termination: Option<&str>, exit_code: Option<i64>) -> u8 {
    if status == "finished" {
        return 0;
    }
    if status == "cancelled" {
        return 130;
    }
    match (termination, exit_code) {
        (Some("timeout"), _) => 124,
        (_, Some(c)) if (1..=255).contains(&c) => c as u8,
        _ => EXIT_REJECTED,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn size_flags_need_a_unit_and_name_the_flag() {
        use super::parse_size_flag;
        assert_eq!(parse_size_flag("--memory", "512m").unwrap(), 512 << 20);
        assert_eq!(parse_size_flag("--disk", "1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size_flag("--max-output", "4096b").unwrap(), 4096);
        let bare = parse_size_flag("--memory", "512").unwrap_err().to_string();
        assert!(bare.contains("--memory") && bare.contains("512m"), "{bare}");
        for (flag, text) in [
            ("--disk", "0"),
            ("--max-output", "0"),
            ("--disk", "0m"),
            ("--memory", "lots"),
        ] {
            let e = parse_size_flag(flag, text).unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
            assert!(!e.contains("memoryLimit"), "{e}");
        }
    }

    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("10m"), Some(600_000));
        assert_eq!(parse_duration_ms("30s"), Some(30_000));
        assert_eq!(parse_duration_ms("45"), Some(45_000));
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("1.5h"), Some(5_400_000));
        assert_eq!(parse_duration_ms("soon"), None);
        assert_eq!(parse_duration_ms("0"), None);
    }

    #[test]
    fn ids_are_prefixed_and_distinct_over_time() {
        let a = new_id("sbx");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_id("sbx");
        assert!(a.starts_with("sbx-"));
        assert_ne!(a, b);
    }

    /// On a terminal a relayed line is inert; to a pipe the bytes go as written.
    #[test]
    fn relayed_lines_are_inert_on_a_terminal_only() {
        let line = "progress\x1b[2K\r\x1b]52;c;ZXZpbA==\x07\tdone \u{9b}1m";
        assert_eq!(
            relayed(line.as_bytes(), false),
            "progress^[[2K^M^[]52;c;ZXZpbA==^G\tdone \\u{9b}1m"
        );
        assert_eq!(relayed(b"a\xffb", false), "a\\xffb");
        let marked = relayed(line.as_bytes(), true);
        let stripped = marked
            .replace(smithers_terminal::MARK_ON, "")
            .replace(smithers_terminal::MARK_OFF, "");
        assert!(!stripped.contains('\x1b'), "{marked:?}");
        let relay = Relay {
            stdout_tty: false,
            stderr_tty: true,
            marked: true,
        };
        assert_eq!(relay.for_tty(relay.stdout_tty), LineOut::Raw);
        assert_eq!(
            relay.for_tty(relay.stderr_tty),
            LineOut::Inert { marked: true }
        );
    }

    /// A terminal is written whole lines: a character split between two chunks is shown
    /// once, and a line the step did not end is shown at the end.
    #[test]
    fn lines_for_a_terminal_are_whole() {
        let mut pending = Vec::new();
        assert!(complete_lines(&mut pending, b"ab\xc3", false).is_empty());
        assert_eq!(
            complete_lines(&mut pending, b"\xa9\ncd", false),
            vec!["ab\u{e9}".as_bytes().to_vec()]
        );
        assert_eq!(
            complete_lines(&mut pending, b"", true),
            vec![b"cd".to_vec()]
        );
        assert!(pending.is_empty());
        let long = vec![b'x'; MAX_HELD_LINE * 2 + 1];
        assert_eq!(complete_lines(&mut pending, &long, false).len(), 2);
    }

    #[test]
    fn many_changes_are_summarised_by_directory_with_the_ignore_rule() {
        let change = |path: &str, operation: &'static str| context::FileChange {
            path: path.into(),
            operation,
            added: 2,
            removed: usize::from(operation == "modify"),
            binary: false,
            renamed: None,
        };
        let mut changes = vec![change("README.md", "modify"), change("src/a.rs", "modify")];
        for i in 0..120 {
            changes.push(change(&format!("node_modules/p{i}/index.js"), "add"));
            changes.push(change(&format!("web/node_modules/q{i}/x.js"), "add"));
        }
        assert_eq!(summary_group("node_modules/p1/index.js"), "node_modules/");
        assert_eq!(
            summary_group("web/node_modules/q/x.js"),
            "web/node_modules/"
        );
        assert_eq!(summary_group("src/deep/a.rs"), "src/");
        assert_eq!(summary_group("README.md"), "README.md");
        let lines = directory_summary(&changes);
        assert!(lines[0].starts_with("node_modules/ "), "{lines:#?}");
        assert!(
            lines[0].contains("120 files (120 new), +240 -0"),
            "{lines:#?}"
        );
        assert!(lines.iter().any(|l| l.starts_with("src/ ")), "{lines:#?}");
        assert!(
            lines.contains(&"242 files changed, 484 insertions(+), 2 deletions(-)".to_string()),
            "{lines:#?}"
        );
        let hints: Vec<&String> = lines.iter().filter(|l| l.starts_with("hint:")).collect();
        assert_eq!(hints.len(), 1, "{hints:#?}");
        assert!(
            hints[0].contains("add node_modules/ to .gitignore"),
            "{hints:#?}"
        );
    }

    #[test]
    fn exit_codes_follow_the_step() {
        assert_eq!(status_exit("finished", Some("exited"), Some(0)), 0);
        assert_eq!(status_exit("failed", Some("exited"), Some(3)), 3);
        assert_eq!(status_exit("failed", Some("timeout"), None), 124);
        assert_eq!(status_exit("cancelled", None, None), 130);
        assert_eq!(status_exit("failed", None, None), 1);
    }
}
