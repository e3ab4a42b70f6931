//! Scenario 11 (its checkpoint and fork half): a session whose layer holds 10,000 changed
//! files and 1 GiB written, checkpointed, restored and forked.
//!
//! Through the session's socket (the API the MCP server uses): a checkpoint (one small file
//! written before each, untimed, so that each is a real layer flip), with how long the
//! session's processes were held still (the engine's own account: from the handover's
//! request to the respawn's answer); a restore to the big checkpoint; the holder's part of a
//! fork (the layers of a checkpoint). Then a whole fork through the CLI
//! (`session fork ID cp-1`, until the new session answers), and, at the engine's API (what
//! a fork costs without our CLI's holder process), 100 sandboxes started from the big
//! checkpoint's layers against 100 started from the project alone.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;
use smithers_resident::session::{self, Request};
use smithers_runtime::{Engine, RequestBundle, RuntimeKind, SandboxConfig};
use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime, INIT_SUBCOMMAND};

use crate::measure::{fmt_ms, Series};
use crate::report::{machine_line, Table};
use crate::whole_cli::cli_binary;

/// What the session's layer holds before the first checkpoint.
const FILES: usize = 10_000;
const BIG_BYTES: u64 = 1 << 30;
/// Sandboxes started from the layers at the engine's API.
const ENGINE_FORKS: usize = 100;

pub fn run(scratch: &Path, rounds: usize) -> anyhow::Result<String> {
    let bin = cli_binary()?;
    let (project, sessions) = crate::sessions::fresh_project(scratch, "forks")?;
    let cli = || {
        let mut c = Command::new(&bin);
        c.env("SMITHERS_RESIDENT_DIR", &sessions)
            .env("SMITHERS_RESIDENT", "off")
            .current_dir(&project)
            .stdin(Stdio::null());
        c
    };
    let json = |args: &[&str]| -> anyhow::Result<Value> {
        let out = cli().arg("--json").args(args).output()?;
        anyhow::ensure!(out.status.success(), "{args:?}: {out:?}");
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let doc = json(&["session", "start", "--idle-timeout", "1h"])?;
    let id = doc["sessionId"].as_str().context("no id")?.to_string();
    let socket = Path::new(doc["socket"].as_str().context("no socket")?).to_path_buf();
    let fill = format!(
        "mkdir f && i=0; while [ $i -lt {FILES} ]; do echo $i > f/$i; i=$((i+1)); done; \
         head -c {BIG_BYTES} /dev/zero > big"
    );
    let out = cli()
        .args(["session", "exec", &id, "-n", "--", "sh", "-c", &fill])
        .output()?;
    anyhow::ensure!(out.status.success(), "filling the layer: {out:?}");
    let ask = |request: &Request| -> anyhow::Result<Value> {
        let stream = session::send(&socket, request, &[])?;
        let answer = session::read_answer(&stream)?;
        anyhow::ensure!(answer["ok"] == serde_json::json!(true), "{answer}");
        Ok(answer)
    };
    let began = Instant::now();
    let first = ask(&Request::Checkpoint)?;
    let first_took = began.elapsed();
    let big = first["checkpoint"].as_str().context("no name")?.to_string();

    let mut checkpoint = Series::new("checkpoint (socket; a small file written before each)");
    let mut held = Series::new("  of which the session's processes were held");
    let mut restore = Series::new("restore to the 1 GiB checkpoint (socket)");
    let mut fork_layers = Series::new("fork: the parent's part (socket: a checkpoint's layers)");
    let mut fork_cli = Series::new("session fork ID cp-1 (whole CLI, until the fork answers)");
    for round in 0..rounds {
        let touch = format!("echo {round} > t");
        let out = cli()
            .args(["session", "exec", &id, "-n", "--", "sh", "-c", &touch])
            .output()?;
        anyhow::ensure!(out.status.success(), "{out:?}");
        let t = Instant::now();
        let made = ask(&Request::Checkpoint)?;
        checkpoint.samples.push(t.elapsed());
        held.samples.push(Duration::from_micros(
            made["heldUs"].as_u64().unwrap_or_default(),
        ));
        let t = Instant::now();
        ask(&Request::Restore {
            checkpoint: big.clone(),
        })?;
        restore.samples.push(t.elapsed());
        let t = Instant::now();
        ask(&Request::Fork {
            checkpoint: Some(big.clone()),
        })?;
        fork_layers.samples.push(t.elapsed());
        if round < rounds.min(20) {
            let t = Instant::now();
            let forked = json(&["session", "fork", &id, &big])?;
            fork_cli.samples.push(t.elapsed());
            let child = forked["sessionId"].as_str().context("no fork id")?;
            json(&["session", "stop", child])?;
            let _ = cli().args(["reject", child]).output();
        }
    }
    let layers = ask(&Request::Fork {
        checkpoint: Some(big.clone()),
    })?["layers"]
        .clone();
    let layers: Vec<String> = serde_json::from_value(layers)?;
    let engine = engine_forks(&bin, &project, &layers)?;
    let _ = cli().args(["session", "stop", &id]).output();
    let _ = cli().args(["reject", &id]).output();
    let series = [checkpoint, held, restore, fork_layers, fork_cli];
    Ok(report(&series, first_took, &engine, rounds))
}

/// At the engine's API: [`ENGINE_FORKS`] sandboxes created, shipped and started from
/// `layers`, one after another, and as many from the project alone; the total of each.
fn engine_forks(
    bin: &Path,
    project: &Path,
    layers: &[String],
) -> anyhow::Result<[(Duration, Duration); 2]> {
    let rt = tokio::runtime::Runtime::new()?;
    // The CLI's own init (`smithers-sandbox __sandbox-init`), as the session's holder uses.
    let native = Arc::new(NativeRuntime::new(NativeOptions {
        init: Some(InitCommand {
            program: bin.to_path_buf(),
            args: vec![INIT_SUBCOMMAND.to_string()],
        }),
        ..NativeOptions::default()
    }));
    let mut totals = [(Duration::ZERO, Duration::ZERO); 2];
    for (which, from) in [layers.to_vec(), Vec::new()].into_iter().enumerate() {
        let mut handles = Vec::new();
        let began = Instant::now();
        let mut slowest = Duration::ZERO;
        for i in 0..ENGINE_FORKS {
            let t = Instant::now();
            let config = SandboxConfig {
                run_id: format!("bench-forks-{}", std::process::id()),
                sandbox_id: format!("f{which}-{i}"),
                runtime: RuntimeKind::Bubblewrap,
                root_dir: project.to_path_buf(),
                image: None,
                controls: Default::default(),
                workspace_layers: from.clone(),
            };
            let handle = rt.block_on(native.create(&config))?;
            let request = RequestBundle {
                request: serde_json::json!({"status": "pending", "sandboxId": config.sandbox_id,
                    "runtime": "bubblewrap", "input": {}}),
            };
            rt.block_on(native.ship(&handle, &request))?;
            rt.block_on(Engine::start(native.as_ref(), &handle))?;
            slowest = slowest.max(t.elapsed());
            handles.push(handle);
        }
        totals[which] = (began.elapsed(), slowest);
        for handle in handles {
            rt.block_on(native.destroy(&handle))?;
        }
    }
    Ok(totals)
}

fn report(
    series: &[Series],
    first: Duration,
    engine: &[(Duration, Duration); 2],
    rounds: usize,
) -> String {
    let mut table = Table::new(&["what", "p50", "p95", "samples"]);
    for s in series {
        table.row(vec![
            s.name.clone(),
            fmt_ms(s.median()),
            fmt_ms(s.p95()),
            s.samples.len().to_string(),
        ]);
    }
    let [(from_layers, slowest_layers), (from_project, slowest_project)] = *engine;
    let mut engine_table = Table::new(&["at the engine's API", "100 in all", "slowest one"]);
    engine_table.row(vec![
        "sandboxes started from the 1 GiB checkpoint's layers".into(),
        fmt_ms(from_layers),
        fmt_ms(slowest_layers),
    ]);
    engine_table.row(vec![
        "sandboxes started from the project alone".into(),
        fmt_ms(from_project),
        fmt_ms(slowest_project),
    ]);
    format!(
        "Machine: {}. A session whose layer holds {FILES} changed files and 1 GiB written; its \
         first checkpoint (that layer frozen) took {}. {rounds} rounds.\n\n{}\n{}\n\
         A checkpoint moves the upper directory into the store (a rename) and swaps the \
         overlay: its cost does not grow with what the layer holds. A fork through the CLI \
         is a new session (its holder process, its sandbox); at the engine's API a sandbox \
         over the checkpoint's layers starts as fast as one over the project. Command: \
         `cargo build --release -p smithers-cli -p smithers-bench && cargo run --release \
         -p smithers-bench -- forks`\n",
        machine_line(),
        fmt_ms(first),
        table.to_markdown(),
        engine_table.to_markdown(),
    )
}
