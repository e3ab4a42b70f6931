//! **Test double, no isolation.** [`HostProcessRuntime`] runs the step as a plain child
//! process of the host, in the workspace directory, to test the HTTP layer and the remote
//! client end to end with real processes, real output, real cancellation and real bundles
//! while the native namespace runtime is elsewhere. It isolates nothing: its probe says so,
//! and it refuses every resource limit it cannot enforce. Only compiled with the
//! `test-runtime` feature; never give it to a product build.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde_json::{json, Value};
use smithers_bundle::{write_bundle, BundleStatus, WriteParams};
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, ExecOutcome, OutputEvent, OutputSink,
    Protection, ProtectionStatus, RequestBundle, ResourceUsage, Runtime, RuntimeError, RuntimeKind,
    SandboxConfig, SandboxHandle, ShipReport, StepCommand, Termination,
};
use tokio::io::{AsyncBufReadExt, BufReader};

const NAME: &str = "host-process test double";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What one execution left for collect.
#[derive(Debug, Clone)]
struct Ran {
    termination: Termination,
    exit_code: Option<i32>,
    result: Option<Value>,
    log: Vec<String>,
}

/// A runtime that runs steps as plain host processes (see the module docs). Counts the
/// executions it started, so tests can prove a step ran exactly once.
#[derive(Debug, Default)]
pub struct HostProcessRuntime {
    executions: AtomicU64,
    ran: Mutex<HashMap<String, Ran>>,
}

impl HostProcessRuntime {
    pub fn new() -> Self {
        HostProcessRuntime::default()
    }

    /// How many times `execute` started a process.
    pub fn executions(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }
}

fn root_dir(handle: &SandboxHandle) -> Result<PathBuf, RuntimeError> {
    handle
        .backend
        .get("rootDir")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .ok_or_else(|| RuntimeError::OutOfOrder {
            verb: "handle",
            reason: "not a host-process handle".into(),
        })
}

fn refuse(control: &'static str) -> RuntimeError {
    RuntimeError::ControlUnsupported {
        runtime: "bubblewrap",
        control,
        reason: format!("the {NAME} enforces no limits"),
    }
}

#[async_trait]
impl Runtime for HostProcessRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Bubblewrap
    }

    async fn probe(&self) -> EnforcementReport {
        EnforcementReport {
            runtime: Some(RuntimeKind::Bubblewrap),
            protections: ["network", "filesystem", "processes", "seccomp"]
                .into_iter()
                .map(|name| Protection {
                    name: name.into(),
                    status: ProtectionStatus::Unavailable,
                    detail: format!("{NAME}: no isolation"),
                    fix: Some("use the native runtime".into()),
                })
                .collect(),
        }
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        config.validate()?;
        let c = &config.controls;
        if c.memory_limit_bytes.is_some() {
            return Err(refuse("memoryLimit"));
        }
        if c.cpu_limit.is_some() {
            return Err(refuse("cpuLimit"));
        }
        if c.pids_limit.is_some() {
            return Err(refuse("pidsLimit"));
        }
        if c.disk_limit_bytes.is_some() {
            return Err(refuse("diskLimit"));
        }
        if !c.volumes.is_empty() {
            return Err(refuse("volumes"));
        }
        let sandbox_root = config
            .root_dir
            .join(".smithers/sandboxes")
            .join(&config.run_id)
            .join(&config.sandbox_id);
        let request_path = sandbox_root.join("request");
        let result_path = sandbox_root.join("result");
        std::fs::create_dir_all(&request_path)
            .map_err(|e| RuntimeError::io("create", &request_path, e))?;
        Ok(SandboxHandle {
            runtime: RuntimeKind::Bubblewrap,
            run_id: config.run_id.clone(),
            sandbox_id: config.sandbox_id.clone(),
            sandbox_root,
            request_path,
            result_path,
            container_id: None,
            workspace_id: None,
            backend: json!({
                "rootDir": config.root_dir,
                "env": config.controls.env,
                "maxOutputBytes": config.controls.max_output_bytes,
                "timeoutMs": config.controls.timeout_ms,
            }),
        })
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        let bytes = serde_json::to_vec_pretty(&request.request)
            .map_err(|e| RuntimeError::spawn("serialise request", e))?;
        let path = handle.request_path.join("request.json");
        std::fs::write(&path, &bytes).map_err(|e| RuntimeError::io("write", &path, e))?;
        Ok(ShipReport {
            bundle_size_bytes: bytes.len() as u64,
        })
    }

    async fn execute(
        &self,
        handle: &SandboxHandle,
        command: &StepCommand,
        cancel: CancellationToken,
        output: &dyn OutputSink,
    ) -> Result<ExecOutcome, RuntimeError> {
        let root = root_dir(handle)?;
        let cwd = match &command.cwd {
            Some(c) => root.join(c.trim_start_matches("/workspace").trim_start_matches('/')),
            None => root.clone(),
        };
        let result_file = handle.sandbox_root.join("result.json");
        let mut cmd = tokio::process::Command::new(&command.argv[0]);
        cmd.args(&command.argv[1..])
            .current_dir(&cwd)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(
                "SMITHERS_SANDBOX_REQUEST_PATH",
                handle.request_path.join("request.json"),
            )
            .env("SMITHERS_SANDBOX_RESULT_PATH", &result_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(env) = handle.backend.get("env").and_then(Value::as_object) {
            for (k, v) in env {
                cmd.env(k, v.as_str().unwrap_or_default());
            }
        }
        let max_output = handle
            .backend
            .get("maxOutputBytes")
            .and_then(Value::as_u64)
            .unwrap_or(1 << 20);
        let timeout = handle
            .backend
            .get("timeoutMs")
            .and_then(Value::as_u64)
            .map(Duration::from_millis);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| RuntimeError::spawn(format!("spawn {}", command.argv[0]), e))?;
        self.executions.fetch_add(1, Ordering::SeqCst);
        let pgid = child
            .id()
            .and_then(|p| rustix::process::Pid::from_raw(p as i32));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        {
            let out_fut = read_lines(stdout, max_output, true, output, log.clone());
            let err_fut = read_lines(stderr, max_output, false, output, log.clone());
            let wait = async {
                tokio::select! {
                    status = child.wait() => (status.ok(), Termination::Exited),
                    _ = cancel.cancelled() => (None, Termination::Cancelled),
                    _ = async {
                        match timeout {
                            Some(t) => tokio::time::sleep(t).await,
                            None => std::future::pending::<()>().await,
                        }
                    } => (None, Termination::Timeout),
                }
            };
            let (((ob, ot, text), (eb, et, _)), (status, termination)) =
                tokio::join!(async { tokio::join!(out_fut, err_fut) }, async {
                    let r = wait.await;
                    // Whatever ended it, kill the whole group: background children too.
                    if let Some(pgid) = pgid {
                        let _ = rustix::process::kill_process_group(
                            pgid,
                            rustix::process::Signal::KILL,
                        );
                    }
                    r
                });
            let _ = child.wait().await;
            let exit_code = status.and_then(|s| s.code());
            let signal = status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s));
            let termination = match (termination, signal) {
                (Termination::Exited, Some(_)) => Termination::Signaled,
                (t, _) => t,
            };
            // The step wrote it (on the host: this double isolates nothing): read through no
            // link and size-capped, as a real runtime reads a step's result.
            let ran_result = smithers_paths::Beneath::open(&handle.sandbox_root)
                .ok()
                .and_then(|b| {
                    b.read_regular(std::path::Path::new("result.json"), 1 << 20)
                        .ok()
                })
                .flatten()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .or_else(|| serde_json::from_str::<Value>(text.trim()).ok());
            let outcome = ExecOutcome {
                termination,
                exit_code,
                signal,
                duration: started.elapsed(),
                stdout_bytes: ob,
                stderr_bytes: eb,
                stdout_truncated: ot,
                stderr_truncated: et,
                usage: ResourceUsage::default(),
                enforcement: self.probe().await,
                result: ran_result.clone(),
                egress: None,
                command_started_after_us: None,
            };
            let ran = Ran {
                termination,
                exit_code,
                result: ran_result,
                log: std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner())),
            };
            self.ran
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(handle.sandbox_root.display().to_string(), ran);
            Ok(outcome)
        }
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let ran = self
            .ran
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&handle.sandbox_root.display().to_string())
            .cloned()
            .ok_or_else(|| RuntimeError::OutOfOrder {
                verb: "collect",
                reason: "nothing was executed".into(),
            })?;
        let status = match (ran.termination, ran.exit_code) {
            (Termination::Cancelled, _) => BundleStatus::Cancelled,
            (Termination::Exited, Some(0)) => BundleStatus::Finished,
            _ => BundleStatus::Failed,
        };
        let log_path = handle.sandbox_root.join("stream.ndjson");
        std::fs::write(&log_path, ran.log.join(""))
            .map_err(|e| RuntimeError::io("write", &log_path, e))?;
        let mut params = WriteParams::new(&handle.result_path, status);
        params.run_id = Some(handle.run_id.clone());
        params.output = ran.result.as_ref().and_then(|r| r.get("outputs").cloned());
        params.stream_log_path = Some(log_path);
        write_bundle(&params).map_err(|e| RuntimeError::inner("write the bundle", &e))?;
        Ok(CollectReport {
            bundle_path: handle.result_path.clone(),
            patch_count: 0,
            ignored_paths: Vec::new(),
        })
    }

    async fn cleanup(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        match std::fs::remove_dir_all(&handle.request_path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RuntimeError::io("remove", &handle.request_path, e)),
        }
    }
}

/// Reads lines, forwarding them while under `max` bytes; returns (bytes seen, truncated, the
/// captured text when it is stdout and small).
async fn read_lines<R: tokio::io::AsyncRead + Unpin>(
    reader: Option<R>,
    max: u64,
    is_stdout: bool,
    sink: &dyn OutputSink,
    log: Arc<Mutex<Vec<String>>>,
) -> (u64, bool, String) {
    let Some(reader) = reader else {
        return (0, false, String::new());
    };
    let mut lines = BufReader::new(reader).lines();
    let mut seen = 0u64;
    let mut truncated = false;
    let mut text = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        seen += line.len() as u64 + 1;
        if seen > max {
            truncated = true;
            continue;
        }
        if is_stdout {
            text.push_str(&line);
            text.push('\n');
        }
        let ts = now_ms();
        let stream = if is_stdout { "stdout" } else { "stderr" };
        log.lock().unwrap_or_else(|p| p.into_inner()).push(format!(
            "{}\n",
            json!({"type": stream, "line": line, "timestampMs": ts})
        ));
        sink.event(if is_stdout {
            OutputEvent::Stdout {
                line,
                timestamp_ms: ts,
            }
        } else {
            OutputEvent::Stderr {
                line,
                timestamp_ms: ts,
            }
        });
    }
    (seen, truncated, text)
}
