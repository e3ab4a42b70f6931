//! The HTTP API against a real server on 127.0.0.1:0, with real processes (the host-process
//! test double as runtime). Every bad-client case checks its documented status and code, that
//! nothing was left half-extracted, and that /health still answers afterwards.

mod common;

use std::time::Duration;

use common::{small_limits, start, start_with, TarBuilder, TOKEN};
use reqwest::Method;
use serde_json::{json, Value};
use smithers_runtime::Termination;
use smithers_wire::wire::{SandboxState, WireEvent};

async fn error_of(r: reqwest::Response) -> (u16, String, Value) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.expect("error bodies are JSON");
    let code = body["code"].as_str().expect("code").to_string();
    assert!(body["message"].is_string(), "{body}");
    assert!(body.get("details").is_some(), "{body}");
    (status, code, body["details"].clone())
}

#[tokio::test]
async fn happy_path_create_upload_execute_follow_bundle_cleanup() {
    let host = start().await;
    let id = host.create("happy").await;
    let archive = TarBuilder::new()
        .dir("src")
        .file("src/input.txt", b"hello from the workspace\n")
        .symlink("link.txt", "src/input.txt")
        .gzip();
    let r = host.upload(&id, archive).await;
    assert_eq!(r.status(), 200);
    let up: Value = r.json().await.unwrap();
    assert_eq!(up["bytes"], 25);
    host.ship(&id).await;
    let script = r#"cat link.txt; echo to-stderr >&2; printf '{"outputs":{"answer":42}}' > "$SMITHERS_SANDBOX_RESULT_PATH""#;
    let r = host.execute(&id, Some("k1"), &["sh", "-c", script]).await;
    assert_eq!(r.status(), 202);
    let events = host.events(&id, "", None).await;
    // Gap-free from 0.
    for (i, (seq, _)) in events.iter().enumerate() {
        assert_eq!(*seq, i as u64);
    }
    let kinds: Vec<&str> = events.iter().map(|(_, e)| e.name()).collect();
    assert_eq!(kinds.first(), Some(&"state"));
    assert!(events.iter().any(
        |(_, e)| matches!(e, WireEvent::Stdout { line, .. } if line == "hello from the workspace")
    ));
    assert!(events
        .iter()
        .any(|(_, e)| matches!(e, WireEvent::Stderr { line, .. } if line == "to-stderr")));
    let (_, last) = events.last().unwrap();
    let WireEvent::Completed { outcome, result } = last else {
        panic!("last event {last:?}")
    };
    assert_eq!(outcome.termination, Termination::Exited);
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(outcome.result.as_ref().unwrap()["outputs"]["answer"], 42);
    assert!(result.bundle_size_bytes > 0);

    let info: Value = host
        .req(Method::GET, &format!("/v1/sandboxes/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["state"], "completed");
    assert_eq!(info["lastSeq"], events.len() as u64 - 1);

    let r = host
        .req(Method::GET, &format!("/v1/sandboxes/{id}/bundle"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-tar");
    let tar_bytes = r.bytes().await.unwrap();
    let mut ar = tar::Archive::new(&tar_bytes[..]);
    let mut readme = None;
    for entry in ar.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.path().unwrap().to_str() == Some("README.md") {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut entry, &mut s).unwrap();
            readme = Some(s);
        }
    }
    let manifest: Value = serde_json::from_str(&readme.expect("README.md in the bundle")).unwrap();
    assert_eq!(manifest["status"], "finished");
    assert_eq!(manifest["outputs"]["answer"], 42);

    let list: Vec<Value> = host
        .req(Method::GET, "/v1/sandboxes")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list.len(), 1);

    let r = host
        .req(Method::DELETE, &format!("/v1/sandboxes/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = host
        .req(Method::DELETE, &format!("/v1/sandboxes/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "delete is idempotent");
    let r = host
        .req(Method::GET, &format!("/v1/sandboxes/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(!host.data.path().join("sandboxes").join(&id).exists());
    assert_eq!(host.runtime.executions(), 1);

    let metrics = host
        .http
        .get(host.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("smithers_sandbox_created_total{runtime=\"bubblewrap\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains(
        "smithers_sandbox_completed_total{runtime=\"bubblewrap\",status=\"finished\"} 1"
    ));
    assert!(metrics.contains("smithers_sandbox_active{runtime=\"bubblewrap\"} 0"));
    host.stop().await;
}

#[tokio::test]
async fn auth_is_required_and_checked() {
    let host = start().await;
    let r = host
        .http
        .get(host.url("/v1/sandboxes"))
        .send()
        .await
        .unwrap();
    assert!(r.headers().contains_key("www-authenticate"));
    let (s, c, d) = error_of(r).await;
    assert_eq!((s, c.as_str()), (401, "INVALID_INPUT"));
    assert_eq!(d["auth"], "missing");
    host.health_ok().await;
    let r = host
        .http
        .get(host.url("/v1/sandboxes"))
        .bearer_auth("wrong-token-wrong-token")
        .send()
        .await
        .unwrap();
    let (s, _, d) = error_of(r).await;
    assert_eq!(s, 401);
    assert_eq!(d["auth"], "invalid");
    // A prefix of the right token is wrong too.
    let r = host
        .http
        .get(host.url("/v1/sandboxes"))
        .bearer_auth(&TOKEN[..TOKEN.len() - 1])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    host.health_ok().await;
    host.stop().await;
}

#[tokio::test]
async fn malformed_oversized_and_unknown_requests() {
    let host = start().await;
    let post = |body: Vec<u8>| {
        host.req(Method::POST, "/v1/sandboxes")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let (s, c, _) = error_of(post(b"{not json".to_vec()).await.unwrap()).await;
    assert_eq!((s, c.as_str()), (400, "INVALID_INPUT"));
    host.health_ok().await;
    // rootDir is the host's choice: refused, not silently dropped.
    let (s, _, _) = error_of(
        post(br#"{"runId":"r","sandboxId":"s","rootDir":"/etc"}"#.to_vec())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 400);
    host.health_ok().await;
    let big = format!(
        r#"{{"runId":"r","sandboxId":"s","image":"{}"}}"#,
        "x".repeat(100 * 1024)
    );
    let (s, c, d) = error_of(post(big.into_bytes()).await.unwrap()).await;
    assert_eq!((s, c.as_str()), (413, "INVALID_INPUT"));
    assert_eq!(d["limit"], "jsonBytes");
    host.health_ok().await;
    // A rule of the config: a path-like id.
    let (s, c, _) = error_of(
        post(br#"{"runId":"../x","sandboxId":"s"}"#.to_vec())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, c.as_str()), (422, "INVALID_INPUT"));
    // Volumes name host paths: refused.
    let (s, c, _) = error_of(
        post(br#"{"runId":"r","sandboxId":"s","controls":{"volumes":[{"host":"/etc","container":"/data"}]}}"#.to_vec())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, c.as_str()), (422, "TASK_RUNTIME_UNAVAILABLE"));
    // A control the runtime cannot enforce is refused, not ignored.
    let (s, c, d) = error_of(
        post(br#"{"runId":"r","sandboxId":"s","controls":{"memoryLimitBytes":1048576}}"#.to_vec())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, c.as_str()), (422, "TASK_RUNTIME_UNAVAILABLE"));
    assert_eq!(d["control"], "memoryLimit");
    host.health_ok().await;

    for (method, path) in [
        (Method::GET, "/v1/sandboxes/nope"),
        (Method::PUT, "/v1/sandboxes/nope/request"),
        (Method::POST, "/v1/sandboxes/nope/cancel"),
        (Method::GET, "/v1/sandboxes/nope/events"),
        (Method::GET, "/v1/sandboxes/nope/bundle"),
        (Method::PUT, "/v1/sandboxes/nope/workspace"),
    ] {
        let r = host
            .req(method.clone(), path)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        let (s, c, _) = error_of(r).await;
        assert_eq!((s, c.as_str()), (404, "INVALID_INPUT"), "{method} {path}");
    }
    let (s, _, _) = error_of(host.req(Method::GET, "/v1/nothing").send().await.unwrap()).await;
    assert_eq!(s, 404);
    // Duplicate runId:sandboxId.
    host.create("dup").await;
    let r = host
        .req(Method::POST, "/v1/sandboxes")
        .json(&json!({"runId": "run-1", "sandboxId": "dup"}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(r).await.0, 409);
    host.health_ok().await;
    host.stop().await;
}

/// Only the runtime's own state may be in the workspace after a refused upload.
fn workspace_untouched(host: &common::Host, id: &str) {
    let dir = host.data.path().join("sandboxes").join(id);
    let ws: Vec<String> = std::fs::read_dir(dir.join("workspace"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        ws,
        vec![".smithers".to_string()],
        "workspace changed: {ws:?}"
    );
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        // The runtime handle the next server recovers from, if this one dies.
        .filter(|n| n != "workspace" && n != "handle.json")
        .collect();
    assert!(leftovers.is_empty(), "staging left behind: {leftovers:?}");
}

#[tokio::test]
async fn hostile_archives_are_refused_whole() {
    let host = start().await;
    let id = host.create("hostile").await;
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "dotdot",
            TarBuilder::new()
                .file("ok.txt", b"1")
                .file("../escape.txt", b"x")
                .zstd(),
            422,
            "TOOL_PATH_ESCAPE",
        ),
        (
            "nested dotdot",
            TarBuilder::new().file("a/../../escape.txt", b"x").zstd(),
            422,
            "TOOL_PATH_ESCAPE",
        ),
        (
            "absolute",
            TarBuilder::new()
                .file("/tmp/smithers-escape.txt", b"x")
                .zstd(),
            422,
            "TOOL_PATH_ESCAPE",
        ),
        (
            "symlink out",
            TarBuilder::new().symlink("etc", "/etc").zstd(),
            422,
            "TOOL_PATH_ESCAPE",
        ),
        (
            "symlink climbs",
            TarBuilder::new().symlink("a/up", "../../x").zstd(),
            422,
            "TOOL_PATH_ESCAPE",
        ),
        (
            "write through symlink",
            TarBuilder::new()
                .dir("real")
                .symlink("d", "real")
                .file("d/x.txt", b"x")
                .zstd(),
            422,
            "TOOL_PATH_ESCAPE",
        ),
        (
            "hardlink",
            TarBuilder::new().file("a", b"1").hardlink("b", "a").zstd(),
            422,
            "TOOL_PATH_ESCAPE",
        ),
        (
            "hardlink out",
            TarBuilder::new().hardlink("shadow", "/etc/shadow").zstd(),
            422,
            "TOOL_PATH_ESCAPE",
        ),
        (
            "char device",
            TarBuilder::new()
                .special("null", tar::EntryType::Char)
                .zstd(),
            422,
            "INVALID_INPUT",
        ),
        (
            "block device",
            TarBuilder::new()
                .special("sda", tar::EntryType::Block)
                .zstd(),
            422,
            "INVALID_INPUT",
        ),
        (
            "fifo",
            TarBuilder::new()
                .special("pipe", tar::EntryType::Fifo)
                .zstd(),
            422,
            "INVALID_INPUT",
        ),
        (
            "reserved",
            TarBuilder::new().file(".smithers/db", b"x").zstd(),
            422,
            "INVALID_INPUT",
        ),
        (
            "duplicate",
            TarBuilder::new().file("a", b"1").file("a", b"2").zstd(),
            422,
            "INVALID_INPUT",
        ),
        (
            "too big",
            TarBuilder::new()
                .file("big", &vec![7u8; 2 * 1024 * 1024])
                .zstd(),
            413,
            "INVALID_INPUT",
        ),
        (
            "too many entries",
            {
                let mut t = TarBuilder::new();
                for i in 0..60 {
                    t.file(&format!("f{i}"), b"");
                }
                t.zstd()
            },
            413,
            "INVALID_INPUT",
        ),
        (
            "garbage",
            b"this is not an archive at all, not even close..........".repeat(20),
            400,
            "INVALID_INPUT",
        ),
        (
            "truncated zstd",
            TarBuilder::new().file("a", &[1u8; 5000]).zstd()[..40].to_vec(),
            400,
            "INVALID_INPUT",
        ),
    ];
    for (name, body, status, code) in cases {
        let r = host.upload(&id, body).await;
        let (s, c, d) = error_of(r).await;
        assert_eq!((s, c.as_str()), (status, code), "{name}: {d}");
        workspace_untouched(&host, &id);
        host.health_ok().await;
    }
    assert!(!std::path::Path::new("/tmp/smithers-escape.txt").exists());
    // An upload larger on the wire than allowed: refused from Content-Length.
    let r = host.upload(&id, vec![0u8; 5 * 1024 * 1024]).await;
    let (s, _, d) = error_of(r).await;
    assert_eq!(s, 413);
    assert_eq!(d["limit"], "uploadBytes");
    host.health_ok().await;
    // The sandbox is still usable: a good upload goes through.
    let r = host
        .upload(&id, TarBuilder::new().file("fine.txt", b"ok").zstd())
        .await;
    assert_eq!(r.status(), 200);
    let metrics = host
        .http
        .get(host.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("smithers_server_rejected_uploads_total{code=\"TOOL_PATH_ESCAPE\"} 8"),
        "{metrics}"
    );
    host.stop().await;
}

#[tokio::test]
async fn execute_is_idempotent_by_key_and_never_runs_twice() {
    let host = start().await;
    let id = host.create("idem").await;
    // Wrong state first: not shipped.
    let (s, c, d) = error_of(host.execute(&id, Some("k"), &["true"]).await).await;
    assert_eq!((s, c.as_str()), (409, "SANDBOX_EXECUTION_FAILED"));
    assert_eq!(d["state"], "created");
    host.ship(&id).await;
    // Shipping the identical request again is answered again; a different one is refused.
    host.ship(&id).await;
    let r = host
        .req(Method::PUT, &format!("/v1/sandboxes/{id}/request"))
        .json(&json!({"other": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(r).await.0, 409);
    let r = host
        .upload(&id, TarBuilder::new().file("late", b"x").zstd())
        .await;
    assert_eq!(error_of(r).await.0, 409, "no upload after ship");
    let bad_key = host
        .execute(&id, Some("bad key with spaces"), &["true"])
        .await;
    assert_eq!(bad_key.status(), 400);

    let r = host
        .execute(&id, Some("key-1"), &["sh", "-c", "echo ran"])
        .await;
    assert_eq!(r.status(), 202);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["started"], true);
    let r = host
        .execute(&id, Some("key-1"), &["sh", "-c", "echo ran"])
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["started"], false);
    let (s, _, _) = error_of(
        host.execute(&id, Some("key-2"), &["sh", "-c", "echo ran"])
            .await,
    )
    .await;
    assert_eq!(s, 409);
    let (s, _, _) = error_of(host.execute(&id, None, &["sh", "-c", "echo ran"]).await).await;
    assert_eq!(s, 409);
    let events = host.events(&id, "", None).await;
    let ran = events
        .iter()
        .filter(|(_, e)| matches!(e, WireEvent::Stdout { line, .. } if line == "ran"))
        .count();
    assert_eq!(ran, 1);
    assert_eq!(host.runtime.executions(), 1);
    // Still the same key after completion: still a retry, not a new run.
    let r = host
        .execute(&id, Some("key-1"), &["sh", "-c", "echo ran"])
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(host.runtime.executions(), 1);
    host.health_ok().await;
    host.stop().await;
}

#[tokio::test]
async fn events_resume_from_seq_and_last_event_id() {
    let host = start().await;
    let id = host.create("resume").await;
    host.ship(&id).await;
    host.execute(
        &id,
        Some("k"),
        &["sh", "-c", "echo one; echo two; echo three"],
    )
    .await;
    let all = host.events(&id, "", None).await;
    assert!(all.len() >= 6, "{all:?}");
    let from3 = host.events(&id, "?since=3", None).await;
    assert_eq!(from3.first().unwrap().0, 3);
    assert_eq!(from3, all[3..].to_vec());
    let after2 = host.events(&id, "", Some(2)).await;
    assert_eq!(after2, all[3..].to_vec());
    // since wins over Last-Event-ID.
    let both = host.events(&id, "?since=1", Some(4)).await;
    assert_eq!(both, all[1..].to_vec());
    let r = host
        .req(Method::GET, &format!("/v1/sandboxes/{id}/events?since=abc"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(r).await.0, 400);
    host.health_ok().await;
    host.stop().await;
}

#[tokio::test]
async fn cancel_running_and_not_yet_running() {
    let host = start().await;
    // Not yet running: cancelled, no bundle, execute refused.
    let id = host.create("early").await;
    let r = host
        .req(Method::POST, &format!("/v1/sandboxes/{id}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["state"], "cancelled");
    let r = host
        .req(Method::GET, &format!("/v1/sandboxes/{id}/bundle"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(r).await.0, 409);

    // Running: every process is killed; the bundle says cancelled.
    let id = host.create("running").await;
    host.ship(&id).await;
    host.execute(
        &id,
        Some("k"),
        &["sh", "-c", "echo started; sleep 60 & sleep 60; echo never"],
    )
    .await;
    let stream_host = &host;
    let follow = stream_host.events(&id, "", None);
    let canceller = async {
        // Wait for the step to be running and to have printed, without timing assumptions.
        loop {
            let v: Value = host
                .req(Method::GET, &format!("/v1/sandboxes/{id}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if v["lastSeq"].as_u64().unwrap_or(0) >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let r = host
            .req(Method::POST, &format!("/v1/sandboxes/{id}/cancel"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    };
    let (events, ()) = tokio::join!(follow, canceller);
    let WireEvent::Completed { outcome, .. } = &events.last().unwrap().1 else {
        panic!("{events:?}")
    };
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert!(!events
        .iter()
        .any(|(_, e)| matches!(e, WireEvent::Stdout { line, .. } if line == "never")));
    let r = host
        .req(Method::GET, &format!("/v1/sandboxes/{id}/bundle"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Cancel again: a no-op.
    let r = host
        .req(Method::POST, &format!("/v1/sandboxes/{id}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    host.health_ok().await;
    host.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_cancels_steps_after_the_grace_period() {
    let host = start_with(small_limits(), Duration::from_millis(300)).await;
    let id = host.create("long").await;
    host.ship(&id).await;
    host.execute(&id, Some("k"), &["sh", "-c", "echo started; sleep 60"])
        .await;
    let follow = {
        let r = host
            .req(Method::GET, &format!("/v1/sandboxes/{id}/events"))
            .send()
            .await
            .unwrap();
        r
    };
    let mut stream = futures_util::StreamExt::boxed(follow.bytes_stream());
    let mut parser = smithers_wire::SseParser::new();
    let mut seen = Vec::new();
    // Read until the step printed, then shut down.
    'outer: while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
        for f in parser.push(&chunk.unwrap()) {
            let ev: WireEvent = serde_json::from_str(&f.data).unwrap();
            let started = matches!(&ev, WireEvent::Stdout { line, .. } if line == "started");
            seen.push(ev);
            if started {
                break 'outer;
            }
        }
    }
    let base = host.base.clone();
    let http = host.http.clone();
    let stopping = tokio::spawn(host.stop());
    while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
        for f in parser.push(&chunk.unwrap()) {
            seen.push(serde_json::from_str(&f.data).unwrap());
        }
    }
    stopping.await.unwrap();
    let WireEvent::Completed { outcome, .. } = seen.last().unwrap() else {
        panic!("{seen:?}")
    };
    assert_eq!(outcome.termination, Termination::Cancelled);
    // The listener is gone.
    assert!(http.get(format!("{base}/health")).send().await.is_err());
}

#[tokio::test]
async fn refuses_to_listen_openly_without_a_token() {
    let err =
        smithers_server::check_exposure(false, "192.0.2.1:7420".parse().unwrap()).unwrap_err();
    assert!(err.to_string().contains("SMITHERS_SANDBOX_TOKEN"), "{err}");
    smithers_server::check_exposure(false, "127.0.0.1:7420".parse().unwrap()).unwrap();
    smithers_server::check_exposure(false, "[::1]:7420".parse().unwrap()).unwrap();
    smithers_server::check_exposure(true, "192.0.2.1:7420".parse().unwrap()).unwrap();
    // And a short token is refused outright.
    let dir = tempfile::tempdir().unwrap();
    let config = smithers_server::ServerConfig {
        token: Some("short".into()),
        tokens: Vec::new(),
        data_dir: dir.path().to_path_buf(),
        limits: small_limits(),
        shutdown_grace: Duration::from_secs(1),
    };
    let rt = std::sync::Arc::new(smithers_server::testing::HostProcessRuntime::new());
    assert!(smithers_server::SandboxServer::new(config, rt).is_err());
}

#[tokio::test]
async fn openapi_document_is_served_and_covers_every_route() {
    let host = start().await;
    let served = host
        .http
        .get(host.url("/v1/openapi.yaml"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../openapi/smithers-sandbox.yaml"
    ))
    .unwrap();
    assert_eq!(served, file);
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&file).unwrap();
    let paths = doc["paths"].as_mapping().unwrap();
    // Every route registered in the router (read from its source, so a new route cannot be
    // added without documenting it).
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let router_src =
        &source[source.find("pub fn router").unwrap()..source.find("pub async fn serve").unwrap()];
    let mut routes = Vec::new();
    for chunk in router_src.split(".route(").skip(1) {
        let path = chunk.split('"').nth(1).unwrap().to_string();
        let call = &chunk[..chunk.find("))").unwrap_or(chunk.len())];
        let full = if path.starts_with("/v1") || path == "/health" || path == "/metrics" {
            path
        } else {
            format!("/v1{path}")
        };
        for method in ["get", "post", "put", "delete"] {
            if call.contains(&format!("{method}(routes::"))
                || call.contains(&format!("{method}(review::"))
                || call.contains(&format!("{method}(session::"))
                || call.contains(&format!("{method}(mcp::"))
                || call.contains(&format!("{method}(fork::"))
            {
                routes.push((method, full.clone()));
            }
        }
    }
    assert!(routes.len() >= 18, "{routes:?}");
    for (method, path) in &routes {
        let item = paths
            .get(serde_yaml_ng::Value::String(path.clone()))
            .unwrap_or_else(|| panic!("{path} missing from the OpenAPI document"));
        assert!(
            item.get(*method).is_some(),
            "{method} {path} missing from the OpenAPI document"
        );
        // And the route really is routed: not the JSON fallback "no such route".
        let url = host.url(
            &path
                .replace("{id}", "sbx-none")
                .replace("{run_id}", "r")
                .replace("{sandbox_id}", "s"),
        );
        let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let r = host
            .http
            .request(m, url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_ne!(r.status(), 405, "{method} {path}");
        assert_ne!(r.status(), 401, "{method} {path}");
        if r.status() == 404 {
            let body: Value = r.json().await.unwrap();
            assert_ne!(
                body["message"], "no such route",
                "{method} {path} is not routed"
            );
        }
    }
    // And nothing documented that is not routed.
    for (path, item) in paths {
        for method in item.as_mapping().unwrap().keys() {
            let m = method.as_str().unwrap();
            if m == "parameters" {
                continue;
            }
            assert!(
                routes
                    .iter()
                    .any(|(rm, rp)| *rm == m && rp == path.as_str().unwrap()),
                "{m} {path:?} documented but not routed"
            );
        }
    }
    let _ = SandboxState::Created;
    host.stop().await;
}

#[tokio::test]
async fn orphaned_step_is_cancelled_when_nobody_follows_it() {
    let limits = smithers_server::Limits {
        orphan_timeout: Some(Duration::from_millis(300)),
        ..small_limits()
    };
    let host = start_with(limits, Duration::from_secs(5)).await;
    let id = host.create("orphan").await;
    host.ship(&id).await;
    host.execute(&id, Some("k"), &["sh", "-c", "sleep 60"])
        .await;
    // Nobody follows: wait (without a deadline of our own) for the host to give up on it.
    loop {
        let v: Value = host
            .req(Method::GET, &format!("/v1/sandboxes/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["state"] != "running" {
            assert_eq!(v["state"], "completed");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = host.events(&id, "", None).await;
    assert!(events.iter().any(
        |(_, e)| matches!(e, WireEvent::Stderr { line, .. } if line.contains("no client followed"))
    ));
    let WireEvent::Completed { outcome, .. } = &events.last().unwrap().1 else {
        panic!("{events:?}")
    };
    assert_eq!(outcome.termination, Termination::Cancelled);
    host.stop().await;
}
