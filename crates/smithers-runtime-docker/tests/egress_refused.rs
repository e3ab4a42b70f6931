//! A docker runtime that cannot hold a step's network namespace refuses an egress policy at
//! create, naming the control; a policy that does not lint is refused as input. Neither
//! needs an engine: both are decided before anything is created.

use serde_json::json;
use smithers_runtime::{Controls, Runtime, RuntimeError, RuntimeKind, SandboxConfig};
use smithers_runtime_docker::{DockerOptions, DockerRuntime};

fn config(dir: &std::path::Path, policy: serde_json::Value) -> SandboxConfig {
    SandboxConfig {
        run_id: "run-egress".into(),
        sandbox_id: "sbx-egress".into(),
        runtime: RuntimeKind::Docker,
        root_dir: dir.to_path_buf(),
        image: Some("smithers-test:busybox".into()),
        controls: Controls {
            egress_policy: Some(policy),
            ..Controls::default()
        },
        workspace_layers: Vec::new(),
    }
}

#[tokio::test]
async fn a_policy_it_cannot_enforce_is_refused_at_create() {
    let dir = tempfile::tempdir().unwrap();
    let rt = DockerRuntime::new(DockerOptions {
        egress_holder: None,
        ..DockerOptions::default()
    });
    let err = rt
        .create(&config(
            dir.path(),
            json!({"allow": [{"host": "api.example.com", "ports": [443]}]}),
        ))
        .await
        .unwrap_err();
    match &err {
        RuntimeError::ControlUnsupported {
            control, reason, ..
        } => {
            assert_eq!(*control, "egressPolicy");
            assert!(reason.contains("holder"), "{reason}");
        }
        other => panic!("not refused as unsupported: {other:?}"),
    }
    let err = rt
        .create(&config(
            dir.path(),
            json!({"allow": [{"host": "*.co.uk", "ports": [443]}]}),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::InvalidControl { control: "egressPolicy", reason } if reason.contains("public suffix")),
        "{err:?}"
    );
}
