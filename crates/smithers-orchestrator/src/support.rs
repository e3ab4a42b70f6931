//! Small pieces every part of the lifecycle uses: blocking calls kept off the async workers,
//! the stored event shape, the clock.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

/// Runs a blocking call (SQLite, bundle validation, patch apply) without holding an async
/// worker: on a multi-threaded runtime (the CLI's and `serve`'s) through
/// `tokio::task::block_in_place`, which hands this worker's other tasks to another thread
/// while `call` runs, so a store call waiting for another writer's lock, or an apply
/// writing a large tree, stalls no other task (HTTP handlers, event streams, heartbeats). On
/// a current-thread runtime (where `block_in_place` panics) or outside any runtime it runs
/// inline: there nothing else could run on another thread anyway.
pub(crate) fn off_worker<T>(call: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(call),
        _ => call(),
    }
}

/// An event as the store keeps it: `{type, runId, sandboxId, ...extra, timestampMs}` (a
/// `null` extra is left out, as `JSON.stringify` leaves out `undefined`).
pub(crate) fn event_json(
    event_type: &str,
    run_id: &str,
    sandbox_id: &str,
    extra: Vec<(&str, Value)>,
    timestamp_ms: i64,
) -> String {
    let mut m = Map::new();
    m.insert("type".into(), json!(event_type));
    m.insert("runId".into(), json!(run_id));
    m.insert("sandboxId".into(), json!(sandbox_id));
    for (k, v) in extra {
        // `undefined` fields are dropped by JSON.stringify; `None` plays that role here.
        if !v.is_null() {
            m.insert(k.to_string(), v);
        }
    }
    m.insert("timestampMs".into(), json!(timestamp_ms));
    Value::Object(m).to_string()
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) fn elapsed_ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
