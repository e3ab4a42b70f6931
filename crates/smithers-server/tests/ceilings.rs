//! The operator's ceilings and scoped tokens, against a real server: clients' network and
//! oversized limits refused by default, compression bombs cut off early, one token unable to
//! see or touch another's sandboxes, the sandbox caps and the idle expiry.

mod common;

use std::io::Write;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use smithers_runtime::Termination;
use smithers_server::{ClientToken, Limits, ServerConfig};
use smithers_wire::wire::WireEvent;

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef00";

fn two_tokens(limits: Limits) -> impl FnOnce(&std::path::Path) -> ServerConfig {
    move |data| ServerConfig {
        token: None,
        tokens: vec![
            ClientToken::new("alice", ALICE),
            ClientToken::new("bob", BOB),
        ],
        data_dir: data.to_path_buf(),
        limits,
        shutdown_grace: Duration::from_secs(5),
    }
}

async fn send(
    host: &common::Host,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut b = host.http.request(method, host.url(path)).bearer_auth(token);
    if let Some(body) = body {
        b = b.json(&body);
    }
    let r = b.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn create_as(
    host: &common::Host,
    token: &str,
    sandbox_id: &str,
    controls: Value,
) -> (u16, Value) {
    send(
        host,
        token,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"runId": "run-1", "sandboxId": sandbox_id, "controls": controls})),
    )
    .await
}

#[tokio::test]
async fn network_and_oversized_limits_are_refused_by_default() {
    let host = common::start_with(Limits::default(), Duration::from_secs(5)).await;
    let (status, body) =
        create_as(&host, common::TOKEN, "net", json!({"allowNetwork": true})).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--allow-network"),
        "{body}"
    );
    for (controls, flag) in [
        (json!({"memoryLimitBytes": 64u64 << 30}), "--max-memory"),
        (json!({"cpuLimit": 64.0}), "--max-cpus"),
        (json!({"pidsLimit": 1_000_000}), "--max-pids"),
        (json!({"diskLimitBytes": 1u64 << 40}), "--max-disk"),
        (json!({"timeoutMs": 86_400_000u64}), "--max-timeout"),
        (json!({"maxOutputBytes": 1u64 << 30}), "--max-output"),
    ] {
        let (status, body) = create_as(&host, common::TOKEN, "big", controls.clone()).await;
        assert_eq!(status, 422, "{controls} → {body}");
        assert_eq!(body["details"]["operatorFlag"], flag, "{body}");
    }
    // Nothing was created by the refusals.
    let r = host.req(Method::GET, "/v1/sandboxes").send().await.unwrap();
    assert_eq!(r.json::<Vec<Value>>().await.unwrap().len(), 0);
    host.stop().await;
}

#[tokio::test]
async fn a_step_asking_no_timeout_or_output_cap_gets_the_ceilings() {
    let mut limits = common::small_limits();
    limits.ceilings.max_timeout = Duration::from_millis(1500);
    limits.ceilings.max_output_bytes = 1000;
    let host = common::start_with(limits, Duration::from_secs(5)).await;
    let id = host.create("defaults").await;
    host.ship(&id).await;
    let script = "head -c 5000 /dev/zero | tr '\\0' a; echo; sleep 30";
    let r = host.execute(&id, None, &["sh", "-c", script]).await;
    assert_eq!(r.status(), 202);
    let events = host.events(&id, "", None).await;
    let Some((_, WireEvent::Completed { outcome, .. })) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(
        outcome.termination,
        Termination::Timeout,
        "the 1.5 s ceiling applied"
    );
    assert!(outcome.stdout_truncated, "the 1000-byte ceiling applied");
    // Asked for explicitly, a value within the ceiling is kept as asked.
    let (status, body) = create_as(
        &host,
        common::TOKEN,
        "within",
        json!({"timeoutMs": 1000, "maxOutputBytes": 500}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    host.stop().await;
}

#[tokio::test]
async fn an_operator_who_allows_network_lets_clients_have_it() {
    let mut limits = Limits::default();
    limits.ceilings.allow_network = true;
    let host = common::start_with(limits, Duration::from_secs(5)).await;
    let (status, body) =
        create_as(&host, common::TOKEN, "net", json!({"allowNetwork": true})).await;
    assert_eq!(status, 201, "{body}");
    host.stop().await;
}

/// A gzip of one file of `size` zero bytes: small on the wire, large unpacked.
fn gzip_bomb(size: u64) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut b = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_path("zeros.bin").unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    b.append(&h, std::io::repeat(0).take(size)).unwrap();
    let mut gz = b.into_inner().unwrap();
    gz.flush().unwrap();
    gz.finish().unwrap()
}

use std::io::Read as _;

#[tokio::test]
async fn a_compression_bomb_is_cut_off_early_and_its_staging_removed() {
    let host = common::start().await; // 1 MiB unpacked at most
    let id = host.create("bomb").await;
    let bomb = gzip_bomb(64 << 20);
    assert!(
        bomb.len() < 128 * 1024,
        "a small upload: {} bytes",
        bomb.len()
    );
    let r = host.upload(&id, bomb).await;
    assert_eq!(r.status(), 413);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["details"]["limit"], "totalBytes", "{body}");
    let dir = host.data.path().join("sandboxes").join(&id);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("staging-"))
        .collect();
    assert!(left.is_empty(), "staging left behind: {left:?}");
    host.health_ok().await;
    host.stop().await;
}

#[tokio::test]
async fn one_token_cannot_see_or_touch_anothers_sandbox() {
    let host = common::start_config(two_tokens(common::small_limits())).await;
    let (status, created) = create_as(&host, ALICE, "mine", json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    // Bob's list is empty, and every verb on alice's sandbox answers as for no sandbox.
    let (status, list) = send(&host, BOB, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!((status, list), (200, json!([])));
    for (method, path, body) in [
        (Method::GET, format!("/v1/sandboxes/{id}"), None),
        (Method::POST, format!("/v1/sandboxes/{id}/cancel"), None),
        (Method::GET, format!("/v1/sandboxes/{id}/bundle"), None),
        (Method::GET, format!("/v1/sandboxes/{id}/events"), None),
        (
            Method::PUT,
            format!("/v1/sandboxes/{id}/request"),
            Some(json!({"input": {}})),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/execute"),
            Some(json!({"argv": ["true"]})),
        ),
    ] {
        let (status, body) = send(&host, BOB, method.clone(), &path, body).await;
        assert_eq!(status, 404, "{method} {path} as bob: {body}");
        assert_eq!(body["message"], format!("no sandbox with id {id:?}"));
    }
    let r = host
        .http
        .put(host.url(&format!("/v1/sandboxes/{id}/workspace")))
        .bearer_auth(BOB)
        .body(common::TarBuilder::new().file("x", b"1").zstd())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Delete is idempotent: bob gets what an unknown id gets, and alice's sandbox stays.
    let (status, _) = send(
        &host,
        BOB,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, mine) = send(
        &host,
        ALICE,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{mine}");
    assert_eq!(mine["state"], "created", "bob's cancel did nothing");
    let (_, list) = send(&host, ALICE, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    // Names are never secrets: a wrong token is refused outright.
    let (status, _) = send(&host, "alice", Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 401);
    host.stop().await;
}

#[tokio::test]
async fn sandboxes_are_capped_per_token_and_in_all() {
    let limits = Limits {
        max_sandboxes: 3,
        max_sandboxes_per_token: 2,
        ..common::small_limits()
    };
    let host = common::start_config(two_tokens(limits)).await;
    for n in 0..2 {
        let (status, body) = create_as(&host, ALICE, &format!("a{n}"), json!({})).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = create_as(&host, ALICE, "a2", json!({})).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["details"]["limit"], "sandboxesPerToken");
    let (status, body) = create_as(&host, BOB, "b0", json!({})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let (status, body) = create_as(&host, BOB, "b1", json!({})).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["details"]["limit"], "sandboxes");
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("--max-sandboxes"));
    // A deleted sandbox frees its slot.
    let (status, _) = send(
        &host,
        BOB,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = create_as(&host, BOB, "b1", json!({})).await;
    assert_eq!(status, 201, "{body}");
    host.stop().await;
}

#[tokio::test]
async fn an_idle_sandbox_expires_and_a_busy_one_does_not() {
    let limits = Limits {
        idle_expiry: Some(Duration::from_millis(600)),
        ..common::small_limits()
    };
    let host = common::start_with(limits, Duration::from_secs(5)).await;
    let idle = host.create("idle").await;
    let busy = host.create("busy").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = host
            .req(Method::GET, &format!("/v1/sandboxes/{busy}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "a sandbox polled every 100 ms is not idle");
        // The list touches nothing: only requests on a sandbox keep it alive.
        let r = host.req(Method::GET, "/v1/sandboxes").send().await.unwrap();
        let ids: Vec<String> = r
            .json::<Vec<Value>>()
            .await
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect();
        assert!(ids.contains(&busy));
        if !ids.contains(&idle) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the idle sandbox never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !host.data.path().join("sandboxes").join(&idle).exists(),
        "an expired sandbox's directory is removed"
    );
    host.stop().await;
}

/// A run resumed after its client died before cleanup creates the same `runId:sandboxId`
/// again: refused naming the sandbox in the way, or (`ifExists: replace`) the old one,
/// running, is cancelled and removed and a new one made. Names are per token: bob's sandbox of
/// the same name neither conflicts with alice's nor is revealed to her, and is never replaced.
#[tokio::test]
async fn a_name_taken_is_refused_naming_it_or_replaced_and_names_are_per_token() {
    let host = common::start_config(two_tokens(common::small_limits())).await;
    let (status, old) = create_as(&host, ALICE, "step", json!({})).await;
    assert_eq!(status, 201, "{old}");
    let old_id = old["id"].as_str().unwrap().to_string();
    // Bob may use the same name: his own sandbox, and no word of alice's.
    let (status, bobs) = create_as(&host, BOB, "step", json!({})).await;
    assert_eq!(status, 201, "{bobs}");
    let bob_id = bobs["id"].as_str().unwrap().to_string();

    // The old one is running when its client dies.
    let path = format!("/v1/sandboxes/{old_id}");
    let (s, _) = send(
        &host,
        ALICE,
        Method::PUT,
        &format!("{path}/request"),
        Some(json!({"input": {}})),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = send(
        &host,
        ALICE,
        Method::POST,
        &format!("{path}/execute"),
        Some(json!({"argv": ["sh", "-c", "sleep 600"]})),
    )
    .await;
    assert_eq!(s, 202);

    let (status, err) = create_as(&host, ALICE, "step", json!({})).await;
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["details"]["id"], old_id.as_str());
    assert!(err["message"].as_str().unwrap().contains(&old_id), "{err}");
    assert!(
        !err.to_string().contains(&bob_id),
        "bob's sandbox is not named to alice: {err}"
    );

    let (status, new) = send(
        &host,
        ALICE,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"runId": "run-1", "sandboxId": "step", "ifExists": "replace"})),
    )
    .await;
    assert_eq!(status, 201, "{new}");
    let new_id = new["id"].as_str().unwrap();
    assert_ne!(new_id, old_id);
    let (s, _) = send(&host, ALICE, Method::GET, &path, None).await;
    assert_eq!(s, 404, "the replaced sandbox is gone");
    let (_, list) = send(&host, ALICE, Method::GET, "/v1/sandboxes", None).await;
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [new_id]);
    // Bob's is untouched.
    let (s, mine) = send(
        &host,
        BOB,
        Method::GET,
        &format!("/v1/sandboxes/{bob_id}"),
        None,
    )
    .await;
    assert_eq!((s, mine["state"].as_str()), (200, Some("created")));
    // A mistyped choice is refused, not read as the default.
    let (s, _) = send(
        &host,
        ALICE,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"runId": "run-1", "sandboxId": "other", "ifExists": "overwrite"})),
    )
    .await;
    assert_eq!(s, 400);
    host.stop().await;
}
