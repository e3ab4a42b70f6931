//! TEST DOUBLES ONLY. Nothing here is production code: the real sandbox runtime, bundle
//! validator and patch applier live in their own crates and are wired in by the binary.
//!
//! - [`HostProcessTestRuntime`] runs the step as a REAL child process on the host (no
//!   isolation at all), in its own process group so cancellation really kills the tree.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use serde_json::{json, Value};
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, ExecOutcome, OutputEvent, OutputSink,
    RequestBundle, ResourceUsage, Runtime, RuntimeError, RuntimeKind, SandboxConfig, SandboxHandle,
    ShipReport, StepCommand, Termination,
};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Runs the step on the host as a child process. A test double: it isolates nothing.
#[derive(Debug, Default)]
pub struct HostProcessTestRuntime {
    /// Verb that returns a runtime error instead of working.
    pub fail_on: Mutex<Option<&'static str>>,
    /// When set, the database at this path loses its events table right before the failing
    /// verb returns, so that recording the failure itself fails.
    pub break_db_on_fail: Mutex<Option<PathBuf>>,
    pub cleanup_fails: AtomicBool,
    /// Collect plants a symlink in the bundle (a hostile step's bundle).
    pub bundle_symlink: AtomicBool,
    pub cleanups: Mutex<Vec<SandboxHandle>>,
    /// Set when a cleanup begins.
    pub cleanup_started: Arc<AtomicBool>,
    outcomes: Mutex<HashMap<String, ExecOutcome>>,
}

impl HostProcessTestRuntime {
    fn injected(&self, verb: &'static str) -> Result<(), RuntimeError> {
        if *self.fail_on.lock().unwrap() == Some(verb) {
            if let Some(db) = self.break_db_on_fail.lock().unwrap().as_ref() {
                break_events_table(db);
            }
            return Err(RuntimeError::spawn(verb, "injected test failure"));
        }
        Ok(())
    }

    pub fn cleanup_count(&self) -> usize {
        self.cleanups.lock().unwrap().len()
    }
}

/// Drops the events table through a separate connection (a broken database).
fn break_events_table(db: &Path) {
    let conn = rusqlite::Connection::open(db).expect("open test database");
    conn.busy_timeout(std::time::Duration::from_secs(30))
        .unwrap();
    conn.execute_batch("DROP TABLE _smithers_events;")
        .expect("drop the events table");
}

fn out_dir(handle: &SandboxHandle) -> PathBuf {
    handle.sandbox_root.join("out")
}

fn io<'a>(op: &'static str, p: &'a Path) -> impl FnOnce(std::io::Error) -> RuntimeError + 'a {
    move |e| RuntimeError::io(op, p, e)
}

#[async_trait]
impl Runtime for HostProcessTestRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Bubblewrap
    }

    async fn probe(&self) -> EnforcementReport {
        EnforcementReport::default()
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        config.validate()?;
        let root = config
            .root_dir
            .join(".smithers/sandboxes")
            .join(&config.run_id)
            .join(&config.sandbox_id);
        for d in ["request", "out/patches"] {
            std::fs::create_dir_all(root.join(d)).map_err(io("create", &root))?;
        }
        self.injected("create")?;
        Ok(SandboxHandle {
            runtime: RuntimeKind::Bubblewrap,
            run_id: config.run_id.clone(),
            sandbox_id: config.sandbox_id.clone(),
            request_path: root.join("request"),
            result_path: root.join("result"),
            sandbox_root: root,
            container_id: None,
            workspace_id: None,
            backend: json!({"testDouble": true}),
        })
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        self.injected("ship")?;
        let text = serde_json::to_string_pretty(&request.request).unwrap();
        let path = handle.request_path.join("request.json");
        std::fs::write(&path, &text).map_err(io("write", &path))?;
        Ok(ShipReport {
            bundle_size_bytes: text.len() as u64,
        })
    }

    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        self.injected("execute")?;
        let out = out_dir(handle);
        let started = Instant::now();
        let mut child = tokio::process::Command::new(&command.argv[0])
            .args(&command.argv[1..])
            .current_dir(&out)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(
                "SMITHERS_SANDBOX_REQUEST_PATH",
                handle.request_path.join("request.json"),
            )
            .env("SMITHERS_SANDBOX_RESULT_PATH", out.join("result.json"))
            .env("OUT", &out)
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| RuntimeError::spawn("spawn step", e))?;
        let pgid = child.id().expect("running child has a pid");
        // Where a later process finds the step group if we die before it ends (crash tests).
        let pgid_file = out.join("step.pgid");
        std::fs::write(&pgid_file, pgid.to_string()).map_err(io("write", &pgid_file))?;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut cancelled = false;
        let mut stdout_bytes = 0u64;
        let status = loop {
            tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        stdout_bytes += line.len() as u64 + 1;
                        if let Some(p) = line.strip_prefix("HEARTBEAT ") {
                            output.event(OutputEvent::Heartbeat { progress: p.trim().parse().ok(), timestamp_ms: 0 });
                        } else {
                            output.event(OutputEvent::Stdout { line, timestamp_ms: 0 });
                        }
                    }
                    // stdout closed: wait for the exit (still cancellable).
                    _ => tokio::select! {
                        s = child.wait() => break s.map_err(|e| RuntimeError::spawn("wait step", e))?,
                        _ = cancel.cancelled(), if !cancelled => {
                            cancelled = true;
                            kill_group(pgid);
                            break child.wait().await.map_err(|e| RuntimeError::spawn("wait step", e))?;
                        }
                    },
                },
                _ = cancel.cancelled(), if !cancelled => {
                    cancelled = true;
                    // The whole process group: the step and everything it started.
                    kill_group(pgid);
                }
            }
        };
        // The group is gone: forget it, so cleanup never signals a reused process group id.
        let _ = std::fs::remove_file(&pgid_file);
        use std::os::unix::process::ExitStatusExt;
        let outcome = ExecOutcome {
            termination: if cancelled {
                Termination::Cancelled
            } else if status.signal().is_some() {
                Termination::Signaled
            } else {
                Termination::Exited
            },
            exit_code: status.code(),
            signal: status.signal(),
            duration: started.elapsed(),
            stdout_bytes,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            usage: ResourceUsage::default(),
            enforcement: EnforcementReport::default(),
            result: None,
            egress: None,
            command_started_after_us: None,
        };
        self.outcomes
            .lock()
            .unwrap()
            .insert(handle.sandbox_id.clone(), outcome.clone());
        Ok(outcome)
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        self.injected("collect")?;
        let out = out_dir(handle);
        let bundle = handle.result_path.clone();
        let _ = std::fs::remove_dir_all(&bundle);
        std::fs::create_dir_all(bundle.join("patches")).map_err(io("create", &bundle))?;
        let mut patches = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(out.join("patches"))
            .map_err(io("read", &out))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".patch"))
            .collect();
        names.sort();
        for n in names {
            std::fs::copy(
                out.join("patches").join(&n),
                bundle.join("patches").join(&n),
            )
            .map_err(io("copy", &bundle))?;
            patches.push(format!("patches/{n}"));
        }
        let outcome = self
            .outcomes
            .lock()
            .unwrap()
            .get(&handle.sandbox_id)
            .cloned();
        let exit_ok = outcome.as_ref().is_some_and(|o| o.succeeded());
        let result: Value = std::fs::read(out.join("result.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(json!({}));
        let status = match outcome.as_ref().map(|o| o.termination) {
            Some(Termination::Cancelled) => "cancelled".to_string(),
            _ => result
                .get("status")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| if exit_ok { "finished" } else { "failed" }.to_string()),
        };
        let mut manifest = serde_json::Map::new();
        if let Some(o) = result.get("outputs") {
            manifest.insert("outputs".into(), o.clone());
        }
        manifest.insert("status".into(), json!(status));
        manifest.insert("patches".into(), json!(patches));
        if self.bundle_symlink.load(Ordering::SeqCst) {
            std::fs::create_dir_all(bundle.join("artifacts")).map_err(io("create", &bundle))?;
            std::os::unix::fs::symlink("/etc/passwd", bundle.join("artifacts/passwd"))
                .map_err(io("symlink", &bundle))?;
        }
        // README.md last: its presence marks a complete bundle.
        std::fs::write(
            bundle.join("README.md"),
            serde_json::to_string_pretty(&Value::Object(manifest)).unwrap(),
        )
        .map_err(io("write", &bundle))?;
        Ok(CollectReport {
            bundle_path: bundle,
            patch_count: patches.len(),
            ignored_paths: vec![],
        })
    }

    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.cleanup_started.store(true, Ordering::SeqCst);
        self.cleanups.lock().unwrap().push(handle.clone());
        if self.cleanup_fails.load(Ordering::SeqCst) {
            return Err(RuntimeError::spawn("cleanup", "injected cleanup failure"));
        }
        // A step left running by a dead owner: kill its whole group (what a real runtime does
        // through its cgroup).
        if let Ok(pgid) = std::fs::read_to_string(out_dir(handle).join("step.pgid")) {
            if let Ok(pgid) = pgid.trim().parse::<u32>() {
                kill_group(pgid);
            }
        }
        let _ = std::fs::remove_dir_all(out_dir(handle));
        Ok(())
    }
}

fn kill_group(pgid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status();
}

/// Collects output lines; cancels `cancel_on` when a line equals `trigger`.
pub struct CancelOnLine {
    pub trigger: &'static str,
    pub token: CancellationToken,
    pub lines: Mutex<Vec<String>>,
}

impl OutputSink for CancelOnLine {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Stdout { line, .. } = event {
            if line == self.trigger {
                self.token.cancel();
            }
            self.lines.lock().unwrap().push(line);
        }
    }
}

/// Shared flag helper.
pub fn flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}
