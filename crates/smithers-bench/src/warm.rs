//! Scenario 7: warm start. The time from asking for a sandbox (`create`) to its first command
//! running, measured to the first line that command prints reaching the runtime, with a warm
//! pool (`NativeOptions::warm`) and without one; against bare `bwrap` with the same isolation
//! (its whole run of `true`, the reference of every ratio, and its spawn to the first line of
//! `echo`), and the cold round trip of scenario 1.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smithers_runtime::{
    CancellationToken, Controls, OutputEvent, OutputSink, RequestBundle, Runtime, RuntimeKind,
    SandboxConfig, StepCommand, Termination,
};
use smithers_runtime_native::{NativeOptions, NativeRuntime};

use crate::measure::{fmt_ms, median_ratio, Series};
use crate::report::{machine_line, Table};

/// Records when the first stdout line arrived.
struct FirstLine {
    at: Mutex<Option<Instant>>,
    notify: tokio::sync::Notify,
}

impl OutputSink for FirstLine {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Stdout { .. } = event {
            let mut at = self.at.lock().unwrap_or_else(|p| p.into_inner());
            if at.is_none() {
                *at = Some(Instant::now());
                self.notify.notify_one();
            }
        }
    }
}

struct Steps {
    runtime: Arc<NativeRuntime>,
    project: std::path::PathBuf,
    executor: tokio::runtime::Runtime,
    warm: bool,
}

impl Steps {
    fn new(project: &Path, warm: usize) -> anyhow::Result<Steps> {
        let runtime = Arc::new(NativeRuntime::new(NativeOptions {
            warm,
            ..NativeOptions::default()
        }));
        let executor = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        if warm > 0 {
            let status = runtime
                .wait_until_warm(Duration::from_secs(60))
                .ok_or_else(|| anyhow::anyhow!("no warm pool"))?;
            anyhow::ensure!(
                status.ready == warm,
                "the warm pool did not fill: {:?}",
                status.last_error
            );
        }
        Ok(Steps {
            runtime,
            project: std::fs::canonicalize(project)?,
            executor,
            warm: warm > 0,
        })
    }

    /// One step printing a line: returns (ask → its command started, ask → its first line,
    /// ask → cleaned up).
    fn step(&self) -> anyhow::Result<(Duration, Duration, Duration)> {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let config = SandboxConfig {
            run_id: format!("bench-warm-{}", std::process::id()),
            sandbox_id: format!("w{n}"),
            runtime: RuntimeKind::Bubblewrap,
            root_dir: self.project.clone(),
            image: None,
            controls: Controls {
                memory_limit_bytes: Some(512 << 20),
                pids_limit: Some(256),
                timeout_ms: Some(60_000),
                ..Controls::default()
            },
            workspace_layers: Vec::new(),
        };
        let command = StepCommand {
            argv: vec!["echo".into(), "first".into()],
            cwd: None,
            stdin: Default::default(),
        };
        let sink = FirstLine {
            at: Mutex::new(None),
            notify: tokio::sync::Notify::new(),
        };
        let rt = &self.runtime;
        let asked = Instant::now();
        let mut started = None;
        let bundle = self.executor.block_on(async {
            let handle = rt.create(&config).await?;
            let result = async {
                let request = RequestBundle {
                    request: serde_json::json!({"status": "pending", "sandboxId": config.sandbox_id, "runtime": "bubblewrap", "input": null}),
                };
                rt.ship(&handle, &request).await?;
                let called = asked.elapsed();
                let outcome = rt
                    .execute(&handle, &command, CancellationToken::new(), &sink)
                    .await?;
                started = outcome
                    .command_started_after_us
                    .map(|us| called + Duration::from_micros(us));
                anyhow::ensure!(
                    outcome.termination == Termination::Exited && outcome.exit_code == Some(0),
                    "step did not succeed: {outcome:?}"
                );
                Ok(rt.collect(&handle).await?.bundle_path)
            }
            .await;
            let cleaned = rt.cleanup(&handle).await;
            let bundle = result?;
            cleaned?;
            Ok::<_, anyhow::Error>(bundle)
        })?;
        let done = asked.elapsed();
        let first = sink
            .at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ok_or_else(|| anyhow::anyhow!("the step printed nothing"))?;
        let _ = std::fs::remove_dir_all(bundle);
        // The pool refills between rounds, untimed: what a step finds after an idle moment.
        if self.warm {
            let status = self
                .runtime
                .wait_until_warm(Duration::from_secs(10))
                .unwrap_or_else(|| unreachable!("a warm runtime has a pool"));
            anyhow::ensure!(status.ready > 0, "the pool did not refill: {status:?}");
        }
        let started = started
            .ok_or_else(|| anyhow::anyhow!("the runtime did not say when the command started"))?;
        Ok((started, first - asked, done))
    }

    fn claimed(&self) -> u64 {
        self.runtime.warm_status().map_or(0, |s| s.claimed)
    }

    /// Claims that took a sandbox armed for the project (see the runtime's `armed` module).
    fn claimed_armed(&self) -> u64 {
        self.runtime.warm_status().map_or(0, |s| s.claimed_armed)
    }
}

/// `bwrap` with scenario 1's isolation running `echo`: spawn → its first byte on our pipe.
fn bwrap_first_line(bwrap_args: &[&str]) -> anyhow::Result<Duration> {
    use std::io::Read;
    let mut args: Vec<&str> = bwrap_args.to_vec();
    args.pop(); // `true`
    args.extend(["echo", "first"]);
    let started = Instant::now();
    let mut child = std::process::Command::new("bwrap")
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut byte = [0u8; 1];
    let got = child
        .stdout
        .as_mut()
        .ok_or_else(|| anyhow::anyhow!("no pipe"))?
        .read(&mut byte)?;
    let first = started.elapsed();
    let status = child.wait()?;
    anyhow::ensure!(got == 1 && status.success(), "bwrap echo failed: {status}");
    Ok(first)
}

pub fn run(
    scratch: &Path,
    rounds: usize,
    bwrap_args: &[&str],
) -> anyhow::Result<(String, Vec<Series>)> {
    let project = scratch.join("warm-start-project");
    std::fs::create_dir_all(&project)?;
    std::fs::write(project.join("README"), "a tiny project\n")?;
    let warm = Steps::new(&project, 2)?;
    let cold = Steps::new(&project, 0)?;
    let names = [
        "warm pool: ask → first command running (its exec)",
        "no pool: ask → first command running (its exec)",
        "warm pool: ask → the command's first line",
        "no pool: ask → the command's first line",
        "bare bwrap ... echo: spawn → first line",
        "bare bwrap --unshare-all ... true (whole run)",
        "warm pool: whole round trip (create → cleanup)",
        "no pool: whole round trip (create → cleanup, scenario 1)",
    ];
    let mut series: Vec<Series> = names
        .iter()
        .map(|n| Series {
            name: n.to_string(),
            samples: Vec::with_capacity(rounds),
        })
        .collect();
    let warmup = 5;
    let mut measured_armed = 0;
    for round in 0..warmup + rounds {
        // Four things run per round, in a rotating order (see `measure::interleaved`).
        for k in 0..4 {
            match (round + k) % 4 {
                0 | 1 => {
                    let steps = if (round + k) % 4 == 0 { &warm } else { &cold };
                    let at = (round + k) % 4;
                    let armed_before = steps.claimed_armed();
                    let (started, first, whole) = steps.step()?;
                    if round >= warmup && steps.claimed_armed() > armed_before {
                        measured_armed += 1;
                    }
                    if round >= warmup {
                        series[at].samples.push(started);
                        series[2 + at].samples.push(first);
                        series[6 + at].samples.push(whole);
                    }
                }
                2 => {
                    let first = bwrap_first_line(bwrap_args)?;
                    if round >= warmup {
                        series[4].samples.push(first);
                    }
                }
                _ => {
                    let started = Instant::now();
                    crate::measure::run_quiet("bwrap", bwrap_args)?;
                    if round >= warmup {
                        series[5].samples.push(started.elapsed());
                    }
                }
            }
        }
    }
    // Every warm round claimed a warm sandbox (the warm-up's too), or the numbers say nothing.
    let claimed = warm.claimed();
    anyhow::ensure!(
        claimed == (warmup + rounds) as u64,
        "only {claimed} of {} warm steps claimed a warm sandbox",
        warmup + rounds
    );
    // From its third step on, the pool arms its sandboxes for the project its steps keep
    // asking for: every measured warm round must have claimed one so set up.
    anyhow::ensure!(
        measured_armed == rounds,
        "only {measured_armed} of {rounds} measured warm steps claimed an armed sandbox: {:?}",
        warm.runtime.warm_status()
    );
    let bwrap = &series[5];
    let mut table = Table::new(&["contender", "p50", "p95", "ratio to bare bwrap (whole run)"]);
    for s in &series {
        table.row(vec![
            s.name.clone(),
            fmt_ms(s.median()),
            fmt_ms(s.p95()),
            format!("{:.2}×", median_ratio(s, bwrap)),
        ]);
    }
    let body = format!(
        "Machine: {}. {rounds} interleaved rounds after {warmup} warm-up rounds. Default \
         isolation (all namespaces, no network, memory/pids limits, seccomp, Landlock); the \
         command is `echo first`. \"Ask\" is the call of `create`; \"first command running\" \
         the moment its exec succeeded, as the sandbox's init reports it \
         (`ExecOutcome::command_started_after_us`); \"first line\" when its output reached \
         the runtime (so it includes the dynamic loading and start of `echo` itself). The warm \
         pool holds 2 sandboxes and refills between rounds (untimed); all {claimed} warm \
         steps claimed one, and every measured one claimed one armed for the project (its \
         workspace mounted, root pivoted, Landlock and seccomp applied while idle, since the \
         pool's steps repeat one configuration).\n\n{}\nWarm ask → first command running / bare bwrap = \
         **{:.2}×** (target ≤ 0.2×); the same without a pool: **{:.2}×**. Warm ask → first \
         line / bwrap's own spawn → first line = **{:.2}×**. Command: `cargo build --release \
         -p smithers-runtime-native -p smithers-bench && cargo run --release -p smithers-bench \
         -- warm-start`\n",
        machine_line(),
        table.to_markdown(),
        median_ratio(&series[0], bwrap),
        median_ratio(&series[1], bwrap),
        median_ratio(&series[2], &series[4]),
    );
    Ok((body, series))
}
