//! `ls`, `show`, `events`, `metrics`: reading the store.
//!
//! Human output is made inert (`crate::output::inert`): every id, status, reason, path and
//! event field may come from a database under the project, which is untrusted. `--json`
//! output is exact JSON.
//!
//! Metrics are derived from the stored rows and events, not from a process's counters: the
//! CLI is a new process each time, so its in-memory counters would always read zero. See
//! [`metrics`] for exactly how each of the seven series is computed.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Map, Value};
use smithers_errors::ErrorCode;
use smithers_orchestrator::Metrics;
use smithers_store::{EventRow, SandboxRow, SandboxStatus};

use super::changes;
use super::context::{self, Ctx, StoreArgs};
use super::review::review_json;
use crate::output::{coded_error, inert, Coded};

/// Arguments of `ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only this run.
    #[arg(long, value_name = "ID")]
    pub run: Option<String>,
    /// Only sandboxes with this status (pending, shipped, review, finished, failed, cancelled).
    #[arg(long, value_name = "S")]
    pub status: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Arguments of `show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// `<sandboxId>` or `<runId>:<sandboxId>`.
    pub id: String,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Arguments of `events`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// The run id.
    pub run: String,
    /// Keep printing new events until no sandbox of the run is running any more (all are
    /// finished, failed, cancelled or waiting in review), or Ctrl-C.
    #[arg(long)]
    pub follow: bool,
    /// Start at this sequence number (events are numbered from 0 per run, without gaps).
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    pub since: i64,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Arguments of `metrics`.
#[derive(Debug, Args)]
pub struct MetricsArgs {
    #[command(flatten)]
    pub store: StoreArgs,
}

fn fmt_time(ms: Option<i64>) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let ago = (now - ms).max(0) / 1000;
    match ago {
        0..=59 => format!("{ago}s ago"),
        60..=3599 => format!("{}m ago", ago / 60),
        3600..=86399 => format!("{}h ago", ago / 3600),
        _ => format!("{}d ago", ago / 86400),
    }
}

fn row_json(ctx: &Ctx, row: &SandboxRow) -> anyhow::Result<Value> {
    let review = ctx
        .store()
        .get_review(&row.run_id, &row.sandbox_id)
        .coded()?;
    let patches = ctx.store().patches(&row.run_id, &row.sandbox_id).coded()?;
    let bundle_path = row
        .bundle_path
        .clone()
        .or_else(|| review.as_ref().map(|r| r.bundle_path.clone()));
    Ok(json!({
        "runId": row.run_id,
        "sandboxId": row.sandbox_id,
        "runtime": row.runtime,
        "status": row.status.as_str(),
        "bundlePath": bundle_path,
        "shippedAtMs": row.shipped_at_ms,
        "completedAtMs": row.completed_at_ms,
        "heartbeatAtMs": row.heartbeat_at_ms,
        "review": review.as_ref().map(review_json),
        "patches": patches,
    }))
}

/// Arguments of `logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The sandbox: its id, a unique short id (prefix, or the last 4+ characters), or
    /// `<runId>:<sandboxId>`.
    pub id: String,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The most a `logs` line may be before it is cut (a bundle's log lines are bounded when
/// written; the file in the project may have been edited since).
const MAX_LOG_LINE: usize = 1 << 20;

/// The egress decisions of a sandbox's bundle log, summarised as the engine summarises them
/// for `run` (counts, the policy, at most 100 destinations); `None` for a step without a
/// policy. Read like `logs` reads it: from the validated ids, through no link, a bounded
/// line at a time.
fn egress_summary(root: &Path, row: &SandboxRow, config: &Value) -> Option<Value> {
    use std::io::{BufRead, Read};
    // The row's config holds the controls at its top level.
    let policy_json = config["egressPolicy"].clone();
    if policy_json.is_null() {
        return None;
    }
    let policy = smithers_egress::Policy::from_json(&policy_json.to_string()).ok();
    let rel = context::sandbox_rel_dir(&row.run_id, &row.sandbox_id)
        .ok()?
        .join("result/logs/stream.ndjson");
    let file = smithers_paths::Beneath::open(root)
        .ok()?
        .open_read(&rel)
        .ok()?;
    let mut reader = std::io::BufReader::new(file);
    let (mut allowed, mut denied, mut would) = (0u64, 0u64, 0u64);
    // (allowed, host, port, verdict, a denial's reason) -> (connections, bytes up, bytes
    // down, a denial's fix), as the engine's summary keeps them.
    type Destination = (bool, String, u64, String, Option<String>);
    let mut dest: BTreeMap<Destination, (u64, u64, u64, Value)> = BTreeMap::new();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = Read::take(&mut reader, MAX_LOG_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)
            .ok()?;
        if n == 0 {
            break;
        }
        if buf.len() > MAX_LOG_LINE {
            let mut rest = Vec::new();
            let _ = reader.read_until(b'\n', &mut rest);
            continue;
        }
        let Ok(r) = serde_json::from_slice::<Value>(&buf) else {
            continue;
        };
        if r["type"] != "egress" {
            continue;
        }
        let verdict = r["verdict"].as_str().unwrap_or("?").to_string();
        match verdict.as_str() {
            "allow" => allowed += 1,
            "would-deny" => would += 1,
            _ => denied += 1,
        }
        let allowed = verdict == "allow";
        let key = (
            allowed,
            r["host"].as_str().unwrap_or("?").to_string(),
            r["port"].as_u64().unwrap_or(0),
            verdict,
            r["reason"]
                .as_str()
                .filter(|_| !allowed)
                .map(str::to_string),
        );
        // Bounded: the first 100 destinations (the counts above cover every record).
        if dest.len() < 100 || dest.contains_key(&key) {
            let e = dest.entry(key).or_insert_with(|| {
                let fix = if allowed {
                    Value::Null
                } else {
                    r["fix"].clone()
                };
                (0, 0, 0, fix)
            });
            e.0 += 1;
            e.1 += r["bytesUp"].as_u64().unwrap_or(0);
            e.2 += r["bytesDown"].as_u64().unwrap_or(0);
        }
    }
    Some(json!({
        "policy": policy.as_ref().map(|p| p.hash()),
        "mode": policy.as_ref().map(|p| p.mode.as_str()),
        "allowed": allowed,
        "denied": denied,
        "wouldDeny": would,
        "destinations": dest.into_iter().take(100).map(|((_, host, port, verdict, reason), (count, up, down, fix))| {
            let mut d = json!({
                "host": host, "port": port, "verdict": verdict, "count": count, "bytesUp": up, "bytesDown": down,
            });
            if let Some(reason) = reason {
                d["reason"] = reason.into();
            }
            if !fix.is_null() {
                d["fix"] = fix;
            }
            d
        }).collect::<Vec<_>>(),
    }))
}

/// Runs `logs`: the step's stdout and stderr, from its bundle's log, to our stdout and stderr
/// (inert on a terminal, as `run` relays them); `--json` prints the log's records as they are.
/// The log is found from the validated ids under the project's own `.smithers`, through no
/// link (the database and the tree may be crafted), and read a line at a time.
pub fn logs(args: &LogsArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    use std::io::{BufRead, IsTerminal, Read, Write};
    let ctx = context::open_required(&args.store, true)?;
    let row = context::resolve(&ctx, &args.id)?;
    let root = args.store.root_dir()?;
    let rel =
        context::sandbox_rel_dir(&row.run_id, &row.sandbox_id)?.join("result/logs/stream.ndjson");
    let beneath = smithers_paths::Beneath::open(&root)
        .map_err(|e| coded_error(ErrorCode::InvalidInput, e.to_string(), Value::Null))?;
    let file = beneath.open_read(&rel).map_err(|e| {
        coded_error(
            ErrorCode::InvalidInput,
            format!(
                "no log for {}:{} ({}): {}",
                inert(&row.run_id),
                inert(&row.sandbox_id),
                row.status.as_str(),
                inert(&e.to_string())
            ),
            json!({ "runId": row.run_id, "sandboxId": row.sandbox_id }),
        )
    })?;
    let out_tty = std::io::stdout().is_terminal();
    let err_tty = std::io::stderr().is_terminal();
    // A record's exact bytes (its newline included unless partial) to a pipe; a line made
    // inert, with bytes that are not UTF-8 as `\xNN`, to a terminal.
    let shown = |bytes: Vec<u8>, tty: bool| {
        if !tty {
            return bytes;
        }
        let line = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        let mut text = smithers_terminal::escape_bytes(line, smithers_terminal::Inert::BODY);
        text.push('\n');
        text.into_bytes()
    };
    let mut reader = std::io::BufReader::new(file);
    let mut buf = Vec::new();
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    loop {
        buf.clear();
        let n = Read::take(&mut reader, MAX_LOG_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        if buf.len() > MAX_LOG_LINE {
            writeln!(err, "note: a log line over {MAX_LOG_LINE} bytes was cut")?;
            // Skip the rest of that line.
            let mut rest = Vec::new();
            reader.read_until(b'\n', &mut rest)?;
            continue;
        }
        let Ok(record) = serde_json::from_slice::<Value>(&buf) else {
            writeln!(err, "note: a log line that is not JSON was skipped")?;
            continue;
        };
        if json_out {
            writeln!(out, "{record}")?;
            continue;
        }
        if let Some((stream, bytes)) = smithers_runtime::output::record_bytes(&record) {
            match stream {
                smithers_runtime::OutputStream::Stdout => out.write_all(&shown(bytes, out_tty))?,
                smithers_runtime::OutputStream::Stderr => err.write_all(&shown(bytes, err_tty))?,
            }
            continue;
        }
        if record["type"] == "note" {
            writeln!(
                err,
                "note: {}",
                inert(record["message"].as_str().unwrap_or_default())
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `ls`.
pub fn ls(args: &LsArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let Some(ctx) = context::open_existing(&args.store, json_out)? else {
        if json_out {
            println!("[]");
        } else {
            eprintln!(
                "no sandboxes here (no database at {})",
                inert(
                    &args
                        .store
                        .root_dir()?
                        .join(".smithers")
                        .display()
                        .to_string()
                )
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let mut rows = match &args.run {
        Some(run) => ctx.store().list_sandboxes(run).coded()?,
        None => context::all_sandboxes(&ctx)?,
    };
    if let Some(s) = &args.status {
        rows.retain(|r| r.status.as_str() == s);
    }
    if json_out {
        let list = rows
            .iter()
            .map(|r| row_json(&ctx, r))
            .collect::<anyhow::Result<Vec<_>>>()?;
        println!("{}", Value::Array(list));
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        eprintln!("no sandboxes in {}", ctx.db_path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = vec![[
        "RUN".to_string(),
        "SANDBOX".into(),
        "RUNTIME".into(),
        "STATUS".into(),
        "REVIEW".into(),
        "PATCHES".into(),
        "UPDATED".into(),
    ]];
    for r in &rows {
        let review = ctx.store().get_review(&r.run_id, &r.sandbox_id).coded()?;
        table.push([
            r.run_id.clone(),
            r.sandbox_id.clone(),
            r.runtime.clone(),
            r.status.as_str().to_string(),
            review
                .as_ref()
                .map_or("-".into(), |v| v.state.as_str().to_string()),
            review
                .as_ref()
                .map_or("-".into(), |v| v.patch_count.to_string()),
            fmt_time(r.completed_at_ms.or(r.heartbeat_at_ms).or(r.shipped_at_ms)),
        ]);
    }
    print_table(&table);
    Ok(ExitCode::SUCCESS)
}

/// Prints a table whose cells are made inert first (so widths are those shown).
fn print_table<const N: usize>(rows: &[[String; N]]) {
    let rows: Vec<[String; N]> = rows.iter().map(|r| r.clone().map(|c| inert(&c))).collect();
    let rows = rows.as_slice();
    let mut widths = [0usize; N];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == N {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", line.trim_end());
    }
}

/// The event's payload, with `seq` first (the NDJSON line of `events --json`).
fn event_json(e: &EventRow) -> Value {
    let mut m = Map::new();
    m.insert("seq".into(), json!(e.seq));
    match serde_json::from_str::<Value>(&e.payload_json) {
        Ok(Value::Object(p)) => m.extend(p),
        _ => {
            m.insert("type".into(), json!(e.event_type));
            m.insert("runId".into(), json!(e.run_id));
            m.insert("timestampMs".into(), json!(e.timestamp_ms));
            m.insert("payloadJson".into(), json!(e.payload_json));
        }
    }
    Value::Object(m)
}

/// One human line: `#seq  time  Type  sandbox  key=value ...`, every field inert (one line
/// per event, whatever the payload holds).
fn event_line(e: &EventRow) -> String {
    let payload: Map<String, Value> = serde_json::from_str(&e.payload_json).unwrap_or_default();
    let secs = e.timestamp_ms.div_euclid(1000);
    let ms = e.timestamp_ms.rem_euclid(1000);
    let tod = secs.rem_euclid(86400);
    let mut extra = Vec::new();
    for (k, v) in &payload {
        if matches!(
            k.as_str(),
            "type" | "runId" | "sandboxId" | "timestampMs" | "configJson"
        ) {
            continue;
        }
        let v = match (k.as_str(), v) {
            ("error", Value::Object(err)) => format!(
                "{}: {}",
                err.get("code").and_then(Value::as_str).unwrap_or("?"),
                err.get("message").and_then(Value::as_str).unwrap_or("")
            ),
            (_, Value::String(s)) => s.clone(),
            (_, other) => other.to_string(),
        };
        extra.push(format!("{}={}", inert(k), inert(&v)));
    }
    format!(
        "#{:<4} {:02}:{:02}:{:02}.{:03}Z  {:<28} {:<16} {}",
        e.seq,
        tod / 3600,
        (tod / 60) % 60,
        tod % 60,
        ms,
        inert(&e.event_type),
        inert(
            payload
                .get("sandboxId")
                .and_then(Value::as_str)
                .unwrap_or("-")
        ),
        extra.join(" ")
    )
}

/// Runs `show`.
pub fn show(args: &ShowArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let ctx = context::open_required(&args.store, json_out)?;
    let row = context::resolve(&ctx, &args.id)?;
    let events: Vec<EventRow> = ctx
        .store()
        .events_since(&row.run_id, 0)
        .coded()?
        .into_iter()
        .filter(|e| {
            serde_json::from_str::<Value>(&e.payload_json)
                .ok()
                .and_then(|p| p["sandboxId"].as_str().map(|s| s == row.sandbox_id))
                .unwrap_or(false)
        })
        .collect();
    let mut doc = row_json(&ctx, &row)?;
    let bundle_path = doc["bundlePath"].as_str().map(str::to_string);
    let outputs = bundle_path.as_deref().and_then(changes::bundle_outputs);
    let recorded = ctx.store().patches(&row.run_id, &row.sandbox_id).coded()?;
    let changes = changes::changes_of(bundle_path.as_deref(), &recorded);
    let config: Value = serde_json::from_str(&row.config_json).unwrap_or(Value::Null);
    let notes = bundle_path
        .as_deref()
        .map(|b| changes::bundle_notes(Path::new(b)))
        .unwrap_or_default();
    let egress = egress_summary(&args.store.root_dir()?, &row, &config);
    if json_out {
        if let Some(e) = &egress {
            doc["egress"] = e.clone();
        }
        doc["config"] = config;
        doc["outputs"] = outputs.unwrap_or(Value::Null);
        doc["patches"] = Value::Array(changes.iter().map(changes::FileChange::to_json).collect());
        doc["events"] = Value::Array(events.iter().map(event_json).collect());
        doc["changeNotes"] = changes::change_notes_json(&notes);
        println!("{doc}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "sandbox   {}:{}",
        inert(&row.run_id),
        inert(&row.sandbox_id)
    );
    println!("runtime   {}", inert(&row.runtime));
    println!("status    {}", row.status.as_str());
    println!(
        "times     shipped {}, completed {}, last heartbeat {}",
        fmt_time(row.shipped_at_ms),
        fmt_time(row.completed_at_ms),
        fmt_time(row.heartbeat_at_ms)
    );
    println!("bundle    {}", inert(bundle_path.as_deref().unwrap_or("-")));
    if let Some(o) = &outputs {
        // JSON escapes C0 controls but leaves C1 and bidi characters raw.
        println!("outputs   {}", inert(&o.to_string()));
    }
    println!("config    {}", inert(&row.config_json));
    for line in super::egress_summary::egress_lines(egress.as_ref()) {
        println!("{line}");
    }
    match &doc["review"] {
        Value::Null => println!("review    none"),
        r => println!(
            "review    {}{} ({} patch file(s), {} changed lines)",
            inert(r["state"].as_str().unwrap_or("?")),
            r["reason"]
                .as_str()
                .map(|s| format!(": {}", inert(s)))
                .unwrap_or_default(),
            r["patchCount"],
            r["totalDiffLines"]
        ),
    }
    let mut findings = smithers_patch::ReviewFindings::default();
    changes::add_change_notes(&mut findings, &notes);
    print!("{}", smithers_patch::render_findings(&findings, false));
    if !changes.is_empty() {
        println!("patches");
        for line in changes::stat_lines(&changes) {
            println!("  {line}");
        }
    }
    // In order of first appearance, which is the lifecycle order.
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for e in &events {
        match counts.iter_mut().find(|(t, _)| *t == e.event_type) {
            Some((_, n)) => *n += 1,
            None => counts.push((e.event_type.as_str(), 1)),
        }
    }
    println!(
        "events    {} ({})",
        events.len(),
        counts
            .iter()
            .map(|(k, v)| if *v > 1 {
                format!("{}×{v}", inert(k))
            } else {
                inert(k)
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    for e in &events {
        println!("  {}", event_line(e));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `events`.
pub fn events(args: &EventsArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let ctx = context::open_required(&args.store, true)?;
    if args.since < 0 {
        return Err(coded_error(
            ErrorCode::InvalidInput,
            format!("--since must be 0 or more (got {})", args.since),
            json!({ "since": args.since }),
        ));
    }
    let print = |e: &EventRow| {
        if json_out {
            println!("{}", event_json(e));
        } else {
            println!("{}", event_line(e));
        }
    };
    let mut next = args.since;
    // A short id, or a sandbox's, as the other commands take them.
    let run = context::resolve_run(&ctx, &args.run)?;
    let first = ctx.store().events_since(&run, next).coded()?;
    // Unknown at once, with --follow too: a mistyped id must not wait forever.
    if first.is_empty() && ctx.store().list_sandboxes(&run).coded()?.is_empty() {
        return Err(coded_error(
            ErrorCode::InvalidInput,
            format!("no run {:?} in {}", run, ctx.db_path.display()),
            json!({ "runId": run }),
        ));
    }
    for e in &first {
        print(e);
        next = e.seq + 1;
    }
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    // Follow: poll for new events; stop once the run has sandboxes and none of them is still
    // running (a sandbox in review is waiting for a person, not running). Ctrl-C ends the
    // process with the default signal disposition.
    loop {
        let rows = ctx.store().list_sandboxes(&run).coded()?;
        let settled = !rows.is_empty()
            && rows
                .iter()
                .all(|r| r.status.is_terminal() || r.status == SandboxStatus::Review);
        // Read once more after seeing the run settled: the final event is written after the
        // row, and nothing after it may be missed.
        let batch = ctx
            .store()
            .wait_for_events(
                &run,
                next,
                if settled {
                    Duration::ZERO
                } else {
                    Duration::from_millis(500)
                },
            )
            .coded()?;
        for e in &batch {
            print(e);
            next = e.seq + 1;
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        if settled && batch.is_empty() {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// Runs `metrics`: the seven series of spec section 8, computed from the database so they mean
/// the same from any process:
///
/// - `created_total{runtime}`: SandboxCreated events (admitted sandboxes);
/// - `completed_total{runtime,status}`: SandboxCompleted events by their status, plus every
///   SandboxFailed event as `failed` (refusals, errors, rejections, orphans — as the
///   orchestrator counts them);
/// - `active{runtime}`: rows whose status holds a gate slot now (pending, shipped, or foreign);
/// - `duration_ms`: `durationMs` of SandboxCompleted;
/// - `bundle_size_bytes`, `patch_count`: from SandboxBundleReceived;
/// - `transport_duration_ms`: the orchestrator times each runtime verb call in memory only, so
///   here it is rebuilt from event timestamps, one observation per phase of each sandbox:
///   create+ship (SandboxCreated → SandboxShipped), execute (SandboxShipped →
///   SandboxHeartbeat), collect+validate (SandboxHeartbeat → SandboxBundleReceived). Cleanup
///   leaves no event and is not included.
pub fn metrics(args: &MetricsArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let ctx = context::open_required(&args.store, true)?;
    let m = derive_metrics(&ctx)?;
    let text = m.render_prometheus();
    if json_out {
        println!(
            "{}",
            json!({ "db": ctx.db_path, "format": "prometheus-0.0.4", "text": text })
        );
    } else {
        print!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Rebuilds the metrics from rows and events (see [`metrics`]).
pub fn derive_metrics(ctx: &Ctx) -> anyhow::Result<Metrics> {
    let m = Metrics::new();
    for run in context::run_ids(&ctx.db_path)? {
        for row in ctx.store().list_sandboxes(&run).coded()? {
            // Every runtime seen gets a sample, 0 included (an absent series reads as "no data").
            m.active_add(&row.runtime, i64::from(row.status.is_active()));
        }
        // Per sandbox: timestamps of the phase events, for the transport histogram.
        let mut phases: BTreeMap<String, [Option<i64>; 4]> = BTreeMap::new();
        for e in ctx.store().events_since(&run, 0).coded()? {
            let p: Value = serde_json::from_str(&e.payload_json).unwrap_or(Value::Null);
            let runtime = p["runtime"].as_str().unwrap_or("unknown");
            let sid = p["sandboxId"].as_str().unwrap_or("").to_string();
            let slot = match e.event_type.as_str() {
                "SandboxCreated" => {
                    m.sandbox_created(runtime);
                    Some(0)
                }
                "SandboxShipped" => Some(1),
                "SandboxHeartbeat" => Some(2),
                "SandboxBundleReceived" => {
                    if let Some(b) = p["bundleSizeBytes"].as_u64() {
                        m.observe_bundle_size(b);
                    }
                    if let Some(c) = p["patchCount"].as_u64() {
                        m.observe_patch_count(c);
                    }
                    Some(3)
                }
                "SandboxCompleted" => {
                    m.sandbox_completed(runtime, p["status"].as_str().unwrap_or("unknown"));
                    if let Some(d) = p["durationMs"].as_f64() {
                        m.observe_duration_ms(d);
                    }
                    None
                }
                "SandboxFailed" => {
                    m.sandbox_completed(runtime, "failed");
                    None
                }
                _ => None,
            };
            if let Some(i) = slot {
                let entry = phases.entry(sid).or_default();
                // The first heartbeat after the step is the one that closes `execute`.
                if entry[i].is_none() {
                    entry[i] = Some(e.timestamp_ms);
                }
            }
        }
        for t in phases.values() {
            for w in [(0, 1), (1, 2), (2, 3)] {
                if let (Some(a), Some(b)) = (t[w.0], t[w.1]) {
                    m.observe_transport_ms((b - a).max(0) as f64);
                }
            }
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event whose payload carries escape sequences and newlines stays one inert line.
    #[test]
    fn event_lines_are_inert() {
        let e = EventRow {
            run_id: "r".into(),
            seq: 3,
            event_type: "SandboxFailed\x1b[2K".into(),
            timestamp_ms: 0,
            payload_json: serde_json::json!({
                "sandboxId": "s\u{202e}1",
                "error": {"code": "X", "message": "boom\n#4    00:00:00.000Z  SandboxCompleted"},
                "note": "\x1b]52;c;ZXZpbA==\x07",
            })
            .to_string(),
        };
        let line = event_line(&e);
        assert!(!line.contains('\n') && !line.contains('\x1b'), "{line:?}");
        assert!(line.contains("SandboxFailed^[[2K"), "{line}");
        assert!(line.contains("s\\u{202e}1"), "{line}");
        assert!(line.contains("error=X: boom^J#4"), "{line}");
        assert!(line.contains("note=^[]52;c;ZXZpbA==^G"), "{line}");
    }
}
