//! Cases about limits: memory, processes and CPU enforced or refused, the timeout and
//! cancellation killing every process.

use serde_json::json;
use smithers_errors::CodedError;
use std::sync::Arc;
use std::time::Duration;

use smithers_runtime::{CancellationToken, ProtectionStatus, StepCommand, Termination};

use crate::conformance::{
    assert_no_marker_processes, check_bundle, create_or_refused, sh, start, unique, Captured,
    CaseResult, Project, Skip, SuiteEnv,
};

/// A memory limit is enforced (a hog ends as `Memory`) or refused.
pub async fn memory_limit_enforced_or_refused(env: &SuiteEnv) -> CaseResult {
    memory_hog_case(env, "memory limit").await
}

pub(crate) async fn memory_hog_case(env: &SuiteEnv, row: &str) -> CaseResult {
    let project = Project::new(env);
    let mut controls = env.controls();
    controls.memory_limit_bytes = Some(64 << 20);
    let Some(mut sandbox) = create_or_refused(env, &project, controls, "memory").await? else {
        return Ok(());
    };
    sandbox.ship(json!({})).await;
    let exec = sandbox
        .exec(project.attack_argv(&["memory-hog", "1024"]))
        .await;
    assert!(
        exec.attempts("memory-hog").is_empty(),
        "{row}: the hog allocated 1 GiB under a 64 MiB limit: {:?}",
        exec.outcome
    );
    assert_eq!(
        exec.outcome.termination,
        Termination::Memory,
        "{row}: the outcome must report the memory limit: {:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect after OOM failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(bundle.manifest["status"], "failed", "{}", bundle.manifest);
    sandbox.cleanup().await;
    Ok(())
}

/// A pids limit is enforced (a fork bomb is capped, reported as `Pids`) or refused.
pub async fn pids_limit_enforced_or_refused(env: &SuiteEnv) -> CaseResult {
    fork_bomb_case(env, "pids limit").await
}

pub(crate) async fn fork_bomb_case(env: &SuiteEnv, row: &str) -> CaseResult {
    let project = Project::new(env);
    let mut controls = env.controls();
    controls.pids_limit = Some(32);
    let Some(mut sandbox) = create_or_refused(env, &project, controls, "pids").await? else {
        return Ok(());
    };
    sandbox.ship(json!({})).await;
    let exec = sandbox
        .exec(project.attack_argv(&["fork-bomb", "5000"]))
        .await;
    let bomb = exec.attempt("fork-bomb");
    assert_eq!(bomb["ok"], false, "{row}: 5000 forks under pids=32: {bomb}");
    let forked = bomb["forked"].as_u64().unwrap_or(u64::MAX);
    assert!(forked < 32, "{row}: {forked} processes under a limit of 32");
    assert_eq!(
        exec.outcome.termination,
        Termination::Pids,
        "{row}: the outcome must report the pids limit: {:?}",
        exec.outcome
    );
    sandbox.cleanup().await;
    Ok(())
}

/// A CPU limit is accepted and shown in the enforcement report, or refused. (Enforcement of a
/// share of CPU time is a timing property, measured by the benchmark, not asserted here.)
pub async fn cpu_limit_enforced_or_refused(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let mut controls = env.controls();
    controls.cpu_limit = Some(0.5);
    let Some(mut sandbox) = create_or_refused(env, &project, controls, "cpu").await? else {
        return Ok(());
    };
    sandbox.ship(json!({})).await;
    let exec = sandbox.exec(sh("true")).await;
    assert!(exec.outcome.succeeded(), "{:?}", exec.outcome);
    let cpu = exec
        .outcome
        .enforcement
        .protections
        .iter()
        .find(|p| p.name.contains("cpu"))
        .unwrap_or_else(|| {
            panic!(
                "a cpu limit was accepted but the enforcement report does not mention it: {:?}",
                exec.outcome.enforcement
            )
        });
    assert!(
        matches!(
            cpu.status,
            ProtectionStatus::Enforced | ProtectionStatus::Degraded
        ),
        "accepted cpu limit reported as {:?}",
        cpu.status
    );
    sandbox.cleanup().await;
    Ok(())
}

/// The timeout ends the run as `Timeout`, kills every process (daemons, setsid, SIGTERM-
/// ignoring ones) before execute returns, and a bundle is still produced.
pub async fn timeout_kills_everything(env: &SuiteEnv) -> CaseResult {
    outlive_case(env, "timeout", true).await
}

pub(crate) async fn outlive_case(env: &SuiteEnv, row: &str, wait: bool) -> CaseResult {
    if !env.host_processes_visible() {
        return Err(Skip::new(
            "sandbox processes are not visible in this host's /proc",
        ));
    }
    let project = Project::new(env);
    let marker = unique("smithers-suite-marker");
    let mut controls = env.controls();
    controls.timeout_ms = Some(3_000);
    let mut sandbox = start(env, &project, controls).await?;
    sandbox.ship(json!({})).await;
    let mut args = vec!["daemonize", marker.as_str(), "600"];
    if wait {
        args.extend(["+", "sleep", marker.as_str(), "600"]);
    }
    let exec = sandbox.exec(project.attack_argv(&args)).await;
    assert_no_marker_processes(&marker, &format!("{row}: when execute returned"));
    let d = exec.attempt("daemonize");
    assert_eq!(d["ok"], true, "the daemons were not started: {d}");
    if wait {
        assert_eq!(
            exec.outcome.termination,
            Termination::Timeout,
            "{row}: {:?}",
            exec.outcome
        );
    } else {
        assert!(exec.outcome.succeeded(), "{row}: {:?}", exec.outcome);
    }
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect after {row} failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    let expected = if wait { "failed" } else { "finished" };
    assert_eq!(bundle.manifest["status"], expected, "{}", bundle.manifest);
    sandbox.cleanup().await;
    assert_no_marker_processes(&marker, &format!("{row}: after cleanup"));
    Ok(())
}

/// Cancelling the token ends the run as `Cancelled`, kills every process, and the bundle says
/// `cancelled`.
pub async fn cancellation_kills_everything(env: &SuiteEnv) -> CaseResult {
    if !env.host_processes_visible() {
        return Err(Skip::new(
            "sandbox processes are not visible in this host's /proc",
        ));
    }
    let project = Project::new(env);
    let marker = unique("smithers-suite-marker");
    let mut sandbox = start(env, &project, env.controls()).await?;
    sandbox.ship(json!({})).await;
    let cancel = CancellationToken::new();
    let output = Arc::new(Captured::default());
    let command = StepCommand {
        argv: project.attack_argv(&["daemonize", &marker, "600", "+", "sleep", &marker, "600"]),
        cwd: None,
        stdin: Default::default(),
    };
    let execute = env
        .runtime()
        .execute(&sandbox.handle, &command, cancel.clone(), output.as_ref());
    let canceller = async {
        let ready = output
            .wait_for_stdout("\"ready\":true", Duration::from_secs(60))
            .await;
        cancel.cancel();
        ready
    };
    let (outcome, ready) = tokio::join!(execute, canceller);
    let outcome = outcome.unwrap_or_else(|e| panic!("execute failed: {}", e.report()));
    assert!(ready, "the command never got ready: {}", output.dump());
    assert_eq!(outcome.termination, Termination::Cancelled, "{outcome:?}");
    assert_no_marker_processes(&marker, "cancellation: when execute returned");
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect after cancellation failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(
        bundle.manifest["status"], "cancelled",
        "{}",
        bundle.manifest
    );
    sandbox.cleanup().await;
    Ok(())
}
