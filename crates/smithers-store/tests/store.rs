//! Integration tests against a real SQLite file in a temporary directory.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use serde_json::json;
use smithers_errors::{CodedError, ErrorCode};
use smithers_store::*;

fn temp_db() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("smithers.db");
    (dir, path)
}

fn me() -> OwnerIdentity {
    OwnerIdentity::current().expect("/proc available")
}

fn admit_req(run: &str, sandbox: &str, per_run: u32, host: u32) -> AdmitRequest {
    AdmitRequest {
        run_id: run.into(),
        sandbox_id: sandbox.into(),
        runtime: "bubblewrap".into(),
        config: RedactedConfig::new(&json!({"env": {"SECRET": "hunter2"}})),
        per_run_max: per_run,
        host_max: host,
        owner: me(),
        now_ms: 1_000,
    }
}

#[test]
fn upsert_absent_leaves_null_clears_value_sets() {
    let (_d, path) = temp_db();
    let store = Store::open(&path).unwrap();
    let config = RedactedConfig::new(&json!({"image": "alpine"}));
    store
        .upsert_sandbox(&SandboxUpsert {
            config: Some(config.clone()),
            remote_run_id: Field::Value("remote-1".into()),
            bundle_path: Field::Value("/b".into()),
            shipped_at_ms: Field::Value(5),
            ..SandboxUpsert::key("run", "sb")
        })
        .unwrap();
    let row = store.get_sandbox("run", "sb").unwrap().unwrap();
    // Defaults of the compatible schema.
    assert_eq!(row.runtime, "bubblewrap");
    assert_eq!(row.status, SandboxStatus::Pending);
    assert_eq!(row.config_json, r#"{"image":"alpine"}"#);

    store
        .upsert_sandbox(&SandboxUpsert {
            status: Some(SandboxStatus::Shipped),
            remote_run_id: Field::Null,
            container_id: Field::Value("c1".into()),
            ..SandboxUpsert::key("run", "sb")
        })
        .unwrap();
    let row = store.get_sandbox("run", "sb").unwrap().unwrap();
    assert_eq!(row.status, SandboxStatus::Shipped);
    assert_eq!(row.remote_run_id, None, "a provided null clears");
    assert_eq!(row.container_id.as_deref(), Some("c1"));
    assert_eq!(row.bundle_path.as_deref(), Some("/b"), "absent leaves");
    assert_eq!(row.shipped_at_ms, Some(5), "absent leaves");
    assert_eq!(row.config_json, config.as_json(), "absent leaves");

    // Key-only upsert of an existing row is a no-op, not an error.
    store
        .upsert_sandbox(&SandboxUpsert::key("run", "sb"))
        .unwrap();
    assert_eq!(store.get_sandbox("run", "sb").unwrap().unwrap(), row);

    // A new row without config_json breaks NOT NULL: an error, nothing written.
    let err = store
        .upsert_sandbox(&SandboxUpsert::key("run", "other"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Internal);
    assert!(store.get_sandbox("run", "other").unwrap().is_none());
}

#[test]
fn config_json_is_redacted_through_every_path() {
    let (_d, path) = temp_db();
    let store = Store::open(&path).unwrap();
    store.try_admit(&admit_req("r", "s", 10, 10)).unwrap();
    let row = store.get_sandbox("r", "s").unwrap().unwrap();
    assert!(!row.config_json.contains("hunter2"), "{}", row.config_json);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&row.config_json).unwrap(),
        json!({"env": {"SECRET": "[redacted]"}})
    );
    // Raw file scan: the secret is nowhere in the database.
    drop(store);
    for f in ["smithers.db", "smithers.db-wal"] {
        let p = path.parent().unwrap().join(f);
        if let Ok(bytes) = std::fs::read(&p) {
            assert!(
                !bytes.windows(7).any(|w| w == b"hunter2"),
                "secret found in {f}"
            );
        }
    }
}

#[test]
fn event_seq_is_gap_free_under_concurrent_writers() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 200;
    let (_d, path) = temp_db();
    Store::open(&path).unwrap();
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let path = path.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                // Each thread its own connection, as separate processes would have.
                let store = Store::open(&path).unwrap();
                barrier.wait();
                let mut seqs = Vec::with_capacity(PER_THREAD);
                for i in 0..PER_THREAD {
                    let payload = format!(r#"{{"type":"T","thread":{t},"i":{i}}}"#);
                    seqs.push(
                        store
                            .insert_event(&NewEvent {
                                run_id: "run-a",
                                timestamp_ms: i as i64,
                                event_type: "T",
                                payload_json: &payload,
                            })
                            .unwrap(),
                    );
                    // Interleave another run to prove seqs are per run.
                    if i % 50 == 0 {
                        store
                            .insert_event(&NewEvent {
                                run_id: "run-b",
                                timestamp_ms: i as i64,
                                event_type: "T",
                                payload_json: &payload,
                            })
                            .unwrap();
                    }
                }
                seqs
            })
        })
        .collect();
    let mut returned: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    returned.sort_unstable();
    let expected: Vec<i64> = (0..(THREADS * PER_THREAD) as i64).collect();
    assert_eq!(
        returned, expected,
        "returned seqs are 0..n without gaps or duplicates"
    );

    let store = Store::open(&path).unwrap();
    let rows = store.events_since("run-a", 0).unwrap();
    let stored: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    assert_eq!(stored, expected, "stored seqs are 0..n without gaps");
    let payloads: BTreeSet<&str> = rows.iter().map(|r| r.payload_json.as_str()).collect();
    assert_eq!(
        payloads.len(),
        THREADS * PER_THREAD,
        "no event lost or merged"
    );
    let b: Vec<i64> = store
        .events_since("run-b", 0)
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(b, (0..(THREADS * 4) as i64).collect::<Vec<_>>());
}

/// A state change and its event are written together or not at all: with the events table
/// gone, the row keeps its old state (the heartbeat too); with it, both are there.
#[test]
fn a_state_change_and_its_event_are_one_transaction() {
    let (_d, path) = temp_db();
    let store = Store::open(&path).unwrap();
    let config = RedactedConfig::new(&json!({}));
    store
        .upsert_sandbox(&SandboxUpsert {
            config: Some(config),
            ..SandboxUpsert::key("r", "sb")
        })
        .unwrap();
    let shipped = SandboxUpsert {
        status: Some(SandboxStatus::Shipped),
        shipped_at_ms: Field::Value(7),
        ..SandboxUpsert::key("r", "sb")
    };
    let event = NewEvent {
        run_id: "r",
        timestamp_ms: 7,
        event_type: "SandboxShipped",
        payload_json: r#"{"type":"SandboxShipped"}"#,
    };
    assert_eq!(
        store.upsert_sandbox_with_event(&shipped, &event).unwrap(),
        0
    );
    let row = store.get_sandbox("r", "sb").unwrap().unwrap();
    assert_eq!(row.status, SandboxStatus::Shipped);
    let beat = NewEvent {
        timestamp_ms: 8,
        event_type: "SandboxHeartbeat",
        ..event
    };
    assert_eq!(
        store
            .heartbeat_sandbox_with_event("r", "sb", 8, &beat)
            .unwrap(),
        (true, 1)
    );
    assert_eq!(store.events_since("r", 0).unwrap().len(), 2);

    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("DROP TABLE _smithers_events;").unwrap();
    let failed = SandboxUpsert {
        status: Some(SandboxStatus::Failed),
        ..SandboxUpsert::key("r", "sb")
    };
    let later = NewEvent {
        timestamp_ms: 9,
        ..event
    };
    assert!(store.upsert_sandbox_with_event(&failed, &later).is_err());
    assert!(store
        .heartbeat_sandbox_with_event("r", "sb", 9, &later)
        .is_err());
    let row = store.get_sandbox("r", "sb").unwrap().unwrap();
    assert_eq!(
        row.status,
        SandboxStatus::Shipped,
        "the row change was rolled back"
    );
    assert_eq!(
        row.heartbeat_at_ms,
        Some(8),
        "the heartbeat was rolled back"
    );
}

/// The gate writes SandboxCreated with the admission, and only with it: a refused start
/// (here, the run's limit) leaves no event.
#[test]
fn the_created_event_is_written_only_by_an_admission() {
    let (_d, path) = temp_db();
    let store = Store::open(&path).unwrap();
    let created = NewEvent {
        run_id: "r",
        timestamp_ms: 1_000,
        event_type: "SandboxCreated",
        payload_json: r#"{"type":"SandboxCreated","sandboxId":"a"}"#,
    };
    let (admitted, seq) = store
        .try_admit_with_event(&admit_req("r", "a", 1, 10), &created)
        .unwrap();
    assert_eq!((admitted.active_in_run, seq), (0, 0));
    let refused = NewEvent {
        payload_json: r#"{"type":"SandboxCreated","sandboxId":"b"}"#,
        ..created
    };
    let err = store
        .try_admit_with_event(&admit_req("r", "b", 1, 10), &refused)
        .unwrap_err();
    assert!(matches!(err, StoreError::ConcurrencyLimit { .. }), "{err}");
    let events = store.events_since("r", 0).unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].payload_json.contains(r#""sandboxId":"a""#));
    assert!(store.get_sandbox("r", "b").unwrap().is_none());
}

#[test]
fn identical_event_insert_is_idempotent() {
    let (_d, path) = temp_db();
    let store = Store::open(&path).unwrap();
    let ev = NewEvent {
        run_id: "r",
        timestamp_ms: 42,
        event_type: "SandboxCreated",
        payload_json: r#"{"type":"SandboxCreated"}"#,
    };
    assert_eq!(store.insert_event(&ev).unwrap(), 0);
    let other = NewEvent {
        timestamp_ms: 43,
        ..ev
    };
    assert_eq!(store.insert_event(&other).unwrap(), 1);
    assert_eq!(store.insert_event(&ev).unwrap(), 0, "existing seq returned");
    assert_eq!(store.insert_event(&other).unwrap(), 1);
    assert_eq!(store.events_since("r", 0).unwrap().len(), 2);
    assert_eq!(store.events_since("r", 1).unwrap()[0].timestamp_ms, 43);
}

#[test]
fn wait_for_events_sees_another_connections_insert() {
    let (_d, path) = temp_db();
    let reader = Store::open(&path).unwrap();
    assert!(reader
        .wait_for_events("r", 0, Duration::from_millis(10))
        .unwrap()
        .is_empty());
    let writer_path = path.clone();
    let writer = thread::spawn(move || {
        let w = Store::open(&writer_path).unwrap();
        w.insert_event(&NewEvent {
            run_id: "r",
            timestamp_ms: 1,
            event_type: "X",
            payload_json: "{}",
        })
        .unwrap()
    });
    // Generous timeout: this asserts the event arrives, not how fast.
    let rows = reader
        .wait_for_events("r", 0, Duration::from_secs(60))
        .unwrap();
    assert_eq!(writer.join().unwrap(), 0);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].event_type, "X");
}

#[test]
fn gate_never_admits_more_than_the_limit_under_contention() {
    const CONTENDERS: usize = 50;
    const LIMIT: u32 = 5;
    let (_d, path) = temp_db();
    Store::open(&path).unwrap();
    let barrier = Arc::new(Barrier::new(CONTENDERS));
    let handles: Vec<_> = (0..CONTENDERS)
        .map(|i| {
            let path = path.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                let store = Store::open(&path).unwrap();
                barrier.wait();
                store.try_admit(&admit_req("run", &format!("sb-{i}"), LIMIT, 1000))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e.code(), ErrorCode::SandboxExecutionFailed);
            assert_eq!(
                e.to_string(),
                "Sandbox concurrency limit reached for run run (5)."
            );
            let d = e.details();
            assert_eq!(d["runId"], "run");
            assert_eq!(d["maxConcurrent"], 5);
            assert_eq!(d["activeSandboxCount"], 5);
        }
    }
    // Proof from the rows, not from our own counting.
    let store = Store::open(&path).unwrap();
    let rows = store.list_sandboxes("run").unwrap();
    let active = rows.iter().filter(|r| r.status.is_active()).count();
    assert_eq!(rows.len(), LIMIT as usize, "refused starts wrote nothing");
    assert_eq!(active, LIMIT as usize);
    assert_eq!(admitted, LIMIT as usize);
    for row in &rows {
        assert!(store.lease(&row.run_id, &row.sandbox_id).unwrap().is_some());
    }

    // A finished sandbox frees its slot.
    store
        .upsert_sandbox(&SandboxUpsert {
            status: Some(SandboxStatus::Finished),
            ..SandboxUpsert::key("run", rows[0].sandbox_id.clone())
        })
        .unwrap();
    let seen = store
        .try_admit(&admit_req("run", "late", LIMIT, 1000))
        .unwrap();
    assert_eq!(seen.active_in_run, 4);
}

#[test]
fn host_limit_and_duplicate_ids_are_refused() {
    let (_d, path) = temp_db();
    let store = Store::open(&path).unwrap();
    store.try_admit(&admit_req("r1", "a", 10, 2)).unwrap();
    store.try_admit(&admit_req("r2", "a", 10, 2)).unwrap();
    let err = store.try_admit(&admit_req("r3", "a", 10, 2)).unwrap_err();
    assert!(matches!(
        err,
        StoreError::ConcurrencyLimit {
            scope: GateScope::Host,
            active_sandbox_count: 2,
            ..
        }
    ));
    assert_eq!(err.details()["scope"], "host");
    let dup = store.try_admit(&admit_req("r1", "a", 10, 10)).unwrap_err();
    assert!(matches!(dup, StoreError::SandboxAlreadyActive { .. }));
    assert_eq!(dup.code(), ErrorCode::InvalidInput);
}

#[test]
fn a_refused_start_never_overwrites_an_active_row() {
    let (_d, path) = temp_db();
    let store = Store::open(&path).unwrap();
    let cfg = RedactedConfig::new(&json!({}));
    assert!(store.record_refused("r", "new", "docker", &cfg, 5).unwrap());
    let row = store.get_sandbox("r", "new").unwrap().unwrap();
    assert_eq!(row.status, SandboxStatus::Failed);
    assert_eq!(row.completed_at_ms, Some(5));
    store.try_admit(&admit_req("r", "busy", 10, 10)).unwrap();
    assert!(!store
        .record_refused("r", "busy", "docker", &cfg, 6)
        .unwrap());
    assert_eq!(
        store.get_sandbox("r", "busy").unwrap().unwrap().status,
        SandboxStatus::Pending
    );
}

#[test]
fn migrations_are_idempotent_on_reopen_and_refuse_newer_schema() {
    let (_d, path) = temp_db();
    {
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        store.try_admit(&admit_req("r", "s", 10, 10)).unwrap();
    }
    for _ in 0..3 {
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert!(store.get_sandbox("r", "s").unwrap().is_some(), "data kept");
    }
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!("PRAGMA user_version = {}", SCHEMA_VERSION + 1))
            .unwrap();
    }
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::SchemaTooNew { .. }), "{err}");
}

#[test]
fn an_older_schema_is_upgraded_in_place() {
    let (_d, path) = temp_db();
    Store::open(&path).unwrap();
    {
        // Back to version 1: without the partial index of active rows.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("DROP INDEX _smithers_sandboxes_active_idx; PRAGMA user_version = 1;")
            .unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    // The gate needs the index (INDEXED BY fails without it): admission proves it is back.
    store.try_admit(&admit_req("r", "s", 10, 10)).unwrap();
    assert_eq!(store.count_active(None).unwrap(), 1);
}

#[test]
fn adopts_a_database_created_by_the_javascript_schema() {
    let (_d, path) = temp_db();
    {
        // The JavaScript package's DDL as of 0.16 (before heartbeat_at_ms existed).
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE _smithers_sandboxes (run_id TEXT NOT NULL, sandbox_id TEXT NOT NULL,
               runtime TEXT NOT NULL DEFAULT 'bubblewrap', remote_run_id TEXT, workspace_id TEXT,
               container_id TEXT, config_json TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
               shipped_at_ms INTEGER, completed_at_ms INTEGER, bundle_path TEXT,
               PRIMARY KEY (run_id, sandbox_id));
             INSERT INTO _smithers_sandboxes (run_id, sandbox_id, config_json) VALUES ('js', 'x', '{}');",
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let row = store.get_sandbox("js", "x").unwrap().unwrap();
    assert_eq!(row.heartbeat_at_ms, None);
    assert!(store.heartbeat_sandbox("js", "x", 7).unwrap());
    assert!(
        !store.heartbeat_sandbox("js", "x", 6).unwrap(),
        "never backwards"
    );
}

#[test]
fn schema_matches_the_compatible_tables_when_sqlite3_cli_is_present() {
    let (_d, path) = temp_db();
    Store::open(&path).unwrap();
    let out = match std::process::Command::new("sqlite3")
        .arg(&path)
        .arg(".schema _smithers_sandboxes")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            smithers_test_support::skip_or_fail(&format!("sqlite3 CLI not installed: {e}"));
            return;
        }
    };
    assert!(out.status.success());
    let schema = String::from_utf8(out.stdout).unwrap();
    let normalized: String = schema.split_whitespace().collect::<Vec<_>>().join(" ");
    for column in [
        "run_id TEXT NOT NULL",
        "sandbox_id TEXT NOT NULL",
        "runtime TEXT NOT NULL DEFAULT 'bubblewrap'",
        "remote_run_id TEXT,",
        "workspace_id TEXT,",
        "container_id TEXT,",
        "config_json TEXT NOT NULL",
        "status TEXT NOT NULL DEFAULT 'pending'",
        "shipped_at_ms INTEGER",
        "completed_at_ms INTEGER",
        "bundle_path TEXT",
        "heartbeat_at_ms INTEGER",
        "PRIMARY KEY (run_id, sandbox_id)",
    ] {
        assert!(
            normalized.contains(column),
            "{column} missing in {normalized}"
        );
    }
    let out = std::process::Command::new("sqlite3")
        .arg(&path)
        .arg("PRAGMA table_info(_smithers_events);")
        .output()
        .unwrap();
    let info = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        info.trim(),
        "0|run_id|TEXT|1||1\n1|seq|INTEGER|1||2\n2|timestamp_ms|INTEGER|1||0\n3|type|TEXT|1||0\n4|payload_json|TEXT|1||0"
    );
    let out = std::process::Command::new("sqlite3")
        .arg(&path)
        .arg("PRAGMA journal_mode;")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "wal");
}

fn dead_owner() -> OwnerIdentity {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn");
    let owner = OwnerIdentity::of_pid(child.id()).expect("child identity");
    child.kill().unwrap();
    child.wait().unwrap();
    owner
}

#[test]
fn recovery_finds_dead_owners_only_and_frees_their_slot() {
    let (_d, path) = temp_db();
    let store = Store::open(&path).unwrap();
    let dead = dead_owner();
    let mut req = admit_req("r", "orphan", 2, 10);
    req.owner = dead.clone();
    store.try_admit(&req).unwrap();
    store
        .set_handle(
            "r",
            "orphan",
            r#"{"runtime":"bubblewrap","sandboxRoot":"/x"}"#,
        )
        .unwrap();
    store.try_admit(&admit_req("r", "alive", 2, 10)).unwrap();
    // A reused pid: same pid as ours but another start time is a dead owner too.
    let mut reused = me();
    reused.start_time += 1;
    let mut req = admit_req("r2", "reused", 2, 10);
    req.owner = reused;
    store.try_admit(&req).unwrap();

    assert!(
        store.try_admit(&admit_req("r", "third", 2, 10)).is_err(),
        "run is full"
    );
    let orphans = store.orphaned_sandboxes().unwrap();
    let ids: Vec<&str> = orphans
        .iter()
        .map(|o| o.sandbox.sandbox_id.as_str())
        .collect();
    assert_eq!(ids, ["orphan", "reused"]);
    assert_eq!(
        orphans[0].lease.handle_json.as_deref(),
        Some(r#"{"runtime":"bubblewrap","sandboxRoot":"/x"}"#)
    );
    assert!(store.mark_orphan_failed(&orphans[0], 99).unwrap());
    assert!(
        !store.mark_orphan_failed(&orphans[0], 100).unwrap(),
        "only once"
    );
    let row = store.get_sandbox("r", "orphan").unwrap().unwrap();
    assert_eq!(row.status, SandboxStatus::Failed);
    assert_eq!(row.completed_at_ms, Some(99));
    let lease = store.lease("r", "orphan").unwrap().unwrap();
    assert_eq!(lease.release_reason.as_deref(), Some("orphaned"));
    store
        .try_admit(&admit_req("r", "third", 2, 10))
        .expect("slot freed");
}

#[test]
fn review_lifecycle_is_durable_and_compare_and_set() {
    let (_d, path) = temp_db();
    {
        let store = Store::open(&path).unwrap();
        store.try_admit(&admit_req("r", "s", 1, 10)).unwrap();
        let patches = vec![
            PatchRecord {
                path: "src/a.rs".into(),
                operation: PatchOperation::Modify,
                base_hash: Some("b1".into()),
                new_hash: Some("n1".into()),
                patch_path: "patches/0001.patch".into(),
            },
            PatchRecord {
                path: "new.txt".into(),
                operation: PatchOperation::Add,
                base_hash: None,
                new_hash: Some("n2".into()),
                patch_path: "patches/0002.patch".into(),
            },
        ];
        store
            .open_review(
                &NewReview {
                    run_id: "r".into(),
                    sandbox_id: "s".into(),
                    root_dir: "/project".into(),
                    bundle_path: "/bundle".into(),
                    bundle_status: "finished".into(),
                    remote_run_id: None,
                    patch_count: 2,
                    total_diff_lines: 7,
                    duration_ms: 12.5,
                    requested_at_ms: 10,
                    bundle_digest: "sha256:test".into(),
                    applied_by: None,
                },
                &patches,
            )
            .unwrap();
        // A sandbox waiting for review holds no gate slot.
        store.try_admit(&admit_req("r", "next", 1, 10)).unwrap();
    }
    // Reopen: the review survived.
    let store = Store::open(&path).unwrap();
    assert_eq!(
        store.get_sandbox("r", "s").unwrap().unwrap().status,
        SandboxStatus::Review
    );
    let pending = store.list_reviews(Some(ReviewState::Pending)).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].total_diff_lines, 7);
    let p = store.patches("r", "s").unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(p[1].operation, PatchOperation::Add);
    assert_eq!(p[1].base_hash, None);

    let accepted = store
        .transition_review(
            "r",
            "s",
            ReviewState::Pending,
            ReviewState::Accepted,
            None,
            20,
        )
        .unwrap();
    assert_eq!(accepted.decided_at_ms, Some(20));
    let twice = store
        .transition_review(
            "r",
            "s",
            ReviewState::Pending,
            ReviewState::Rejected,
            Some("no"),
            21,
        )
        .unwrap_err();
    assert!(matches!(twice, StoreError::ReviewTransition { ref from, .. } if from == "accepted"));
    let bogus = store
        .transition_review(
            "r",
            "s",
            ReviewState::Applied,
            ReviewState::Pending,
            None,
            22,
        )
        .unwrap_err();
    assert_eq!(bogus.code(), ErrorCode::InvalidInput);
    let applied = store
        .transition_review(
            "r",
            "s",
            ReviewState::Accepted,
            ReviewState::Applied,
            None,
            30,
        )
        .unwrap();
    assert_eq!(applied.state, ReviewState::Applied);
    assert_eq!(applied.applied_at_ms, Some(30));
}

#[test]
fn store_error_reports_code_message_details() {
    let (_d, path) = temp_db();
    let bad = Path::new(&path).join("not-a-dir").join("x.db");
    let err = Store::open(&bad).unwrap_err();
    let report = err.report();
    assert_eq!(report.code, ErrorCode::Internal);
    assert!(report.details["path"].as_str().unwrap().ends_with("x.db"));
}

/// One `Store` shared by threads (its pool, not one `Store` per thread as above): the gate is
/// still one IMMEDIATE transaction, on whichever connection a call gets.
#[test]
fn gate_holds_on_one_shared_store_under_contention() {
    const CONTENDERS: usize = 40;
    const LIMIT: u32 = 3;
    let (_d, path) = temp_db();
    let store = Arc::new(Store::open(&path).unwrap());
    let barrier = Arc::new(Barrier::new(CONTENDERS));
    let handles: Vec<_> = (0..CONTENDERS)
        .map(|i| {
            let (store, barrier) = (store.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                store.try_admit(&admit_req("run", &format!("sb-{i}"), LIMIT, 1000))
            })
        })
        .collect();
    let admitted = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|r| r.is_ok())
        .count();
    let rows = store.list_sandboxes("run").unwrap();
    assert_eq!(admitted, LIMIT as usize);
    assert_eq!(rows.len(), LIMIT as usize, "refused starts wrote nothing");
}

/// A call waiting for the database's write lock (another process holds it: here a raw
/// connection in an open IMMEDIATE transaction) holds only its own connection: a read on
/// another thread of the same `Store` answers meanwhile (WAL readers do not wait for writers).
/// With one connection behind a mutex, the read waited for the write, which waited up to
/// `BUSY_TIMEOUT` for the lock.
#[test]
fn a_write_waiting_for_the_lock_does_not_hold_readers() {
    let (_d, path) = temp_db();
    let store = Arc::new(Store::open(&path).unwrap());
    store
        .try_admit(&admit_req("run", "sb-1", 10, 1000))
        .unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();

    let writer = {
        let store = store.clone();
        thread::spawn(move || store.heartbeat_sandbox("run", "sb-1", 2_000))
    };
    // Let the writer take its connection and start waiting for the lock.
    thread::sleep(Duration::from_millis(300));
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let store = store.clone();
        thread::spawn(move || {
            let _ = tx.send(store.get_sandbox("run", "sb-1"));
        })
    };
    // Loose: the read takes a millisecond; the write waits until the lock is released below.
    let read = rx.recv_timeout(Duration::from_secs(10));
    other.execute_batch("COMMIT").unwrap();
    let read = read.expect("the read waited for the write holding the lock");
    let row = read.unwrap().expect("row");
    assert_eq!(row.sandbox_id, "sb-1");
    reader.join().unwrap();
    assert!(writer.join().unwrap().unwrap(), "the write went through");
    assert_eq!(
        store
            .get_sandbox("run", "sb-1")
            .unwrap()
            .unwrap()
            .heartbeat_at_ms,
        Some(2_000)
    );
}

/// Closing a store does not checkpoint (two fsyncs, the WAL's unlink and its re-creation at
/// the next open, on every short CLI process): the WAL is kept, fsync'd at drop, and what it
/// holds is read back by the next store.
#[test]
fn close_keeps_the_synced_wal_and_the_next_open_reads_it() {
    let (_d, path) = temp_db();
    let wal = path.with_file_name("smithers.db-wal");
    let store = Store::open(&path).unwrap();
    store.sync_wal().unwrap();
    store.try_admit(&admit_req("r", "s", 10, 10)).unwrap();
    store.sync_wal().unwrap();
    drop(store);
    let kept = std::fs::metadata(&wal).expect("the WAL is kept at close");
    assert!(kept.len() > 0, "the committed frames are in the WAL");
    let again = Store::open(&path).unwrap();
    assert!(again.get_sandbox("r", "s").unwrap().is_some());
}

/// A WAL grown past half a megabyte is checkpointed into the database and emptied by
/// `sync_wal` (the next process would otherwise read and checksum every frame at its first
/// connection); what it held is in the database for the next store.
#[test]
fn sync_wal_checkpoints_and_empties_a_grown_wal() {
    let (_d, path) = temp_db();
    let wal = path.with_file_name("smithers.db-wal");
    let store = Store::open(&path).unwrap();
    let payload = "x".repeat(2000);
    let mut n = 0;
    while std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0) <= 512 << 10 {
        store
            .insert_event(&NewEvent {
                run_id: "grown",
                timestamp_ms: n,
                event_type: "T",
                payload_json: &payload,
            })
            .unwrap();
        n += 1;
        assert!(n < 10_000, "the WAL grows with the inserts");
    }
    store.sync_wal().unwrap();
    assert_eq!(
        std::fs::metadata(&wal).unwrap().len(),
        0,
        "checkpointed and truncated"
    );
    drop(store);
    let again = Store::open(&path).unwrap();
    assert_eq!(again.events_since("grown", 0).unwrap().len() as i64, n);
}

#[test]
fn the_recovery_pass_reads_only_the_active_rows() {
    // Every `run` starts with it: its cost must not grow with the database's history.
    let (_dir, path) = temp_db();
    let store = Store::open(&path).unwrap();
    let plan = store.orphan_query_plan().unwrap();
    assert!(
        plan.iter()
            .any(|step| step.contains("_smithers_sandboxes_active_idx")),
        "the partial index of active rows is used: {plan:?}"
    );
    assert!(
        !plan
            .iter()
            .any(|step| step.starts_with("SCAN s")
                && !step.contains("_smithers_sandboxes_active_idx")),
        "no scan of the whole table: {plan:?}"
    );
}

#[test]
fn many_opens_of_a_new_database_at_once_all_succeed() {
    // Six `run`s started together on a new project once met "database is locked" while one
    // of them set the WAL mode up; an open now waits that out.
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sandbox.db");
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || smithers_store::Store::open(&path).map(drop))
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
    }
}
