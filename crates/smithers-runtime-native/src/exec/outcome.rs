//! What happened, made into the step's [`ExecOutcome`] and the bundle's log (written for
//! `collect` with the outcome).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use smithers_runtime::{Controls, ExecOutcome, ResourceUsage, RuntimeError, Termination};

use crate::backend::{Backend, StoredConfig};
use crate::cgroup::CgroupStats;
use crate::clock::now_ms;
use crate::files::write_private;
use crate::host::HostCaps;
use crate::plan::InitPlan;
use crate::report;
use smithers_sandbox_init::sys;

use super::result::step_result;
use super::supervise::Ended;

/// How a warm sandbox served the step, or why it did not (for the log).
pub(super) struct WarmStart {
    pub(super) warm_for: Option<Duration>,
    pub(super) armed_served: bool,
    pub(super) armed_given_up: bool,
    pub(super) warm_lost: Option<String>,
}

/// Refuses an outcome of a sandbox that was not set up: the init's `error`, or an egress
/// policy whose listeners never came.
pub(super) fn check_setup(controls: &Controls, ended: &Ended) -> Result<(), RuntimeError> {
    let (events, reason) = (&ended.events, ended.reason);
    if controls.egress_policy.is_some() && ended.egress_summary.is_none() && reason.is_none() {
        let said = events.iter().any(|e| e["event"] == "error");
        if !said && events.iter().any(|e| e["event"] == "exit") {
            return Err(RuntimeError::spawn(
                "set up the sandbox (egress)",
                "the init did not hand over the egress listeners, so the step had no network at all",
            ));
        }
    }
    if reason.is_none() {
        if let Some(error) = events.iter().find(|e| e["event"] == "error") {
            return Err(RuntimeError::Spawn {
                operation: format!(
                    "set up the sandbox ({})",
                    error["stage"].as_str().unwrap_or("init")
                ),
                reason: error["message"].as_str().unwrap_or("unknown").to_string(),
            });
        }
    }
    Ok(())
}

/// How the step ended, from why the runtime ended it (if it did), the cgroups' counters and
/// the command's exit.
fn termination(
    ended: &Ended,
    controls: &Controls,
    backend: &Backend,
    exit_code: Option<i32>,
    signal: Option<i32>,
) -> Result<Termination, RuntimeError> {
    let (reason, stats, out, err) = (ended.reason, &ended.stats, &ended.out, &ended.err);
    let disk_full = backend.layer_tmpfs
        && sys::statvfs(&backend.layer())
            .map(|st| st.f_bavail == 0)
            .unwrap_or(false);
    let failed = exit_code != Some(0);
    Ok(match reason {
        Some(Termination::Cancelled) => Termination::Cancelled,
        Some(Termination::Timeout) => Termination::Timeout,
        Some(Termination::Disk) => Termination::Disk,
        _ if stats.oom_kills > 0 => Termination::Memory,
        Some(Termination::Output) => Termination::Output,
        // The step may exit before the kill for a cap lands (its last bytes still in the
        // pipe): asked to fail on a cap, it fails on it all the same.
        _ if controls.fail_on_output_cap && (out.truncated() || err.truncated()) => {
            Termination::Output
        }
        _ if disk_full && failed => Termination::Disk,
        _ if stats.pids_limit_hits > 0 => Termination::Pids,
        _ if signal.is_some() => Termination::Signaled,
        _ if exit_code.is_some() => Termination::Exited,
        _ => {
            return Err(RuntimeError::spawn(
                "run the command",
                "the sandbox init ended without reporting the command's exit status",
            ))
        }
    })
}

/// What the step's cgroups and layer used.
fn usage(stats: &CgroupStats, backend: &Backend) -> ResourceUsage {
    ResourceUsage {
        cpu_time_ms: stats.cpu_time_ns.map(|ns| ns / 1_000_000),
        peak_memory_bytes: stats.peak_memory_bytes,
        max_pids: stats.peak_pids,
        disk_bytes: if backend.layer_tmpfs {
            sys::statvfs(&backend.layer())
                .ok()
                .map(|st| (st.f_blocks - st.f_bfree) * st.f_frsize)
        } else {
            None
        },
    }
}

/// The step's outcome, and why its result was rejected if it was.
pub(super) fn outcome(
    caps: &HostCaps,
    stored: &StoredConfig,
    plan: &InitPlan,
    backend: &Backend,
    result_file: &Path,
    ended: &Ended,
) -> Result<(ExecOutcome, Option<String>), RuntimeError> {
    let controls = &stored.config.controls;
    let (events, out, err) = (&ended.events, &ended.out, &ended.err);
    let ready = events.iter().find(|e| e["event"] == "ready");
    let exit = events.iter().find(|e| e["event"] == "exit");
    let exit_code = exit.and_then(|e| e["code"].as_i64()).map(|c| c as i32);
    let signal = exit.and_then(|e| e["signal"].as_i64()).map(|s| s as i32);
    let termination = termination(ended, controls, backend, exit_code, signal)?;
    let (result, result_problem) =
        smithers_runtime::check_result_fields(step_result(result_file, out));
    let usage = usage(&ended.stats, backend);
    let cgroups = &backend.cgroups;
    let enforcement = report::enforcement(caps, stored, plan, cgroups, ready, &backend.workspace);
    let outcome = ExecOutcome {
        termination,
        exit_code,
        signal,
        duration: ended.duration,
        stdout_bytes: out.total(),
        stderr_bytes: err.total(),
        stdout_truncated: out.truncated(),
        stderr_truncated: err.truncated(),
        usage,
        enforcement,
        result,
        egress: ended
            .egress_summary
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok()),
        command_started_after_us: ended.command_started,
    };
    Ok((outcome, result_problem))
}

/// The log's lines before the enforcement and exit records: how the sandbox was started and
/// its workspace first, then the output records, the egress records and a rejected result.
pub(super) fn log_lines(
    ended: Ended,
    warm: &WarmStart,
    backend: &Backend,
    result_problem: Option<&str>,
) -> Vec<String> {
    let (warm_for, armed_served, armed_given_up) =
        (warm.warm_for, warm.armed_served, warm.armed_given_up);
    let egress_summary = ended.egress_summary;
    let mut lines = ended.log;
    if let Some(waited) = warm_for {
        lines.insert(
            0,
            json!({"type": "warmStart", "timestampMs": now_ms(), "preparedMsBefore": waited.as_millis() as u64, "armed": armed_served})
                .to_string(),
        );
    }
    if armed_given_up {
        lines.insert(
            0,
            json!({"type": "warmStartGivenUp", "timestampMs": now_ms(), "reason": "the step's plan is not the one its armed warm sandbox was set up with (the project or the host changed since); a cold one served the step"})
                .to_string(),
        );
    }
    if let Some(reason) = &warm.warm_lost {
        let message = format!(
            "the claimed warm sandbox's init was gone when the step's plan was sent ({reason}); a cold one served the step"
        );
        lines.insert(
            0,
            json!({"type": "warmStartLost", "timestampMs": now_ms(), "reason": message})
                .to_string(),
        );
    }
    // Copy mode is a degradation: the log (which goes into the bundle) says so first.
    if let Some(reason) = backend.workspace.copy_reason() {
        let mut record =
            json!({"type": "workspace", "timestampMs": now_ms(), "mode": "copy", "reason": reason});
        // What ship copied (files, bytes, entries it could not reproduce).
        if let Ok(Value::Object(copied)) = std::fs::read(backend.copy_report_file())
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()))
        {
            for (k, v) in copied {
                record[k] = v;
            }
        }
        lines.insert(0, record.to_string());
    }
    if let Some(summary) = &egress_summary {
        lines.extend(crate::egress::log_lines(summary));
    }
    if let Some(problem) = result_problem {
        lines.push(
            json!({"type": "resultRejected", "timestampMs": now_ms(), "reason": problem})
                .to_string(),
        );
    }
    lines
}

/// The log record of a step's enforcement report (the same shape in every runtime's log).
pub(crate) fn enforcement_record(report: &smithers_runtime::EnforcementReport) -> Value {
    json!({"type": "enforcement", "timestampMs": now_ms(), "report": report})
}

/// Writes the NDJSON log (lines, the enforcement record, then the exit record) and the
/// outcome for `collect`.
pub(crate) fn persist(
    backend: &Backend,
    outcome: &ExecOutcome,
    mut lines: Vec<String>,
    result_problem: Option<&str>,
) -> Result<(), RuntimeError> {
    let problem_file = backend.result_problem_file();
    match result_problem {
        Some(p) => write_private(&problem_file, p.as_bytes())?,
        None => {
            let _ = std::fs::remove_file(&problem_file);
        }
    }
    let exit = json!({
        "type": "exit",
        "timestampMs": now_ms(),
        "termination": outcome.termination.as_str(),
        "exitCode": outcome.exit_code,
        "signal": outcome.signal,
        "durationMs": outcome.duration.as_millis() as u64,
        "stdoutBytes": outcome.stdout_bytes,
        "stderrBytes": outcome.stderr_bytes,
        "stdoutTruncated": outcome.stdout_truncated,
        "stderrTruncated": outcome.stderr_truncated,
        "usage": outcome.usage,
    });
    // What held for this step, next to how it ended: a limit unavailable on this host (an
    // ordinary user's, a container's) is named in the bundle, not only in `doctor`.
    lines.push(enforcement_record(&outcome.enforcement).to_string());
    lines.push(exit.to_string());
    let mut text = lines.join("\n");
    text.push('\n');
    write_private(&backend.log_file(), text.as_bytes())?;
    let outcome_bytes = serde_json::to_vec(outcome).unwrap_or_default();
    write_private(&backend.outcome_file(), &outcome_bytes)
}
