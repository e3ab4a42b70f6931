//! Cases about what a sandbox cannot reach: the network, the host's files outside the
//! workspace, the host project tree, the host's environment.

use serde_json::{json, Value};
use smithers_errors::CodedError;
use std::path::Path;

use crate::conformance::{
    assert_reported_not_enforced, breaches, check_bundle, host_secret, run_once, sh, unique,
    CaseResult, Project, SuiteEnv, ENV_ALLOWLIST,
};

/// No network by default: no interface but loopback, no route (checked with a UDP `connect`,
/// which sends nothing), and a host TCP listener on 127.0.0.1 unreachable.
pub async fn network_denied_by_default(env: &SuiteEnv) -> CaseResult {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind host listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port().to_string();
    let project = Project::new(env);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&[
            "net-info",
            "+",
            "udp-route",
            "192.0.2.1",
            "53",
            "+",
            "udp-route",
            "2001:db8::1",
            "53",
            "+",
            "connect-tcp",
            "127.0.0.1",
            &port,
        ]),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), 4, "{}", exec.output.dump());
    assert!(
        listener.accept().is_err(),
        "the host listener on 127.0.0.1:{port} accepted a connection from the sandbox"
    );
    assert_reported_not_enforced(
        env,
        "network",
        &["network"],
        Some(&exec.outcome),
        &breaches(&results),
    )
    .await;
    Ok(())
}

/// Writes outside /workspace, /result and /tmp fail; writes inside them work.
pub async fn write_outside_workspace_denied(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let name = unique("smithers-suite-write");
    let outside: Vec<String> = ["/etc", "/usr", "/"]
        .iter()
        .map(|d| format!("{}/{name}", d.trim_end_matches('/')))
        .collect();
    let mut args: Vec<String> = Vec::new();
    for p in &outside {
        args.extend(["write-file".into(), p.clone(), "x".into(), "+".into()]);
    }
    for p in [
        format!("{}/inside.txt", env.workspace_dir()),
        format!("/tmp/{name}"),
        "/result/inside.txt".to_string(),
    ] {
        args.extend(["write-file".into(), p, "x".into(), "+".into()]);
    }
    args.pop();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (exec, _) = run_once(env, &project, env.controls(), project.attack_argv(&args)).await?;
    let results = exec.attempts("write-file");
    assert_eq!(results.len(), 6, "{}", exec.output.dump());
    let (denied, allowed) = results.split_at(3);
    for r in allowed {
        assert_eq!(r["ok"], true, "writing inside must work: {r}");
    }
    // The sandbox's /tmp is its own: the file written there must not be on the host's /tmp.
    let host_tmp = format!("/tmp/{name}");
    let appeared: Vec<&String> = outside
        .iter()
        .chain(std::iter::once(&host_tmp))
        .filter(|p| Path::new(p).exists())
        .collect();
    for p in &appeared {
        let _ = std::fs::remove_file(p);
    }
    assert!(
        appeared.is_empty(),
        "files appeared on the host after the sandbox wrote them: {appeared:?}"
    );
    assert_reported_not_enforced(
        env,
        "write outside workspace",
        &["filesystem", "landlock", "mount-namespace"],
        Some(&exec.outcome),
        &breaches(denied),
    )
    .await;
    Ok(())
}

/// The host project is byte-identical after a run that changed /workspace, and the changes
/// (modify, add, delete) are in the bundle's patches.
pub async fn host_tree_unchanged_and_changes_become_patches(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = project.snapshot();
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        sh(
            "echo changed-by-sandbox >> README.txt && echo brand-new > new-file.txt \
            && rm src/gone.txt && mkdir -p made/deep && echo deep > made/deep/f.txt",
        ),
    )
    .await?;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    before.assert_same(
        &project.snapshot(),
        "the host project changed before any patch was applied",
    );
    let report = collected.unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(bundle.manifest["status"], "finished", "{}", bundle.manifest);
    assert!(report.patch_count >= 1, "{report:?}");
    for needle in [
        "README.txt",
        "changed-by-sandbox",
        "new-file.txt",
        "brand-new",
        "src/gone.txt",
        "made/deep/f.txt",
    ] {
        assert!(
            bundle.patch_text.contains(needle),
            "patches do not mention {needle:?}:\n{}",
            bundle.patch_text
        );
    }
    assert!(
        !bundle.patch_text.contains("smithers-attack"),
        "an unchanged file appeared in the patches"
    );
    Ok(())
}

/// The environment is cleared but for the allowlist and the step's own env: a host variable
/// (a secret) set in the test process is not visible.
pub async fn env_cleared_except_allowlist(env: &SuiteEnv) -> CaseResult {
    let secret = host_secret();
    let project = Project::new(env);
    let mut controls = env.controls();
    controls.env.insert("STEP_VAR".into(), "step-value".into());
    let (exec, _) = run_once(env, &project, controls, project.attack_argv(&["env"])).await?;
    let inside = exec.attempt("env")["env"].clone();
    let inside = inside.as_object().expect("env object");
    assert_eq!(inside.get("STEP_VAR"), Some(&json!("step-value")));
    assert!(
        inside.contains_key("SMITHERS_SANDBOX_REQUEST_PATH")
            && inside.contains_key("SMITHERS_SANDBOX_RESULT_PATH"),
        "request/result path variables missing: {inside:?}"
    );
    assert!(
        !inside.values().any(|v| v.as_str() == Some(secret.as_str())),
        "the host secret is visible inside"
    );
    let leaked: Vec<&String> = std::env::vars()
        .filter(|(k, v)| {
            !ENV_ALLOWLIST.contains(&k.as_str())
                && !k.starts_with("SMITHERS_SANDBOX_")
                && inside.get(k).and_then(Value::as_str) == Some(v.as_str())
        })
        .filter_map(|(k, _)| inside.keys().find(|ik| **ik == k))
        .collect();
    assert!(
        leaked.is_empty(),
        "host variables leaked into the sandbox: {leaked:?}"
    );
    Ok(())
}
