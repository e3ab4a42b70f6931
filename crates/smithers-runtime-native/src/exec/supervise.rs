//! A running step: its output pumped to the sink and the log, the init's status lines read
//! (egress listeners, the command's start, its exit), and the timeout, cancellation, output
//! cap and disk guard enforced by killing the sandbox.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use smithers_runtime::output::Capture;
use smithers_runtime::{
    CancellationToken, Controls, OutputEvent, OutputSink, OutputStream, RuntimeError, Termination,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::Notify;

use crate::backend::Backend;
use crate::cgroup::{CgroupStats, SandboxCgroups};
use crate::egress;
use crate::launcher::{spawn_err, SpawnedInit};
use crate::status::StatusReader;
use crate::threads::blocking;
use smithers_sandbox_init::sys;

use super::disk_guard::DiskGuard;
use super::pump::Pump;

/// How long a kill may take before we stop trusting the init and kill it ourselves.
pub(super) const KILL_GRACE: Duration = Duration::from_secs(5);

/// What a running step answers to, and reports to.
pub(super) struct Supervision<'a> {
    pub(super) sink: &'a dyn OutputSink,
    pub(super) controls: &'a Controls,
    pub(super) backend: &'a Backend,
    /// `HostCaps::disk_reserve` (see [`DiskGuard`]).
    pub(super) disk_reserve: u64,
    pub(super) cancel: CancellationToken,
    /// Told when the command has started (whether in the armed init it claimed).
    pub(super) started_hook: &'a (dyn Fn(bool) + Send + Sync),
    pub(super) armed_served: bool,
    /// When `execute` was called, on the wall clock and on the clock the sandbox shares.
    pub(super) called: Instant,
    pub(super) called_ns: u64,
}

/// What the step's run left, for its end to be read.
pub(super) struct Ran {
    out: Capture,
    err: Capture,
    events: Vec<Value>,
    engine: Option<smithers_egress::Engine>,
    reason: Option<Termination>,
    log: Vec<String>,
    command_started: Option<u64>,
    child: Option<tokio::process::Child>,
    live_tx: UnboundedSender<smithers_egress::EgressRecord>,
    live_rx: UnboundedReceiver<smithers_egress::EgressRecord>,
}

/// What happened, once the step is over and its sandbox's processes gone.
pub(super) struct Ended {
    pub(super) out: Capture,
    pub(super) err: Capture,
    /// The init's status lines (`ready`, `error`, `exit`).
    pub(super) events: Vec<Value>,
    /// Why the runtime ended the step, if it did.
    pub(super) reason: Option<Termination>,
    /// The log's output records so far.
    pub(super) log: Vec<String>,
    pub(super) command_started: Option<u64>,
    pub(super) duration: Duration,
    pub(super) stats: CgroupStats,
    pub(super) egress_summary: Option<smithers_egress::Summary>,
}

/// Relays an egress record to the sink, live.
fn forward(sink: &dyn OutputSink, r: smithers_egress::EgressRecord) {
    if let Ok(record) = serde_json::to_value(&r) {
        sink.event(OutputEvent::Egress {
            record,
            timestamp_ms: r.timestamp_ms,
        });
    }
}

impl Supervision<'_> {
    /// Runs the step to its end: pumps its output, reads the init's status, and ends it on a
    /// limit or a cancellation.
    pub(super) async fn run(
        &self,
        ours: UnixStream,
        spawned: SpawnedInit,
        ready: Option<Value>,
        egress_policy: Option<egress::Served>,
        denials_file: PathBuf,
    ) -> Result<Ran, RuntimeError> {
        let (sink, controls) = (self.sink, self.controls);
        let init_pid = spawned.pid;
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
        let live_fut = async {
            loop {
                tokio::select! {
                    r = live_rx.recv() => match r {
                        Some(r) => forward(sink, r),
                        None => break,
                    },
                    _ = live_done.cancelled() => break,
                }
            }
        };
        let command_started = OnceLock::new();
        let mut egress_policy = egress_policy;
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
                        let fds = reader.take_fds();
                        let policy = egress_policy.take();
                        match serve_egress(&v, fds, policy, &denials_file, &live_tx) {
                            Some(Ok(e)) => engine = Some(e),
                            Some(Err(error)) => events.push(error),
                            None => {}
                        }
                        continue;
                    }
                    if v["event"] == "started" {
                        let _ = command_started.set(self.command_started_at(&v));
                        (self.started_hook)(self.armed_served);
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
        let disk_guard = DiskGuard::new(self.backend, self.disk_reserve);
        let cgroups = &self.backend.cgroups;
        let control_fut = async {
            let reason = tokio::select! {
                _ = finished.notified() => None,
                _ = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => Some(Termination::Timeout),
                _ = self.cancel.cancelled() => Some(Termination::Cancelled),
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
                        let _ = sys::kill(pid, libc::SIGKILL);
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
        Ok(Ran {
            out,
            err,
            events,
            engine,
            reason,
            log: log.into_inner().unwrap_or_default(),
            command_started: command_started.get().copied(),
            child: spawned.child,
            live_tx,
            live_rx,
        })
    }

    /// When the init's spawn returned, on the clock the sandbox shares with us; else (a value
    /// off the clock's range since `called`) when we read it.
    fn command_started_at(&self, v: &Value) -> u64 {
        let seen_us = self.called.elapsed().as_micros() as u64;
        v["monotonicNs"]
            .as_u64()
            .and_then(|ns| ns.checked_sub(self.called_ns))
            .map(|ns| ns / 1000)
            .filter(|us| *us <= seen_us)
            .unwrap_or(seen_us)
    }
}

/// Serves P0's `egress` line (its listeners, `fds`) with the step's policy: the engine, or
/// the `error` event its start failed with; `None` without a policy (the descriptors are
/// closed).
fn serve_egress(
    v: &Value,
    fds: Vec<std::os::fd::OwnedFd>,
    policy: Option<egress::Served>,
    denials_file: &std::path::Path,
    live_tx: &UnboundedSender<smithers_egress::EgressRecord>,
) -> Option<Result<smithers_egress::Engine, Value>> {
    let names: Vec<String> = v["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    match policy {
        Some(policy) => {
            match egress::start(
                policy,
                &names,
                fds,
                denials_file.to_path_buf(),
                live_tx.clone(),
            ) {
                Ok(e) => Some(Ok(e)),
                Err(message) => Some(Err(json!({
                    "event": "error", "stage": "egress", "message": message,
                }))),
            }
        }
        None => {
            drop(fds);
            None
        }
    }
}

/// Once the step's run is over: the executed init reaped in the background, anything left in
/// the cgroups killed, the counters read and the egress engine stopped.
pub(super) async fn after_run(
    ran: Ran,
    started: Instant,
    cgroups: &SandboxCgroups,
    sink: &dyn OutputSink,
) -> Result<Ended, RuntimeError> {
    let Ran {
        out,
        err,
        events,
        engine,
        reason,
        log,
        command_started,
        child,
        live_tx,
        mut live_rx,
    } = ran;
    // The init has reported `exit` (every other sandbox process is gone) or closed its
    // descriptors. What is left is its own exit and the kernel tearing down the namespaces,
    // which the runtime need not wait for; an executed init is reaped in the background.
    if let Some(mut child) = child {
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
        blocking("kill what is left of the sandbox", move || {
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
        forward(sink, r);
    }
    Ok(Ended {
        out,
        err,
        events,
        reason,
        log,
        command_started,
        duration,
        stats,
        egress_summary,
    })
}
