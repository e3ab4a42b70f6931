//! A started sandbox of a case, the output of its execs, and the host's view of its processes.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;
use smithers_errors::CodedError;
use smithers_runtime::{
    CancellationToken, ExecExit, ExecRequest, OutputEvent, OutputSink, OutputStream, RequestBundle,
    RuntimeError, SandboxHandle, StepStdin,
};

use super::EngineEnv;
use crate::conformance::{unique, Skip};

/// Keeps every byte an exec wrote, per stream, in order.
#[derive(Debug, Default)]
pub struct ByteSink {
    stdout: Mutex<Vec<u8>>,
    stderr: Mutex<Vec<u8>>,
}

impl OutputSink for ByteSink {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Output { stream, bytes, .. } = event {
            let buf = match stream {
                OutputStream::Stdout => &self.stdout,
                OutputStream::Stderr => &self.stderr,
            };
            buf.lock().unwrap_or_else(|e| e.into_inner()).extend(bytes);
        }
    }
}

impl ByteSink {
    pub fn stdout(&self) -> Vec<u8> {
        self.stdout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    pub fn stderr(&self) -> Vec<u8> {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// One exec's end and output.
#[derive(Debug)]
pub struct Ran {
    pub exit: ExecExit,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Ran {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// Panics unless the command exited 0.
    pub fn ok(self) -> Ran {
        assert_eq!(
            (self.exit.exit_code, self.exit.signal),
            (Some(0), None),
            "the command failed: {:?}\nstdout: {}\nstderr: {}",
            self.exit,
            self.stdout_text(),
            String::from_utf8_lossy(&self.stderr)
        );
        self
    }
}

/// A sandbox a case created, shipped and (usually) started; destroyed by [`Live::destroy`].
#[derive(Debug)]
pub struct Live<'e> {
    pub env: &'e EngineEnv,
    pub handle: SandboxHandle,
    pub project: PathBuf,
    /// The project's directory, owned by the first sandbox over it.
    _dir: Option<tempfile::TempDir>,
}

impl<'e> Live<'e> {
    /// A created and shipped sandbox over a fresh project (with `README.txt`), not started.
    /// An engine that cannot run here is a [`Skip`].
    pub async fn created(env: &'e EngineEnv) -> Result<Live<'e>, Skip> {
        let dir = tempfile::Builder::new()
            .prefix("smithers-engine-suite-")
            .tempdir()
            .expect("create a temp dir");
        let project = dir.path().join("project");
        std::fs::create_dir_all(&project).expect("mkdir project");
        std::fs::write(project.join("README.txt"), "from the host\n").expect("write");
        let config = env.config(&project, &unique("eng"));
        let handle = match env.engine().create(&config).await {
            Ok(h) => h,
            Err(RuntimeError::Unavailable { reason, .. }) => return Err(Skip::new(reason)),
            Err(e) => panic!("create failed: {}", e.report()),
        };
        let request = RequestBundle {
            request: json!({"status": "pending", "sandboxId": config.sandbox_id,
                "runtime": config.runtime.as_str(), "input": {}}),
        };
        env.engine()
            .ship(&handle, &request)
            .await
            .unwrap_or_else(|e| panic!("ship failed: {}", e.report()));
        Ok(Live {
            env,
            handle,
            project,
            _dir: Some(dir),
        })
    }

    /// Another sandbox over the same project, started from `layers` (a snapshot's).
    pub async fn forked(&self, layers: Vec<String>) -> Live<'e> {
        let mut config = self.env.config(&self.project, &unique("fork"));
        config.workspace_layers = layers;
        let engine = self.env.engine();
        let handle = engine
            .create(&config)
            .await
            .unwrap_or_else(|e| panic!("create the fork failed: {}", e.report()));
        let request = RequestBundle {
            request: json!({"status": "pending", "sandboxId": config.sandbox_id,
                "runtime": config.runtime.as_str(), "input": {}}),
        };
        engine
            .ship(&handle, &request)
            .await
            .unwrap_or_else(|e| panic!("ship failed: {}", e.report()));
        engine
            .start(&handle)
            .await
            .unwrap_or_else(|e| panic!("start the fork failed: {}", e.report()));
        Live {
            env: self.env,
            handle,
            project: self.project.clone(),
            _dir: None,
        }
    }

    /// A created, shipped and started sandbox.
    pub async fn started(env: &'e EngineEnv) -> Result<Live<'e>, Skip> {
        let live = Live::created(env).await?;
        live.env
            .engine()
            .start(&live.handle)
            .await
            .unwrap_or_else(|e| panic!("start failed: {}", e.report()));
        Ok(live)
    }

    /// Runs `script` with `sh -c` (panics on an engine error: commands are outcomes).
    pub async fn sh(&self, script: &str) -> Ran {
        self.run(sh(script)).await
    }

    pub async fn run(&self, request: ExecRequest) -> Ran {
        self.try_run(request, CancellationToken::new())
            .await
            .unwrap_or_else(|e| panic!("exec failed: {}", e.report()))
    }

    pub async fn try_run(
        &self,
        request: ExecRequest,
        cancel: CancellationToken,
    ) -> Result<Ran, RuntimeError> {
        let sink = ByteSink::default();
        let exit = self
            .env
            .engine()
            .exec(&self.handle, request, cancel, &sink)
            .await?;
        Ok(Ran {
            exit,
            stdout: sink.stdout(),
            stderr: sink.stderr(),
        })
    }

    pub async fn stop(&self) {
        self.env
            .engine()
            .stop(&self.handle)
            .await
            .unwrap_or_else(|e| panic!("stop failed: {}", e.report()));
    }

    pub async fn destroy(self) {
        self.env
            .engine()
            .destroy(&self.handle)
            .await
            .unwrap_or_else(|e| panic!("destroy failed: {}", e.report()));
    }
}

/// `sh -c script`, nothing else set.
pub fn sh(script: &str) -> ExecRequest {
    ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..ExecRequest::default()
    }
}

/// `sh -c script` with `bytes` as its stdin.
pub fn sh_with_stdin(script: &str, bytes: Vec<u8>) -> ExecRequest {
    ExecRequest {
        stdin: StepStdin::from_reader(std::io::Cursor::new(bytes)),
        ..sh(script)
    }
}

/// Pids of the host's processes whose command line holds `token` (the engines under this
/// suite run their sandboxes' processes on this host, visible in its `/proc`).
pub fn host_pids_with(token: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(token.len()).any(|w| w == token.as_bytes()))
        })
        .collect()
}

/// Waits (up to `limit`, a safety net) until no host process holds `token`.
pub async fn gone(token: &str, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if host_pids_with(token).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
