//! Sandboxes of a case: creating, shipping and executing through the runtime under test, and
//! the output an execute captured.

use serde_json::{json, Value};
use smithers_errors::CodedError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smithers_runtime::{
    CancellationToken, CollectReport, Controls, ExecOutcome, OutputEvent, OutputSink,
    RequestBundle, RuntimeError, SandboxConfig, SandboxHandle, StepCommand,
};

use super::{unique, Project, Skip, SuiteEnv, VERBOSE_ENV};

/// Collects the live output of `execute` (its line events; of the relayed bytes only their
/// count, so that a flood is not held here) and wakes waiters on every line.
#[derive(Debug, Default)]
pub struct Captured {
    events: Mutex<Vec<OutputEvent>>,
    notify: tokio::sync::Notify,
    relayed_stdout: AtomicU64,
    relayed_stderr: AtomicU64,
}

impl OutputSink for Captured {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Output { stream, bytes, .. } = &event {
            let count = match stream {
                smithers_runtime::OutputStream::Stdout => &self.relayed_stdout,
                smithers_runtime::OutputStream::Stderr => &self.relayed_stderr,
            };
            count.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            return;
        }
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
        self.notify.notify_one();
    }
}

impl Captured {
    pub fn stdout(&self) -> Vec<String> {
        self.lines(true)
    }

    pub fn stderr(&self) -> Vec<String> {
        self.lines(false)
    }

    fn lines(&self, stdout: bool) -> Vec<String> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|e| match (e, stdout) {
                (OutputEvent::Stdout { line, .. }, true) => Some(line.clone()),
                (OutputEvent::Stderr { line, .. }, false) => Some(line.clone()),
                _ => None,
            })
            .collect()
    }

    /// Total bytes of captured lines (plus one newline each) on one stream.
    pub fn bytes(&self, stdout: bool) -> u64 {
        self.lines(stdout).iter().map(|l| l.len() as u64 + 1).sum()
    }

    /// Bytes of one stream relayed as written ([`OutputEvent::Output`]), whatever the caps.
    pub fn relayed(&self, stdout: bool) -> u64 {
        let count = if stdout {
            &self.relayed_stdout
        } else {
            &self.relayed_stderr
        };
        count.load(Ordering::Relaxed)
    }

    /// Waits until a stdout line contains `needle` (bounded by `limit`, a safety net only).
    pub async fn wait_for_stdout(&self, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.stdout().iter().any(|l| l.contains(needle)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ =
                tokio::time::timeout(left.min(Duration::from_millis(200)), self.notify.notified())
                    .await;
        }
    }

    /// The attack result lines (`{"attempt":..}`) printed on either stream.
    pub fn attempts(&self) -> Vec<Value> {
        self.stdout()
            .into_iter()
            .chain(self.stderr())
            .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
            .filter(|v| v.get("attempt").is_some())
            .collect()
    }

    /// Everything printed, for failure messages.
    pub fn dump(&self) -> String {
        let cut = |v: Vec<String>| {
            let s = v.join("\n");
            if s.len() > 4000 {
                format!(
                    "{}… ({} bytes)",
                    &s[..s.floor_char_boundary_compat(4000)],
                    s.len()
                )
            } else {
                s
            }
        };
        format!(
            "--- stdout ---\n{}\n--- stderr ---\n{}",
            cut(self.stdout()),
            cut(self.stderr())
        )
    }
}

trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorCharBoundary for String {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        i = i.min(self.len());
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

/// One execute's result: the outcome and the captured output.
#[derive(Debug)]
pub struct Exec {
    pub outcome: ExecOutcome,
    pub output: Arc<Captured>,
}

impl Exec {
    /// The result line of `attempt`; panics with the whole output when it is missing.
    pub fn attempt(&self, attempt: &str) -> Value {
        self.attempts(attempt)
            .into_iter()
            .next()
            .unwrap_or_else(|| {
                panic!(
                    "no result line for attempt {attempt:?}; outcome {:?}\n{}",
                    self.outcome,
                    self.output.dump()
                )
            })
    }

    /// Every result line of `attempt`, in order.
    pub fn attempts(&self, attempt: &str) -> Vec<Value> {
        self.output
            .attempts()
            .into_iter()
            .filter(|v| v["attempt"] == attempt)
            .collect()
    }
}

/// A created sandbox. Cleaned up on drop if the case did not (a failing case must not leak).
#[derive(Debug)]
pub struct Sandbox<'e> {
    pub env: &'e SuiteEnv,
    pub handle: SandboxHandle,
    pub config: SandboxConfig,
    cleaned: bool,
}

impl<'e> Sandbox<'e> {
    /// `create` over `project`; `Err` is the runtime's refusal, returned for the case to judge.
    pub async fn create(
        env: &'e SuiteEnv,
        project: &Project,
        controls: Controls,
    ) -> Result<Sandbox<'e>, RuntimeError> {
        let config = env.config(&project.root, &unique("sbx"), controls);
        let handle = create_placed(env, &config).await?;
        Ok(Sandbox {
            env,
            handle,
            config,
            cleaned: false,
        })
    }

    /// `ship` with a request carrying `input`.
    pub async fn ship(&self, input: Value) {
        let request = RequestBundle {
            request: json!({
                "status": "pending",
                "sandboxId": self.config.sandbox_id,
                "runtime": self.config.runtime.as_str(),
                "input": input,
            }),
        };
        self.env
            .runtime()
            .ship(&self.handle, &request)
            .await
            .unwrap_or_else(|e| panic!("ship failed: {}", e.report()));
    }

    /// `execute` of `argv` (panics on a runtime error: commands are outcomes, not errors).
    pub async fn exec(&self, argv: Vec<String>) -> Exec {
        self.exec_with(argv, CancellationToken::new())
            .await
            .unwrap_or_else(|e| panic!("execute failed: {}", e.report()))
    }

    /// `execute` with a caller-owned cancellation token; returns the runtime error, if any.
    pub async fn exec_with(
        &self,
        argv: Vec<String>,
        cancel: CancellationToken,
    ) -> Result<Exec, RuntimeError> {
        let output = Arc::new(Captured::default());
        let command = StepCommand {
            argv,
            cwd: None,
            stdin: Default::default(),
        };
        let outcome = self
            .env
            .runtime()
            .execute(&self.handle, &command, cancel, output.as_ref())
            .await?;
        if std::env::var_os(VERBOSE_ENV).is_some() {
            // For a person checking what the attacks really met, not for the assertions.
            println!(
                "[{}] {:?} exit={:?} signal={:?}",
                self.env.test_name, outcome.termination, outcome.exit_code, outcome.signal
            );
            for a in output.attempts() {
                println!("[{}]   {a}", self.env.test_name);
            }
        }
        Ok(Exec { outcome, output })
    }

    pub async fn collect(&self) -> Result<CollectReport, RuntimeError> {
        let r = self.env.runtime().collect(&self.handle).await;
        if std::env::var_os(VERBOSE_ENV).is_some() {
            match &r {
                Ok(report) => {
                    let readme = std::fs::read_to_string(report.bundle_path.join("README.md"))
                        .unwrap_or_default();
                    let cut = &readme[..readme.len().min(300)];
                    println!(
                        "[{}] collect ok: {} patches; README {} bytes: {}",
                        self.env.test_name,
                        report.patch_count,
                        readme.len(),
                        cut.replace('\n', " ")
                    );
                }
                Err(e) => println!("[{}] collect error: {}", self.env.test_name, e.report()),
            }
        }
        r
    }

    /// `cleanup`, which must succeed.
    pub async fn cleanup(&mut self) {
        self.cleaned = true;
        self.env
            .runtime()
            .cleanup(&self.handle)
            .await
            .unwrap_or_else(|e| panic!("cleanup failed: {}", e.report()));
    }
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // Best effort on the failure path: the case already panicked or returned early.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let runtime = self.env.runtime.clone();
            let handle = self.handle.clone();
            tokio::task::block_in_place(|| {
                let _ = rt.block_on(runtime.cleanup(&handle));
            });
        }
    }
}

/// Creates, ships and executes `argv` over a fresh project: the usual shape of a case.
/// `Err(Skip)` when the runtime is unavailable on this host.
pub async fn start<'e>(
    env: &'e SuiteEnv,
    project: &Project,
    controls: Controls,
) -> Result<Sandbox<'e>, Skip> {
    match Sandbox::create(env, project, controls).await {
        Ok(s) => Ok(s),
        Err(e) => Err(unavailable_or_panic(e)),
    }
}

/// `create` then `place`, as the orchestrator does (a fleet's lease is granted in `place`);
/// a sandbox whose place failed is cleaned up before the error is returned.
pub async fn create_placed(
    env: &SuiteEnv,
    config: &SandboxConfig,
) -> Result<SandboxHandle, RuntimeError> {
    let handle = env.runtime().create(config).await?;
    match env
        .runtime()
        .place(handle.clone(), &smithers_runtime::NoPlacementEvents)
        .await
    {
        Ok((placed, _)) => Ok(placed),
        Err(e) => {
            let _ = env.runtime().cleanup(&handle).await;
            Err(e)
        }
    }
}

/// A runtime that is unavailable on this host is a skip; any other create error is a failure.
pub fn unavailable_or_panic(e: RuntimeError) -> Skip {
    match e {
        RuntimeError::Unavailable {
            runtime,
            reason,
            fix,
        } => Skip(format!(
            "the {runtime} runtime is unavailable here: {reason}{}",
            fix.map(|f| format!(" (fix: {f})")).unwrap_or_default()
        )),
        other => panic!("create failed unexpectedly: {}", other.report()),
    }
}
