//! The engine suite (`smithers_test_support::engine`) against the docker runtime: a sandbox's
//! long-lived container, sent many commands (at once too) with `docker exec`, stopped and
//! destroyed; and what is the docker engine's own (how an exec ends, stdin's end, the kill of
//! a group, a pid file the step forged, the egress decisions of a sandbox's life). Needs the
//! engine and `smithers-test:busybox` (`scripts/docker-up.sh`): without them each case prints
//! `SKIP` (create fails with `Unavailable`), and fails under `CI=true`.

use std::sync::Arc;
use std::time::Duration;

use smithers_runtime::{
    CancellationToken, Controls, Engine, ExecRequest, RequestBundle, Runtime, RuntimeError,
    RuntimeKind, SandboxConfig, StepStdin, Termination,
};
use smithers_runtime_docker::{DockerOptions, DockerRuntime};
use smithers_test_support::conformance::Skip;
use smithers_test_support::engine::{EngineEnv, Live};

const IMAGE: &str = "smithers-test:busybox";

fn options() -> DockerOptions {
    DockerOptions {
        watchdog: Some(env!("CARGO_BIN_EXE_smithers-docker-watchdog").into()),
        egress_holder: Some(env!("CARGO_BIN_EXE_smithers-docker-init").into()),
        ..DockerOptions::default()
    }
}

fn make_env() -> EngineEnv {
    EngineEnv::new(Arc::new(DockerRuntime::new(options()))).with_image(IMAGE)
}

smithers_test_support::engine_tests!(make_env);

/// Runs `case` on a runtime of its own; a missing engine is a SKIP (a failure under CI=true).
fn run_case<F>(name: &str, case: impl FnOnce(EngineEnv) -> F)
where
    F: std::future::Future<Output = Result<(), Skip>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Err(Skip(reason)) = rt.block_on(case(make_env())) {
        smithers_test_support::skip_or_fail_as(name, &reason);
    }
}

fn sh(script: &str) -> ExecRequest {
    ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..ExecRequest::default()
    }
}

fn token(what: &str) -> String {
    smithers_test_support::conformance::unique(what)
}

/// An exit code past 128 is an exit, a signal a signal, whatever the numbers.
#[test]
fn exit_and_signal_are_told_apart_exactly() {
    run_case("exit_and_signal_are_told_apart_exactly", |env| async move {
        let live = Live::started(&env).await?;
        for (script, want) in [
            ("exit 143", (Termination::Exited, Some(143), None)),
            ("exit 129", (Termination::Exited, Some(129), None)),
            ("exit 192", (Termination::Exited, Some(192), None)),
            ("exit 200", (Termination::Exited, Some(200), None)),
            ("kill -TERM $$", (Termination::Signaled, None, Some(15))),
            ("kill -KILL $$", (Termination::Signaled, None, Some(9))),
            ("kill -USR1 $$", (Termination::Signaled, None, Some(10))),
        ] {
            let ran = live.run(sh(script)).await;
            let got = (ran.exit.termination, ran.exit.exit_code, ran.exit.signal);
            assert_eq!(got, want, "{script}");
        }
        let ran = live
            .run(ExecRequest {
                timeout: Some(Duration::from_millis(200)),
                ..sh("sleep 1000")
            })
            .await;
        assert_eq!(ran.exit.termination, Termination::Timeout, "{:?}", ran.exit);
        // Nothing of those execs is left in the wrappers' tmpfs: at most this one's pid file
        // (which its wrapper may write after `ls` has looked).
        let left = live.sh("ls -A /run/smithers/exec").await.ok().stdout_text();
        assert!(left.lines().count() <= 1, "{left}");
        assert!(left.lines().all(|l| l.ends_with(".pid")), "{left}");
        live.destroy().await;
        Ok(())
    });
}

/// The end of the stdin stream reaches the command (a `cat` ends), with every byte before it;
/// without a stream stdin is /dev/null.
#[test]
fn stdin_ends_where_its_stream_ends() {
    run_case("stdin_ends_where_its_stream_ends", |env| async move {
        let live = Live::started(&env).await?;
        let ran = live
            .run(ExecRequest {
                stdin: StepStdin::from_reader(std::io::Cursor::new(b"abc".to_vec())),
                ..sh("cat; echo; echo after-eof")
            })
            .await
            .ok();
        assert_eq!(ran.stdout_text(), "abc\nafter-eof\n");
        let ran = live
            .run(ExecRequest {
                stdin: StepStdin::from_reader(std::io::empty()),
                ..sh("wc -c")
            })
            .await
            .ok();
        assert_eq!(ran.stdout_text().trim(), "0");
        let ran = live.sh("readlink /proc/self/fd/0; cat").await.ok();
        assert_eq!(ran.stdout_text(), "/dev/null\n");
        live.destroy().await;
        Ok(())
    });
}

/// A cancel kills the whole group of the command (a child and a grandchild too), and nothing
/// else: a process of another exec goes on.
#[test]
fn a_cancel_kills_the_commands_whole_group() {
    run_case(
        "a_cancel_kills_the_commands_whole_group",
        |env| async move {
            let live = Live::started(&env).await?;
            let (mine, other) = (token("group"), token("other"));
            // It has left the group before its command ends (else it is killed with it).
            let background = format!(
            "setsid sh -c 'touch /tmp/left; sleep 1000; : {other}' </dev/null >/dev/null 2>&1 & \
             while [ ! -e /tmp/left ]; do sleep 0.01; done"
        );
            live.sh(&background).await.ok();
            let cancel = CancellationToken::new();
            let script = format!(
            "sh -c 'sleep 1000; : {mine}-child' & sh -c 'sh -c \"sleep 1000; : {mine}-grand\"' & \
             sleep 1000; : {mine}"
        );
            let canceller = {
                let cancel = cancel.clone();
                let mine = mine.clone();
                async move {
                    while smithers_test_support::engine::host_pids_with(&format!("{mine}-grand"))
                        .is_empty()
                    {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    cancel.cancel();
                }
            };
            let (ran, ()) = tokio::join!(live.try_run(sh(&script), cancel), canceller);
            let ran = ran.unwrap();
            assert_eq!(
                ran.exit.termination,
                Termination::Cancelled,
                "{:?}",
                ran.exit
            );
            assert!(
                smithers_test_support::engine::gone(&mine, Duration::from_secs(30)).await,
                "a process of the cancelled group lives on"
            );
            assert!(
                !smithers_test_support::engine::host_pids_with(&other).is_empty(),
                "the cancel reached a process outside the command's group"
            );
            live.sh("true").await.ok();
            live.destroy().await;
            Ok(())
        },
    );
}

/// Pid files the step forged (pid 1, every process, the waiting init, garbage, a symlink)
/// neither stop the kill of a timed-out command nor reach anything else: the sandbox goes on.
#[test]
fn a_forged_pid_file_neither_blocks_nor_misdirects_the_kill() {
    run_case(
        "a_forged_pid_file_neither_blocks_nor_misdirects_the_kill",
        |env| async move {
            let live = Live::started(&env).await?;
            let mine = token("forged");
            // Every pid file there is, and every one to come, rewritten while the command runs.
            let forger = "i=0; while true; do for f in /run/smithers/exec/*.pid; do \
                 [ -f \"$f\" ] || continue; i=$((i + 1)); echo $i >> /tmp/forged; \
                 case $((i % 5)) in \
                 0) echo 1 > \"$f\";; 1) echo -1 > \"$f\";; 2) echo garbage > \"$f\";; \
                 3) echo $PPID > \"$f\";; \
                 4) rm -f \"$f\"; ln -s /proc/1/stat \"$f\";; esac; done; sleep 0.01; done";
            let forging = format!(
                "setsid sh -c 'touch /tmp/forging; {forger}' </dev/null >/dev/null 2>&1 & \
                 while [ ! -e /tmp/forging ]; do sleep 0.01; done"
            );
            live.sh(&forging).await.ok();
            let ran = live
                .run(ExecRequest {
                    timeout: Some(Duration::from_millis(500)),
                    ..sh(&format!("sleep 1000; : {mine}"))
                })
                .await;
            assert_eq!(ran.exit.termination, Termination::Timeout, "{:?}", ran.exit);
            assert!(
                smithers_test_support::engine::gone(&mine, Duration::from_secs(30)).await,
                "the timed-out command lives on"
            );
            let forged = live.sh("wc -l < /tmp/forged").await.ok().stdout_text();
            assert_ne!(forged.trim(), "0", "no pid file was forged");
            // The container's init and the sandbox are whole.
            live.sh("echo still here").await.ok();
            live.destroy().await;
            Ok(())
        },
    );
}

/// What a started sandbox's egress engine decided reaches its log at stop, and with it the
/// bundle collect makes from the layer the sandbox left.
#[test]
fn a_live_sandboxs_egress_decisions_reach_its_bundle() {
    run_case(
        "a_live_sandboxs_egress_decisions_reach_its_bundle",
        |_| async {
            let docker = DockerRuntime::new(options());
            let dir = tempfile::tempdir().unwrap();
            let project = dir.path().join("project");
            std::fs::create_dir_all(&project).unwrap();
            let config = SandboxConfig {
                run_id: "engine-egress".into(),
                sandbox_id: format!("egress-{}", std::process::id()),
                runtime: RuntimeKind::Docker,
                root_dir: project.clone(),
                image: Some(IMAGE.into()),
                controls: Controls {
                    egress_policy: Some(serde_json::json!({
                        "allow": [{"host": "api.example.com", "ports": [443]}]
                    })),
                    timeout_ms: Some(120_000),
                    ..Controls::default()
                },
                workspace_layers: Vec::new(),
            };
            let handle = match Engine::create(&docker, &config).await {
                Ok(h) => h,
                Err(RuntimeError::Unavailable { reason, .. }) => return Err(Skip::new(reason)),
                Err(e) => panic!("create: {e}"),
            };
            let request = RequestBundle {
                request: serde_json::json!({"status": "pending", "sandboxId": config.sandbox_id,
                "runtime": "docker", "input": {}}),
            };
            Engine::ship(&docker, &handle, &request).await.unwrap();
            Engine::start(&docker, &handle).await.unwrap();
            let sink = smithers_test_support::engine::ByteSink::default();
            let exit = Engine::exec(
                &docker,
                &handle,
                sh("nslookup denied.example.org; echo made > /workspace/made.txt"),
                Default::default(),
                &sink,
            )
            .await
            .unwrap();
            assert_eq!(exit.termination, Termination::Exited, "{exit:?}");
            Engine::stop(&docker, &handle).await.unwrap();
            let report = Runtime::collect(&docker, &handle).await.unwrap();
            let log =
                std::fs::read_to_string(report.bundle_path.join("logs/stream.ndjson")).unwrap();
            assert!(
                log.lines()
                    .any(|l| l.contains("\"egress\"") && l.contains("denied.example.org")),
                "no egress record of the denied name in the log:\n{log}"
            );
            let patches = std::fs::read_dir(report.bundle_path.join("patches"))
                .map(|d| d.count())
                .unwrap_or(0);
            assert!(patches > 0, "the sandbox's write is not in the bundle");
            Engine::destroy(&docker, &handle).await.unwrap();
            Ok(())
        },
    );
}

/// An exec returns once its command has ended, even when a process that left its group still
/// holds its output (the engine ends the exec's stream a moment after the command's end); what
/// the command wrote is all there.
#[test]
fn an_exec_ends_with_its_command_not_with_a_process_that_left() {
    run_case(
        "an_exec_ends_with_its_command_not_with_a_process_that_left",
        |env| async move {
            let live = Live::started(&env).await?;
            let began = std::time::Instant::now();
            let ran = live
                .sh("setsid sh -c 'touch /tmp/left; sleep 60' & \
                     while [ ! -e /tmp/left ]; do sleep 0.01; done; echo mine")
                .await
                .ok();
            assert_eq!(ran.stdout_text(), "mine\n");
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "the exec waited for a process that left its group ({:?})",
                began.elapsed()
            );
            live.destroy().await;
            Ok(())
        },
    );
}

/// Two starts of one sandbox at once: one starts it, the other is out of order, and the
/// sandbox works.
#[test]
fn two_starts_at_once_start_one_sandbox() {
    run_case("two_starts_at_once_start_one_sandbox", |env| async move {
        let live = Live::created(&env).await?;
        let engine = env.engine();
        let (a, b) = tokio::join!(engine.start(&live.handle), engine.start(&live.handle));
        let refused = [&a, &b]
            .iter()
            .filter(|r| matches!(r, Err(RuntimeError::OutOfOrder { .. })))
            .count();
        assert!(refused == 1 && (a.is_ok() || b.is_ok()), "{a:?} {b:?}");
        live.sh("echo works").await.ok();
        live.destroy().await;
        Ok(())
    });
}

/// A project owned by another user than root: the sandbox's commands run as that user, and
/// its wrappers' files (pid, kill marker, status) work for it as for root.
#[test]
fn a_sandbox_of_a_project_not_owned_by_root_works_whole() {
    run_case(
        "a_sandbox_of_a_project_not_owned_by_root_works_whole",
        |env| async move {
            let dir = tempfile::tempdir().unwrap();
            let project = dir.path().join("project");
            std::fs::create_dir_all(&project).unwrap();
            // Only root can give the project away; otherwise it is ours, not root's, already.
            let _ = std::os::unix::fs::chown(&project, Some(4321), Some(4321));
            let mut config = env.config(&project, &token("owner"));
            config.controls.timeout_ms = Some(120_000);
            let docker = env.engine();
            let handle = match docker.create(&config).await {
                Ok(h) => h,
                Err(RuntimeError::Unavailable { reason, .. }) => return Err(Skip::new(reason)),
                Err(e) => panic!("create: {e}"),
            };
            let request = RequestBundle {
                request: serde_json::json!({"status": "pending", "input": {}}),
            };
            docker.ship(&handle, &request).await.unwrap();
            docker.start(&handle).await.unwrap();
            let run = |req: ExecRequest| {
                let handle = handle.clone();
                async move {
                    let sink = smithers_test_support::engine::ByteSink::default();
                    let exit = docker
                        .exec(&handle, req, CancellationToken::new(), &sink)
                        .await
                        .unwrap();
                    (exit, String::from_utf8_lossy(&sink.stdout()).into_owned())
                }
            };
            let owner = std::fs::metadata(&project).unwrap();
            let (_, id) = run(sh(
                "id -u; touch /workspace/mine; stat -c %u /workspace/mine",
            ))
            .await;
            use std::os::unix::fs::MetadataExt;
            assert_eq!(id, format!("{0}\n{0}\n", owner.uid()));
            let (exit, _) = run(sh("kill -TERM $$")).await;
            assert_eq!(
                (exit.termination, exit.signal),
                (Termination::Signaled, Some(15))
            );
            let (exit, _) = run(sh("exit 130")).await;
            assert_eq!(
                (exit.termination, exit.exit_code),
                (Termination::Exited, Some(130))
            );
            let mine = token("owned");
            let (exit, _) = run(ExecRequest {
                timeout: Some(Duration::from_millis(300)),
                ..sh(&format!("sleep 1000; : {mine}"))
            })
            .await;
            assert_eq!(exit.termination, Termination::Timeout, "{exit:?}");
            assert!(
                smithers_test_support::engine::gone(&mine, Duration::from_secs(30)).await,
                "the timed-out command lives on"
            );
            docker.destroy(&handle).await.unwrap();
            Ok(())
        },
    );
}

/// Set in the child process of [`a_started_sandbox_dies_with_the_process_that_started_it`].
const CHILD_ENV: &str = "SMITHERS_DOCKER_ENGINE_TEST_CHILD";

/// The process that started a sandbox is killed (`kill -9`): its watchdog has the engine kill
/// the container. Another process then destroys it from the stored handle.
#[test]
fn a_started_sandbox_dies_with_the_process_that_started_it() {
    if let Ok(project) = std::env::var(CHILD_ENV) {
        return start_and_wait_to_be_killed(project.into());
    }
    run_case(
        "a_started_sandbox_dies_with_the_process_that_started_it",
        |env| async move {
            use std::io::BufRead;
            let dir = tempfile::tempdir().unwrap();
            let project = dir.path().join("project");
            std::fs::create_dir_all(&project).unwrap();
            // The engine is there, or this is a SKIP before any child runs.
            let probe = Live::created(&env).await?;
            probe.destroy().await;
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "a_started_sandbox_dies_with_the_process_that_started_it",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, &project)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
            let line = tokio::task::spawn_blocking(move || {
                stdout
                    .lines()
                    .map_while(Result::ok)
                    // After the harness's `test NAME ... `, on the same line.
                    .find_map(|l| l.split_once("HANDLE ").map(|(_, h)| h.to_string()))
            })
            .await
            .unwrap()
            .expect("the child started no sandbox");
            let handle: smithers_runtime::SandboxHandle = serde_json::from_str(&line).unwrap();
            let state: smithers_runtime_docker::BackendState =
                serde_json::from_value(handle.backend.clone()).unwrap();
            child.kill().unwrap();
            child.wait().unwrap();
            let docker = bollard::Docker::connect_with_unix(
                &smithers_runtime_docker::default_socket(),
                30,
                bollard::API_DEFAULT_VERSION,
            )
            .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let info = docker
                    .inspect_container(&state.container_name, None)
                    .await
                    .unwrap();
                if info.state.and_then(|s| s.running) != Some(true) {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the container outlived the process that started it"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Another runtime, from the stored handle: destroy removes it.
            env.engine().destroy(&handle).await.unwrap();
            assert!(docker
                .inspect_container(&state.container_name, None)
                .await
                .is_err());
            Ok(())
        },
    );
}

/// The child: a sandbox started over `project`, its handle printed, then a wait to be killed.
fn start_and_wait_to_be_killed(project: std::path::PathBuf) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let env = make_env();
        let config = env.config(&project, &token("orphan"));
        let engine = env.engine();
        let handle = engine.create(&config).await.unwrap();
        let request = RequestBundle {
            request: serde_json::json!({"status": "pending", "input": {}}),
        };
        engine.ship(&handle, &request).await.unwrap();
        engine.start(&handle).await.unwrap();
        println!("HANDLE {}", serde_json::to_string(&handle).unwrap());
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
}

/// The step's cleanup of a started sandbox, without a stop: the container goes, and so does
/// what the sandbox kept (its watchdog, whose command line names the container); then the
/// sandbox takes no exec.
#[test]
fn cleanup_without_stop_leaves_nothing_running() {
    run_case(
        "cleanup_without_stop_leaves_nothing_running",
        |_| async move {
            let runtime = Arc::new(DockerRuntime::new(options()));
            let env = EngineEnv::new(runtime.clone()).with_image(IMAGE);
            let live = Live::started(&env).await?;
            let state: smithers_runtime_docker::BackendState =
                serde_json::from_value(live.handle.backend.clone()).unwrap();
            let docker = bollard::Docker::connect_with_unix(
                &smithers_runtime_docker::default_socket(),
                30,
                bollard::API_DEFAULT_VERSION,
            )
            .unwrap();
            let id = docker
                .inspect_container(&state.container_name, None)
                .await
                .unwrap()
                .id
                .unwrap();
            assert!(
                !smithers_test_support::engine::host_pids_with(&id).is_empty(),
                "no watchdog for the started sandbox"
            );
            Runtime::cleanup(&*runtime, &live.handle).await.unwrap();
            assert!(
                smithers_test_support::engine::gone(&id, Duration::from_secs(30)).await,
                "the watchdog outlived the cleanup"
            );
            match live.try_run(sh("true"), CancellationToken::new()).await {
                Err(RuntimeError::OutOfOrder { .. }) => {}
                other => panic!("exec after cleanup: {other:?}"),
            }
            live.destroy().await;
            Ok(())
        },
    );
}
