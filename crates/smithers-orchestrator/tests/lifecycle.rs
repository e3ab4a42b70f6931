//! Event order and payloads of every lifecycle path, against a real SQLite file and a real
//! child process (through the host-process TEST DOUBLE runtime in `support`).

mod support;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};
use smithers_orchestrator::*;
use smithers_runtime::{CancellationToken, StepCommand};
use smithers_store::{
    AdmitRequest, OwnerIdentity, PatchOperation, RedactedConfig, ReviewState, SandboxStatus, Store,
};
use support::*;

const RUN: &str = "run-1";

/// (sandbox id, stage, progress) of every heartbeat received.
type Beats = Arc<Mutex<Vec<(String, &'static str, u8)>>>;

struct Harness {
    _dir: tempfile::TempDir,
    root: PathBuf,
    db: PathBuf,
    store: Arc<Store>,
    runtime: Arc<HostProcessTestRuntime>,
    orch: Orchestrator,
    beats: Beats,
}

fn harness_with(settings: Settings) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("hello.txt"), "hello\n").unwrap();
    let db = dir.path().join("smithers.db");
    let store = Arc::new(Store::open(&db).unwrap());
    let runtime = Arc::new(HostProcessTestRuntime::default());
    let orch = Orchestrator::new(store.clone(), Arc::new(AtomicPatchApplier), settings)
        .unwrap()
        .with_runtime(runtime.clone());
    Harness {
        _dir: dir,
        root,
        db,
        store,
        runtime,
        orch,
        beats: Arc::new(Mutex::new(Vec::new())),
    }
}

fn harness() -> Harness {
    harness_with(Settings::default())
}

impl Harness {
    fn ctx(&self) -> StepContext {
        let beats = self.beats.clone();
        StepContext {
            heartbeat: Some(Arc::new(move |hb: &Heartbeat| {
                beats
                    .lock()
                    .unwrap()
                    .push((hb.sandbox_id.clone(), hb.stage, hb.progress));
            })),
            ..Default::default()
        }
    }

    fn request(&self, sandbox: &str, script: &str) -> SandboxRequest {
        let mut r = SandboxRequest::new(RUN, sandbox, &self.root);
        r.command = Some(StepCommand {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            cwd: None,
            stdin: Default::default(),
        });
        r.input = json!({"question": "six times seven"});
        r.config = json!({"env": {"API_TOKEN": "s3cret-value"}, "memoryLimit": "512m"});
        r
    }

    /// Events of one sandbox: (type, payload).
    fn events(&self, sandbox: &str) -> Vec<(String, Value)> {
        self.store
            .events_since(RUN, 0)
            .unwrap()
            .into_iter()
            .map(|e| {
                let p: Value = serde_json::from_str(&e.payload_json).unwrap();
                assert_eq!(p["type"], e.event_type.as_str());
                assert_eq!(p["runId"], RUN);
                assert!(p["timestampMs"].as_i64().unwrap() > 0);
                assert_eq!(p["timestampMs"].as_i64().unwrap(), e.timestamp_ms);
                (e.event_type, p)
            })
            .filter(|(_, p)| p["sandboxId"] == sandbox)
            .collect()
    }

    fn types(&self, sandbox: &str) -> Vec<String> {
        self.events(sandbox).into_iter().map(|(t, _)| t).collect()
    }

    fn stages(&self, sandbox: &str) -> Vec<&'static str> {
        self.beats
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, _, _)| s == sandbox)
            .map(|(_, st, _)| *st)
            .collect()
    }
}

fn payload<'a>(events: &'a [(String, Value)], ty: &str) -> &'a Value {
    &events
        .iter()
        .find(|(t, _)| t == ty)
        .unwrap_or_else(|| panic!("no {ty}"))
        .1
}

const ADD_WORLD_PATCH: &str = r#"mkdir -p "$OUT/patches" && cat > "$OUT/patches/0001-hello.patch" <<'P'
diff --git a/hello.txt b/hello.txt
index ce013625030ba8dba906f756967f9e9ca394464a..0056b4ab5bae17e5bd426bcdd9f73103d9109e80 100644
--- a/hello.txt
+++ b/hello.txt
@@ -1 +1,3 @@
 hello
+world
+again
P
"#;

fn write_result(status: &str) -> String {
    format!(
        r#"echo '{{"status":"{status}","outputs":{{"answer":42}}}}' > "$SMITHERS_SANDBOX_RESULT_PATH""#
    )
}

fn assert_standard_payloads(events: &[(String, Value)]) {
    let created = payload(events, "SandboxCreated");
    assert_eq!(created["runtime"], "bubblewrap");
    let config: Value = serde_json::from_str(created["configJson"].as_str().unwrap()).unwrap();
    assert_eq!(config["env"]["API_TOKEN"], "[redacted]");
    assert_eq!(config["selectedRuntime"], "bubblewrap");
    assert_eq!(config["reviewDiffs"], true);
    // Every output cap the step ran under is recorded, not only the byte cap.
    assert_eq!(config["maxOutputLines"], 100_000);
    assert_eq!(config["failOnOutputCap"], false);
    assert!(!created.to_string().contains("s3cret-value"));
    let shipped = payload(events, "SandboxShipped");
    assert_eq!(shipped["runtime"], "bubblewrap");
    assert!(shipped["bundleSizeBytes"].as_u64().unwrap() > 0);
    let hb = payload(events, "SandboxHeartbeat");
    assert_eq!(hb["progress"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_step_events_rows_heartbeats_and_metrics() {
    let h = harness();
    let req = h.request("sb", &write_result("finished"));
    let out = h.orch.execute(&req, &h.ctx()).await.unwrap();
    let SandboxOutcome::Completed(done) = out else {
        panic!("{out:?}")
    };
    assert_eq!(done.status, "finished");
    assert_eq!(done.outputs, Some(json!({"answer": 42})));
    assert_eq!(
        h.types("sb"),
        [
            "SandboxCreated",
            "SandboxShipped",
            "SandboxHeartbeat",
            "SandboxBundleReceived",
            "SandboxCompleted"
        ]
    );
    let events = h.events("sb");
    assert_standard_payloads(&events);
    // The request document really shipped: its size is what the event says.
    let request_doc = h
        .root
        .join(".smithers/sandboxes/run-1/sb/request/request.json");
    let shipped = payload(&events, "SandboxShipped");
    assert_eq!(
        shipped["bundleSizeBytes"].as_u64().unwrap(),
        std::fs::metadata(&request_doc).unwrap().len()
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&request_doc).unwrap()).unwrap();
    assert_eq!(
        doc,
        json!({"status": "pending", "sandboxId": "sb", "runtime": "bubblewrap", "input": {"question": "six times seven"}})
    );
    let received = payload(&events, "SandboxBundleReceived");
    assert_eq!(received["patchCount"], 0);
    assert_eq!(received["hasOutputs"], true);
    assert!(received["bundleSizeBytes"].as_u64().unwrap() > 0);
    let completed = payload(&events, "SandboxCompleted");
    assert_eq!(completed["status"], "finished");
    assert_eq!(completed["runtime"], "bubblewrap");
    assert!(completed["durationMs"].as_f64().unwrap() >= 0.0);
    assert!(completed.get("remoteRunId").is_none(), "absent, not null");

    assert_eq!(
        h.stages("sb"),
        [
            "initializing",
            "created",
            "shipped",
            "executing",
            "child-finished",
            "bundle-collected",
            "completed"
        ]
    );
    let row = h.store.get_sandbox(RUN, "sb").unwrap().unwrap();
    assert_eq!(row.status, SandboxStatus::Finished);
    let shipped_at = row.shipped_at_ms.unwrap();
    assert!(shipped_at <= row.completed_at_ms.unwrap());
    assert!(!row.config_json.contains("s3cret-value"));
    assert_eq!(
        row.bundle_path.as_deref(),
        Some(done.bundle_path.to_str().unwrap())
    );
    assert_eq!(h.runtime.cleanup_count(), 1, "cleanup always runs");
    let lease = h.store.lease(RUN, "sb").unwrap().unwrap();
    assert_eq!(lease.release_reason.as_deref(), Some("finished"));
    assert!(lease.handle_json.unwrap().contains("sandboxRoot"));

    let m = h.orch.metrics();
    assert_eq!(m.created("bubblewrap"), 1);
    assert_eq!(m.active("bubblewrap"), 0);
    assert_eq!(m.completed("bubblewrap", "finished"), 1);
    assert_eq!(
        m.patch_count_snapshot().count,
        1,
        "observed once per sandbox"
    );
    assert_eq!(m.duration_snapshot().count, 1);
    // create, ship, execute, collect, cleanup.
    assert_eq!(m.transport_snapshot().count, 5);
    let text = m.render_prometheus();
    assert!(text.contains("smithers_sandbox_active{runtime=\"bubblewrap\"} 0\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_step_returns_outputs_without_throwing() {
    let h = harness();
    let req = h.request("sb", &format!("{}; exit 3", write_result("failed")));
    let out = h.orch.execute(&req, &h.ctx()).await.unwrap();
    let SandboxOutcome::Completed(done) = out else {
        panic!("{out:?}")
    };
    assert_eq!(done.status, "failed");
    assert_eq!(done.outputs, Some(json!({"answer": 42})));
    assert_eq!(
        h.types("sb"),
        [
            "SandboxCreated",
            "SandboxShipped",
            "SandboxHeartbeat",
            "SandboxBundleReceived",
            "SandboxCompleted"
        ]
    );
    assert_eq!(
        payload(&h.events("sb"), "SandboxCompleted")["status"],
        "failed"
    );
    assert_eq!(
        h.store.get_sandbox(RUN, "sb").unwrap().unwrap().status,
        SandboxStatus::Failed
    );

    // A step that exits non-zero but claims "finished" is recorded as failed.
    let liar = h.request("liar", &format!("{}; exit 1", write_result("finished")));
    let SandboxOutcome::Completed(done) = h.orch.execute(&liar, &h.ctx()).await.unwrap() else {
        panic!()
    };
    assert_eq!(done.status, "failed");
    assert_eq!(h.orch.metrics().completed("bubblewrap", "failed"), 2);
    assert_eq!(h.orch.metrics().active("bubblewrap"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_error_is_recorded_and_rethrown_with_its_code() {
    let h = harness();
    *h.runtime.fail_on.lock().unwrap() = Some("ship");
    let req = h.request("sb", "true");
    let err = h.orch.execute(&req, &h.ctx()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ProcessSpawnFailed, "inner code kept");
    assert_eq!(h.types("sb"), ["SandboxCreated", "SandboxFailed"]);
    let failed = payload(&h.events("sb"), "SandboxFailed").clone();
    assert_eq!(failed["runtime"], "bubblewrap");
    let e = &failed["error"];
    assert_eq!(e["name"], "SmithersError");
    assert_eq!(e["code"], "PROCESS_SPAWN_FAILED");
    assert_eq!(e["message"], err.to_string());
    assert_eq!(e["summary"], err.to_string());
    assert_eq!(e["details"]["verb"], "ship");
    let row = h.store.get_sandbox(RUN, "sb").unwrap().unwrap();
    assert_eq!(row.status, SandboxStatus::Failed);
    assert_eq!(
        row.shipped_at_ms, None,
        "never shipped: no invented ship time"
    );
    assert!(row.completed_at_ms.is_some());
    assert_eq!(h.stages("sb").last(), Some(&"failed"));
    assert_eq!(h.runtime.cleanup_count(), 1, "cleanup after a failure too");
    assert_eq!(
        h.orch.metrics().active("bubblewrap"),
        0,
        "gauge goes down on failure"
    );
    assert_eq!(h.orch.metrics().completed("bubblewrap", "failed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn original_error_wins_when_recording_the_failure_fails() {
    let h = harness();
    *h.runtime.fail_on.lock().unwrap() = Some("execute");
    *h.runtime.break_db_on_fail.lock().unwrap() = Some(h.db.clone());
    let req = h.request("sb", "true");
    let err = h.orch.execute(&req, &h.ctx()).await.unwrap_err();
    assert!(
        matches!(
            err,
            OrchestratorError::Runtime {
                verb: "execute",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), ErrorCode::ProcessSpawnFailed);
    assert_eq!(h.runtime.cleanup_count(), 1);
    assert_eq!(h.orch.metrics().active("bubblewrap"), 0);
    assert!(
        h.store.events_since(RUN, 0).is_err(),
        "the events table is really gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_hit_fails_with_the_javascript_error() {
    let h = harness_with(Settings {
        per_run_max: 1,
        ..Settings::default()
    });
    // Another sandbox of the run holds the only slot.
    h.store
        .try_admit(&AdmitRequest {
            run_id: RUN.into(),
            sandbox_id: "holder".into(),
            runtime: "bubblewrap".into(),
            config: RedactedConfig::new(&json!({})),
            per_run_max: 1,
            host_max: 10,
            owner: OwnerIdentity::current().unwrap(),
            now_ms: 1,
        })
        .unwrap();
    let req = h.request("sb", "true");
    let err = h.orch.execute(&req, &h.ctx()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SandboxExecutionFailed);
    assert_eq!(
        err.to_string(),
        "Sandbox concurrency limit reached for run run-1 (1)."
    );
    assert_eq!(
        err.details(),
        json!({"runId": "run-1", "maxConcurrent": 1, "activeSandboxCount": 1})
    );
    assert_eq!(h.types("sb"), ["SandboxFailed"]);
    let events = h.events("sb");
    let e = &payload(&events, "SandboxFailed")["error"];
    assert_eq!(e["details"]["activeSandboxCount"], 1);
    assert_eq!(
        h.store.get_sandbox(RUN, "sb").unwrap().unwrap().status,
        SandboxStatus::Failed
    );
    assert_eq!(h.stages("sb"), ["initializing", "failed"]);
    assert_eq!(h.runtime.cleanup_count(), 0, "nothing was created");
    assert_eq!(h.orch.metrics().active("bubblewrap"), 0);
    assert_eq!(h.orch.metrics().created("bubblewrap"), 0);
    // The holder is untouched.
    assert_eq!(
        h.store.get_sandbox(RUN, "holder").unwrap().unwrap().status,
        SandboxStatus::Pending
    );
}

fn assert_review_requested_prefix(h: &Harness, sandbox: &str) {
    let types = h.types(sandbox);
    assert_eq!(
        types[..5],
        [
            "SandboxCreated",
            "SandboxShipped",
            "SandboxHeartbeat",
            "SandboxBundleReceived",
            "SandboxDiffReviewRequested"
        ]
    );
    let events = h.events(sandbox);
    assert_standard_payloads(&events);
    assert_eq!(payload(&events, "SandboxBundleReceived")["patchCount"], 1);
    let rr = payload(&events, "SandboxDiffReviewRequested");
    assert_eq!(rr["patchCount"], 1);
    assert_eq!(rr["totalDiffLines"], 2, "real count: two added lines");
}

fn hello(h: &Harness) -> String {
    std::fs::read_to_string(h.root.join("hello.txt")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_review_accepted_applies_then_completes() {
    let h = harness();
    let req = h.request(
        "sb",
        &format!("{ADD_WORLD_PATCH}\n{}", write_result("finished")),
    );
    let out = h.orch.execute(&req, &h.ctx()).await.unwrap();
    let SandboxOutcome::AwaitingReview(pending) = out else {
        panic!("{out:?}")
    };
    assert_eq!(pending.patch_count, 1);
    assert_eq!(pending.total_diff_lines, 2);
    assert_eq!(pending.patches.len(), 1);
    assert_eq!(pending.patches[0].path, "hello.txt");
    assert_eq!(pending.patches[0].operation, PatchOperation::Modify);
    assert_eq!(
        pending.patches[0].base_hash.as_deref(),
        Some("ce013625030ba8dba906f756967f9e9ca394464a")
    );
    assert_eq!(
        pending.patches[0].new_hash.as_deref(),
        Some("0056b4ab5bae17e5bd426bcdd9f73103d9109e80")
    );
    assert_review_requested_prefix(&h, "sb");
    assert_eq!(h.types("sb").len(), 5, "waiting: no decision event yet");
    assert_eq!(hello(&h), "hello\n", "nothing applied before the decision");
    assert_eq!(
        h.store.get_sandbox(RUN, "sb").unwrap().unwrap().status,
        SandboxStatus::Review
    );
    assert_eq!(h.stages("sb").last(), Some(&"review"));
    assert_eq!(
        h.runtime.cleanup_count(),
        1,
        "runtime released while waiting"
    );
    assert_eq!(h.orch.metrics().active("bubblewrap"), 0);
    assert_eq!(h.store.patches(RUN, "sb").unwrap(), pending.patches);

    // The decision may come from another process: a fresh orchestrator on the same file.
    let other = Orchestrator::new(
        Arc::new(Store::open(&h.db).unwrap()),
        Arc::new(AtomicPatchApplier),
        Settings::default(),
    )
    .unwrap();
    let done = other.accept(RUN, "sb").await.unwrap();
    assert_eq!(done.status, "finished");
    assert_eq!(done.applied_patches, 1);
    assert_eq!(hello(&h), "hello\nworld\nagain\n");
    let types = h.types("sb");
    assert_eq!(types[5..], ["SandboxDiffAccepted", "SandboxCompleted"]);
    let events = h.events("sb");
    assert_eq!(payload(&events, "SandboxDiffAccepted")["patchCount"], 1);
    assert_eq!(payload(&events, "SandboxCompleted")["status"], "finished");
    assert_eq!(
        h.store.get_sandbox(RUN, "sb").unwrap().unwrap().status,
        SandboxStatus::Finished
    );
    assert_eq!(
        h.store.get_review(RUN, "sb").unwrap().unwrap().state,
        ReviewState::Applied
    );
    // A second decision is refused.
    let again = other.accept(RUN, "sb").await.unwrap_err();
    assert_eq!(again.code(), ErrorCode::InvalidInput);
    assert!(other.reject(RUN, "sb", "late").await.is_err());
    assert_eq!(h.orch.metrics().patch_count_snapshot().count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_review_rejected_applies_nothing_and_fails() {
    let h = harness();
    let req = h.request(
        "sb",
        &format!("{ADD_WORLD_PATCH}\n{}", write_result("finished")),
    );
    let out = h.orch.execute(&req, &h.ctx()).await.unwrap();
    assert!(matches!(out, SandboxOutcome::AwaitingReview(_)));
    h.orch.reject(RUN, "sb", "too risky").await.unwrap();
    assert_review_requested_prefix(&h, "sb");
    let types = h.types("sb");
    assert_eq!(types[5..], ["SandboxDiffRejected", "SandboxFailed"]);
    let events = h.events("sb");
    assert_eq!(
        payload(&events, "SandboxDiffRejected")["reason"],
        "too risky"
    );
    let e = &payload(&events, "SandboxFailed")["error"];
    assert_eq!(e["code"], "INVALID_INPUT");
    assert_eq!(e["details"]["reason"], "too risky");
    assert_eq!(hello(&h), "hello\n");
    let review = h.store.get_review(RUN, "sb").unwrap().unwrap();
    assert_eq!(review.state, ReviewState::Rejected);
    assert_eq!(review.reason.as_deref(), Some("too risky"));
    assert_eq!(
        h.store.get_sandbox(RUN, "sb").unwrap().unwrap().status,
        SandboxStatus::Failed
    );
    assert!(h.orch.accept(RUN, "sb").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_accept_applies_and_completes() {
    let h = harness();
    let mut req = h.request(
        "sb",
        &format!("{ADD_WORLD_PATCH}\n{}", write_result("finished")),
    );
    req.auto_accept_diffs = true;
    let SandboxOutcome::Completed(done) = h.orch.execute(&req, &h.ctx()).await.unwrap() else {
        panic!()
    };
    assert_eq!(done.applied_patches, 1);
    assert_review_requested_prefix(&h, "sb");
    assert_eq!(
        h.types("sb")[5..],
        ["SandboxDiffAccepted", "SandboxCompleted"]
    );
    assert_eq!(hello(&h), "hello\nworld\nagain\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_review_reproduces_0_16() {
    let h = harness_with(Settings {
        review_mode: ReviewMode::FailClosed,
        ..Settings::default()
    });
    let req = h.request(
        "sb",
        &format!("{ADD_WORLD_PATCH}\n{}", write_result("finished")),
    );
    let err = h.orch.execute(&req, &h.ctx()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidInput);
    assert_eq!(
        err.to_string(),
        "Sandbox produced patches that require review approval."
    );
    assert_eq!(err.details(), json!({"sandboxId": "sb", "patchCount": 1}));
    assert_review_requested_prefix(&h, "sb");
    assert_eq!(h.types("sb")[5..], ["SandboxDiffRejected", "SandboxFailed"]);
    assert_eq!(
        payload(&h.events("sb"), "SandboxDiffRejected")["reason"],
        FAIL_CLOSED_REJECT_REASON
    );
    assert_eq!(hello(&h), "hello\n");
    assert_eq!(h.orch.metrics().active("bubblewrap"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_kills_the_process_tree_and_ends_cancelled() {
    let h = harness();
    let token = CancellationToken::new();
    let sink = Arc::new(CancelOnLine {
        trigger: "started",
        token: token.clone(),
        lines: Mutex::new(Vec::new()),
    });
    let mut ctx = h.ctx();
    ctx.cancel = token;
    ctx.output = Some(sink.clone());
    // A grandchild that would outlive a naive kill of the direct child.
    let pid_file = h.root.join("grandchild.pid");
    let script = format!(
        r#"sleep 300 & echo $! > '{}'; echo started; wait"#,
        pid_file.display()
    );
    let req = h.request("sb", &script);
    let out = h.orch.execute(&req, &ctx).await.unwrap();
    let SandboxOutcome::Cancelled { bundle_path } = out else {
        panic!("{out:?}")
    };
    assert!(
        bundle_path.is_some(),
        "a bundle is produced for cancelled runs too"
    );
    assert_eq!(
        h.types("sb"),
        [
            "SandboxCreated",
            "SandboxShipped",
            "SandboxHeartbeat",
            "SandboxBundleReceived",
            "SandboxCompleted"
        ]
    );
    let completed = payload(&h.events("sb"), "SandboxCompleted").clone();
    assert_eq!(completed["status"], "cancelled");
    assert_eq!(
        h.store.get_sandbox(RUN, "sb").unwrap().unwrap().status,
        SandboxStatus::Cancelled
    );
    assert_eq!(h.stages("sb").last(), Some(&"cancelled"));
    assert_eq!(h.orch.metrics().completed("bubblewrap", "cancelled"), 1);
    assert_eq!(h.orch.metrics().active("bubblewrap"), 0);
    assert_eq!(h.runtime.cleanup_count(), 1);
    assert_eq!(sink.lines.lock().unwrap().as_slice(), ["started"]);
    // The grandchild died with the group. SIGKILL delivery is asynchronous, so wait (bounded)
    // for the kernel to finish it; this asserts death, not speed.
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stat = format!("/proc/{pid}/stat");
    let gone = || match std::fs::read_to_string(&stat) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !gone() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(gone(), "grandchild {pid} survived cancellation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_before_start_never_executes() {
    let h = harness();
    let ctx = h.ctx();
    ctx.cancel.cancel();
    let marker = h.root.join("ran");
    let req = h.request("sb", &format!("touch {}", marker.display()));
    let out = h.orch.execute(&req, &ctx).await.unwrap();
    assert_eq!(out, SandboxOutcome::Cancelled { bundle_path: None });
    assert_eq!(h.types("sb"), ["SandboxCreated", "SandboxCompleted"]);
    assert!(!marker.exists());
    assert_eq!(h.orch.metrics().active("bubblewrap"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_heartbeats_move_the_row_heartbeat() {
    let h = harness();
    let req = h.request(
        "sb",
        &format!("echo 'HEARTBEAT 0.5'\n{}", write_result("finished")),
    );
    h.orch.execute(&req, &h.ctx()).await.unwrap();
    let stages = h.stages("sb");
    // initializing, created, shipped, executing, then the step's own heartbeat.
    assert_eq!(
        stages[..5],
        [
            "initializing",
            "created",
            "shipped",
            "executing",
            "executing"
        ]
    );
}

/// The sandbox is cleaned up beside the rest of the lifecycle once its bundle is collected
/// (validation, rows, events read only the bundle), not after it: the `completed` heartbeat,
/// the lifecycle's last act, waits here for the cleanup to have begun (it would wait in vain,
/// up to its 10 s, were cleanup still run after the lifecycle). Still exactly one cleanup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_begins_once_the_bundle_is_collected() {
    let h = harness();
    let started = h.runtime.cleanup_started.clone();
    let seen_at_completed = Arc::new(Mutex::new(None));
    let seen = seen_at_completed.clone();
    let ctx = StepContext {
        heartbeat: Some(Arc::new(move |hb: &Heartbeat| {
            if hb.stage == "completed" {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while !started.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                *seen.lock().unwrap() = Some(started.load(Ordering::SeqCst));
            }
        })),
        ..Default::default()
    };
    let out = h
        .orch
        .execute(&h.request("sb", &write_result("finished")), &ctx)
        .await
        .unwrap();
    assert!(matches!(out, SandboxOutcome::Completed(ref c) if c.status == "finished"));
    assert_eq!(*seen_at_completed.lock().unwrap(), Some(true));
    assert_eq!(h.runtime.cleanup_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_failure_is_logged_and_never_masks_the_result() {
    let h = harness();
    h.runtime.cleanup_fails.store(true, Ordering::SeqCst);
    let req = h.request("sb", &write_result("finished"));
    let out = h.orch.execute(&req, &h.ctx()).await.unwrap();
    assert!(matches!(out, SandboxOutcome::Completed(ref c) if c.status == "finished"));
    let types = h.types("sb");
    assert_eq!(types[4..], ["SandboxCompleted", "SandboxCleanupFailed"]);

    // And never masks an error either.
    *h.runtime.fail_on.lock().unwrap() = Some("collect");
    let err = h
        .orch
        .execute(&h.request("sb2", "true"), &h.ctx())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        OrchestratorError::Runtime {
            verb: "collect",
            ..
        }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistered_runtime_fails_closed_without_falling_back() {
    let h = harness();
    let mut req = h.request("sb", "true");
    req.runtime = Some(smithers_runtime::RuntimeKind::Docker);
    let err = h.orch.execute(&req, &h.ctx()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::TaskRuntimeUnavailable);
    assert!(h.store.get_sandbox(RUN, "sb").unwrap().is_none());
    assert_eq!(h.runtime.cleanup_count(), 0);
}

fn dead_owner() -> OwnerIdentity {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let owner = OwnerIdentity::of_pid(child.id()).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    owner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_cleans_up_orphans_and_frees_their_slots() {
    let h = harness_with(Settings {
        per_run_max: 1,
        ..Settings::default()
    });
    // A sandbox left behind by a process that died mid-run, with its stored handle.
    h.store
        .try_admit(&AdmitRequest {
            run_id: RUN.into(),
            sandbox_id: "orphan".into(),
            runtime: "bubblewrap".into(),
            config: RedactedConfig::new(&json!({})),
            per_run_max: 1,
            host_max: 10,
            owner: dead_owner(),
            now_ms: 1,
        })
        .unwrap();
    let sandbox_root: PathBuf = h.root.join(".smithers/sandboxes/run-1/orphan");
    std::fs::create_dir_all(sandbox_root.join("out")).unwrap();
    let handle = json!({
        "runtime": "bubblewrap", "runId": RUN, "sandboxId": "orphan",
        "sandboxRoot": sandbox_root, "requestPath": sandbox_root.join("request"),
        "resultPath": sandbox_root.join("result")
    });
    h.store
        .set_handle(RUN, "orphan", &handle.to_string())
        .unwrap();
    // The slot is taken: a new sandbox is refused until recovery.
    assert!(h
        .orch
        .execute(&h.request("before", "true"), &h.ctx())
        .await
        .is_err());

    let recovered = h.orch.recover().await.unwrap();
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0].sandbox_id, "orphan");
    assert!(recovered[0].cleaned_up, "{:?}", recovered[0].cleanup_error);
    let cleaned = h.runtime.cleanups.lock().unwrap().clone();
    assert_eq!(cleaned.len(), 1);
    assert_eq!(cleaned[0].sandbox_root, sandbox_root);
    assert!(!sandbox_root.join("out").exists(), "leftovers removed");
    assert_eq!(
        h.store.get_sandbox(RUN, "orphan").unwrap().unwrap().status,
        SandboxStatus::Failed
    );
    assert_eq!(h.types("orphan"), ["SandboxFailed"]);
    let events = h.events("orphan");
    let e = &payload(&events, "SandboxFailed")["error"];
    assert_eq!(e["code"], "SANDBOX_EXECUTION_FAILED");
    assert_eq!(e["details"]["reason"], "orphaned");
    // Running again finds nothing; the slot is free.
    assert!(h.orch.recover().await.unwrap().is_empty());
    let out = h
        .orch
        .execute(&h.request("after", &write_result("finished")), &h.ctx())
        .await
        .unwrap();
    assert!(matches!(out, SandboxOutcome::Completed(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_leaves_live_owners_and_reviews_alone() {
    let h = harness();
    let req = h.request(
        "sb",
        &format!("{ADD_WORLD_PATCH}\n{}", write_result("finished")),
    );
    assert!(matches!(
        h.orch.execute(&req, &h.ctx()).await.unwrap(),
        SandboxOutcome::AwaitingReview(_)
    ));
    h.store
        .try_admit(&AdmitRequest {
            run_id: RUN.into(),
            sandbox_id: "live".into(),
            runtime: "bubblewrap".into(),
            config: RedactedConfig::new(&json!({})),
            per_run_max: 10,
            host_max: 10,
            owner: OwnerIdentity::current().unwrap(),
            now_ms: 1,
        })
        .unwrap();
    assert!(h.orch.recover().await.unwrap().is_empty());
    assert_eq!(
        h.store.get_sandbox(RUN, "sb").unwrap().unwrap().status,
        SandboxStatus::Review
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_bundle_fails_with_the_validator_code() {
    let h = harness();
    h.runtime.bundle_symlink.store(true, Ordering::SeqCst);
    let req = h.request("sb", &write_result("finished"));
    let err = h.orch.execute(&req, &h.ctx()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ToolPathEscape, "{err}");
    assert_eq!(
        h.types("sb"),
        [
            "SandboxCreated",
            "SandboxShipped",
            "SandboxHeartbeat",
            "SandboxFailed"
        ]
    );
    let events = h.events("sb");
    assert_eq!(
        payload(&events, "SandboxFailed")["error"]["code"],
        "TOOL_PATH_ESCAPE"
    );
    let row = h.store.get_sandbox(RUN, "sb").unwrap().unwrap();
    assert_eq!(row.status, SandboxStatus::Failed);
    assert!(row.shipped_at_ms.is_some(), "the real ship time is kept");
    assert!(
        row.bundle_path.is_some(),
        "the rejected bundle is kept for inspection"
    );
    assert_eq!(h.orch.metrics().patch_count_snapshot().count, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_accept_applies_nothing_and_can_be_retried_once_fixed() {
    let h = harness();
    let req = h.request(
        "sb",
        &format!("{ADD_WORLD_PATCH}\n{}", write_result("finished")),
    );
    assert!(matches!(
        h.orch.execute(&req, &h.ctx()).await.unwrap(),
        SandboxOutcome::AwaitingReview(_)
    ));
    // Someone edits the host file while the review waits.
    std::fs::write(h.root.join("hello.txt"), "bonjour\n").unwrap();
    let err = h.orch.accept(RUN, "sb").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ToolPatchFailed, "{err}");
    assert_eq!(hello(&h), "bonjour\n", "nothing applied");
    assert_eq!(h.types("sb")[5..], ["SandboxDiffApplyFailed"]);
    let events = h.events("sb");
    assert_eq!(
        payload(&events, "SandboxDiffApplyFailed")["error"]["code"],
        "TOOL_PATCH_FAILED"
    );
    let review = h.store.get_review(RUN, "sb").unwrap().unwrap();
    assert_eq!(review.state, ReviewState::Pending, "the review waits again");
    assert!(review.apply_error.is_some());
    assert_eq!(
        h.store.get_sandbox(RUN, "sb").unwrap().unwrap().status,
        SandboxStatus::Review
    );
    // The cause fixed (the host edit undone), the same accept goes through.
    std::fs::write(h.root.join("hello.txt"), "hello\n").unwrap();
    let done = h.orch.accept(RUN, "sb").await.unwrap();
    assert_eq!(done.applied_patches, 1);
    assert_eq!(hello(&h), "hello\nworld\nagain\n");
    assert_eq!(
        h.types("sb")[5..],
        [
            "SandboxDiffApplyFailed",
            "SandboxDiffAccepted",
            "SandboxCompleted"
        ]
    );
    assert_eq!(
        h.store.get_review(RUN, "sb").unwrap().unwrap().state,
        ReviewState::Applied
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_changed_after_review_is_never_applied() {
    let h = harness();
    let req = h.request(
        "sb",
        &format!("{ADD_WORLD_PATCH}\n{}", write_result("finished")),
    );
    let SandboxOutcome::AwaitingReview(pending) = h.orch.execute(&req, &h.ctx()).await.unwrap()
    else {
        panic!("expected a review")
    };
    let recorded = h.store.get_review(RUN, "sb").unwrap().unwrap();
    assert!(recorded
        .bundle_digest
        .as_deref()
        .is_some_and(|d| d.starts_with("sha256:")));
    // The patch is swapped on disk for one that adds something else (same size, valid).
    let patch = pending.bundle_path.join("patches/0001-hello.patch");
    let text = std::fs::read_to_string(&patch).unwrap();
    let evil = text.replace("+again", "+EVIL!");
    assert_ne!(text, evil);
    std::fs::write(&patch, &evil).unwrap();
    let err = h.orch.accept(RUN, "sb").await.unwrap_err();
    assert!(
        matches!(err, OrchestratorError::BundleChanged { .. }),
        "{err}"
    );
    assert_eq!(hello(&h), "hello\n", "nothing applied");
    assert_eq!(
        h.store.get_review(RUN, "sb").unwrap().unwrap().state,
        ReviewState::Pending
    );
    // The applier itself hashes the bytes it applies: given the swapped bundle and the
    // recorded digest (as after a swap between the orchestrator's check and the apply), it
    // applies nothing.
    let inspected = BundleValidator.inspect(&pending.bundle_path).unwrap();
    let digest = recorded.bundle_digest.clone().unwrap();
    let err = AtomicPatchApplier
        .apply_reviewed(&h.root, &inspected, &digest, false)
        .unwrap_err();
    assert!(
        err.message.contains("changed since it was reviewed"),
        "{err}"
    );
    assert_eq!(hello(&h), "hello\n", "nothing applied");
    // Put back, the reviewed bytes are accepted.
    std::fs::write(&patch, &text).unwrap();
    h.orch.accept(RUN, "sb").await.unwrap();
    assert_eq!(hello(&h), "hello\nworld\nagain\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_diffs_off_applies_directly() {
    let h = harness();
    let mut req = h.request(
        "sb",
        &format!("{ADD_WORLD_PATCH}\n{}", write_result("finished")),
    );
    req.review_diffs = false;
    let SandboxOutcome::Completed(done) = h.orch.execute(&req, &h.ctx()).await.unwrap() else {
        panic!()
    };
    assert_eq!(done.applied_patches, 1);
    assert_eq!(hello(&h), "hello\nworld\nagain\n");
    assert_eq!(
        h.types("sb"),
        [
            "SandboxCreated",
            "SandboxShipped",
            "SandboxHeartbeat",
            "SandboxBundleReceived",
            "SandboxCompleted"
        ]
    );
}

const CRASH_DB: &str = "SMITHERS_TEST_CRASH_DB";
const CRASH_ROOT: &str = "SMITHERS_TEST_CRASH_ROOT";

/// Not a test on its own: the process that `crash_mid_run_is_recovered_by_the_next_process`
/// starts and then kills with SIGKILL in the middle of a sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of crash_mid_run_is_recovered_by_the_next_process"]
async fn crash_helper_process() {
    let db = std::env::var(CRASH_DB).expect("run by the crash test only");
    let root = std::env::var(CRASH_ROOT).expect("run by the crash test only");
    let store = Arc::new(Store::open(&db).unwrap());
    let orch = Orchestrator::new(store, Arc::new(AtomicPatchApplier), Settings::default())
        .unwrap()
        .with_runtime(Arc::new(HostProcessTestRuntime::default()));
    let mut req = SandboxRequest::new(RUN, "crashy", root);
    req.command = Some(StepCommand {
        argv: vec!["sh".into(), "-c".into(), "sleep 300".into()],
        cwd: None,
        stdin: Default::default(),
    });
    let out = orch.execute(&req, &StepContext::default()).await;
    panic!("the helper should have been killed, but execute returned {out:?}");
}

fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Bounded wait for a condition driven by another process (asserts the outcome, not speed).
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_run_is_recovered_by_the_next_process() {
    let h = harness_with(Settings {
        per_run_max: 1,
        ..Settings::default()
    });
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "crash_helper_process",
            "--nocapture",
        ])
        .env(CRASH_DB, &h.db)
        .env(CRASH_ROOT, &h.root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pgid_file = h
        .root
        .join(".smithers/sandboxes/run-1/crashy/out/step.pgid");
    eventually("the helper's step to run", || pgid_file.exists()).await;
    eventually("the shipped row", || {
        h.store
            .get_sandbox(RUN, "crashy")
            .unwrap()
            .is_some_and(|r| r.status == SandboxStatus::Shipped)
    })
    .await;
    // SIGKILL: no destructor, no bookkeeping, exactly like a crash.
    helper.kill().unwrap();
    helper.wait().unwrap();
    let step: u32 = std::fs::read_to_string(&pgid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !process_gone(step),
        "the step outlived its owner, as after a real crash"
    );
    assert!(h
        .store
        .lease(RUN, "crashy")
        .unwrap()
        .unwrap()
        .handle_json
        .is_some());

    // The next process starts: recovery kills the leftovers and frees the slot.
    let recovered = h.orch.recover().await.unwrap();
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0].sandbox_id, "crashy");
    assert!(recovered[0].cleaned_up, "{:?}", recovered[0].cleanup_error);
    eventually("the orphaned step to die", || process_gone(step)).await;
    let row = h.store.get_sandbox(RUN, "crashy").unwrap().unwrap();
    assert_eq!(row.status, SandboxStatus::Failed);
    assert_eq!(
        h.types("crashy"),
        ["SandboxCreated", "SandboxShipped", "SandboxFailed"]
    );
    let events = h.events("crashy");
    assert_eq!(
        payload(&events, "SandboxFailed")["error"]["details"]["reason"],
        "orphaned"
    );
    let out = h
        .orch
        .execute(&h.request("next", &write_result("finished")), &h.ctx())
        .await
        .unwrap();
    assert!(matches!(out, SandboxOutcome::Completed(_)), "slot freed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_starts_never_exceed_the_run_limit() {
    let h = Arc::new(harness_with(Settings {
        per_run_max: 2,
        ..Settings::default()
    }));
    let go = h.root.join("go");
    // Admitted steps hold their slot until `go` exists, so the outcome does not depend on
    // timing: exactly two can be admitted, the other three must be refused.
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.02; done; {}",
        go.display(),
        write_result("finished")
    );
    let mut tasks = Vec::new();
    for i in 0..5 {
        let h = h.clone();
        let req = h.request(&format!("p{i}"), &script);
        tasks.push(tokio::spawn(async move {
            let ctx = h.ctx();
            h.orch.execute(&req, &ctx).await
        }));
    }
    eventually("three refusals", || {
        (0..5)
            .filter(|i| {
                h.store
                    .get_sandbox(RUN, &format!("p{i}"))
                    .unwrap()
                    .is_some_and(|r| r.status == SandboxStatus::Failed)
            })
            .count()
            == 3
    })
    .await;
    assert_eq!(h.store.count_active(Some(RUN)).unwrap(), 2);
    std::fs::write(&go, "").unwrap();
    let mut completed = 0;
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(SandboxOutcome::Completed(_)) => completed += 1,
            Err(e) => {
                assert_eq!(
                    e.to_string(),
                    "Sandbox concurrency limit reached for run run-1 (2)."
                );
                refused += 1;
            }
            Ok(other) => panic!("{other:?}"),
        }
    }
    assert_eq!((completed, refused), (2, 3));
    assert_eq!(h.orch.metrics().active("bubblewrap"), 0);
    assert_eq!(h.orch.metrics().created("bubblewrap"), 2);
}

/// 50 steps start at once against a per-run limit of 5; a refused start retries with a new
/// sandbox id (as a workflow engine would) until all 50 have run. The limit is then checked
/// from the events alone, not from any counter of the orchestrator: every step's execution
/// window — from its `SandboxShipped` to its `SandboxBundleReceived` timestamp — lies inside
/// the time it held a gate slot (shipped is stamped after admission, the bundle before the
/// final row frees the slot), so at no millisecond may more than 5 windows overlap. The test
/// also requires that 5 did overlap at some point: a gate that serialised everything would
/// "pass" a weaker check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_parallel_starts_never_exceed_a_limit_of_five() {
    const STEPS: usize = 50;
    const LIMIT: u32 = 5;
    let h = Arc::new(harness_with(Settings {
        per_run_max: LIMIT,
        ..Settings::default()
    }));
    // Long enough that admitted steps really overlap, short enough for a quick test.
    let script = format!("sleep 0.3; {}", write_result("finished"));
    let mut tasks = Vec::new();
    for i in 0..STEPS {
        let h = h.clone();
        let script = script.clone();
        tasks.push(tokio::spawn(async move {
            for attempt in 0.. {
                let req = h.request(&format!("s{i:02}-a{attempt}"), &script);
                match h.orch.execute(&req, &h.ctx()).await {
                    Ok(SandboxOutcome::Completed(c)) => {
                        assert_eq!(c.status, "finished");
                        return attempt;
                    }
                    Ok(other) => panic!("{other:?}"),
                    Err(e) => {
                        assert_eq!(e.code(), ErrorCode::SandboxExecutionFailed, "{e}");
                        assert!(e.to_string().contains("concurrency limit"), "{e}");
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                }
            }
            unreachable!()
        }));
    }
    let mut retries = 0;
    for t in tasks {
        retries += t.await.unwrap();
    }
    assert!(
        retries > 0,
        "50 starts against a limit of 5 must have been refused at times"
    );

    // Execution windows, from the events only.
    let mut windows: std::collections::BTreeMap<String, (Option<i64>, Option<i64>)> =
        Default::default();
    for e in h.store.events_since(RUN, 0).unwrap() {
        let p: Value = serde_json::from_str(&e.payload_json).unwrap();
        let sid = p["sandboxId"].as_str().unwrap().to_string();
        match e.event_type.as_str() {
            "SandboxShipped" => windows.entry(sid).or_default().0 = Some(e.timestamp_ms),
            "SandboxBundleReceived" => windows.entry(sid).or_default().1 = Some(e.timestamp_ms),
            _ => {}
        }
    }
    let windows: Vec<(i64, i64)> = windows
        .into_values()
        .map(|w| match w {
            (Some(start), Some(end)) => (start, end),
            other => panic!("a step without a complete execution window: {other:?}"),
        })
        .collect();
    assert_eq!(windows.len(), STEPS, "every step ran exactly once");

    // Sweep over half-open windows [shipped, bundle received): timestamps are whole
    // milliseconds, and a step admitted into a slot freed in the same millisecond shares that
    // millisecond with its predecessor without overlapping it; ends sort before starts.
    let mut edges: Vec<(i64, i32)> = windows
        .iter()
        .flat_map(|&(s, e)| [(s, 1), (e, -1)])
        .collect();
    edges.sort();
    let (mut running, mut peak) = (0, 0);
    for (_, d) in edges {
        running += d;
        peak = peak.max(running);
    }
    assert!(
        peak <= LIMIT as i32,
        "{peak} steps were executing at once with a limit of {LIMIT}"
    );
    assert_eq!(
        peak, LIMIT as i32,
        "the limit was never reached: the test proved nothing"
    );
}

/// The workspace layer a backend kept (changes left out for a size limit) goes when the
/// review is rejected; accepting applies none of what it holds, so it stays then (and while
/// the review is pending).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_review_removes_the_kept_layer() {
    let h = harness();
    for (sandbox, accept) in [("sb-reject", false), ("sb-accept", true)] {
        let req = h.request(
            sandbox,
            &format!("{ADD_WORLD_PATCH}\n{}", write_result("finished")),
        );
        let out = h.orch.execute(&req, &h.ctx()).await.unwrap();
        assert!(matches!(out, SandboxOutcome::AwaitingReview(_)));
        let kept = smithers_runtime::kept_layer::kept_layer_path(&h.root, RUN, sandbox).unwrap();
        std::fs::create_dir_all(kept.join("sub")).unwrap();
        std::fs::write(kept.join("sub/big.bin"), vec![0u8; 4096]).unwrap();
        if accept {
            h.orch.accept(RUN, sandbox).await.unwrap();
        } else {
            h.orch.reject(RUN, sandbox, "no").await.unwrap();
        }
        assert_eq!(
            kept.exists(),
            accept,
            "{sandbox}: kept after accept, gone after reject"
        );
        assert!(
            kept.parent().unwrap().join("result/README.md").is_file(),
            "{sandbox}: the bundle stays"
        );
    }
}

/// A store call waiting for the database's write lock (held here by another connection, as
/// another process would) does not hold the async worker it was called on: with ONE worker,
/// a task beside the waiting step still runs. Before, the step's admission (SQLite's busy
/// wait, up to 30 s) held that worker and the task ran not once until the lock was released.
#[test]
fn a_store_call_waiting_for_the_lock_does_not_hold_the_worker() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let h = Arc::new(harness());
    let other = rusqlite::Connection::open(&h.db).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let step = {
        let h = h.clone();
        rt.spawn(async move {
            let req = h.request("sb", &write_result("finished"));
            h.orch.execute(&req, &h.ctx()).await
        })
    };
    let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ticker = {
        let ticks = ticks.clone();
        rt.spawn(async move {
            loop {
                ticks.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    };
    // This thread is not a worker: it waits with the step stuck at its admission.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = ticks.load(Ordering::SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let after = ticks.load(Ordering::SeqCst);
    other.execute_batch("COMMIT").unwrap();
    let out = rt.block_on(step).unwrap().unwrap();
    ticker.abort();
    println!("ticks while the step waited for the lock: {before} then {after}");
    // Loose: about 50 ticks fit in that second; one shows the worker was free.
    assert!(
        after > before,
        "no other task ran while a store call waited for the lock"
    );
    let SandboxOutcome::Completed(done) = out else {
        panic!("{out:?}")
    };
    assert_eq!(done.status, "finished");
}
