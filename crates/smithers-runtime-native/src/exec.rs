//! `execute`: compile the plan, start the init, pump output, enforce the timeout, cancellation
//! and the output cap, and turn what happened into an [`ExecOutcome`].

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use smithers_runtime::output::{Capture, Kept};
use smithers_runtime::{
    CancellationToken, ExecOutcome, OutputEvent, OutputSink, OutputStream, ResourceUsage,
    RuntimeError, StepCommand, Termination,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

use crate::cgroup::SandboxCgroups;
use crate::plan::{self, HostLayout, PlanInput, WorkspaceFacts};
use crate::status::StatusReader;
use crate::warm::ClaimedWarm;
use crate::zygote::Zygote;
use crate::{Backend, HostCaps, InitCommand, StoredConfig};

/// Largest result JSON file read back (the README limit of the bundle).
const MAX_RESULT_BYTES: u64 = 5 << 20;

/// How long a kill may take before we stop trusting the init and kill it ourselves.
const KILL_GRACE: Duration = Duration::from_secs(5);

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The host-disk guard of a step whose workspace layer is on the host's disk (no `--disk`):
/// resolves once the layer's file system has less free space than the floor, which is the
/// runtime's reserve or half of what was free at the start, whichever is smaller (so a disk
/// already low at the start still leaves the step some room). Checked every
/// [`DISK_CHECK_INTERVAL`]: one `statvfs`, whatever the step writes.
struct DiskGuard {
    layer: Option<std::path::PathBuf>,
    floor: u64,
}

const DISK_CHECK_INTERVAL: Duration = Duration::from_millis(200);

impl DiskGuard {
    fn new(backend: &Backend, reserve: u64) -> DiskGuard {
        let layer = (!backend.layer_tmpfs && reserve > 0).then(|| backend.layer());
        let free = |p: &std::path::Path| {
            crate::sys::statvfs(p)
                .ok()
                .map(|st| st.f_bavail.saturating_mul(st.f_frsize))
        };
        match layer.as_deref().and_then(free) {
            Some(at_start) => DiskGuard {
                layer,
                floor: reserve.min(at_start / 2),
            },
            None => DiskGuard {
                layer: None,
                floor: 0,
            },
        }
    }

    async fn exhausted(&self) {
        let Some(layer) = &self.layer else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(DISK_CHECK_INTERVAL).await;
            if let Ok(st) = crate::sys::statvfs(layer) {
                if st.f_bavail.saturating_mul(st.f_frsize) < self.floor {
                    return;
                }
            }
        }
    }
}

/// One stream's pump: relays every byte to the sink as it is read, and keeps what the caps
/// allow in the log ([`Capture`]).
struct Pump<'a> {
    sink: &'a dyn OutputSink,
    log: &'a Mutex<Vec<String>>,
    /// Told when a stream passes a cap and the step is to be stopped for it.
    over: &'a Notify,
    max: u64,
    max_lines: u64,
    /// `failOnOutputCap`: a cap ends the step.
    fail_on_cap: bool,
    /// Fired once the step is over or being ended: the pump no longer waits for the sink's
    /// room (what is left is at most a pipe's buffer).
    released: &'a CancellationToken,
}

impl Pump<'_> {
    fn keep(&self, kept: &mut Vec<Kept>, stream: OutputStream) {
        if kept.is_empty() {
            return;
        }
        if let Ok(mut log) = self.log.lock() {
            log.extend(kept.iter().map(|k| k.record.to_string()));
        }
        for k in kept.drain(..) {
            let timestamp_ms = k.record["timestampMs"].as_u64().unwrap_or(0);
            let line = k.line;
            self.sink.event(match stream {
                OutputStream::Stdout => OutputEvent::Stdout { line, timestamp_ms },
                OutputStream::Stderr => OutputEvent::Stderr { line, timestamp_ms },
            });
        }
    }

    async fn run<R: AsyncRead + Unpin>(&self, mut reader: R, stream: OutputStream) -> Capture {
        let mut cap = Capture::new(
            stream,
            self.max,
            self.max_lines,
            stream == OutputStream::Stdout,
        );
        let mut kept = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // A sink whose reader is behind holds the step back, as a full pipe would.
            if !self.released.is_cancelled() {
                tokio::select! {
                    _ = self.sink.room() => {}
                    _ = self.released.cancelled() => {}
                }
            }
            let n = match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let ts = now_ms();
            // Every byte, past the caps too: the caps bound what is kept, not the step.
            self.sink.event(OutputEvent::Output {
                stream,
                bytes: buf[..n].to_vec(),
                timestamp_ms: ts,
            });
            if cap.feed(&buf[..n], ts, &mut kept) && self.fail_on_cap {
                self.over.notify_one();
            }
            self.keep(&mut kept, stream);
        }
        let truncated = cap.finish(now_ms(), &mut kept);
        self.keep(&mut kept, stream);
        if let (Some(record), Ok(mut log)) = (truncated, self.log.lock()) {
            log.push(record.to_string());
        }
        cap
    }
}

/// What reading the step's result file found.
enum Untrusted {
    Missing,
    TooBig(u64),
    Bytes(Vec<u8>),
}

/// Reads a host file the sandbox wrote, without following a symlink it may have planted.
fn read_untrusted(path: &Path, max: u64) -> Untrusted {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return Untrusted::Missing;
    };
    let Ok(meta) = file.metadata() else {
        return Untrusted::Missing;
    };
    if !meta.is_file() {
        return Untrusted::Missing;
    }
    if meta.len() > max {
        return Untrusted::TooBig(meta.len());
    }
    let mut out = Vec::new();
    if file.take(max + 1).read_to_end(&mut out).is_err() {
        return Untrusted::Missing;
    }
    if out.len() as u64 > max {
        return Untrusted::TooBig(out.len() as u64);
    }
    Untrusted::Bytes(out)
}

/// Parses a result document: a JSON object. Errors say why (serde names a recursion limit
/// for a too-deep document).
fn result_json(bytes: &[u8]) -> Result<Option<Value>, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| "is not UTF-8".to_string())?
        .trim();
    if text.is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(Some(v)),
        Ok(_) => Err("is not a JSON object".to_string()),
        Err(e) if e.to_string().contains("recursion limit") => Err(format!(
            "exceeds the maximum nesting depth the runtime accepts ({e})"
        )),
        Err(e) => Err(format!("is not valid JSON ({e})")),
    }
}

/// The step's result: the result file, else stdout when it holds a JSON object. A result the
/// step clearly meant to give but that breaks a limit is reported (never dropped silently).
fn step_result(result_file: &Path, out: &Capture) -> (Option<Value>, Option<String>) {
    match read_untrusted(result_file, MAX_RESULT_BYTES) {
        Untrusted::TooBig(n) => {
            return (
                None,
                Some(format!(
                    "the result JSON ({n} bytes) exceeds the limit of {MAX_RESULT_BYTES} bytes (SANDBOX_MAX_README_BYTES)"
                )),
            )
        }
        Untrusted::Bytes(b) => {
            return match result_json(&b) {
                Ok(v) => (v, None),
                Err(why) => (None, Some(format!("the result JSON {why}"))),
            }
        }
        Untrusted::Missing => {}
    }
    let looks_like_json = out
        .copy()
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    if !looks_like_json {
        return (None, None);
    }
    if let Some(cap) = out.cap() {
        let cap = cap.control();
        return (
            None,
            Some(format!(
                "the result JSON on stdout exceeds {cap} and was truncated"
            )),
        );
    }
    match result_json(out.copy()) {
        Ok(v) => (v, None),
        // Plain output that happens to start with `{` is not a result; a too-deep object is.
        Err(why) if why.contains("depth") => {
            (None, Some(format!("the result JSON on stdout {why}")))
        }
        Err(_) => (None, None),
    }
}

fn spawn_err(reason: impl ToString) -> RuntimeError {
    RuntimeError::spawn("start the sandbox init", reason)
}

/// A started init: its pid, its output pipes and, when spawned directly, the child to reap.
struct SpawnedInit {
    pid: Option<i32>,
    stdout: std::pin::Pin<Box<dyn AsyncRead + Send>>,
    stderr: std::pin::Pin<Box<dyn AsyncRead + Send>>,
    child: Option<tokio::process::Child>,
}

/// An init forked from the zygote: its pid and the read ends of its stdout and stderr pipes
/// (plain descriptors, made async only where they are read).
#[derive(Debug)]
pub(crate) struct ForkedInit {
    pub(crate) pid: i32,
    pub(crate) stdout: OwnedFd,
    pub(crate) stderr: OwnedFd,
}

impl ForkedInit {
    fn into_spawned(self) -> Result<SpawnedInit, RuntimeError> {
        let pipe = |fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(spawn_err);
        Ok(SpawnedInit {
            pid: Some(self.pid),
            stdout: Box::pin(pipe(self.stdout)?),
            stderr: Box::pin(pipe(self.stderr)?),
            child: None,
        })
    }
}

/// The runtime's zygote, if started: shared with the blocking thread that waits for its
/// answer (the lock is held across that wait, so one thread talks to it at a time).
pub(crate) type ZygoteSlot = std::sync::Arc<std::sync::Mutex<Option<Zygote>>>;

/// Starts the init with `control` as its fd 0 and fresh pipes as its stdout and stderr:
/// forked by the runtime's zygote where there is one (replaced once if it failed), else
/// spawned from the binary. The zygote is asked on a blocking thread: its answer is a
/// blocking receive (up to its timeout, and a replacement zygote's start) under its lock.
async fn spawn_init(
    zygote: Option<&ZygoteSlot>,
    init: &InitCommand,
    control: std::os::unix::net::UnixStream,
) -> Result<SpawnedInit, RuntimeError> {
    let control = match zygote {
        Some(zygote) => {
            let (zygote, program) = (zygote.clone(), init.clone());
            let (forked, control) = crate::blocking("start the sandbox init", move || {
                let forked = fork_from_zygote(&zygote, &program, &control);
                (forked, control)
            })
            .await?;
            if let Some(forked) = forked {
                // The init has its own copy now; ours must go so that EOF means "init gone".
                drop(control);
                return forked.into_spawned();
            }
            control
        }
        None => control,
    };
    let mut cmd = tokio::process::Command::new(&init.program);
    cmd.args(&init.args)
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(control)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| spawn_err(format!("{}: {e}", init.program.display())))?;
    // The Command still owns the init's end of the socket: drop it so EOF means "init gone".
    drop(cmd);
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| spawn_err("no stdout pipe"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| spawn_err("no stderr pipe"))?;
    Ok(SpawnedInit {
        pid: child.id().map(|p| p as i32),
        stdout: Box::pin(stdout),
        stderr: Box::pin(stderr),
        child: Some(child),
    })
}

/// The init mounts its overlays `volatile` (never synced, see the init's `mounts`), and
/// overlayfs leaves `work/incompat/volatile` in the work directory of such a mount: it refuses
/// to mount that work directory again, since after a crash the upper layer may have lost
/// writes. A second `execute` in the same sandbox mounts its layer again, so the mark is
/// removed first (with the rest of overlayfs' `work/`), but only when it was made since this boot (the layer then cannot have
/// been through a crash: a crash is a reboot). A mark from before this boot is left, and the
/// mount refused, as overlayfs means it to be.
fn clear_volatile_mark(work: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // Overlayfs makes its `work/` and `work/incompat/` mode 000, owned by whoever mounted it:
    // root looks inside anyway, an ordinary user (the sandbox's root is their own uid) must
    // open them up first, or the mark is never seen and the next mount refused. They are
    // overlayfs' scratch, made anew at every mount.
    for dir in [work.join("work"), work.join("work/incompat")] {
        if std::fs::symlink_metadata(&dir)
            .is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o700 != 0o700)
        {
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
    }
    let mark = work.join("work/incompat/volatile");
    let meta = match std::fs::symlink_metadata(&mark) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(RuntimeError::io(
                "look for the overlay's volatile mark",
                &mark,
                e,
            ))
        }
    };
    let booted = std::fs::read_to_string("/proc/stat").ok().and_then(|stat| {
        stat.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|t| t.trim().parse::<i64>().ok())
    });
    match booted {
        // Overlayfs' own `work/` (mode 000 directories), which it makes anew at every mount.
        Some(booted) if meta.is_dir() && meta.ctime() >= booted => {
            let own = work.join("work");
            crate::remove_tree(&own)
                .map_err(|e| RuntimeError::io("remove the overlay's volatile mark", &own, e))
        }
        _ => Err(RuntimeError::spawn(
            "mount the workspace again",
            format!(
                "{} is from before this boot: the layer may have lost writes in a crash",
                mark.display()
            ),
        )),
    }
}

/// Ends an armed warm init that is not used after all, before a cold one mounts the same
/// layers: closing our end of its control socket tells P0 to kill P1, its cgroups are emptied
/// (one pid at a time: they serve the cold init next), and P0's closing of the socket, after
/// it reaped P1, says the sandbox's processes are gone, with or without cgroups. Whether both
/// happened within `budget`.
fn end_given_up_init(
    control: Option<std::os::unix::net::UnixStream>,
    cgroups: &SandboxCgroups,
    budget: Duration,
) -> bool {
    use std::io::Read as _;
    let deadline = Instant::now() + budget;
    if let Some(c) = &control {
        let _ = c.shutdown(std::net::Shutdown::Write);
    }
    let emptied = cgroups.kill_and_wait(budget);
    let Some(mut control) = control else {
        return emptied;
    };
    if control.set_nonblocking(false).is_err() {
        return false;
    }
    let mut buf = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || control.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        match control.read(&mut buf) {
            Ok(0) => return emptied,
            // P0's reports (its `initExit`), or a peer already gone.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => return emptied,
            Err(_) => return false,
        }
    }
}

/// [`clear_volatile_mark`] of the workspace's layer (overlay) and of the git layer.
fn clear_volatile_marks(layout: &HostLayout, git_work: Option<&Path>) -> Result<(), RuntimeError> {
    if layout.workspace_copy.is_none() {
        clear_volatile_mark(&layout.work)?;
    }
    if let Some(work) = git_work {
        clear_volatile_mark(work)?;
    }
    Ok(())
}

/// A close-on-exec pipe: (read end, write end).
pub(crate) fn output_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(crate) fn fork_from_zygote(
    zygote: &std::sync::Mutex<Option<Zygote>>,
    init: &InitCommand,
    control: &std::os::unix::net::UnixStream,
) -> Option<ForkedInit> {
    use std::os::fd::AsRawFd;
    let (out_r, out_w) = output_pipe().ok()?;
    let (err_r, err_w) = output_pipe().ok()?;
    let mut slot = zygote.lock().unwrap_or_else(|p| p.into_inner());
    for _attempt in 0..2 {
        if slot.is_none() {
            *slot = Zygote::start(init).ok();
        }
        let z = slot.as_ref()?;
        match z.fork(&[control.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()]) {
            Ok(pid) => {
                return Some(ForkedInit {
                    pid,
                    stdout: out_r,
                    stderr: err_r,
                })
            }
            // A zygote that failed is replaced (dropping it ends it).
            Err(_) => *slot = None,
        }
    }
    None
}

/// Starts a cold init: the prelude into a fresh control socket, then the init (see
/// [`spawn_init`]). Returns our end of the socket and the init.
async fn start_cold(
    zygote: Option<&ZygoteSlot>,
    init: &InitCommand,
    prelude_line: &[u8],
) -> Result<(std::os::unix::net::UnixStream, SpawnedInit), RuntimeError> {
    use std::io::Write;
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(spawn_err)?;
    ours.write_all(prelude_line)
        .map_err(|e| spawn_err(format!("sending the prelude: {e}")))?;
    let spawned = spawn_init(zygote, init, theirs).await?;
    Ok((ours, spawned))
}

/// Where the sandbox's parts are on the host, and what the project holds at its top.
pub(crate) fn host_layout(
    backend: &Backend,
    copy: Option<std::path::PathBuf>,
) -> (HostLayout, WorkspaceFacts) {
    let layout = HostLayout {
        root_dir: backend.root_dir.clone(),
        upper: backend.upper(),
        work: backend.work(),
        workspace_copy: copy,
        new_root: backend.new_root(),
        artifacts: backend.artifacts(),
        out: backend.out(),
        request: backend.request_dir(),
    };
    let workspace = match &layout.workspace_copy {
        None => WorkspaceFacts {
            has_git_dir: backend.root_dir.join(".git").is_dir(),
        },
        // The copy's stand-ins (see copy.rs): real directories only, never through a link.
        Some(copy) => {
            let dir = |name: &str| {
                std::fs::symlink_metadata(copy.join(name)).is_ok_and(|m| m.is_dir())
                    && std::fs::symlink_metadata(backend.root_dir.join(name))
                        .is_ok_and(|m| m.is_dir())
            };
            WorkspaceFacts {
                has_git_dir: dir(".git"),
            }
        }
    };
    (layout, workspace)
}

/// The repository an overlay workspace's git layer is over: its common directory, and, for a
/// project below its repository's top, that top and the project's path in it. `None` for a
/// copy, or a project in no repository.
pub(crate) fn git_repository(
    backend: &Backend,
    layout: &HostLayout,
) -> Option<(std::path::PathBuf, Option<(std::path::PathBuf, String)>)> {
    if layout.workspace_copy.is_some() {
        return None;
    }
    let root = &backend.root_dir;
    match smithers_git::worktree_dirs(root) {
        Some((_, common)) => Some((common, None)),
        None => smithers_git::enclosing_repository(root)
            .map(|(top, rel)| (top.join(".git"), Some((top, rel)))),
    }
}

/// The git layer of an overlay workspace, made (and its index prepared) here.
///
/// A git worktree (overlay mode): its repository's common directory becomes writable in the
/// sandbox through a layer of its own, so the step can commit (collect reads the commits from
/// that layer; the host's repository is written only on accept). The same for a project
/// below its repository's top: the top's `.git` through a layer, the host's index copied
/// there with the files outside the project marked skip-worktree, and the workspace shown
/// again at the project's host path.
pub(crate) fn git_layer(
    backend: &Backend,
    layout: &HostLayout,
) -> Result<Option<plan::GitCommonLayer>, RuntimeError> {
    let Some((common, below)) = git_repository(backend, layout) else {
        return Ok(None);
    };
    let (upper, work) = (backend.git_common_upper(), backend.git_common_work());
    for dir in [&upper, &work] {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::io("make the git layer", dir, e))?;
    }
    if let Some((top, rel)) = &below {
        smithers_git::prepare_subdir_index(top, rel, &upper)
            .map_err(|e| RuntimeError::spawn("prepare the step's git index", e))?;
    }
    Ok(Some(plan::GitCommonLayer {
        common,
        upper,
        work,
        workspace_at: below.map(|(top, rel)| top.join(rel)),
    }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn execute(
    caps: &HostCaps,
    zygote: Option<&ZygoteSlot>,
    backend: &Backend,
    command: &StepCommand,
    cancel: CancellationToken,
    sink: &dyn OutputSink,
    warm: Option<ClaimedWarm>,
    started_hook: &(dyn Fn(bool) + Send + Sync),
) -> Result<ExecOutcome, RuntimeError> {
    let called = Instant::now();
    let called_ns = smithers_sandbox_init::sys::monotonic_ns();
    let config_bytes =
        std::fs::read(backend.config_file()).map_err(|e| RuntimeError::OutOfOrder {
            verb: "execute",
            reason: format!("the sandbox has no state (not created, or cleaned up): {e}"),
        })?;
    let stored: StoredConfig = serde_json::from_slice(&config_bytes)
        .map_err(|e| RuntimeError::spawn("read the sandbox config", e))?;
    let controls = &stored.config.controls;
    let request_file = backend.request_dir().join(plan::REQUEST_FILE_NAME);
    if !request_file.is_file() {
        return Err(RuntimeError::OutOfOrder {
            verb: "execute",
            reason: "nothing was shipped: call ship before execute".into(),
        });
    }
    if command.argv.is_empty() || command.argv[0].is_empty() {
        return Err(RuntimeError::InvalidControl {
            control: "command",
            reason: "the command is empty".into(),
        });
    }
    // A C string ends at its first NUL: the init would silently run a shorter command (or
    // an environment entry without its tail), so such input is refused here, whole.
    if let Some(i) = command.argv.iter().position(|a| a.contains('\0')) {
        return Err(RuntimeError::InvalidControl {
            control: "command",
            reason: format!("argument {i} contains a NUL byte, which a command line cannot carry"),
        });
    }
    if let Some((k, _)) = controls
        .env
        .iter()
        .find(|(k, v)| k.contains('\0') || v.contains('\0') || k.contains('='))
    {
        return Err(RuntimeError::InvalidControl {
            control: "env",
            reason: format!(
                "variable {:?} has a NUL byte or '=' in its name, or a NUL byte in its value",
                k.replace('\0', "\\0")
            ),
        });
    }
    if let Some(cwd) = &command.cwd {
        if cwd.contains('\0') {
            return Err(RuntimeError::InvalidControl {
                control: "cwd",
                reason: "contains a NUL byte".into(),
            });
        }
        if !cwd.starts_with('/') {
            return Err(RuntimeError::InvalidControl {
                control: "cwd",
                reason: format!("must be an absolute path inside the sandbox, got {cwd:?}"),
            });
        }
    }
    let init = caps.init.as_ref().map_err(spawn_err)?;
    let seccomp = caps.seccomp.as_ref().map_err(spawn_err)?;
    // The policy was checked at create; parsed again from the stored config, which is ours.
    let mut egress_policy = crate::egress::policy(controls)?;
    let egress_listen = egress_policy.as_ref().map(crate::egress::listen_plan);
    let egress_resolv = match &egress_policy {
        Some(_) => Some(crate::egress::etc_files(&caps.state_root).map_err(|e| {
            RuntimeError::io(
                "write the egress resolver configuration in",
                &caps.state_root,
                e,
            )
        })?),
        None => None,
    };
    // The proxy variables, under the step's own (which win).
    let step_env = match &egress_policy {
        None => controls.env.clone(),
        Some(_) => {
            let mut env: std::collections::BTreeMap<String, String> =
                crate::egress::proxy_env().into_iter().collect();
            env.extend(controls.env.clone());
            env
        }
    };
    let denials_file = backend.request_dir().join(crate::egress::DENIALS_FILE);

    // A result from a previous execute must not be mistaken for this one's.
    let result_file = backend.out().join(plan::RESULT_FILE_NAME);
    let _ = std::fs::remove_file(&result_file);

    let copy = backend.workspace.copy_reason().map(|_| backend.copy());
    if let Some(copy) = &copy {
        if !copy.is_dir() {
            return Err(RuntimeError::OutOfOrder {
                verb: "execute",
                reason: "the workspace copy was not made: call ship before execute".into(),
            });
        }
    }
    let (layout, workspace) = host_layout(backend, copy);
    // The prelude goes into the socket's buffer before the init exists, and the init is
    // started before the plan is compiled: the init's fork and its namespaces (~0.4 ms here)
    // overlap the plan's compilation (~0.1 ms), and P0 reads the plan only after its
    // namespaces are made. A plan that cannot be made closes the socket instead, and the init,
    // at the end of its input, exits.
    let mut prelude = prelude(caps, backend, controls.allow_network);
    prelude.egress = egress_listen;
    let prelude_line = json_line(&prelude)?;
    // An armed warm init has mounted the workspace over this sandbox's layers already.
    let armed = warm.as_ref().is_some_and(|w| w.armed.is_some());
    // A warm init attached at create serves only the prelude a cold one would get (the
    // plan is compared below, once compiled); otherwise it is dropped, which ends it.
    // An armed init not used keeps its control socket here until it is known to have ended.
    let mut given_up_control = None;
    let warm = match warm {
        Some(w) => {
            let mut cold = prelude.clone();
            cold.warm = true;
            if w.prelude == cold {
                Some(w)
            } else {
                // A plain one is dropped here, which ends it.
                if w.armed.is_some() {
                    given_up_control = Some(w.control);
                }
                None
            }
        }
        None => None,
    };
    let started = Instant::now();
    let mut cold = match warm {
        // An armed init given up must be gone before a cold one joins its cgroups (below).
        None if armed => None,
        Some(_) => None,
        None => Some(start_cold(zygote, init, &prelude_line).await?),
    };
    let tmp_bytes = controls.disk_limit_bytes.unwrap_or(plan::DEFAULT_TMP_BYTES);
    // The caller's stream as the command's stdin, through a FIFO in the request directory;
    // the feed stops when this function returns.
    let request_dir = backend.request_dir();
    let _stdin_feed = match command.stdin.take() {
        Some(reader) => Some(
            crate::stdin_feed::start(&request_dir, reader)
                .map_err(|e| RuntimeError::io("make the stdin FIFO in", &request_dir, e))?,
        ),
        None => None,
    };
    let git_common = git_layer(backend, &layout)?;
    // A second execute mounts the overlays again over the same layers (an armed init's
    // mounts are this execute's own: their marks are cleared only if it is given up).
    let git_work = git_common.as_ref().map(|g| g.work.clone());
    if !armed {
        clear_volatile_marks(&layout, git_work.as_deref())?;
    }
    let mut plan = plan::compile(&PlanInput {
        stdin: _stdin_feed.is_some(),
        git_common,
        layout: &layout,
        workspace,
        host: &caps.facts,
        allow_network: controls.allow_network,
        tmp_bytes,
        volumes: &controls.volumes,
        argv: &command.argv,
        cwd: command.cwd.as_deref(),
        step_env: &step_env,
        host_env: &caps.host_env,
        egress_etc: egress_resolv.as_deref(),
        seccomp: seccomp.clone(),
        prepared_root: caps.prepared_root,
    });
    if caps.prepared_root {
        let (files, mounts) = plan::split_prepared(std::mem::take(&mut plan.mounts));
        // Usually one stamp of an existing root, done here; making one (and sweeping old
        // ones) is a tree of file operations, on a blocking thread.
        let (source, mounts) =
            match crate::prepared_root::existing(&caps.state_root, &files, &mounts) {
                Some(source) => (Ok(source), mounts),
                None => {
                    let state_root = caps.state_root.clone();
                    crate::blocking("prepare the sandbox root", move || {
                        let made = crate::prepared_root::ensure(&state_root, &files, &mounts)
                            .map_err(|e| {
                                RuntimeError::io("prepare the sandbox root in", &state_root, e)
                            });
                        (made, mounts)
                    })
                    .await?
                }
            };
        let source = source?;
        plan.mounts = mounts;
        plan.root = plan::RootFs::Prepared { source };
    }
    // The warm init goes on only if what it built is exactly this plan's first part, on the
    // same root: it is then sent the rest. Else a cold init is started after all.
    let warm_rest = warm.as_ref().and_then(|w| {
        let (prefix, rest) = plan::split_warm(plan.mounts.clone());
        (plan.new_root == w.plan.new_root && plan.root == w.plan.root && prefix == w.plan.mounts)
            .then_some(rest)
    });
    let warm_for = warm.as_ref().map(|w| w.since.elapsed());
    // The warm init is sent the rest of the plan; an armed one, set up with exactly this
    // plan's rest already, only the command. It may have died since its claim (killed, or
    // the OOM killer): the write then fails (its socket's peer is gone) and a cold init
    // serves the step instead, which the bundle's log names (`warmStartLost`).
    use std::io::Write as _;
    let mut warm_lost = None;
    let mut ready = None;
    let warmed = match (warm, warm_rest) {
        (Some(w), Some(rest)) => {
            let mut step = plan.clone();
            step.mounts = rest;
            let line = match &w.armed {
                None => Some(json_line(&step)?),
                Some(armed) => {
                    step.exec = Default::default();
                    step.exec_follows = true;
                    let same = json_line(&step)? == armed.line_for(backend).as_bytes();
                    ready = Some(armed.ready.clone());
                    same.then(|| json_line(&plan.exec)).transpose()?
                }
            };
            let mut control = w.control;
            match line.map(|line| control.write_all(&line)) {
                Some(Ok(())) => Some((control, ForkedInit::into_spawned(w.init)?)),
                not_sent => {
                    warm_lost = not_sent.and_then(|r| r.err()).map(|e| e.to_string());
                    given_up_control = Some(control);
                    None
                }
            }
        }
        (Some(w), None) => {
            given_up_control = Some(w.control);
            None
        }
        (None, _) => None,
    };
    if warmed.is_none() {
        ready = None;
    }
    // An armed init given up (or lost) is ended, and its mounts' volatile marks cleared,
    // before a cold one mounts the same layers.
    if armed && warmed.is_none() {
        let cgroups = backend.cgroups.clone();
        let control = given_up_control.take();
        let ended = crate::blocking("end the armed warm init", move || {
            end_given_up_init(control, &cgroups, KILL_GRACE)
        })
        .await?;
        if !ended {
            return Err(RuntimeError::Spawn {
                operation: "end the armed warm sandbox's init".into(),
                reason: format!(
                    "it was still running (its mounts are over this sandbox's layers) {} s after it was told to end and killed; no cold init may mount them meanwhile",
                    KILL_GRACE.as_secs()
                ),
            });
        }
        clear_volatile_marks(&layout, git_work.as_deref())?;
    }
    drop(given_up_control);
    let warm_for = warm_for.filter(|_| warmed.is_some());
    let armed_served = armed && warmed.is_some();
    let armed_given_up = armed && warmed.is_none() && warm_lost.is_none();
    let (ours, spawned) = match warmed {
        Some(warm) => warm,
        None => {
            let (mut ours, spawned) = match cold.take() {
                Some(c) => c,
                None => start_cold(zygote, init, &prelude_line).await?,
            };
            ours.write_all(&json_line(&plan)?)
                .map_err(|e| spawn_err(format!("sending the plan: {e}")))?;
            (ours, spawned)
        }
    };
    let init_pid = spawned.pid;
    // While the sandbox starts the command (over half a millisecond before it even runs),
    // the directories its bundle is written into are made, off collect's path. A failure
    // here is collect's to report: it makes them again.
    let (_, _, result_path) = crate::project_dirs(&backend.root_dir, &stored.config);
    let _ = crate::blocking("prepare the bundle's directories", move || {
        smithers_bundle::prepare_bundle_dirs(&result_path)
    })
    .await;
    let (stdout, stderr) = (spawned.stdout, spawned.stderr);
    ours.set_nonblocking(true).map_err(spawn_err)?;
    let ours = tokio::net::UnixStream::from_std(ours).map_err(spawn_err)?;
    let (status_rd, mut control_wr) = ours.into_split();

    let log = Mutex::new(Vec::new());
    let over = Notify::new();
    let finished = Notify::new();
    let released = CancellationToken::new();
    let pump = Pump {
        sink,
        log: &log,
        over: &over,
        max: controls.max_output_bytes,
        max_lines: controls.max_output_lines,
        fail_on_cap: controls.fail_on_output_cap,
        released: &released,
    };
    // Egress records, live to the sink while the step runs (serve's clients see them).
    let (live_tx, mut live_rx) = tokio::sync::mpsc::unbounded_channel();
    let live_done = CancellationToken::new();
    let forward = |r: smithers_egress::EgressRecord| {
        if let Ok(record) = serde_json::to_value(&r) {
            sink.event(OutputEvent::Egress {
                record,
                timestamp_ms: r.timestamp_ms,
            });
        }
    };
    let live_fut = async {
        loop {
            tokio::select! {
                r = live_rx.recv() => match r {
                    Some(r) => forward(r),
                    None => break,
                },
                _ = live_done.cancelled() => break,
            }
        }
    };
    let command_started = std::sync::OnceLock::new();
    let status_fut = async {
        // An armed init's `ready`, which the pool's keeper read.
        let mut events: Vec<Value> = ready.into_iter().collect();
        let mut engine = None;
        let mut reader = StatusReader::new(status_rd.as_ref());
        while let Some(line) = reader.next_line().await {
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                // P0's listeners, bound in the sandbox's network namespace, arrive with
                // this line: served from here for the sandbox's life.
                if v["event"] == "egress" {
                    let names: Vec<String> = v["listeners"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|n| n.as_str().map(str::to_string))
                        .collect();
                    let fds = reader.take_fds();
                    match egress_policy.take() {
                        Some(policy) => {
                            match crate::egress::start(
                                policy,
                                &names,
                                fds,
                                denials_file.clone(),
                                live_tx.clone(),
                            ) {
                                Ok(e) => engine = Some(e),
                                Err(message) => events.push(json!({
                                    "event": "error", "stage": "egress", "message": message,
                                })),
                            }
                        }
                        None => drop(fds),
                    }
                    continue;
                }
                if v["event"] == "started" {
                    // When the init's spawn returned, on the clock the sandbox shares with us;
                    // else (a value off the clock's range since `called`) when we read it.
                    let seen_us = called.elapsed().as_micros() as u64;
                    let at_us = v["monotonicNs"]
                        .as_u64()
                        .and_then(|ns| ns.checked_sub(called_ns))
                        .map(|ns| ns / 1000)
                        .filter(|us| *us <= seen_us)
                        .unwrap_or(seen_us);
                    let _ = command_started.set(at_us);
                    started_hook(armed_served);
                    continue;
                }
                // `exit` is the last word: every other sandbox process is gone by then (see
                // smithers_sandbox_init); the init's own exit and the namespaces' teardown go on
                // without us.
                let last = v["event"] == "exit";
                events.push(v);
                if last {
                    break;
                }
            }
        }
        finished.notify_one();
        live_done.cancel();
        (events, engine)
    };
    let deadline = controls.timeout().map(|t| tokio::time::Instant::now() + t);
    let disk_guard = DiskGuard::new(backend, caps.disk_reserve);
    let cgroups = &backend.cgroups;
    let control_fut = async {
        let reason = tokio::select! {
            _ = finished.notified() => None,
            _ = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => Some(Termination::Timeout),
            _ = cancel.cancelled() => Some(Termination::Cancelled),
            _ = over.notified() => Some(Termination::Output),
            _ = disk_guard.exhausted() => Some(Termination::Disk),
        };
        // The step is over or being ended: what is left in its pipes is read on without
        // waiting for the sink.
        released.cancel();
        if reason.is_some() {
            // P0 SIGKILLs pid 1 of the sandbox; the pid namespace dies with it.
            let _ = control_wr.write_all(b"k\n").await;
            if tokio::time::timeout(KILL_GRACE, finished.notified())
                .await
                .is_err()
            {
                // The init did not finish the kill: take the whole tree down ourselves.
                if let Some(pid) = init_pid {
                    let _ = crate::sys::kill(pid, libc::SIGKILL);
                }
                // The sandbox may be executed again: its cgroups must stay fit for an init.
                cgroups.kill_each();
            }
        }
        drop(control_wr);
        reason
    };
    let (out, err, (events, engine), reason, ()) = tokio::join!(
        pump.run(stdout, OutputStream::Stdout),
        pump.run(stderr, OutputStream::Stderr),
        status_fut,
        control_fut,
        live_fut
    );
    // The init has reported `exit` (every other sandbox process is gone) or closed its
    // descriptors. What is left is its own exit and the kernel tearing down the namespaces,
    // which the runtime need not wait for; an executed init is reaped in the background.
    if let Some(mut child) = spawned.child {
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
    }
    let duration = started.elapsed();

    // Without an `exit` report (a kill, a failure), belt and braces: the pid namespace is
    // gone, so the cgroups should be empty. If anything escaped into them (it cannot leave a
    // pid namespace, but be sure), kill it now. After one, the init alone is left, exiting.
    let exit = events.iter().find(|e| e["event"] == "exit");
    if exit.is_none() && cgroups.populated() {
        // A kill that waits (up to KILL_GRACE) for the cgroups to empty: off the workers.
        let cgroups = cgroups.clone();
        crate::blocking("kill what is left of the sandbox", move || {
            cgroups.kill_and_wait(KILL_GRACE)
        })
        .await?;
    }
    let stats = cgroups.stats();

    // Every connection ends with the sandbox; what the engine decided is the step's.
    let egress_summary = match engine {
        Some(engine) => Some(engine.stop().await),
        None => None,
    };
    drop(live_tx);
    while let Ok(r) = live_rx.try_recv() {
        forward(r);
    }
    if stored.config.controls.egress_policy.is_some()
        && egress_summary.is_none()
        && reason.is_none()
    {
        let said = events.iter().any(|e| e["event"] == "error");
        if !said && events.iter().any(|e| e["event"] == "exit") {
            return Err(RuntimeError::spawn(
                "set up the sandbox (egress)",
                "the init did not hand over the egress listeners, so the step had no network at all",
            ));
        }
    }
    let ready = events.iter().find(|e| e["event"] == "ready");
    if reason.is_none() {
        if let Some(error) = events.iter().find(|e| e["event"] == "error") {
            return Err(RuntimeError::Spawn {
                operation: format!(
                    "set up the sandbox ({})",
                    error["stage"].as_str().unwrap_or("init")
                ),
                reason: error["message"].as_str().unwrap_or("unknown").to_string(),
            });
        }
    }
    let exit_code = exit.and_then(|e| e["code"].as_i64()).map(|c| c as i32);
    let signal = exit.and_then(|e| e["signal"].as_i64()).map(|s| s as i32);

    let disk_full = backend.layer_tmpfs
        && crate::sys::statvfs(&backend.layer())
            .map(|st| st.f_bavail == 0)
            .unwrap_or(false);
    let failed = exit_code != Some(0);
    let termination = match reason {
        Some(Termination::Cancelled) => Termination::Cancelled,
        Some(Termination::Timeout) => Termination::Timeout,
        Some(Termination::Disk) => Termination::Disk,
        _ if stats.oom_kills > 0 => Termination::Memory,
        Some(Termination::Output) => Termination::Output,
        // The step may exit before the kill for a cap lands (its last bytes still in the
        // pipe): asked to fail on a cap, it fails on it all the same.
        _ if controls.fail_on_output_cap && (out.truncated() || err.truncated()) => {
            Termination::Output
        }
        _ if disk_full && failed => Termination::Disk,
        _ if stats.pids_limit_hits > 0 => Termination::Pids,
        _ if signal.is_some() => Termination::Signaled,
        _ if exit_code.is_some() => Termination::Exited,
        _ => {
            return Err(RuntimeError::spawn(
                "run the command",
                "the sandbox init ended without reporting the command's exit status",
            ))
        }
    };

    let (result, result_problem) =
        smithers_runtime::check_result_fields(step_result(&result_file, &out));
    let usage = ResourceUsage {
        cpu_time_ms: stats.cpu_time_ns.map(|ns| ns / 1_000_000),
        peak_memory_bytes: stats.peak_memory_bytes,
        max_pids: stats.peak_pids,
        disk_bytes: if backend.layer_tmpfs {
            crate::sys::statvfs(&backend.layer())
                .ok()
                .map(|st| (st.f_blocks - st.f_bfree) * st.f_frsize)
        } else {
            None
        },
    };
    let enforcement =
        crate::report::enforcement(caps, &stored, &plan, cgroups, ready, &backend.workspace);
    let outcome = ExecOutcome {
        termination,
        exit_code,
        signal,
        duration,
        stdout_bytes: out.total(),
        stderr_bytes: err.total(),
        stdout_truncated: out.truncated(),
        stderr_truncated: err.truncated(),
        usage,
        enforcement,
        result,
        egress: egress_summary
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok()),
        command_started_after_us: command_started.get().copied(),
    };
    let mut lines = log.into_inner().unwrap_or_default();
    if let Some(waited) = warm_for {
        lines.insert(
            0,
            json!({"type": "warmStart", "timestampMs": now_ms(), "preparedMsBefore": waited.as_millis() as u64, "armed": armed_served})
                .to_string(),
        );
    }
    if armed_given_up {
        lines.insert(
            0,
            json!({"type": "warmStartGivenUp", "timestampMs": now_ms(), "reason": "the step's plan is not the one its armed warm sandbox was set up with (the project or the host changed since); a cold one served the step"})
                .to_string(),
        );
    }
    if let Some(reason) = warm_lost {
        let message = format!(
            "the claimed warm sandbox's init was gone when the step's plan was sent ({reason}); a cold one served the step"
        );
        lines.insert(
            0,
            json!({"type": "warmStartLost", "timestampMs": now_ms(), "reason": message})
                .to_string(),
        );
    }
    // Copy mode is a degradation: the log (which goes into the bundle) says so first.
    if let Some(reason) = backend.workspace.copy_reason() {
        let mut record =
            json!({"type": "workspace", "timestampMs": now_ms(), "mode": "copy", "reason": reason});
        // What ship copied (files, bytes, entries it could not reproduce).
        if let Ok(Value::Object(copied)) = std::fs::read(backend.copy_report_file())
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()))
        {
            for (k, v) in copied {
                record[k] = v;
            }
        }
        lines.insert(0, record.to_string());
    }
    if let Some(summary) = &egress_summary {
        lines.extend(
            summary
                .records
                .iter()
                .filter_map(|r| serde_json::to_string(r).ok()),
        );
        if summary.records_dropped > 0 {
            lines.push(
                json!({"type": "egressRecordsDropped", "timestampMs": now_ms(), "count": summary.records_dropped})
                    .to_string(),
            );
        }
    }
    if let Some(problem) = &result_problem {
        lines.push(
            json!({"type": "resultRejected", "timestampMs": now_ms(), "reason": problem})
                .to_string(),
        );
    }
    persist(backend, &outcome, lines, result_problem.as_deref())?;
    Ok(outcome)
}

pub(crate) fn json_line(value: &impl serde::Serialize) -> Result<Vec<u8>, RuntimeError> {
    let mut line = serde_json::to_vec(value).map_err(spawn_err)?;
    line.push(b'\n');
    Ok(line)
}

/// The prelude of this sandbox's init (see [`plan::Prelude`]).
pub(crate) fn prelude(caps: &HostCaps, backend: &Backend, allow_network: bool) -> plan::Prelude {
    plan::Prelude::new(
        caps.uid,
        caps.gid,
        backend.cgroups.join_plan(),
        allow_network,
    )
}

/// The log record of a step's enforcement report (the same shape in every runtime's log).
pub(crate) fn enforcement_record(report: &smithers_runtime::EnforcementReport) -> Value {
    json!({"type": "enforcement", "timestampMs": now_ms(), "report": report})
}

/// Writes the NDJSON log (lines, the enforcement record, then the exit record) and the
/// outcome for `collect`.
fn persist(
    backend: &Backend,
    outcome: &ExecOutcome,
    mut lines: Vec<String>,
    result_problem: Option<&str>,
) -> Result<(), RuntimeError> {
    let problem_file = backend.result_problem_file();
    match result_problem {
        Some(p) => crate::write_private(&problem_file, p.as_bytes())?,
        None => {
            let _ = std::fs::remove_file(&problem_file);
        }
    }
    let exit = json!({
        "type": "exit",
        "timestampMs": now_ms(),
        "termination": outcome.termination.as_str(),
        "exitCode": outcome.exit_code,
        "signal": outcome.signal,
        "durationMs": outcome.duration.as_millis() as u64,
        "stdoutBytes": outcome.stdout_bytes,
        "stderrBytes": outcome.stderr_bytes,
        "stdoutTruncated": outcome.stdout_truncated,
        "stderrTruncated": outcome.stderr_truncated,
        "usage": outcome.usage,
    });
    // What held for this step, next to how it ended: a limit unavailable on this host (an
    // ordinary user's, a container's) is named in the bundle, not only in `doctor`.
    lines.push(enforcement_record(&outcome.enforcement).to_string());
    lines.push(exit.to_string());
    let mut text = lines.join("\n");
    text.push('\n');
    crate::write_private(&backend.log_file(), text.as_bytes())?;
    let outcome_bytes = serde_json::to_vec(outcome).unwrap_or_default();
    crate::write_private(&backend.outcome_file(), &outcome_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smithers_runtime::output::OutputCap;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts line events, and the bytes relayed as written.
    #[derive(Default)]
    struct Count {
        lines: AtomicU64,
        relayed: Mutex<Vec<u8>>,
    }

    impl OutputSink for Count {
        fn event(&self, event: OutputEvent) {
            match event {
                OutputEvent::Output { bytes, .. } => {
                    self.relayed.lock().unwrap().extend_from_slice(&bytes)
                }
                _ => {
                    self.lines.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    struct Pumped {
        cap: Capture,
        lines: u64,
        relayed: Vec<u8>,
        log: Vec<Value>,
        over: bool,
    }

    /// Pumps `input` as stdout under caps of `max` bytes and `max_lines` lines.
    async fn pump_with(input: &[u8], max: u64, max_lines: u64, fail_on_cap: bool) -> Pumped {
        let sink = Count::default();
        let log = Mutex::new(Vec::new());
        let over = Notify::new();
        let released = CancellationToken::new();
        let pump = Pump {
            sink: &sink,
            log: &log,
            over: &over,
            max,
            max_lines,
            fail_on_cap,
            released: &released,
        };
        let cap = pump.run(input, OutputStream::Stdout).await;
        let told = tokio::time::timeout(Duration::from_millis(1), over.notified())
            .await
            .is_ok();
        Pumped {
            cap,
            lines: sink.lines.load(Ordering::Relaxed),
            relayed: sink.relayed.into_inner().unwrap(),
            log: log
                .into_inner()
                .unwrap()
                .iter()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
            over: told,
        }
    }

    async fn pump(input: &[u8], max: u64) -> Pumped {
        pump_with(input, max, 100_000, false).await
    }

    fn truncation_records(log: &[Value]) -> Vec<&Value> {
        log.iter()
            .filter(|r| r["type"] == "outputTruncated")
            .collect()
    }

    #[tokio::test]
    async fn a_million_newlines_are_capped_in_the_log_and_relayed_whole() {
        let flood = vec![b'\n'; 1_000_000];
        // Under the byte cap: only the line cap can cut it.
        let p = pump(&flood, 2 << 20).await;
        assert!(p.cap.truncated());
        assert_eq!(p.cap.cap(), Some(OutputCap::Lines));
        assert_eq!(p.cap.total(), 1_000_000, "every byte is still read");
        assert_eq!(p.relayed, flood, "and relayed");
        assert_eq!(p.lines, 100_000);
        let lines = p.log.iter().filter(|r| r["type"] == "stdout").count();
        assert_eq!(lines, 100_000);
        let records = truncation_records(&p.log);
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0]["cap"], "lines");
        assert_eq!(records[0]["stream"], "stdout");
        assert_eq!(records[0]["limit"], 100_000);
        assert_eq!(records[0]["notKeptLines"], 900_000);
        assert_eq!(records[0]["notKeptBytes"], 900_000);
        assert!(!p.over, "without failOnOutputCap the step goes on");
    }

    #[tokio::test]
    async fn the_byte_cap_is_named_as_bytes_and_stops_the_step_only_when_asked() {
        let flood = vec![b'x'; 10_000];
        let p = pump(&flood, 1000).await;
        assert!(p.cap.truncated());
        assert_eq!(p.cap.cap(), Some(OutputCap::Bytes));
        assert_eq!(p.relayed, flood);
        // The cut-off line is still one event.
        assert_eq!(p.lines, 1);
        let records = truncation_records(&p.log);
        assert_eq!(records.len(), 1);
        assert_eq!(records[0]["cap"], "bytes");
        assert_eq!(records[0]["limit"], 1000);
        assert_eq!(records[0]["notKeptBytes"], 9000);
        assert!(!p.over);
        assert!(pump_with(&flood, 1000, 100_000, true).await.over);
        assert!(pump_with(b"a\nb\nc\n", 1 << 20, 2, true).await.over);
    }

    #[tokio::test]
    async fn output_under_both_caps_is_unaffected() {
        let mut input = Vec::new();
        for i in 0..1000 {
            input.extend_from_slice(format!("{}\n", i % 10).as_bytes());
        }
        let p = pump_with(&input, 1 << 20, 1000, true).await;
        assert!(!p.cap.truncated(), "{:?}", p.cap.cap());
        assert_eq!(p.lines, 1000);
        assert!(truncation_records(&p.log).is_empty());
        assert_eq!(p.cap.copy(), input);
        assert!(!p.over);

        let p = pump(b"hello\nworld", 1 << 20).await;
        assert!(!p.cap.truncated());
        assert_eq!(p.lines, 2);
        assert_eq!(p.log[1]["partial"], true);
    }

    #[tokio::test]
    async fn bytes_that_are_not_utf8_are_relayed_and_logged_exactly() {
        let input = b"\xff\xfex";
        let p = pump(input, 1 << 20).await;
        assert_eq!(p.relayed, input);
        let mut replayed = Vec::new();
        for r in &p.log {
            replayed.extend(smithers_runtime::output::record_bytes(r).unwrap().1);
        }
        assert_eq!(replayed, input);
    }
}
