//! Rows 6, 12-13: the host's processes (invisible from inside; nothing outlives the timeout
//! or the death of the process that ran the sandbox).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use smithers_errors::CodedError;
use smithers_runtime::SandboxHandle;

use super::{args, batch};
use crate::conformance::{
    assert_no_marker_processes, assert_reported_not_enforced, host_marker_pids, kill_host_pids,
    outlive_case, run_once, unique, CaseResult, Project, Skip, SuiteEnv, HELPER_ENV,
};

/// Row 6: a host process (carrying a marker) is neither visible nor signalable from inside.
pub async fn row06_host_processes_invisible(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let marker = unique("smithers-suite-victim");
    let mut victim = Command::new(env.attack_bin())
        .args(["sleep", &marker, "600"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the host victim");
    let pid = victim.id().to_string();
    // Reversed, so the marker is not in the argv of anything inside the sandbox.
    let hidden = format!("rev:{}", marker.chars().rev().collect::<String>());
    let argv = batch(&[
        vec!["find-proc".into(), hidden.clone()],
        vec!["read-file".into(), format!("/proc/{pid}/cmdline"), hidden],
        vec!["kill".into(), pid.clone(), "9".into()],
        vec!["list-dir".into(), "/proc/1/root/proc".into()],
    ]);
    let result = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&args(&argv)),
    )
    .await;
    let alive = victim.try_wait().expect("try_wait").is_none();
    let _ = victim.kill();
    let _ = victim.wait();
    let (exec, _) = result?;
    assert!(
        alive,
        "row 6: the host victim process was killed from inside the sandbox"
    );
    let found = exec.attempt("find-proc");
    let read = exec.attempt("read-file");
    let mut leaks = Vec::new();
    if found["ok"] == true {
        leaks.push(found.clone());
    }
    if read["contains_needle"] == true {
        leaks.push(read.clone());
    }
    assert_reported_not_enforced(
        env,
        "row 6",
        &["pid-namespace"],
        Some(&exec.outcome),
        &leaks,
    )
    .await;
    Ok(())
}

/// Row 12: background, double-forked, setsid'd, SIGTERM-ignoring children are all gone when
/// execute returns: after a timeout, and after the main command exits on its own.
pub async fn row12_outlive_timeout(env: &SuiteEnv) -> CaseResult {
    outlive_case(env, "row 12 (timeout)", true).await?;
    outlive_case(env, "row 12 (main exits)", false).await
}

/// Row 13: when the orchestrating process is SIGKILLed, its sandbox processes die with it,
/// and another process can clean up from the stored handle.
///
/// The test re-executes its own binary (this test only, `HELPER_ENV` set) as the orchestrator,
/// which starts a sandbox running a marked `sleep`; the parent waits for the marker to show in
/// `/proc`, SIGKILLs the child, and checks (bounded, generous wait for the kernel) that no
/// marked process survives.
pub async fn row13_survive_host_kill(env: &SuiteEnv) -> CaseResult {
    if std::env::var(HELPER_ENV).as_deref() == Ok("row13") {
        return row13_helper(env).await;
    }
    if !env.host_processes_visible() {
        return Err(Skip::new(
            "sandbox processes are not visible in this host's /proc",
        ));
    }
    let project = Project::new(env);
    let marker = unique("smithers-suite-orphan");
    let handle_file = project.outside.join("handle.json");
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(&exe)
        .args([
            env.test_name(),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, "row13")
        .envs(env.helper_env().iter().map(|(k, v)| (k, v)))
        .env("SMITHERS_SUITE_ROW13_PROJECT", &project.root)
        .env("SMITHERS_SUITE_ROW13_HANDLE", &handle_file)
        .env("SMITHERS_SUITE_ROW13_MARKER", &marker)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("re-exec the test binary as the orchestrator");
    let started = wait_until(Duration::from_secs(60), || {
        !host_marker_pids(&marker).is_empty()
    })
    .await;
    if !started {
        let _ = child.kill();
        let out = child.wait_with_output().expect("wait helper");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if stderr.contains("SKIP") {
            return Err(Skip::new(format!("helper skipped: {stderr}")));
        }
        panic!(
            "row 13: the helper never started its sandbox ({}):\n{stderr}",
            out.status
        );
    }
    if std::env::var_os(crate::conformance::VERBOSE_ENV).is_some() {
        println!(
            "[{}] sandbox processes before SIGKILL of the orchestrator: {:?}",
            env.test_name(),
            host_marker_pids(&marker)
        );
    }
    child.kill().expect("SIGKILL the orchestrator");
    let _ = child.wait();
    // The kernel needs a moment to deliver the deaths; a generous bound, not a timing claim.
    let gone = wait_until(Duration::from_secs(30), || {
        host_marker_pids(&marker).is_empty()
    })
    .await;
    let survivors = host_marker_pids(&marker);
    // Recovery: another process cleans up from the stored handle.
    let cleanup = match std::fs::read_to_string(&handle_file)
        .ok()
        .and_then(|t| serde_json::from_str::<SandboxHandle>(&t).ok())
    {
        Some(handle) => Some(env.runtime().cleanup(&handle).await),
        None => None,
    };
    if !gone {
        kill_host_pids(&survivors);
        assert_reported_not_enforced(
            env,
            "row 13",
            &["parent-death", "process-cleanup"],
            None,
            &[json!({"attempt": "survive-host-kill", "ok": true, "pids": survivors})],
        )
        .await;
    }
    match cleanup {
        Some(Ok(())) => {}
        Some(Err(e)) => panic!(
            "row 13: cleanup from the stored handle failed: {}",
            e.report()
        ),
        None => panic!("row 13: the helper did not store its handle"),
    }
    assert_no_marker_processes(&marker, "row 13: after cleanup from the stored handle");
    Ok(())
}

async fn row13_helper(env: &SuiteEnv) -> CaseResult {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("helper needs {k}"));
    let root = std::path::PathBuf::from(var("SMITHERS_SUITE_ROW13_PROJECT"));
    let marker = var("SMITHERS_SUITE_ROW13_MARKER");
    let config = env.config(&root, &unique("orphan"), env.controls());
    let handle = match crate::conformance::create_placed(env, &config).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("SKIP helper: {}", e.report());
            return Err(crate::conformance::unavailable_or_panic(e));
        }
    };
    std::fs::write(
        var("SMITHERS_SUITE_ROW13_HANDLE"),
        serde_json::to_vec(&handle).expect("handle json"),
    )
    .expect("store the handle");
    let request = smithers_runtime::RequestBundle {
        request: json!({"status": "pending", "sandboxId": config.sandbox_id,
                        "runtime": config.runtime.as_str(), "input": {}}),
    };
    env.runtime().ship(&handle, &request).await.expect("ship");
    let command = smithers_runtime::StepCommand {
        argv: vec![
            "/workspace/smithers-attack".into(),
            "daemonize".into(),
            marker.clone(),
            "600".into(),
            "+".into(),
            "sleep".into(),
            marker,
            "600".into(),
        ],
        cwd: None,
        stdin: Default::default(),
    };
    // Runs until the parent SIGKILLs this process.
    let _ = env
        .runtime()
        .execute(
            &handle,
            &command,
            smithers_runtime::CancellationToken::new(),
            &smithers_runtime::NullSink,
        )
        .await;
    Ok(())
}

async fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f()
}
