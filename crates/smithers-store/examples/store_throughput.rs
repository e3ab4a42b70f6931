//! Measures the store on a real file: event appends (one writer, then 8 concurrent
//! connections) and gate admissions. Prints numbers; asserts nothing (timing belongs here,
//! not in tests).
//!
//!     cargo run --release -p smithers-store --example store_throughput

use std::sync::{Arc, Barrier};
use std::time::Instant;

use serde_json::json;
use smithers_store::{AdmitRequest, NewEvent, OwnerIdentity, RedactedConfig, Store};

fn main() {
    let dir = std::env::temp_dir().join(format!("smithers-store-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bench.db");
    let store = Store::open(&path).expect("open");

    const N: usize = 2000;
    let started = Instant::now();
    for i in 0..N {
        let payload = format!(r#"{{"type":"SandboxHeartbeat","i":{i}}}"#);
        store
            .insert_event(&NewEvent {
                run_id: "single",
                timestamp_ms: i as i64,
                event_type: "SandboxHeartbeat",
                payload_json: &payload,
            })
            .expect("insert");
    }
    let single = started.elapsed();
    println!(
        "insert_event, 1 connection: {N} events in {:.1} ms ({:.0} events/s)",
        single.as_secs_f64() * 1e3,
        N as f64 / single.as_secs_f64()
    );

    const THREADS: usize = 8;
    const PER: usize = 250;
    let barrier = Arc::new(Barrier::new(THREADS));
    let started = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let path = path.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let s = Store::open(&path).expect("open");
                barrier.wait();
                for i in 0..PER {
                    let payload = format!(r#"{{"t":{t},"i":{i}}}"#);
                    s.insert_event(&NewEvent {
                        run_id: "multi",
                        timestamp_ms: i as i64,
                        event_type: "X",
                        payload_json: &payload,
                    })
                    .expect("insert");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("join");
    }
    let multi = started.elapsed();
    println!(
        "insert_event, {THREADS} connections: {} events in {:.1} ms ({:.0} events/s)",
        THREADS * PER,
        multi.as_secs_f64() * 1e3,
        (THREADS * PER) as f64 / multi.as_secs_f64()
    );

    let owner = OwnerIdentity::current().expect("identity");
    let config = RedactedConfig::new(&json!({"env": {"A": "b"}}));
    const ADMITS: usize = 500;
    let started = Instant::now();
    for i in 0..ADMITS {
        store
            .try_admit(&AdmitRequest {
                run_id: format!("run-{}", i / 5),
                sandbox_id: format!("sb-{i}"),
                runtime: "bubblewrap".into(),
                config: config.clone(),
                per_run_max: 10,
                host_max: u32::MAX,
                owner: owner.clone(),
                now_ms: i as i64,
            })
            .expect("admit");
    }
    let admits = started.elapsed();
    println!(
        "try_admit (count run + host, insert row + lease): {ADMITS} in {:.1} ms ({:.3} ms each, {} active rows at the end)",
        admits.as_secs_f64() * 1e3,
        admits.as_secs_f64() * 1e3 / ADMITS as f64,
        ADMITS
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
