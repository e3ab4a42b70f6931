//! The docker runtime against a real engine. Needs `/var/run/docker.sock` (or `DOCKER_HOST`)
//! and the image `smithers-test:busybox` (`scripts/docker-up.sh` provides both). Without
//! them each test prints `SKIP <reason>` — and fails under `CI=true`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use bollard::query_parameters::{ListContainersOptions, ListVolumesOptions};
use bollard::Docker;
use smithers_errors::{CodedError, ErrorCode};
use smithers_runtime::{
    CancellationToken, Controls, OutputEvent, OutputSink, RequestBundle, Runtime, RuntimeError,
    RuntimeKind, SandboxConfig, SandboxHandle, StepCommand, Termination,
};
use smithers_runtime_docker::{default_socket, DockerOptions, DockerRuntime, OrphanFilter};

const IMAGE: &str = "smithers-test:busybox";

/// The runtime when the engine and the test image are there; None (after printing SKIP) when
/// not; a panic under CI=true, so a green CI run cannot be hollow.
async fn runtime_or_skip(test: &str) -> Option<DockerRuntime> {
    let socket = default_socket();
    let reason = if !Path::new(&socket).exists() {
        Some(format!(
            "no Docker engine socket at {socket} (run scripts/docker-up.sh)"
        ))
    } else {
        match Docker::connect_with_unix(&socket, 10, bollard::API_DEFAULT_VERSION) {
            Err(e) => Some(format!("cannot open {socket}: {e}")),
            Ok(d) => match d.negotiate_version().await {
                Err(e) => Some(format!("engine at {socket} does not answer: {e}")),
                Ok(d) => match d.inspect_image(IMAGE).await {
                    Err(_) => Some(format!("image {IMAGE} missing (run scripts/docker-up.sh)")),
                    Ok(_) => None,
                },
            },
        }
    };
    if let Some(reason) = reason {
        smithers_test_support::skip_or_fail_as(test, &reason);
        return None;
    }
    Some(DockerRuntime::new(options()))
}

fn options() -> DockerOptions {
    DockerOptions {
        watchdog: Some(env!("CARGO_BIN_EXE_smithers-docker-watchdog").into()),
        ..DockerOptions::default()
    }
}

async fn engine() -> Docker {
    Docker::connect_with_unix(&default_socket(), 30, bollard::API_DEFAULT_VERSION)
        .unwrap()
        .negotiate_version()
        .await
        .unwrap()
}

#[derive(Default)]
struct Lines(Mutex<Vec<(bool, String)>>);
impl OutputSink for Lines {
    fn event(&self, e: OutputEvent) {
        let mut v = self.0.lock().unwrap();
        match e {
            OutputEvent::Stdout { line, .. } => v.push((true, line)),
            OutputEvent::Stderr { line, .. } => v.push((false, line)),
            _ => {}
        }
    }
}
impl Lines {
    fn stdout(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| *o)
            .map(|(_, l)| l.clone())
            .collect()
    }
    fn stderr(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| !*o)
            .map(|(_, l)| l.clone())
            .collect()
    }
}

struct Sandbox {
    project: tempfile::TempDir,
    config: SandboxConfig,
}

fn sandbox(test: &str, controls: Controls) -> Sandbox {
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("hello.txt"), "hello\n").unwrap();
    std::fs::create_dir(project.path().join("src")).unwrap();
    std::fs::write(project.path().join("src/lib.rs"), "fn a() {}\n").unwrap();
    std::fs::create_dir_all(project.path().join(".smithers")).unwrap();
    std::fs::write(project.path().join(".smithers/secret.db"), "db").unwrap();
    let config = SandboxConfig {
        run_id: format!("t{}-{test}", std::process::id()),
        sandbox_id: "sb1".to_string(),
        runtime: RuntimeKind::Docker,
        root_dir: project.path().to_path_buf(),
        image: Some(IMAGE.to_string()),
        controls,
        workspace_layers: Vec::new(),
    };
    Sandbox { project, config }
}

fn sh(script: &str) -> StepCommand {
    StepCommand {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        cwd: None,
        stdin: Default::default(),
    }
}

async fn run(
    rt: &DockerRuntime,
    sb: &Sandbox,
    script: &str,
) -> (SandboxHandle, smithers_runtime::ExecOutcome, Lines) {
    let handle = rt.create(&sb.config).await.expect("create");
    rt.ship(
        &handle,
        &RequestBundle {
            request: serde_json::json!({"status": "pending", "input": {"x": 1}}),
        },
    )
    .await
    .expect("ship");
    let lines = Lines::default();
    let outcome = rt
        .execute(&handle, &sh(script), CancellationToken::new(), &lines)
        .await
        .expect("execute");
    (handle, outcome, lines)
}

async fn labelled(run_id: &str) -> (usize, usize) {
    let d = engine().await;
    let filters = HashMap::from([(
        "label".to_string(),
        vec![format!("smithers.run_id={run_id}")],
    )]);
    let c = d
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters.clone()),
            ..Default::default()
        }))
        .await
        .unwrap();
    let v = d
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(filters),
        }))
        .await
        .unwrap();
    (c.len(), v.volumes.unwrap_or_default().len())
}

#[tokio::test(flavor = "multi_thread")]
async fn echo_request_result_and_bundle() {
    let Some(rt) = runtime_or_skip("echo_request_result_and_bundle").await else {
        return;
    };
    let sb = sandbox("echo", Controls::default());
    let (h, o, lines) = run(
        &rt,
        &sb,
        "echo hello; echo oops >&2; cat $SMITHERS_SANDBOX_REQUEST_PATH | tr -d ' \\n'; echo; \
         echo '{\"status\":\"finished\",\"outputs\":{\"n\":42}}' > $SMITHERS_SANDBOX_RESULT_PATH; \
         echo art > /result/a.txt",
    )
    .await;
    assert_eq!(o.termination, Termination::Exited, "{o:?}");
    assert_eq!(o.exit_code, Some(0));
    let out = lines.stdout();
    assert_eq!(out[0], "hello");
    assert!(out[1].contains("\"input\":{\"x\":1}"), "{out:?}");
    assert_eq!(lines.stderr(), vec!["oops".to_string()]);
    assert_eq!(o.result.as_ref().unwrap()["outputs"]["n"], 42);
    let report = rt.collect(&h).await.expect("collect");
    let readme: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.bundle_path.join("README.md")).unwrap())
            .unwrap();
    assert_eq!(readme["status"], "finished");
    assert_eq!(readme["outputs"]["n"], 42);
    assert_eq!(readme["patches"], serde_json::json!([]));
    assert_eq!(
        std::fs::read_to_string(report.bundle_path.join("artifacts/a.txt")).unwrap(),
        "art\n"
    );
    let log = std::fs::read_to_string(report.bundle_path.join("logs/stream.ndjson")).unwrap();
    assert!(log.contains("\"line\":\"hello\""));
    assert!(log.contains("\"type\":\"exit\""));
    smithers_bundle::validate_bundle(&report.bundle_path).expect("bundle validates");
    rt.cleanup(&h).await.expect("cleanup");
    drop(sb.project);
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_code_is_an_outcome_and_bundle_is_failed() {
    let Some(rt) = runtime_or_skip("exit_code").await else {
        return;
    };
    let sb = sandbox("exit", Controls::default());
    let (h, o, _) = run(&rt, &sb, "exit 3").await;
    assert_eq!(o.termination, Termination::Exited);
    assert_eq!(o.exit_code, Some(3));
    assert!(!o.succeeded());
    let r = rt.collect(&h).await.unwrap();
    let readme = std::fs::read_to_string(r.bundle_path.join("README.md")).unwrap();
    assert!(readme.contains("\"status\": \"failed\""), "{readme}");
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_command_is_an_outcome() {
    let Some(rt) = runtime_or_skip("missing_command").await else {
        return;
    };
    let sb = sandbox("nocmd", Controls::default());
    let h = rt.create(&sb.config).await.unwrap();
    rt.ship(
        &h,
        &RequestBundle {
            request: serde_json::json!({}),
        },
    )
    .await
    .unwrap();
    let lines = Lines::default();
    let o = rt
        .execute(
            &h,
            &StepCommand {
                argv: vec!["/no/such/binary".into()],
                cwd: None,
                stdin: Default::default(),
            },
            CancellationToken::new(),
            &lines,
        )
        .await
        .expect("a missing binary is the step's failure, not the runtime's");
    assert!(!o.succeeded());
    assert_ne!(o.exit_code, Some(0));
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn workspace_is_copy_on_write_and_becomes_patches() {
    let Some(rt) = runtime_or_skip("workspace_cow").await else {
        return;
    };
    let sb = sandbox("cow", Controls::default());
    let (h, o, lines) = run(
        &rt,
        &sb,
        "cd /workspace && echo changed > hello.txt && echo new > new.txt && rm src/lib.rs && \
         ls -A .smithers | wc -l && (echo x > .smithers/y 2>/dev/null && echo writable || echo ro)",
    )
    .await;
    assert!(o.succeeded(), "{o:?} {:?}", lines.stderr());
    assert_eq!(lines.stdout(), vec!["0".to_string(), "ro".to_string()]);
    // The host tree is untouched until a patch is applied.
    let root = sb.project.path();
    assert_eq!(
        std::fs::read_to_string(root.join("hello.txt")).unwrap(),
        "hello\n"
    );
    assert!(!root.join("new.txt").exists());
    assert!(root.join("src/lib.rs").exists());
    let r = rt.collect(&h).await.unwrap();
    assert_eq!(r.patch_count, 3);
    let mut all = String::new();
    for e in std::fs::read_dir(r.bundle_path.join("patches")).unwrap() {
        all.push_str(&std::fs::read_to_string(e.unwrap().path()).unwrap());
    }
    assert!(all.contains("+changed"), "{all}");
    assert!(all.contains("+new"));
    assert!(all.contains("deleted file mode"));
    smithers_bundle::validate_bundle(&r.bundle_path).unwrap();
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn network_is_none_by_default() {
    let Some(rt) = runtime_or_skip("network_none").await else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let sb = sandbox("net", Controls::default());
    let (h, o, lines) = run(
        &rt,
        &sb,
        &format!(
            "ls /sys/class/net; if nc -w 2 127.0.0.1 {port} </dev/null; then echo CONNECTED; fi; \
             if wget -q -T 2 -O- http://1.1.1.1/ ; then echo OUTSIDE; fi; true"
        ),
    )
    .await;
    assert!(o.succeeded());
    let out = lines.stdout();
    assert_eq!(out.first().map(String::as_str), Some("lo"), "{out:?}");
    assert!(
        !out.iter().any(|l| l == "CONNECTED" || l == "OUTSIDE"),
        "{out:?}"
    );
    assert!(o.enforcement.is_enforced("network"));
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn host_env_does_not_leak_and_step_env_arrives() {
    let Some(rt) = runtime_or_skip("env").await else {
        return;
    };
    let mut controls = Controls::default();
    controls.env.insert("STEP_VAR".into(), "step-value".into());
    let sb = sandbox("env", controls);
    // Whatever the host process has (HOME, CARGO_*, USER...), only the allowlist goes in.
    let (h, o, lines) = run(&rt, &sb, "env | cut -d= -f1 | sort; echo STEP=$STEP_VAR").await;
    assert!(o.succeeded());
    let out = lines.stdout();
    assert!(out.contains(&"STEP=step-value".to_string()));
    for name in out.iter().filter(|l| !l.contains('=')) {
        assert!(
            matches!(
                name.as_str(),
                "PATH"
                    | "HOME"
                    | "TMPDIR"
                    | "HOSTNAME"
                    | "PWD"
                    | "SHLVL"
                    | "STEP_VAR"
                    | "SMITHERS_SANDBOX_REQUEST_PATH"
                    | "SMITHERS_SANDBOX_RESULT_PATH"
                    | "SMITHERS_SANDBOX_ID"
                    | "SMITHERS_RUN_ID"
                    | "SMITHERS_RUNTIME"
            ),
            "unexpected variable {name} inside the sandbox"
        );
    }
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_limit_oom_is_reported() {
    let Some(rt) = runtime_or_skip("memory_oom").await else {
        return;
    };
    let sb = sandbox(
        "oom",
        Controls {
            memory_limit_bytes: Some(32 << 20),
            timeout_ms: Some(60_000),
            ..Controls::default()
        },
    );
    let (h, o, _) = run(
        &rt,
        &sb,
        "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}",
    )
    .await;
    assert_eq!(o.termination, Termination::Memory, "{o:?}");
    let r = rt.collect(&h).await.unwrap();
    let readme = std::fs::read_to_string(r.bundle_path.join("README.md")).unwrap();
    assert!(readme.contains("\"status\": \"failed\""));
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn pids_limit_caps_a_fork_bomb() {
    let Some(rt) = runtime_or_skip("pids_limit").await else {
        return;
    };
    let sb = sandbox(
        "pids",
        Controls {
            pids_limit: Some(20),
            timeout_ms: Some(60_000),
            ..Controls::default()
        },
    );
    let (h, o, _) = run(&rt, &sb, "for i in $(seq 1 60); do sleep 3 & done; wait").await;
    assert_eq!(o.termination, Termination::Pids, "{o:?}");
    assert!(o.usage.max_pids.unwrap_or(0) <= 20, "{o:?}");
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_kills_everything() {
    let Some(rt) = runtime_or_skip("timeout").await else {
        return;
    };
    let sb = sandbox(
        "timeout",
        Controls {
            timeout_ms: Some(1500),
            ..Controls::default()
        },
    );
    // A TERM-ignoring, double-forked background child and a foreground sleeper.
    let (h, o, _) = run(
        &rt,
        &sb,
        "trap '' TERM; (setsid sh -c 'trap \"\" TERM; sleep 300' &) ; sleep 300",
    )
    .await;
    assert_eq!(o.termination, Termination::Timeout, "{o:?}");
    let info = engine()
        .await
        .inspect_container(h.workspace_id.as_deref().unwrap(), None)
        .await
        .unwrap();
    assert_eq!(info.state.unwrap().running, Some(false));
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn cancellation_kills_and_bundle_is_cancelled() {
    let Some(rt) = runtime_or_skip("cancellation").await else {
        return;
    };
    let sb = sandbox("cancel", Controls::default());
    let h = rt.create(&sb.config).await.unwrap();
    rt.ship(
        &h,
        &RequestBundle {
            request: serde_json::json!({}),
        },
    )
    .await
    .unwrap();
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        c2.cancel();
    });
    let o = rt
        .execute(
            &h,
            &sh("echo started; sleep 300"),
            cancel,
            &Lines::default(),
        )
        .await
        .unwrap();
    assert_eq!(o.termination, Termination::Cancelled);
    let r = rt.collect(&h).await.unwrap();
    let readme = std::fs::read_to_string(r.bundle_path.join("README.md")).unwrap();
    assert!(readme.contains("\"status\": \"cancelled\""));
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn output_is_capped_and_truncation_recorded() {
    let Some(rt) = runtime_or_skip("output_cap").await else {
        return;
    };
    let sb = sandbox(
        "outcap",
        Controls {
            max_output_bytes: 1000,
            ..Controls::default()
        },
    );
    let (h, o, _) = run(&rt, &sb, "head -c 1000000 /dev/zero | tr '\\0' x").await;
    assert!(o.succeeded());
    assert!(o.stdout_truncated);
    assert_eq!(o.stdout_bytes, 1_000_000);
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_outside_workspace_are_denied() {
    let Some(rt) = runtime_or_skip("readonly_root").await else {
        return;
    };
    let sb = sandbox("rofs", Controls::default());
    let (h, o, lines) = run(
        &rt,
        &sb,
        "for p in /etc/x /usr/x /bin/x /x; do (echo x > $p) 2>/dev/null && echo WROTE $p; done; \
         echo ok > /tmp/t && cat /tmp/t; grep CapEff /proc/self/status",
    )
    .await;
    assert!(o.succeeded());
    let out = lines.stdout();
    assert!(!out.iter().any(|l| l.starts_with("WROTE")), "{out:?}");
    assert!(out.contains(&"ok".to_string()));
    assert!(
        out.iter().any(|l| l.ends_with("0000000000000000")),
        "{out:?}"
    );
    rt.cleanup(&h).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn cleanup_leaves_nothing_and_is_idempotent() {
    let Some(rt) = runtime_or_skip("cleanup").await else {
        return;
    };
    let sb = sandbox("cleanup", Controls::default());
    let (h, o, _) = run(&rt, &sb, "echo x > /workspace/f").await;
    assert!(o.succeeded());
    assert_eq!(labelled(&sb.config.run_id).await, (1, 1));
    let state: smithers_runtime_docker::BackendState =
        serde_json::from_value(h.backend.clone()).unwrap();
    assert!(state.upper.join("f").exists());
    rt.cleanup(&h).await.unwrap();
    assert_eq!(labelled(&sb.config.run_id).await, (0, 0));
    assert!(!state.state_dir.exists());
    assert!(!h.request_path.exists());
    // Again, and from a fresh runtime instance (another process would hold only the handle).
    rt.cleanup(&h).await.unwrap();
    DockerRuntime::new(DockerOptions::default())
        .cleanup(&h)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn orphans_of_dead_owners_are_removed() {
    let Some(rt) = runtime_or_skip("orphans").await else {
        return;
    };
    let sb = sandbox("orphans", Controls::default());
    let h = rt.create(&sb.config).await.unwrap();
    // Our own (live) objects are left alone by default...
    let report = rt
        .cleanup_orphans(&OrphanFilter {
            run_id: Some(sb.config.run_id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(report.volumes.is_empty(), "{report:?}");
    // ...a dead owner's are removed: simulate one with a volume labelled for a pid that
    // cannot exist.
    let d = engine().await;
    let name = format!("smithers-orphan-{}", std::process::id());
    d.create_volume(bollard::models::VolumeCreateRequest {
        name: Some(name.clone()),
        labels: Some(HashMap::from([
            ("smithers.managed".to_string(), "true".to_string()),
            ("smithers.run_id".to_string(), sb.config.run_id.clone()),
            ("smithers.owner_pid".to_string(), "999999999".to_string()),
            ("smithers.owner_start".to_string(), "1".to_string()),
        ])),
        ..Default::default()
    })
    .await
    .unwrap();
    let report = rt
        .cleanup_orphans(&OrphanFilter {
            run_id: Some(sb.config.run_id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(report.volumes, vec![name]);
    rt.cleanup(&h).await.unwrap();
    assert_eq!(labelled(&sb.config.run_id).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_image_fails_closed() {
    let Some(rt) = runtime_or_skip("missing_image").await else {
        return;
    };
    let mut sb = sandbox("noimage", Controls::default());
    sb.config.image = Some("smithers-test:does-not-exist".into());
    let err = rt.create(&sb.config).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Unavailable { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::TaskRuntimeUnavailable);
    let text = err.to_string();
    assert!(text.contains("smithers-test:does-not-exist"), "{text}");
    assert!(format!("{:?}", err.details()).contains("docker import"));
    // Nothing was left behind.
    assert_eq!(labelled(&sb.config.run_id).await, (0, 0));
    assert!(!sb.project.path().join(".smithers/sandboxes").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_engine_fails_closed() {
    // No engine needed: this is the case without one.
    let rt = DockerRuntime::new(DockerOptions {
        socket: "/nonexistent/smithers/docker.sock".into(),
        ..DockerOptions::default()
    });
    let sb = sandbox("noengine", Controls::default());
    let err = rt.create(&sb.config).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Unavailable { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::TaskRuntimeUnavailable);
    assert!(err
        .to_string()
        .contains("/nonexistent/smithers/docker.sock"));
    assert!(format!("{:?}", err.details()).contains("start the Docker engine"));
    let report = rt.probe().await;
    assert_eq!(
        report.get("engine").unwrap().status,
        smithers_runtime::ProtectionStatus::Unavailable
    );
    // A socket path that exists but is not an engine.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake.sock");
    let _l = std::os::unix::net::UnixListener::bind(&fake).unwrap();
    drop(_l);
    let rt = DockerRuntime::new(DockerOptions {
        socket: fake.to_string_lossy().into_owned(),
        ..DockerOptions::default()
    });
    let err = rt.create(&sb.config).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Unavailable { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn unsupported_controls_are_refused() {
    let rt = DockerRuntime::new(DockerOptions::default());
    let mut sb = sandbox("refuse", Controls::default());
    sb.config.controls.workspace = Some(smithers_runtime::WorkspaceSpec {
        name: "w".into(),
        snapshot_id: None,
        idle_timeout_secs: None,
        persistence: Default::default(),
    });
    let err = rt.create(&sb.config).await.unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::ControlUnsupported {
                control: "workspace",
                ..
            }
        ),
        "{err:?}"
    );
    sb.config.controls.workspace = None;
    sb.config.image = None;
    let err = rt.create(&sb.config).await.unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::InvalidControl {
                control: "image",
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_reports_the_engine() {
    let Some(rt) = runtime_or_skip("probe").await else {
        return;
    };
    let report = rt.probe().await;
    let engine = report.get("engine").unwrap();
    assert_eq!(engine.status, smithers_runtime::ProtectionStatus::Enforced);
    assert!(engine.detail.contains("cgroup driver"), "{engine:?}");
    assert!(report.is_enforced("network"));
    assert!(report.is_enforced("pids"));
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_limit_caps_workspace_and_tmp() {
    let Some(rt) = runtime_or_skip("disk_limit").await else {
        return;
    };
    let sb = sandbox(
        "disk",
        Controls {
            disk_limit_bytes: Some(8 << 20),
            timeout_ms: Some(60_000),
            ..Controls::default()
        },
    );
    let h = match rt.create(&sb.config).await {
        Ok(h) => h,
        // Without CAP_SYS_ADMIN the workspace layer cannot be capped: refused, never ignored.
        Err(RuntimeError::ControlUnsupported { control, .. }) => {
            assert_eq!(control, "diskLimit");
            return;
        }
        Err(e) => panic!("create: {e}"),
    };
    rt.ship(
        &h,
        &RequestBundle {
            request: serde_json::json!({}),
        },
    )
    .await
    .unwrap();
    let lines = Lines::default();
    let o = rt
        .execute(
            &h,
            &sh("head -c 20000000 /dev/zero > /tmp/big; echo tmp=$?; \
                 head -c 20000000 /dev/zero > /workspace/big; echo ws=$?; exit 1"),
            CancellationToken::new(),
            &lines,
        )
        .await
        .unwrap();
    let out = lines.stdout();
    assert!(
        out.iter().any(|l| l.starts_with("tmp=") && l != "tmp=0"),
        "{out:?}"
    );
    assert!(
        out.iter().any(|l| l.starts_with("ws=") && l != "ws=0"),
        "{out:?}"
    );
    assert_eq!(o.termination, Termination::Disk, "{o:?}");
    assert!(o.usage.disk_bytes.unwrap_or(0) <= 8 << 20, "{o:?}");
    assert!(!sb.project.path().join("big").exists());
    rt.cleanup(&h).await.unwrap();
    let state: smithers_runtime_docker::BackendState =
        serde_json::from_value(h.backend.clone()).unwrap();
    assert!(!state.state_dir.exists());
}

/// A handle as a crafted database would hold it: the layout `create` derives for `run`/`sb`
/// in `project` (so only the engine objects' labels stand in the way), or with `name` in
/// place of the derived object name.
fn crafted_handle(rt: &DockerRuntime, project: &Path, run: &str, name: &str) -> SandboxHandle {
    let sandbox_root = project.join(".smithers/sandboxes").join(run).join("sb1");
    let state_dir = rt.options().state_root.join(name);
    let layer = state_dir.join("layer");
    let state = smithers_runtime_docker::BackendState {
        socket: default_socket(),
        container_name: name.to_string(),
        volume_name: name.to_string(),
        image: IMAGE.to_string(),
        user: "0:0".to_string(),
        upper: layer.join("upper"),
        work: layer.join("work"),
        out_dir: state_dir.join("out"),
        artifacts_dir: state_dir.join("artifacts"),
        state_dir,
        layer_tmpfs: false,
        hide_smithers_dir: true,
        pids_cgroup: None,
    };
    SandboxHandle {
        runtime: RuntimeKind::Docker,
        run_id: run.to_string(),
        sandbox_id: "sb1".to_string(),
        request_path: sandbox_root.join("request"),
        result_path: sandbox_root.join("result"),
        sandbox_root,
        container_id: None,
        workspace_id: None,
        backend: serde_json::to_value(&state).unwrap(),
    }
}

/// An unrelated container and volume (no labels) under `name`.
async fn unlabelled_objects(d: &Docker, name: &str) {
    d.create_container(
        Some(bollard::query_parameters::CreateContainerOptions {
            name: Some(name.to_string()),
            platform: String::new(),
        }),
        bollard::models::ContainerCreateBody {
            image: Some(IMAGE.to_string()),
            cmd: Some(vec!["true".to_string()]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    d.create_volume(bollard::models::VolumeCreateRequest {
        name: Some(name.to_string()),
        ..Default::default()
    })
    .await
    .unwrap();
}

async fn objects_exist(d: &Docker, name: &str) -> (bool, bool) {
    (
        d.inspect_container(name, None).await.is_ok(),
        d.inspect_volume(name).await.is_ok(),
    )
}

async fn remove_objects(d: &Docker, name: &str) {
    let _ = d
        .remove_container(
            name,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    let _ = d
        .remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>)
        .await;
}

/// A crafted handle whose layout is exactly the derived one, naming a container and volume
/// that are not ours (no labels): cleanup inspects the labels and removes neither.
#[tokio::test(flavor = "multi_thread")]
async fn a_crafted_handle_does_not_remove_an_unlabelled_container() {
    let Some(rt) = runtime_or_skip("unlabelled_container").await else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    let run = format!("crafted{}", std::process::id());
    let name = smithers_runtime_docker::plan::object_name(&run, "sb1", project.path());
    let d = engine().await;
    unlabelled_objects(&d, &name).await;
    let handle = crafted_handle(&rt, project.path(), &run, &name);
    let err = rt.cleanup(&handle).await.expect_err("refused");
    let found = objects_exist(&d, &name).await;
    remove_objects(&d, &name).await;
    assert!(err.to_string().contains("not this sandbox's"), "{err}");
    assert_eq!(
        found,
        (true, true),
        "an unlabelled container or volume was removed"
    );
}

/// A crafted handle naming some other container outright (not the derived name) is refused
/// before the engine is asked to remove anything.
#[tokio::test(flavor = "multi_thread")]
async fn a_crafted_handle_naming_another_container_is_refused() {
    let Some(rt) = runtime_or_skip("other_container").await else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    let run = format!("crafted{}", std::process::id());
    let name = format!("bystander-{}", std::process::id());
    let d = engine().await;
    unlabelled_objects(&d, &name).await;
    let handle = crafted_handle(&rt, project.path(), &run, &name);
    let err = rt.cleanup(&handle).await.expect_err("refused");
    let found = objects_exist(&d, &name).await;
    remove_objects(&d, &name).await;
    assert!(err.to_string().contains("not the one derived"), "{err}");
    assert_eq!(
        found,
        (true, true),
        "a bystander container or volume was removed"
    );
}
