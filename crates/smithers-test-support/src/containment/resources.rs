//! Rows 8-11, 16: resources (processes, memory, disk and output capped; a bundle bomb
//! rejected).

use std::path::Path;

use serde_json::{json, Value};
use smithers_errors::CodedError;
use smithers_runtime::{RuntimeError, Termination};

use crate::conformance::{
    check_bundle, create_or_refused, fork_bomb_case, memory_hog_case, run_once, start, unique,
    CaseResult, Project, SuiteEnv,
};

/// Row 8: a fork bomb is capped by the pids limit and reported as such.
pub async fn row08_fork_bomb_capped(env: &SuiteEnv) -> CaseResult {
    fork_bomb_case(env, "row 8").await
}

/// Row 9: a memory hog is killed by the memory limit and reported as `Memory`.
pub async fn row09_memory_hog_killed(env: &SuiteEnv) -> CaseResult {
    memory_hog_case(env, "row 9").await
}

/// Row 10: filling the disk through /workspace or /tmp is capped and reported.
pub async fn row10_disk_fill_capped(env: &SuiteEnv) -> CaseResult {
    for dir in [env.workspace_dir().to_string(), "/tmp".to_string()] {
        let project = Project::new(env);
        let fill = format!("{}.bin", unique("smithers-suite-fill"));
        let mut controls = env.controls();
        let limit: u64 = 32 << 20;
        controls.disk_limit_bytes = Some(limit);
        let Some(mut sandbox) = create_or_refused(env, &project, controls, "disk").await? else {
            return Ok(());
        };
        sandbox.ship(json!({})).await;
        let exec = sandbox
            .exec(project.attack_argv(&["fill-disk", &format!("{dir}/{fill}"), "512"]))
            .await;
        // On the host, /tmp/<fill> exists only if the sandbox's /tmp was the host's.
        let leaked = Path::new("/tmp").join(&fill);
        let leaked_tmp = leaked.exists();
        let _ = std::fs::remove_file(&leaked);
        assert!(!leaked_tmp, "row 10: the sandbox's /tmp is the host's /tmp");
        sandbox.cleanup().await;
        let fill = exec.attempts("fill-disk").into_iter().next();
        let written = fill
            .as_ref()
            .and_then(|f| f["written"].as_u64())
            .unwrap_or(0);
        assert!(
            fill.as_ref().is_none_or(|f| f["ok"] == false),
            "row 10: wrote 512 MiB into {dir} under a 32 MiB disk limit: {fill:?}"
        );
        assert!(
            written <= limit + (8 << 20),
            "row 10: {written} bytes written into {dir} under a {limit}-byte limit"
        );
        let enospc = fill.as_ref().is_some_and(|f| {
            matches!(f["errno"].as_i64(), Some(28) | Some(122)) // ENOSPC, EDQUOT
        });
        assert!(
            exec.outcome.termination == Termination::Disk || enospc,
            "row 10: filling {dir} must end as Disk or ENOSPC: {:?}\n{}",
            exec.outcome,
            exec.output.dump()
        );
    }
    Ok(())
}

/// Peak resident memory (`VmHWM`) of `pid`, or of this process.
fn peak_rss_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Row 11: what is kept of a stdout/stderr flood is capped at maxOutputBytes with truncation
/// recorded, the relay (where a backend relays) gets all of it, and the host process does not
/// buffer it (its peak RSS stays below the flood size). The host is this
/// process, or the one named by [`SuiteEnv::with_host_pid`] (a sandbox server); its peak must
/// be readable then, or the row would check nothing.
pub async fn row11_output_flood_capped(env: &SuiteEnv) -> CaseResult {
    let flood: u64 = 256 << 20;
    let cap: u64 = 1 << 20;
    for stream in ["stdout", "stderr"] {
        let project = Project::new(env);
        let mut controls = env.controls();
        controls.max_output_bytes = cap;
        let (exec, collected) = run_once(
            env,
            &project,
            controls,
            project.attack_argv(&["flood", &flood.to_string(), stream]),
        )
        .await?;
        let o = &exec.outcome;
        let (truncated, captured) = if stream == "stdout" {
            (o.stdout_truncated, exec.output.bytes(true))
        } else {
            (o.stderr_truncated, exec.output.bytes(false))
        };
        assert!(
            truncated,
            "row 11: {stream} flood not recorded as truncated: {o:?}"
        );
        assert!(
            captured <= cap + (64 << 10),
            "row 11: {captured} bytes of {stream} delivered under a cap of {cap}"
        );
        assert!(
            matches!(o.termination, Termination::Exited | Termination::Output),
            "row 11: {o:?}"
        );
        // What is relayed is the step's stream, not what is kept: whole, where a backend
        // relays it (streamed through, never held).
        let relayed = exec.output.relayed(stream == "stdout");
        assert!(
            relayed == 0 || o.termination != Termination::Exited || relayed >= flood,
            "row 11: {relayed} bytes of a {flood}-byte {stream} flood relayed: {o:?}"
        );
        if let Ok(report) = collected {
            check_bundle(&report.bundle_path);
        }
    }
    let host = env.host_pid();
    if std::env::var_os(crate::conformance::VERBOSE_ENV).is_some() {
        println!(
            "[{}] peak RSS of the host ({}): {:?} bytes; flood {flood} bytes",
            env.test_name(),
            host.map_or("this process".to_string(), |p| format!("pid {p}")),
            peak_rss_bytes(host)
        );
    }
    match (peak_rss_bytes(host), host) {
        (Some(peak), _) => assert!(
            peak < flood,
            "row 11: the host process ({}) peaked at {peak} bytes: output was buffered on the host",
            host.map_or("this test process".to_string(), |p| format!("pid {p}"))
        ),
        (None, Some(pid)) => panic!("row 11: cannot read the peak memory of host pid {pid}"),
        (None, None) => {}
    }
    Ok(())
}

fn names_a_limit(e: &RuntimeError) -> bool {
    let text = e.report().to_json().to_string().to_ascii_lowercase();
    LIMIT_WORDS.iter().any(|w| text.contains(w))
}

/// Row 16: bundle bombs (deep result JSON, a huge result JSON, deep JSON on stdout, outputs
/// just past the depth and string bounds, 10k files in /result) are rejected naming the limit,
/// or cut to the contract's bounds with the cut recorded; the bundle that is written stays
/// valid. A result silently dropped (a `finished` bundle without the step's outputs and no word
/// of why) fails the row.
pub async fn row16_bundle_bomb_rejected(env: &SuiteEnv) -> CaseResult {
    // (what, attack, whether the bomb is the step's result)
    let bombs: [(&str, Vec<&str>, bool); 6] = [
        (
            "deep result JSON (100000)",
            vec!["deep-json", "$RESULT", "100000"],
            true,
        ),
        (
            "result outputs 20 deep",
            vec!["deep-json", "$RESULT", "20"],
            true,
        ),
        (
            "huge result JSON (8 MiB)",
            vec!["big-result", "$RESULT", "8388608"],
            true,
        ),
        (
            "result string of 100000",
            vec!["big-result", "$RESULT", "100000"],
            true,
        ),
        (
            "deep JSON on stdout",
            vec!["deep-json", "-", "100000"],
            true,
        ),
        (
            "10k files in /result",
            vec!["many-files", "/result/artifacts/bomb", "10000"],
            false,
        ),
    ];
    let mut failures = Vec::new();
    for (what, attack, is_result) in bombs {
        let project = Project::new(env);
        // The attack takes the result path literally; let the shell expand it.
        let line = format!(
            "exec {} {}",
            project.attack,
            attack
                .iter()
                .map(|a| if *a == "$RESULT" {
                    "\"$SMITHERS_SANDBOX_RESULT_PATH\"".to_string()
                } else {
                    (*a).to_string()
                })
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut sandbox = start(env, &project, env.controls()).await?;
        sandbox.ship(json!({})).await;
        let exec = sandbox
            .exec_with(
                vec!["/bin/sh".into(), "-c".into(), line],
                smithers_runtime::CancellationToken::new(),
            )
            .await;
        let exec = match exec {
            Ok(exec) => exec,
            Err(e) => {
                if !names_a_limit(&e) {
                    failures.push(format!(
                        "{what}: execute failed without naming a limit: {}",
                        e.report()
                    ));
                }
                sandbox.cleanup().await;
                continue;
            }
        };
        if let Some(result) = &exec.outcome.result {
            let size = result.to_string().len();
            // Depth is the bundle writer's business; the host-memory bound is the size.
            if size > 5 << 20 {
                failures.push(format!(
                    "{what}: the outcome carries a result beyond the bundle bounds ({size} bytes)"
                ));
            }
        }
        match sandbox.collect().await {
            Err(e) => {
                if !names_a_limit(&e) {
                    failures.push(format!(
                        "{what}: collect failed without naming the limit: {}",
                        e.report()
                    ));
                }
            }
            Ok(report) => {
                let bundle = check_bundle(&report.bundle_path);
                let outputs = &bundle.manifest["outputs"];
                if json_depth(outputs) > 16 {
                    failures.push(format!("{what}: outputs deeper than 16 in the bundle"));
                }
                let artifacts = bundle
                    .files
                    .iter()
                    .filter(|f| f.starts_with("artifacts"))
                    .count();
                if artifacts > 1000 {
                    failures.push(format!("{what}: {artifacts} artifacts in the bundle"));
                }
                if outputs["big"].as_str().is_some_and(|s| s.len() > 65536) {
                    failures.push(format!("{what}: a string beyond 65536 in the outputs"));
                }
                let dropped = is_result && outputs.is_null();
                if dropped
                    && (bundle.manifest["status"] == "finished"
                        || !bundle_mentions_limit(&report.bundle_path))
                {
                    failures.push(format!(
                        "{what}: the step's result was dropped silently (bundle status {}, no \
                         outputs, no limit named in the bundle or an error)",
                        bundle.manifest["status"]
                    ));
                }
            }
        }
        sandbox.cleanup().await;
    }
    assert!(failures.is_empty(), "row 16: {failures:#?}");
    Ok(())
}

/// Whether the bundle's README or log names a limit (a cut recorded for the reader).
fn bundle_mentions_limit(bundle: &Path) -> bool {
    ["README.md", "logs/stream.ndjson"].iter().any(|f| {
        let mut text = Vec::new();
        if let Ok(file) = std::fs::File::open(bundle.join(f)) {
            use std::io::Read;
            let _ = file.take(8 << 20).read_to_end(&mut text);
        }
        let text = String::from_utf8_lossy(&text).to_ascii_lowercase();
        LIMIT_WORDS.iter().any(|w| text.contains(w))
    })
}

const LIMIT_WORDS: &[&str] = &[
    "limit",
    "exceed",
    "max",
    "too many",
    "depth",
    "too large",
    "too big",
];

fn json_depth(v: &Value) -> usize {
    // Iterative: the value under test may be deep enough to overflow a recursive walk.
    let mut max = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}
