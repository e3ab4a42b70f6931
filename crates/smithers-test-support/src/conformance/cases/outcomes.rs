//! Cases about what a run produces: exit codes and signals as outcomes, the request and
//! result paths, a result printed on stdout.

use serde_json::{json, Value};
use smithers_errors::CodedError;

use smithers_runtime::Termination;

use crate::conformance::{
    check_bundle, run_once, sh, start, unique, CaseResult, Project, SuiteEnv,
};

/// Echo and exit codes: a non-zero exit and a signal are outcomes, never errors; both streams
/// are captured; /workspace is the project.
pub async fn exit_code_is_an_outcome(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        sh("cat README.txt; echo to-stderr >&2; echo discarded > /dev/null; exit 7"),
    )
    .await?;
    let o = &exec.outcome;
    assert_eq!(
        o.termination,
        Termination::Exited,
        "{o:?}\n{}",
        exec.output.dump()
    );
    assert_eq!(o.exit_code, Some(7), "{o:?}");
    assert!(!o.succeeded());
    assert!(
        exec.output
            .stdout()
            .iter()
            .any(|l| l.contains("hello from the host project")),
        "/workspace must show the project; {}",
        exec.output.dump()
    );
    assert!(exec.output.stderr().iter().any(|l| l.contains("to-stderr")));

    let project = Project::new(env);
    let (exec, _) = run_once(env, &project, env.controls(), sh("echo fine")).await?;
    assert!(exec.outcome.succeeded(), "{:?}", exec.outcome);
    assert_eq!(exec.output.stdout(), vec!["fine".to_string()]);

    let project = Project::new(env);
    let (exec, _) = run_once(env, &project, env.controls(), sh("kill -KILL $$")).await?;
    assert_eq!(
        exec.outcome.termination,
        Termination::Signaled,
        "{:?}",
        exec.outcome
    );
    assert_eq!(exec.outcome.signal, Some(9));
    Ok(())
}

/// The request JSON is readable at $SMITHERS_SANDBOX_REQUEST_PATH; the result JSON written at
/// $SMITHERS_SANDBOX_RESULT_PATH is picked up (outcome and bundle outputs).
pub async fn request_and_result_paths(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let nonce = unique("input");
    let mut sandbox = start(env, &project, env.controls()).await?;
    sandbox.ship(json!({ "nonce": nonce })).await;
    let exec = sandbox
        .exec(sh("cat \"$SMITHERS_SANDBOX_REQUEST_PATH\"; echo; \
             printf '%s' '{\"status\":\"finished\",\"outputs\":{\"answer\":42}}' \
             > \"$SMITHERS_SANDBOX_RESULT_PATH\""))
        .await;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    let printed = exec.output.stdout().join("\n");
    assert!(
        printed.contains(&nonce),
        "request JSON not readable inside: {printed}"
    );
    // The whole stdout is the request file (compact or pretty-printed, both fine).
    let request: Value = serde_json::from_str(printed.trim())
        .unwrap_or_else(|e| panic!("request is not JSON ({e}): {printed}"));
    assert_eq!(request["input"]["nonce"], nonce.as_str());
    assert_eq!(request["sandboxId"], sandbox.config.sandbox_id.as_str());
    let result = exec.outcome.result.clone().expect("result JSON picked up");
    assert_eq!(result["outputs"]["answer"], 42, "{result}");
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(
        bundle.manifest["outputs"]["answer"], 42,
        "{}",
        bundle.manifest
    );
    assert_eq!(bundle.manifest["status"], "finished");
    sandbox.cleanup().await;
    Ok(())
}

/// A result JSON printed as the step's stdout is picked up.
pub async fn result_from_stdout(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        sh("echo '{\"status\":\"finished\",\"outputs\":{\"via\":\"stdout\"}}'"),
    )
    .await?;
    let result = exec
        .outcome
        .result
        .clone()
        .unwrap_or_else(|| panic!("stdout result not picked up: {:?}", exec.outcome));
    assert_eq!(result["outputs"]["via"], "stdout");
    let report = collected.unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(
        bundle.manifest["outputs"]["via"], "stdout",
        "{}",
        bundle.manifest
    );
    Ok(())
}
