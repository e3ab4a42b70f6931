//! The suites must be able to fail. This runs a few cases against `HostRunner`, a test double
//! that executes commands directly on the host with no isolation at all, and checks that each
//! case panics (and that a case about plain execution passes, so the harness itself works).
//!
//! Only cases whose attempts are harmless on an unconfined host are used: loopback
//! connections to a listener of this test, reading the environment, killing a victim process
//! this test spawned, and daemons that the suite kills afterwards. Rows that write to /etc or
//! exhaust resources are never run unconfined.

use std::path::PathBuf;
use std::time::Instant;

use async_trait::async_trait;
use serde_json::json;
use smithers_runtime::{
    CancellationToken, CollectReport, EnforcementReport, ExecOutcome, OutputEvent, OutputSink,
    RequestBundle, Runtime, RuntimeError, RuntimeKind, SandboxConfig, SandboxHandle, ShipReport,
    StepCommand, Termination,
};
use smithers_test_support::conformance::{run_case, CaseFuture, SuiteEnv};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Runs the command on the host, in the project directory, with the host's environment: the
/// opposite of a sandbox. A test double, never a runtime.
#[derive(Debug)]
struct HostRunner;

fn io_err(what: &'static str, path: &std::path::Path, e: std::io::Error) -> RuntimeError {
    RuntimeError::io(what, path, e)
}

#[async_trait]
impl Runtime for HostRunner {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Bubblewrap
    }

    async fn probe(&self) -> EnforcementReport {
        // Claims nothing is missing: a breach must then fail the row.
        EnforcementReport::default()
    }

    async fn create(&self, config: &SandboxConfig) -> Result<SandboxHandle, RuntimeError> {
        config.validate()?;
        let root = config
            .root_dir
            .join(".smithers/sandboxes")
            .join(&config.run_id)
            .join(&config.sandbox_id);
        if root.exists() {
            return Err(RuntimeError::OutOfOrder {
                verb: "create",
                reason: "exists".into(),
            });
        }
        for d in ["request", "result"] {
            std::fs::create_dir_all(root.join(d)).map_err(|e| io_err("mkdir", &root, e))?;
        }
        Ok(SandboxHandle {
            runtime: RuntimeKind::Bubblewrap,
            run_id: config.run_id.clone(),
            sandbox_id: config.sandbox_id.clone(),
            request_path: root.join("request"),
            result_path: root.join("result/bundle"),
            sandbox_root: root,
            container_id: None,
            workspace_id: None,
            backend: json!({
                "root": config.root_dir,
                "timeoutMs": config.controls.timeout_ms,
                "env": config.controls.env,
            }),
        })
    }

    async fn ship(
        &self,
        handle: &SandboxHandle,
        request: &RequestBundle,
    ) -> Result<ShipReport, RuntimeError> {
        let text = request.request.to_string();
        let path = handle.request_path.join("request.json");
        std::fs::write(&path, &text).map_err(|e| io_err("write", &path, e))?;
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
        let root = PathBuf::from(handle.backend["root"].as_str().unwrap_or("/"));
        // "/workspace" is the project itself here.
        let argv: Vec<String> = command
            .argv
            .iter()
            .map(|a| match a.strip_prefix("/workspace") {
                Some(rest) => format!("{}{rest}", root.display()),
                None => a.clone(),
            })
            .collect();
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(&root)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .env(
                "SMITHERS_SANDBOX_REQUEST_PATH",
                handle.request_path.join("request.json"),
            )
            .env(
                "SMITHERS_SANDBOX_RESULT_PATH",
                handle.sandbox_root.join("result.json"),
            );
        if let Some(env) = handle.backend["env"].as_object() {
            for (k, v) in env {
                cmd.env(k, v.as_str().unwrap_or_default());
            }
        }
        let start = Instant::now();
        // The suite has just copied the probe binary into the project; another test thread
        // forking in that moment holds the copy's write descriptor until its child execs, and
        // exec then fails with ETXTBSY. The window is short: retry a bounded number of times.
        let mut attempts = 0;
        let mut child = loop {
            match cmd.spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 50 => {
                    attempts += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                other => break other.map_err(|e| RuntimeError::spawn("spawn", e))?,
            }
        };
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let timeout = std::time::Duration::from_millis(
            handle.backend["timeoutMs"].as_u64().unwrap_or(60_000),
        );
        let sleep = tokio::time::sleep(timeout);
        tokio::pin!(sleep);
        let (mut out_done, mut err_done) = (false, false);
        let mut termination = Termination::Exited;
        // Only the direct child is killed: daemons it left behind survive, as they would
        // without a sandbox.
        let status = loop {
            tokio::select! {
                line = stdout.next_line(), if !out_done => match line {
                    Ok(Some(line)) => output.event(OutputEvent::Stdout { line, timestamp_ms: 0 }),
                    _ => out_done = true,
                },
                line = stderr.next_line(), if !err_done => match line {
                    Ok(Some(line)) => output.event(OutputEvent::Stderr { line, timestamp_ms: 0 }),
                    _ => err_done = true,
                },
                status = child.wait(), if out_done && err_done => {
                    break status.map_err(|e| RuntimeError::spawn("wait", e))?;
                }
                _ = &mut sleep => {
                    termination = Termination::Timeout;
                    let _ = child.kill().await;
                    break child.wait().await.map_err(|e| RuntimeError::spawn("wait", e))?;
                }
                _ = cancel.cancelled() => {
                    termination = Termination::Cancelled;
                    let _ = child.kill().await;
                    break child.wait().await.map_err(|e| RuntimeError::spawn("wait", e))?;
                }
            }
        };
        use std::os::unix::process::ExitStatusExt;
        if termination == Termination::Exited && status.signal().is_some() {
            termination = Termination::Signaled;
        }
        Ok(ExecOutcome {
            termination,
            exit_code: status.code(),
            signal: status.signal(),
            duration: start.elapsed(),
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            usage: Default::default(),
            enforcement: EnforcementReport::default(),
            result: None,
            egress: None,
            command_started_after_us: None,
        })
    }

    async fn collect(&self, handle: &SandboxHandle) -> Result<CollectReport, RuntimeError> {
        let bundle = &handle.result_path;
        std::fs::create_dir_all(bundle).map_err(|e| io_err("mkdir", bundle, e))?;
        let readme = json!({"status": "failed", "patches": []});
        std::fs::write(bundle.join("README.md"), readme.to_string())
            .map_err(|e| io_err("write", bundle, e))?;
        Ok(CollectReport {
            bundle_path: bundle.clone(),
            patch_count: 0,
            ignored_paths: vec![],
        })
    }

    async fn cleanup(&self, _handle: &SandboxHandle) -> Result<(), RuntimeError> {
        Ok(())
    }
}

fn make_env() -> SuiteEnv {
    SuiteEnv::new(std::sync::Arc::new(HostRunner))
}

/// Runs a case that must fail against the host runner; returns its panic message.
fn must_fail(name: &str, case: smithers_test_support::conformance::CaseFn) -> String {
    let result = std::panic::catch_unwind(|| run_case(name, make_env, case));
    match result {
        Err(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
        Ok(()) => panic!("{name} passed against a runner with no isolation at all"),
    }
}

macro_rules! case {
    ($path:path) => {{
        fn case(env: &SuiteEnv) -> CaseFuture<'_> {
            Box::pin($path(env))
        }
        case as smithers_test_support::conformance::CaseFn
    }};
}

#[test]
fn plain_execution_passes_so_the_harness_works() {
    run_case(
        "exit_code_is_an_outcome",
        make_env,
        case!(smithers_test_support::conformance::exit_code_is_an_outcome),
    );
}

#[test]
fn network_reachable_fails_the_case() {
    let msg = must_fail(
        "network_denied_by_default",
        case!(smithers_test_support::conformance::network_denied_by_default),
    );
    assert!(msg.contains("listener"), "{msg}");
    let msg = must_fail(
        "row01_host_loopback_unreachable",
        case!(smithers_test_support::containment::row01_host_loopback_unreachable),
    );
    assert!(msg.contains("row 1"), "{msg}");
}

#[test]
fn leaked_environment_fails_the_case() {
    let msg = must_fail(
        "env_cleared_except_allowlist",
        case!(smithers_test_support::conformance::env_cleared_except_allowlist),
    );
    assert!(msg.contains("secret") || msg.contains("leaked"), "{msg}");
}

#[test]
fn surviving_daemons_fail_the_case() {
    let msg = must_fail(
        "timeout_kills_everything",
        case!(smithers_test_support::conformance::timeout_kills_everything),
    );
    assert!(msg.contains("still alive"), "{msg}");
}

#[test]
fn a_killed_host_process_fails_the_row() {
    let msg = must_fail(
        "row06_host_processes_invisible",
        case!(smithers_test_support::containment::row06_host_processes_invisible),
    );
    assert!(msg.contains("row 6"), "{msg}");
}
