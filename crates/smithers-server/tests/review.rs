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
                applied_by: None,
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

/// A review decision whose store call waits for the database's write lock (held by another
/// connection, as another process would) runs on a blocking thread: on a runtime with ONE
/// thread, `/health` still answers meanwhile. Before, the handler ran the decision on that
/// thread and `/health` waited for the store's busy timeout (30 s).
#[tokio::test]
async fn health_answers_while_a_review_decision_waits_for_the_store() {
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("smithers.db");
    let store = Arc::new(Store::open(&db).unwrap());
    let project = tempfile::tempdir().unwrap();
    store
        .upsert_sandbox(&SandboxUpsert {
            config: Some(RedactedConfig::new(&json!({}))),
            status: Some(SandboxStatus::Review),
            ..SandboxUpsert::key("run-w", "sbx-w")
        })
        .unwrap();
    store
        .open_review(
            &NewReview {
                run_id: "run-w".into(),
                sandbox_id: "sbx-w".into(),
                root_dir: project.path().display().to_string(),
                bundle_path: data.path().join("bundle").display().to_string(),
                bundle_status: "finished".into(),
                remote_run_id: None,
                patch_count: 0,
                total_diff_lines: 0,
                duration_ms: 5.0,
                requested_at_ms: 1,
                bundle_digest: "sha256:none".into(),
                applied_by: None,
            },
            &[],
        )
        .unwrap();
    let orch = Orchestrator::new(store, Arc::new(AtomicPatchApplier), Settings::default()).unwrap();
    let server = SandboxServer::new(
        ServerConfig {
            token: Some(common::TOKEN.into()),
            tokens: Vec::new(),
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

    let other = rusqlite::Connection::open(&db).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let reject = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            http.post(format!(
                "{base}/v1/runs/run-w/sandboxes/sbx-w/review/reject"
            ))
            .bearer_auth(common::TOKEN)
            .json(&json!({"reason": "stuck"}))
            .send()
            .await
        })
    };
    // Let the decision reach its store call and wait there for the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !reject.is_finished(),
        "the decision did not wait for the lock"
    );
    let asked = std::time::Instant::now();
    let health = http.get(format!("{base}/health")).send().await.unwrap();
    let took = asked.elapsed();
    assert_eq!(health.status(), 200);
    assert!(!reject.is_finished(), "the lock is still held");
    other.execute_batch("COMMIT").unwrap();
    let rejected = reject.await.unwrap().unwrap();
    assert_eq!(rejected.status(), 200);
    println!("/health took {took:?} while a review decision waited for the store");
    // Loose: it answers in milliseconds; stalled, it took the store's 30 s busy timeout.
    assert!(
        took < Duration::from_secs(5),
        "/health waited {took:?} for a review decision"
    );
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}
