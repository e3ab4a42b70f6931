//! The engine suite (`smithers_test_support::engine`) against the native runtime: a sandbox
//! started once, sent many commands (at once too), stopped and destroyed, in real namespaces.
//! A host without user namespaces or overlayfs makes `create` fail with `Unavailable`: the
//! cases print `SKIP`, and fail under `CI=true`.

use std::sync::Arc;

use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime};
use smithers_test_support::engine::EngineEnv;

fn make_env() -> EngineEnv {
    EngineEnv::new(Arc::new(NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        ..NativeOptions::default()
    })))
}

smithers_test_support::engine_tests!(make_env);

/// What a live sandbox's egress engine decided reaches its log when it stops, and with it the
/// bundle collect makes (a session's execs write no log of their own).
#[test]
fn a_live_sandboxs_egress_decisions_reach_its_bundle() {
    use smithers_runtime::{Controls, Engine, ExecRequest, RequestBundle, Runtime, SandboxConfig};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let native = NativeRuntime::new(NativeOptions {
            init: Some(InitCommand::binary(env!(
                "CARGO_BIN_EXE_smithers-sandbox-init"
            ))),
            ..NativeOptions::default()
        });
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("project");
        std::fs::create_dir_all(&project).unwrap();
        let config = SandboxConfig {
            run_id: "engine-egress".into(),
            sandbox_id: format!("egress-{}", std::process::id()),
            runtime: smithers_runtime::RuntimeKind::Bubblewrap,
            root_dir: project.clone(),
            image: None,
            controls: Controls {
                egress_policy: Some(serde_json::json!({
                    "allow": [{"host": "api.example.com", "ports": [443]}]
                })),
                timeout_ms: Some(120_000),
                ..Controls::default()
            },
            workspace_layers: Vec::new(),
        };
        let handle = match Engine::create(&native, &config).await {
            Ok(h) => h,
            Err(smithers_runtime::RuntimeError::Unavailable { reason, .. }) => {
                smithers_test_support::skip_or_fail(&reason);
                return;
            }
            Err(e) => panic!("create: {e}"),
        };
        let request = RequestBundle {
            request: serde_json::json!({"status": "pending", "sandboxId": config.sandbox_id,
                "runtime": "bubblewrap", "input": {}}),
        };
        Engine::ship(&native, &handle, &request).await.unwrap();
        Engine::start(&native, &handle).await.unwrap();
        let sink = smithers_test_support::engine::ByteSink::default();
        let lookup = ExecRequest {
            argv: vec!["getent".into(), "hosts".into(), "denied.example.org".into()],
            ..ExecRequest::default()
        };
        let exit = Engine::exec(&native, &handle, lookup, Default::default(), &sink)
            .await
            .unwrap();
        assert_ne!(exit.exit_code, Some(0), "a name the policy denies resolved");
        Engine::stop(&native, &handle).await.unwrap();
        let report = Runtime::collect(&native, &handle).await.unwrap();
        let log = std::fs::read_to_string(report.bundle_path.join("logs/stream.ndjson")).unwrap();
        assert!(
            log.lines()
                .any(|l| l.contains("\"egress\"") && l.contains("denied.example.org")),
            "no egress record of the denied name in the log:\n{log}"
        );
        Engine::destroy(&native, &handle).await.unwrap();
    });
}
