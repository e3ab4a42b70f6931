//! The review endpoints on a real server with a real orchestrator over a real SQLite store.

mod common;

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use smithers_orchestrator::{AtomicPatchApplier, Orchestrator, Settings};
use smithers_server::testing::HostProcessRuntime;
use smithers_server::{ClientToken, SandboxServer, ServerConfig};

/// A named client token: the host's reviews are not its to see or decide.
const CLIENT_TOKEN: &str = "client-token-0123456789abcdef";
use smithers_store::{NewReview, RedactedConfig, SandboxStatus, SandboxUpsert, Store};

#[tokio::test]
async fn without_an_orchestrator_reviews_are_unavailable() {
    let host = common::start().await;
    let r = host.req(Method::GET, "/v1/reviews").send().await.unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "TASK_RUNTIME_UNAVAILABLE");
    host.health_ok().await;
    host.stop().await;
}

#[tokio::test]
async fn list_read_and_reject_a_pending_review() {
    let data = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(data.path().join("smithers.db")).unwrap());
    let project = tempfile::tempdir().unwrap();
    store
        .upsert_sandbox(&SandboxUpsert {
            config: Some(RedactedConfig::new(&json!({}))),
            status: Some(SandboxStatus::Review),
            ..SandboxUpsert::key("run-r", "sbx-r")
        })
        .unwrap();
    store
        .open_review(
            &NewReview {
                run_id: "run-r".into(),
                sandbox_id: "sbx-r".into(),
                root_dir: project.path().display().to_string(),
                bundle_path: data.path().join("bundle").display().to_string(),
                bundle_status: "finished".into(),
                remote_run_id: None,
                patch_count: 1,
                total_diff_lines: 2,
                duration_ms: 5.0,
                requested_at_ms: 1,
                bundle_digest: "sha256:none".into(),
            },
            &[],
        )
        .unwrap();
    let orch = Orchestrator::new(
        store.clone(),
        Arc::new(AtomicPatchApplier),
        Settings::default(),
    )
    .unwrap();
    let server = SandboxServer::new(
        ServerConfig {
            token: Some(common::TOKEN.into()),
            tokens: vec![ClientToken::new("client", CLIENT_TOKEN)],
            data_dir: data.path().join("host"),
            limits: common::small_limits(),
            shutdown_grace: Duration::from_secs(5),
        },
        Arc::new(HostProcessRuntime::new()),
    )
    .unwrap()
    .with_orchestrator(Arc::new(orch))
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.serve(listener, async move {
        let _ = rx.await;
    }));
    let http = reqwest::Client::new();
    let req = |m: Method, p: &str| {
        http.request(m, format!("{base}{p}"))
            .bearer_auth(common::TOKEN)
    };

    for (m, p) in [
        (Method::GET, "/v1/reviews"),
        (Method::GET, "/v1/runs/run-r/sandboxes/sbx-r/review"),
        (Method::POST, "/v1/runs/run-r/sandboxes/sbx-r/review/accept"),
        (Method::POST, "/v1/runs/run-r/sandboxes/sbx-r/review/reject"),
    ] {
        let r = http
            .request(m.clone(), format!("{base}{p}"))
            .bearer_auth(CLIENT_TOKEN)
            .json(&json!({"reason": "not mine"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{m} {p} as a client token");
    }
    let list: Vec<Value> = req(Method::GET, "/v1/reviews?state=pending")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["sandboxId"], "sbx-r");
    let r = req(Method::GET, "/v1/reviews?state=bogus")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let one: Value = req(Method::GET, "/v1/runs/run-r/sandboxes/sbx-r/review")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["review"]["state"], "pending");
    assert_eq!(one["review"]["totalDiffLines"], 2);
    let r = req(Method::GET, "/v1/runs/run-r/sandboxes/nope/review")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = req(Method::POST, "/v1/runs/run-r/sandboxes/nope/review/accept")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let r = req(Method::POST, "/v1/runs/run-r/sandboxes/sbx-r/review/reject")
        .body("{oops")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = req(Method::POST, "/v1/runs/run-r/sandboxes/sbx-r/review/reject")
        .json(&json!({"reason": "not today"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let one: Value = req(Method::GET, "/v1/runs/run-r/sandboxes/sbx-r/review")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["review"]["state"], "rejected");
    assert_eq!(one["review"]["reason"], "not today");
    // Decided once: a second decision is a conflict, and nothing was applied.
    let r = req(Method::POST, "/v1/runs/run-r/sandboxes/sbx-r/review/accept")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(std::fs::read_dir(project.path()).unwrap().count(), 0);
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}
