//! One step's run: the sandbox's host side prepared, then its container created, attached,
//! started, watched and waited for, and its outcome read.

use std::path::Path;
use std::time::{Duration, Instant};

use bollard::models::ContainerStateStatusEnum;
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, KillContainerOptions, WaitContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use serde_json::Value;
use smithers_runtime::{
    CancellationToken, Controls, EnforcementReport, ExecOutcome, OutputSink, RuntimeError,
    SandboxConfig, SandboxHandle, StepCommand, Termination,
};

use crate::egress::{self, forward_egress};
use crate::enforcement::enforcement_for;
use crate::engine::{self, describe, remove_container, spawn_err};
use crate::plan::{self, BackendState};
use crate::runtime::{DockerRuntime, Live};
use crate::watchdog::spawn_watchdog;
use crate::{cgroup, hostfs, monitor, pump};

/// Largest result JSON read from `/result/result.json` (the README limit of a bundle).
const MAX_RESULT_JSON_BYTES: u64 = 5 * 1024 * 1024;
/// How long to wait for a killed container to be reported stopped.
const KILL_WAIT: Duration = Duration::from_secs(30);

impl DockerRuntime {
    pub(crate) async fn prepare(
        &self,
        docker: &Docker,
        config: &SandboxConfig,
        state: &BackendState,
        handle: &SandboxHandle,
    ) -> Result<(), RuntimeError> {
        let (uid, gid) = hostfs::owner_of(&config.root_dir)?;
        hostfs::mkdir(&state.state_dir, 0o700)?;
        let layer = state.state_dir.join("layer");
        hostfs::mkdir(&layer, 0o755)?;
        if let Some(limit) = config.controls.disk_limit_bytes {
            hostfs::mount_layer_tmpfs(&layer, limit)?;
        }
        hostfs::mkdir(&state.upper, 0o755)?;
        hostfs::mkdir(&state.work, 0o700)?;
        // The upper root's owner becomes /workspace's owner: keep it the project's.
        chown(&state.upper, uid, gid)?;
        hostfs::mkdir(&handle.request_path, 0o755)?;
        for dir in [&state.out_dir, &state.artifacts_dir] {
            hostfs::mkdir(dir, 0o755)?;
            chown(dir, uid, gid)?;
        }

        let labels = plan::labels(
            &config.run_id,
            &config.sandbox_id,
            hostfs::self_identity(),
            &state.state_dir,
        );
        docker
            .create_volume(plan::volume_request(
                &state.volume_name,
                &config.root_dir,
                &state.upper,
                &state.work,
                labels,
            ))
            .await
            .map_err(|e| spawn_err(format!("create overlay volume {}", state.volume_name), &e))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run_container(
        &self,
        docker: &Docker,
        handle: &SandboxHandle,
        state: &BackendState,
        live: &Live,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
        holder: Option<&mut egress::Holder>,
    ) -> Result<(ExecOutcome, bool), RuntimeError> {
        let name = &state.container_name;
        let id = self
            .create_container(docker, handle, state, live, command, holder.as_deref())
            .await?;
        // From here until the container is seen stopped, our death must take it down.
        let mut watchdog = match &self.opts.watchdog {
            Some(bin) => Some(spawn_watchdog(bin, &state.socket, &id)?),
            None => None,
        };

        let log_path = state.state_dir.join("stream.ndjson");
        let attach = docker
            .attach_container(
                name,
                Some(AttachContainerOptions {
                    stream: true,
                    stdout: true,
                    stderr: true,
                    stdin: false,
                    logs: false,
                    detach_keys: None,
                }),
            )
            .await
            .map_err(|e| spawn_err(format!("attach to container {name}"), &e))?;

        let started_at = Instant::now();
        // Fired by the pump when a stream passes a cap of a step that fails on it.
        let over = CancellationToken::new();
        let caps = pump::Caps {
            bytes: live.controls.max_output_bytes,
            lines: live.controls.max_output_lines,
        };
        let mut pump = pump::Pump::new(
            &log_path,
            caps,
            live.controls.fail_on_output_cap.then(|| over.clone()),
        )?;
        if let Err(e) = docker.start_container(name, None).await {
            // The engine refuses to start a command that does not exist in the image; that is
            // the step's failure (exit 127/126 like a shell), not the runtime's.
            let enforcement = enforcement_for(&live.controls, state, self.opts.watchdog.is_some());
            return start_refused(docker, name, e, pump, output, started_at, enforcement).await;
        }

        // Usage and limit hits from the container's cgroup while it runs.
        let monitor_stop = CancellationToken::new();
        let monitor = match docker.inspect_container(name, None).await {
            Ok(info) => info
                .state
                .and_then(|s| s.pid)
                .filter(|p| *p > 0)
                .and_then(|pid| monitor::CgroupPaths::of_pid(pid, &id))
                .map(|paths| tokio::spawn(monitor::watch(paths, monitor_stop.clone()))),
            Err(_) => None,
        };

        let timeout = live.controls.timeout();
        let pump_stop = CancellationToken::new();
        // Fired once the step is over or being ended: the pump stops waiting for the sink.
        let released = CancellationToken::new();
        let waiter = wait_step(
            docker, name, timeout, started_at, &cancel, &over, &released, &pump_stop,
        );
        let (pumped, waited, ()) = tokio::join!(
            pump.run(attach.output, output, pump_stop.clone(), released.clone()),
            waiter,
            forward_live_egress(holder, output, &pump_stop)
        );
        pump_stop.cancel();
        monitor_stop.cancel();
        let mut sample = match monitor {
            Some(h) => h.await.unwrap_or_default(),
            None => monitor::Sample::default(),
        };
        add_parent_pids(&mut sample, state, &live.controls);
        let (reason, duration) = waited?;
        let pumped = pumped?;
        if let Some(w) = watchdog.take() {
            w.dismiss().await;
        }

        let (termination, exit_code, signal) =
            termination_of(docker, name, state, reason, &sample, over.is_cancelled()).await?;
        let mut usage = sample.usage();
        if state.layer_tmpfs {
            usage.disk_bytes = layer_used(&state.state_dir.join("layer"));
        }
        let (result, note) =
            smithers_runtime::check_result_fields(read_result(&state.out_dir, &pumped));
        let rejected = note.is_some();
        if let Some(note) = note {
            pump.write_note(&note)?;
        }
        let outcome = ExecOutcome {
            termination,
            exit_code,
            signal,
            duration,
            stdout_bytes: pumped.stdout_bytes,
            stderr_bytes: pumped.stderr_bytes,
            stdout_truncated: pumped.stdout_truncated,
            stderr_truncated: pumped.stderr_truncated,
            usage,
            enforcement: enforcement_for(&live.controls, state, self.opts.watchdog.is_some()),
            result,
            egress: None,
            command_started_after_us: None,
        };
        pump.write_exit(&outcome)?;
        Ok((outcome, rejected))
    }

    /// Creates the step's container (after removing a previous execute's) and returns its id.
    async fn create_container(
        &self,
        docker: &Docker,
        handle: &SandboxHandle,
        state: &BackendState,
        live: &Live,
        command: &StepCommand,
        holder: Option<&egress::Holder>,
    ) -> Result<String, RuntimeError> {
        let name = &state.container_name;
        // A previous execute's container (a second execute on one sandbox) goes first.
        remove_container(docker, name).await?;
        let mut st = state.clone();
        st.hide_smithers_dir = live.root_dir.join(".smithers").is_dir();
        let labels = plan::labels(
            &handle.run_id,
            &handle.sandbox_id,
            hostfs::self_identity(),
            &state.state_dir,
        );
        let body = plan::container_body(&plan::ContainerPlan {
            state: &st,
            controls: &live.controls,
            labels,
            argv: &command.argv,
            cwd: command.cwd.as_deref(),
            request_dir: &handle.request_path,
            run_id: &handle.run_id,
            sandbox_id: &handle.sandbox_id,
            egress: holder.map(|h| plan::EgressPlan {
                holder: &h.name,
                etc_dir: &h.etc_dir,
                secret_env: &h.secret_env,
            }),
        });
        let created = docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.clone()),
                    platform: String::new(),
                }),
                body,
            )
            .await
            .map_err(|e| spawn_err(format!("create container {name}"), &e))?;
        Ok(created.id)
    }
}

/// The outcome of a step whose container the engine refused to start with an exit code (a
/// command missing from the image): the step's failure, exited with that code; without a
/// code, the runtime's error.
async fn start_refused(
    docker: &Docker,
    name: &str,
    e: bollard::errors::Error,
    mut pump: pump::Pump,
    output: &dyn OutputSink,
    started_at: Instant,
    enforcement: EnforcementReport,
) -> Result<(ExecOutcome, bool), RuntimeError> {
    let msg = describe(&e);
    let info = docker.inspect_container(name, None).await.ok();
    let code = info
        .as_ref()
        .and_then(|i| i.state.as_ref())
        .and_then(|s| s.exit_code)
        .filter(|c| *c != 0);
    let Some(code) = code else {
        return Err(spawn_err(format!("start container {name}"), &e));
    };
    pump.note_stderr(output, &msg);
    let pumped = pump.finish(output)?;
    Ok((
        ExecOutcome {
            termination: Termination::Exited,
            exit_code: Some(code as i32),
            signal: None,
            duration: started_at.elapsed(),
            stdout_bytes: pumped.stdout_bytes,
            stderr_bytes: pumped.stderr_bytes,
            stdout_truncated: pumped.stdout_truncated,
            stderr_truncated: pumped.stderr_truncated,
            usage: Default::default(),
            enforcement,
            result: None,
            egress: None,
            command_started_after_us: None,
        },
        false,
    ))
}

/// Waits for the step's end: its container's exit, or the timeout, the caller's cancellation
/// or an output cap (`over`), on which the container is killed and waited for. Fires
/// `released` once the step is over or being ended and `pump_stop` shortly after it stopped.
/// Returns why it was ended (None: it exited) and how long it ran.
#[allow(clippy::too_many_arguments)]
async fn wait_step(
    docker: &Docker,
    name: &str,
    timeout: Option<Duration>,
    started_at: Instant,
    cancel: &CancellationToken,
    over: &CancellationToken,
    released: &CancellationToken,
    pump_stop: &CancellationToken,
) -> Result<(Option<Termination>, Duration), RuntimeError> {
    let reason = {
        let wait = first_exit(docker, name);
        tokio::pin!(wait);
        let sleep = async {
            match timeout {
                Some(t) => tokio::time::sleep(t.saturating_sub(started_at.elapsed())).await,
                None => std::future::pending::<()>().await,
            }
        };
        let reason = tokio::select! {
            r = &mut wait => { r?; None }
            _ = sleep => Some(Termination::Timeout),
            _ = cancel.cancelled() => Some(Termination::Cancelled),
            _ = over.cancelled() => Some(Termination::Output),
        };
        released.cancel();
        reason
    };
    if reason.is_some() {
        // SIGKILL to the container's init kills its pid namespace: every process.
        match docker
            .kill_container(
                name,
                Some(KillContainerOptions {
                    signal: "KILL".into(),
                }),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if matches!(engine::status(&e), Some(404 | 409)) => {}
            Err(e) => return Err(spawn_err(format!("kill container {name}"), &e)),
        }
        tokio::time::timeout(KILL_WAIT, first_exit(docker, name))
            .await
            .map_err(|_| RuntimeError::Spawn {
                operation: format!("stop container {name}"),
                reason: format!("still running {}s after SIGKILL", KILL_WAIT.as_secs()),
            })??;
    }
    let elapsed = started_at.elapsed();
    // The attach stream ends when the container's last writer is gone; give it a
    // moment to drain, then stop reading.
    let stop = pump_stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.cancel();
    });
    Ok::<_, RuntimeError>((reason, elapsed))
}

/// The engine's decisions, live to the caller while the step runs (until `pump_stop`).
async fn forward_live_egress(
    holder: Option<&mut egress::Holder>,
    output: &dyn OutputSink,
    pump_stop: &CancellationToken,
) {
    let Some(h) = holder else { return };
    loop {
        tokio::select! {
            r = h.live.recv() => match r {
                Some(r) => forward_egress(output, r),
                None => break,
            },
            _ = pump_stop.cancelled() => break,
        }
    }
}

/// Adds the pids cgroup we own (when there is one) to the sample: its limit hits and peak.
fn add_parent_pids(sample: &mut monitor::Sample, state: &BackendState, controls: &Controls) {
    if let Some(rel) = &state.pids_cgroup {
        let (hits, peak) = cgroup::read(rel);
        sample.pids_limit_hits = sample.pids_limit_hits.max(hits);
        sample.max_pids = sample.max_pids.max(peak);
        // On cgroup v1 the kernel counts a refused fork in the forking (container's)
        // group, which the engine deletes at exit; the parent's peak survives. Reaching
        // the cap is reported as hitting it.
        let limit = u64::from(controls.pids_limit.unwrap_or(plan::DEFAULT_PIDS_LIMIT));
        if peak.is_some_and(|p| p >= limit) {
            sample.pids_limit_hits = sample.pids_limit_hits.max(1);
        }
    }
}

/// How the stopped step ended (termination, exit code, signal): the reason it was ended for,
/// else what its container's state, the cgroup sample and the layer say. `over_cap`: an
/// output cap of a step that fails on it was passed.
async fn termination_of(
    docker: &Docker,
    name: &str,
    state: &BackendState,
    reason: Option<Termination>,
    sample: &monitor::Sample,
    over_cap: bool,
) -> Result<(Termination, Option<i32>, Option<i32>), RuntimeError> {
    let info = docker
        .inspect_container(name, None)
        .await
        .map_err(|e| spawn_err(format!("inspect container {name}"), &e))?;
    let cstate = info.state.unwrap_or_default();
    if cstate.status == Some(ContainerStateStatusEnum::RUNNING) {
        return Err(RuntimeError::Spawn {
            operation: format!("wait for container {name}"),
            reason: "the engine reports it still running".to_string(),
        });
    }
    let code = cstate.exit_code.unwrap_or(-1) as i32;
    let oom = cstate.oom_killed == Some(true) || (sample.oom_kills > 0 && code != 0);
    let disk_full = state.layer_tmpfs && code != 0 && layer_full(&state.state_dir.join("layer"));
    Ok(match reason {
        Some(t) => (t, None, Some(9)),
        None if oom => (Termination::Memory, None, Some(9)),
        // Exited before the kill for a cap landed: asked to fail on a cap, it fails.
        None if over_cap => (Termination::Output, Some(code), None),
        None if sample.pids_limit_hits > 0 => (Termination::Pids, Some(code), None),
        None if disk_full => (Termination::Disk, Some(code), None),
        // docker-init (tini) exits 128+n when its child died of signal n.
        None if (129..=128 + 64).contains(&code) => (Termination::Signaled, None, Some(code - 128)),
        None => (Termination::Exited, Some(code), None),
    })
}

/// Waits until the container is not running (returns at once if it already stopped).
async fn first_exit(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
    let mut stream = docker.wait_container(
        name,
        Some(WaitContainerOptions {
            condition: "not-running".to_string(),
        }),
    );
    match stream.next().await {
        None | Some(Ok(_)) => Ok(()),
        // bollard reports a non-zero exit status as an error; it is an outcome here.
        Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => Ok(()),
        Some(Err(e)) => Err(spawn_err(format!("wait for container {name}"), &e)),
    }
}

fn layer_stat(layer: &Path) -> Option<(u64, u64)> {
    let st = rustix::fs::statvfs(layer).ok()?;
    let total = st.f_blocks * st.f_frsize;
    let free = st.f_bavail * st.f_frsize;
    Some((total, free))
}

fn layer_full(layer: &Path) -> bool {
    // A tmpfs has no reserve: a write that failed with ENOSPC leaves less than a page or so.
    layer_stat(layer).is_some_and(|(_, free)| free < 64 * 1024)
}

fn layer_used(layer: &Path) -> Option<u64> {
    layer_stat(layer).map(|(total, free)| total.saturating_sub(free))
}

/// The step's result JSON: `result.json` if it is a regular file holding a JSON object, else
/// its stdout if that is one (and was not truncated). A result that was there but cannot be
/// taken (too large, too deep, not an object) comes back as a note naming the limit, so it is
/// never dropped silently.
fn read_result(out_dir: &Path, pumped: &pump::Pumped) -> (Option<Value>, Option<String>) {
    fn parse(bytes: &[u8], what: &str) -> Result<Option<Value>, String> {
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => Ok(Some(v)),
            Ok(_) => Err(format!("{what} ignored: not a JSON object")),
            Err(e) if e.to_string().contains("recursion limit") => Err(format!(
                "{what} ignored: JSON nesting depth exceeds the limit of 128 levels"
            )),
            Err(e) => Err(format!("{what} ignored: not valid JSON ({e})")),
        }
    }
    let mut note = None;
    match hostfs::read_untrusted_file(out_dir, plan::RESULT_FILE, MAX_RESULT_JSON_BYTES) {
        Some(bytes) => match parse(&bytes, "result.json") {
            Ok(Some(v)) => return (Some(v), None),
            Ok(None) => {}
            Err(n) => note = Some(n),
        },
        None => {
            if let Ok(md) = std::fs::symlink_metadata(out_dir.join(plan::RESULT_FILE)) {
                note = Some(if md.len() > MAX_RESULT_JSON_BYTES && md.is_file() {
                    format!(
                        "result.json ignored: {} bytes exceeds the limit of {MAX_RESULT_JSON_BYTES} bytes",
                        md.len()
                    )
                } else {
                    "result.json ignored: not a regular file (symlinks are never followed)"
                        .to_string()
                });
            }
        }
    }
    if note.is_some() || pumped.stdout_truncated {
        return (None, note);
    }
    // Stdout that is not JSON at all is ordinary output, not a rejected result.
    let looks_json = pumped
        .stdout
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    match parse(&pumped.stdout, "result JSON on stdout") {
        Ok(v) => (v, None),
        Err(n) if looks_json => (None, Some(n)),
        Err(_) => (None, None),
    }
}

fn chown(path: &Path, uid: u32, gid: u32) -> Result<(), RuntimeError> {
    match std::os::unix::fs::chown(path, Some(uid), Some(gid)) {
        Ok(()) => Ok(()),
        // Not root: the directory is already ours, which is the project owner's when the
        // caller owns the project. Anything else surfaces when the step writes.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Ok(()),
        Err(e) => Err(RuntimeError::io("chown", path, e)),
    }
}
