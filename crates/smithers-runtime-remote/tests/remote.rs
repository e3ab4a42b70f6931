//! The codeplane runtime against a real sandbox host on 127.0.0.1:0 (in-process, with the
//! host-process test double as the host's runtime): the five verbs end to end, fail-closed
//! errors, a step never run twice when a retry follows a dropped connection, cancellation.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smithers_errors::CodedError;
use smithers_runtime::{
    CancellationToken, OutputEvent, OutputSink, RequestBundle, Runtime, RuntimeError, RuntimeKind,
    SandboxConfig, StepCommand, Termination,
};
use smithers_runtime_remote::{RemoteOptions, RemoteRuntime, RetryPolicy};
use smithers_server::testing::HostProcessRuntime;
use smithers_server::{Limits, SandboxServer, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "remote-test-token-0123456789";

struct Host {
    addr: SocketAddr,
    runtime: Arc<HostProcessRuntime>,
    _data: tempfile::TempDir,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<Result<(), smithers_server::ServerError>>,
}

async fn start_host() -> Host {
    let data = tempfile::tempdir().unwrap();
    let runtime = Arc::new(HostProcessRuntime::new());
    let server = SandboxServer::new(
        ServerConfig {
            token: Some(TOKEN.into()),
            tokens: Vec::new(),
            data_dir: data.path().to_path_buf(),
            limits: Limits::default(),
            shutdown_grace: Duration::from_secs(10),
        },
        runtime.clone(),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.serve(listener, async move {
        let _ = rx.await;
    }));
    Host {
        addr,
        runtime,
        _data: data,
        stop,
        served,
    }
}

impl Host {
    async fn shutdown(self) {
        let _ = self.stop.send(());
        self.served.await.unwrap().unwrap();
    }
}

fn options(addr: SocketAddr, token: &str) -> RemoteOptions {
    let mut o = RemoteOptions::new(format!("http://{addr}"), token);
    o.retry = RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
    };
    o
}

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::create_dir_all(p.join("src")).unwrap();
    std::fs::write(p.join("src/a.txt"), "line from the project\n").unwrap();
    std::fs::create_dir_all(p.join(".git")).unwrap();
    std::fs::write(p.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::create_dir_all(p.join(".smithers")).unwrap();
    std::fs::write(p.join(".smithers/secret.txt"), "project state\n").unwrap();
    std::os::unix::fs::symlink("src/a.txt", p.join("link")).unwrap();
    dir
}

fn config(root: &std::path::Path, sandbox_id: &str) -> SandboxConfig {
    SandboxConfig {
        run_id: "run-remote".into(),
        sandbox_id: sandbox_id.into(),
        runtime: RuntimeKind::Codeplane,
        root_dir: root.to_path_buf(),
        image: None,
        controls: Default::default(),
        workspace_layers: Vec::new(),
    }
}

#[derive(Default)]
struct Lines(Mutex<Vec<String>>);

impl OutputSink for Lines {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Stdout { line, .. } = event {
            self.0.lock().unwrap().push(line);
        }
    }
}

fn sh(script: &str) -> StepCommand {
    StepCommand {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        cwd: None,
        stdin: Default::default(),
    }
}

fn request() -> RequestBundle {
    RequestBundle {
        request: serde_json::json!({"status": "pending", "sandboxId": "s", "runtime": "codeplane", "input": {"x": 1}}),
    }
}

#[tokio::test]
async fn five_verbs_end_to_end() {
    let host = start_host().await;
    let rt = RemoteRuntime::new(options(host.addr, TOKEN)).unwrap();
    assert_eq!(rt.kind(), RuntimeKind::Codeplane);
    let probe = rt.probe().await;
    assert!(probe.is_enforced("remote-host"), "{probe:?}");
    let proj = project();
    let handle = rt.create(&config(proj.path(), "e2e")).await.unwrap();
    assert!(handle.workspace_id.as_deref().unwrap().starts_with("sbx-"));
    let shipped = rt.ship(&handle, &request()).await.unwrap();
    assert!(shipped.bundle_size_bytes > 0);
    let lines = Lines::default();
    let script = r#"
        test ! -e .smithers/secret.txt || { echo "project .smithers was uploaded"; exit 3; }
        test -f .git/HEAD || { echo ".git missing"; exit 4; }
        test -L link || { echo "link is not a symlink"; exit 5; }
        cat link
        printf '{"status":"finished","outputs":{"ok":true}}' > "$SMITHERS_SANDBOX_RESULT_PATH"
    "#;
    let outcome = rt
        .execute(&handle, &sh(script), CancellationToken::new(), &lines)
        .await
        .unwrap();
    assert_eq!(
        (outcome.termination, outcome.exit_code),
        (Termination::Exited, Some(0)),
        "{:?}",
        lines.0.lock().unwrap()
    );
    assert_eq!(
        *lines.0.lock().unwrap(),
        vec!["line from the project".to_string()]
    );
    assert_eq!(outcome.result.as_ref().unwrap()["outputs"]["ok"], true);
    let report = rt.collect(&handle).await.unwrap();
    assert_eq!(report.bundle_path, handle.result_path);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.bundle_path.join("README.md")).unwrap())
            .unwrap();
    assert_eq!(manifest["status"], "finished");
    assert_eq!(manifest["outputs"]["ok"], true);
    assert!(report.bundle_path.join("logs/stream.ndjson").is_file());
    // Collect is repeatable (replaces the local copy).
    rt.collect(&handle).await.unwrap();
    rt.cleanup(&handle).await.unwrap();
    rt.cleanup(&handle).await.unwrap();
    assert!(!handle.request_path.exists());
    assert!(
        handle.result_path.join("README.md").is_file(),
        "cleanup keeps the bundle"
    );
    assert_eq!(host.runtime.executions(), 1);
    // The project itself was never written.
    assert_eq!(
        std::fs::read_to_string(proj.path().join("src/a.txt")).unwrap(),
        "line from the project\n"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn failed_step_is_an_outcome_with_a_bundle() {
    let host = start_host().await;
    let rt = RemoteRuntime::new(options(host.addr, TOKEN)).unwrap();
    let proj = project();
    let handle = rt.create(&config(proj.path(), "fails")).await.unwrap();
    rt.ship(&handle, &request()).await.unwrap();
    let outcome = rt
        .execute(
            &handle,
            &sh("echo nope; exit 7"),
            CancellationToken::new(),
            &Lines::default(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.exit_code, Some(7));
    assert!(!outcome.succeeded());
    let report = rt.collect(&handle).await.unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.bundle_path.join("README.md")).unwrap())
            .unwrap();
    assert_eq!(manifest["status"], "failed");
    rt.cleanup(&handle).await.unwrap();
    host.shutdown().await;
}

#[tokio::test]
async fn wrong_token_and_unreachable_host_fail_closed_with_the_fix() {
    let host = start_host().await;
    let proj = project();
    let rt = RemoteRuntime::new(options(host.addr, "not-the-token-at-all")).unwrap();
    let err = rt.create(&config(proj.path(), "denied")).await.unwrap_err();
    match &err {
        RuntimeError::Unavailable { fix, .. } => {
            assert!(
                fix.as_deref().unwrap().contains("CODEPLANE_API_KEY"),
                "{err}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.code().as_str(), "TASK_RUNTIME_UNAVAILABLE");
    let probe = rt.probe().await;
    assert!(!probe.is_enforced("remote-host"));

    // A port nobody listens on (bound, then released).
    let free = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let rt = RemoteRuntime::new(options(free, TOKEN)).unwrap();
    let err = rt
        .create(&config(proj.path(), "nowhere"))
        .await
        .unwrap_err();
    match &err {
        RuntimeError::Unavailable { fix, reason, .. } => {
            assert!(
                fix.as_deref().unwrap().contains("CODEPLANE_API_URL"),
                "{err}"
            );
            assert!(reason.contains(&free.to_string()), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(RemoteRuntime::new(RemoteOptions::new("not a url", TOKEN)).is_err());
    // A codeplane config with host volumes is refused before anything is sent.
    let rt = RemoteRuntime::new(options(host.addr, TOKEN)).unwrap();
    let mut c = config(proj.path(), "vol");
    c.controls.volumes.push(smithers_runtime::VolumeMount {
        host: "/data".into(),
        container: "/data".into(),
        readonly: true,
    });
    assert!(matches!(
        rt.create(&c).await,
        Err(RuntimeError::ControlUnsupported {
            control: "volumes",
            ..
        })
    ));
    host.shutdown().await;
}

/// A TCP proxy that, once armed, lets one `execute` request through to the host, waits for
/// the host's answer, and then drops the connection instead of delivering it.
async fn dropping_proxy(
    upstream: SocketAddr,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let armed = armed.clone();
            let dropped = dropped.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let kill = Arc::new(AtomicBool::new(false));
                let kill_up = kill.clone();
                let up = async move {
                    let mut buf = vec![0u8; 16384];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        if chunk.windows(8).any(|w| w == b"/execute")
                            && armed.swap(false, Ordering::SeqCst)
                        {
                            kill_up.store(true, Ordering::SeqCst);
                        }
                        if sw.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                };
                let down = async move {
                    let mut buf = vec![0u8; 16384];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if kill.load(Ordering::SeqCst) {
                            // The host answered execute: drop it on the floor.
                            dropped.store(true, Ordering::SeqCst);
                            return;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                tokio::select! {
                    _ = up => {}
                    _ = down => {}
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_retry_after_a_dropped_execute_never_runs_the_step_twice() {
    let host = start_host().await;
    let armed = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicBool::new(false));
    let proxy = dropping_proxy(host.addr, armed.clone(), dropped.clone()).await;
    let rt = RemoteRuntime::new(options(proxy, TOKEN)).unwrap();
    let proj = project();
    let handle = rt.create(&config(proj.path(), "retry")).await.unwrap();
    rt.ship(&handle, &request()).await.unwrap();
    armed.store(true, Ordering::SeqCst);
    let lines = Lines::default();
    let outcome = rt
        .execute(&handle, &sh("echo once"), CancellationToken::new(), &lines)
        .await
        .unwrap();
    assert!(
        dropped.load(Ordering::SeqCst),
        "the proxy never dropped the execute answer"
    );
    assert!(outcome.succeeded());
    assert_eq!(*lines.0.lock().unwrap(), vec!["once".to_string()]);
    assert_eq!(host.runtime.executions(), 1, "the step ran more than once");
    rt.collect(&handle).await.unwrap();
    rt.cleanup(&handle).await.unwrap();
    host.shutdown().await;
}

/// Cancels once the step printed its first line.
struct CancelOnFirstLine {
    token: CancellationToken,
    lines: Mutex<Vec<String>>,
}

impl OutputSink for CancelOnFirstLine {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Stdout { line, .. } = event {
            self.lines.lock().unwrap().push(line);
            self.token.cancel();
        }
    }
}

#[tokio::test]
async fn cancellation_reaches_the_host_and_the_bundle_says_cancelled() {
    let host = start_host().await;
    let rt = RemoteRuntime::new(options(host.addr, TOKEN)).unwrap();
    let proj = project();
    let handle = rt.create(&config(proj.path(), "cancel")).await.unwrap();
    rt.ship(&handle, &request()).await.unwrap();
    let token = CancellationToken::new();
    let sink = CancelOnFirstLine {
        token: token.clone(),
        lines: Mutex::new(Vec::new()),
    };
    let outcome = rt
        .execute(
            &handle,
            &sh("echo started; sleep 60; echo never"),
            token,
            &sink,
        )
        .await
        .unwrap();
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert_eq!(*sink.lines.lock().unwrap(), vec!["started".to_string()]);
    let report = rt.collect(&handle).await.unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.bundle_path.join("README.md")).unwrap())
            .unwrap();
    assert_eq!(manifest["status"], "cancelled");
    rt.cleanup(&handle).await.unwrap();
    host.shutdown().await;
}

#[tokio::test]
async fn a_refused_workspace_is_reported_with_the_hosts_code_not_as_a_network_error() {
    let host = start_host().await;
    let rt = RemoteRuntime::new(options(host.addr, TOKEN)).unwrap();
    let proj = tempfile::tempdir().unwrap();
    // A link out of the project, then a large incompressible file, so the host refuses the
    // archive long before the client finished sending it.
    std::os::unix::fs::symlink("/etc/passwd", proj.path().join("a-link")).unwrap();
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let noise: Vec<u8> = (0..8 * 1024 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(proj.path().join("big.bin"), noise).unwrap();
    let handle = rt.create(&config(proj.path(), "refused")).await.unwrap();
    let err = rt.ship(&handle, &request()).await.unwrap_err();
    assert_eq!(err.code().as_str(), "TOOL_PATH_ESCAPE", "{err}");
    assert!(err.to_string().contains("a-link"), "{err}");
    rt.cleanup(&handle).await.unwrap();
    host.shutdown().await;
}

/// A handle read back from a crafted database (it lives in the project tree) that names
/// another host: cleanup refuses it and never connects there, so our token never leaves for
/// a server we were not configured with; nor does it remove a directory outside the layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crafted_handle_naming_another_host_is_not_contacted() {
    let host = start_host().await;
    let attacker = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let attacker_addr = attacker.local_addr().unwrap();
    let contacted = Arc::new(AtomicBool::new(false));
    let flag = contacted.clone();
    let listening = tokio::spawn(async move {
        if let Ok((mut s, _)) = attacker.accept().await {
            flag.store(true, Ordering::SeqCst);
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
        }
    });
    let rt = RemoteRuntime::new(options(host.addr, TOKEN)).unwrap();
    let project = tempfile::tempdir().unwrap();
    let sandbox_root = project.path().join(".smithers/sandboxes/r1/s1");
    let handle = smithers_runtime::SandboxHandle {
        runtime: RuntimeKind::Codeplane,
        run_id: "r1".into(),
        sandbox_id: "s1".into(),
        request_path: sandbox_root.join("request"),
        result_path: sandbox_root.join("result"),
        sandbox_root,
        container_id: None,
        workspace_id: None,
        backend: serde_json::json!({
            "baseUrl": format!("http://{attacker_addr}"),
            "hostId": "sbx-0000",
            "rootDir": project.path(),
        }),
    };
    let err = rt.cleanup(&handle).await.expect_err("refused");
    assert!(err.to_string().contains("not contacted"), "{err}");
    // A host id that would splice a path into the URL is refused too.
    let mut spliced = handle.clone();
    spliced.backend["baseUrl"] = serde_json::json!(format!("http://{}", host.addr));
    spliced.backend["hostId"] = serde_json::json!("../../v1/sandboxes/x");
    assert!(rt.cleanup(&spliced).await.is_err());
    // And a request path outside the derived layout is never removed.
    let victim = tempfile::tempdir().unwrap();
    let mut outside = handle.clone();
    outside.request_path = victim.path().to_path_buf();
    assert!(rt.cleanup(&outside).await.is_err());
    assert!(victim.path().exists());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !contacted.load(Ordering::SeqCst),
        "cleanup connected to the host a crafted handle named"
    );
    listening.abort();
    host.shutdown().await;
}
