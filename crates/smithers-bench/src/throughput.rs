//! Scenario 3: throughput and concurrency through the orchestrator with the SQLite store.
//!
//! For N = 1, 10, 100: rounds of N steps (`true`) started at once in one run, each the full
//! lifecycle (atomic gate, rows and events in SQLite, create → ship → execute → collect →
//! validate → cleanup) on the native runtime. Reported: steps per second (N / wall time of
//! the round, median over rounds) and the latency of one step (p50/p95 over every step of
//! every round).
//!
//! Host memory per idle sandbox: N sandboxes run `sleep` at once; when every one is executing,
//! the processes of the sandboxes (every descendant of this process: the sandbox init and the
//! step) are read from `/proc/<pid>/smaps_rollup` (PSS: shared pages divided among their
//! users, so libc is not counted N times; RSS too, for reference) and summed, divided by N.
//! The kernel side (namespaces, overlay mount, cgroups, page tables) is not in any process's
//! PSS, so the drop of `MemAvailable` (/proc/meminfo) from before the sandboxes started to
//! while they sleep, divided by N, is reported next to it (it includes everything, and also
//! whatever else the shared machine did meanwhile: an upper bound, noisy).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use smithers_orchestrator::{
    AtomicPatchApplier, Heartbeat, Orchestrator, ReviewMode, SandboxOutcome, SandboxRequest,
    Settings, StepContext,
};
use smithers_runtime::{CancellationToken, RuntimeKind, StepCommand};
use smithers_store::Store;

use crate::measure::{fmt_ms, percentile, Series};

/// Results for one N.
pub struct Level {
    pub n: usize,
    pub rounds: usize,
    /// Steps per second of each round.
    pub rates: Vec<f64>,
    /// Latency of every step.
    pub latencies: Vec<Duration>,
}

/// Memory of N idle sandboxes.
pub struct Idle {
    pub n: usize,
    pub processes: usize,
    pub pss_kib: u64,
    pub rss_kib: u64,
    pub mem_available_drop_kib: i64,
}

pub struct Bench {
    orchestrator: Arc<Orchestrator>,
    project: PathBuf,
    executor: tokio::runtime::Runtime,
}

fn median_f64(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

impl Bench {
    /// An orchestrator over a fresh database in `scratch`, with the native runtime and limits
    /// that admit `max` concurrent sandboxes (the default per-run limit is 10, host-wide 64).
    pub fn new(scratch: &Path, max: u32) -> anyhow::Result<Self> {
        let dir = scratch.join("throughput");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        let project = dir.join("project");
        std::fs::create_dir_all(&project)?;
        std::fs::write(project.join("README"), "a tiny project\n")?;
        let store = Arc::new(Store::open(dir.join("bench.db"))?);
        let native = smithers_runtime_native::NativeRuntime::new(Default::default());
        let orchestrator = Orchestrator::new(
            store,
            Arc::new(AtomicPatchApplier),
            Settings {
                per_run_max: max,
                host_max: max,
                review_mode: ReviewMode::Durable,
            },
        )?
        .with_runtime(Arc::new(native));
        // Several workers: the orchestrator makes short blocking SQLite calls on its tasks.
        let executor = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()?;
        Ok(Bench {
            orchestrator: Arc::new(orchestrator),
            project: std::fs::canonicalize(project)?,
            executor,
        })
    }

    fn request(&self, run: &str, i: usize, argv: &[&str]) -> SandboxRequest {
        let mut req = SandboxRequest::new(run, format!("s{i}"), &self.project);
        req.runtime = Some(RuntimeKind::Bubblewrap);
        req.command = Some(StepCommand {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            stdin: Default::default(),
        });
        req
    }

    /// One round: N steps of `true` at once. Returns (wall time, per-step latencies).
    fn round(&self, run: &str, n: usize) -> anyhow::Result<(Duration, Vec<Duration>)> {
        let reqs: Vec<SandboxRequest> = (0..n).map(|i| self.request(run, i, &["true"])).collect();
        self.executor.block_on(async {
            let started = Instant::now();
            let mut tasks = Vec::with_capacity(n);
            for req in reqs {
                let orch = self.orchestrator.clone();
                tasks.push(tokio::spawn(async move {
                    let t = Instant::now();
                    let r = orch.execute(&req, &StepContext::default()).await;
                    (t.elapsed(), r)
                }));
            }
            let mut lat = Vec::with_capacity(n);
            for t in tasks {
                let (took, r) = t.await?;
                match r? {
                    SandboxOutcome::Completed(c) if c.status == "finished" => lat.push(took),
                    other => anyhow::bail!("a step did not finish: {other:?}"),
                }
            }
            Ok((started.elapsed(), lat))
        })
    }

    /// Rounds of N parallel steps (after one warm-up round).
    pub fn level(&self, n: usize, rounds: usize) -> anyhow::Result<Level> {
        self.round(&format!("warmup-{n}"), n)?;
        let mut rates = Vec::new();
        let mut latencies = Vec::new();
        for r in 0..rounds {
            let (wall, lat) = self.round(&format!("n{n}-r{r}"), n)?;
            rates.push(n as f64 / wall.as_secs_f64());
            latencies.extend(lat);
            eprintln!(
                "  N={n} round {r}: {:.1} steps/s, wall {}",
                n as f64 / wall.as_secs_f64(),
                fmt_ms(wall)
            );
        }
        Ok(Level {
            n,
            rounds,
            rates,
            latencies,
        })
    }

    /// N sandboxes running `sleep`: memory while they are all executing, then cancelled.
    pub fn idle(&self, n: usize) -> anyhow::Result<Idle> {
        let before = mem_available_kib()?;
        let executing = Arc::new(AtomicUsize::new(0));
        let cancel = CancellationToken::new();
        let run = format!("idle-{n}");
        let reqs: Vec<SandboxRequest> = (0..n)
            .map(|i| self.request(&run, i, &["sleep", "300"]))
            .collect();
        self.executor.block_on(async {
            let mut tasks = Vec::with_capacity(n);
            for req in reqs {
                let orch = self.orchestrator.clone();
                let counter = executing.clone();
                let ctx = StepContext {
                    heartbeat: Some(Arc::new(move |hb: &Heartbeat| {
                        // The first `executing` of each sandbox (steps may repeat it).
                        if hb.stage == "executing" && hb.data.is_empty() {
                            counter.fetch_add(1, Ordering::SeqCst);
                        }
                    })),
                    cancel: cancel.clone(),
                    output: None,
                };
                tasks.push(tokio::spawn(async move { orch.execute(&req, &ctx).await }));
            }
            let deadline = Instant::now() + Duration::from_secs(300);
            while executing.load(Ordering::SeqCst) < n {
                anyhow::ensure!(Instant::now() < deadline, "sandboxes never all started");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Let every init exec its step and settle.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let procs = descendants(std::process::id());
            let mut pss = 0;
            let mut rss = 0;
            for pid in &procs {
                if let Some((p, r)) = smaps_rollup(*pid) {
                    pss += p;
                    rss += r;
                }
            }
            let during = mem_available_kib()?;
            cancel.cancel();
            for t in tasks {
                match t.await?? {
                    SandboxOutcome::Cancelled { .. } => {}
                    other => anyhow::bail!("an idle step was not cancelled: {other:?}"),
                }
            }
            Ok(Idle {
                n,
                processes: procs.len(),
                pss_kib: pss,
                rss_kib: rss,
                mem_available_drop_kib: before - during,
            })
        })
    }
}

/// Every descendant process of `root` (not `root` itself), from /proc/<pid>/stat ppids.
fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The command name may hold spaces and parentheses: fields start after the last ')'.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for c in children.get(&p).cloned().unwrap_or_default() {
            if seen.insert(c) {
                out.push(c);
                stack.push(c);
            }
        }
    }
    out
}

/// (PSS, RSS) in KiB of one process.
fn smaps_rollup(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("Pss:")?, field("Rss:")?))
}

fn mem_available_kib() -> anyhow::Result<i64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .context("MemAvailable missing from /proc/meminfo")
}

/// Runs the scenario and renders its section body plus the series for the chart.
pub fn run(scratch: &Path, rounds: Option<usize>) -> anyhow::Result<(String, Vec<Series>)> {
    let levels = [1usize, 10, 100];
    let bench = Bench::new(scratch, 100)?;
    let mut results = Vec::new();
    for n in levels {
        // Comparable sample counts: more rounds for small N.
        let r = rounds.unwrap_or(match n {
            1 => 30,
            10 => 8,
            _ => 3,
        });
        eprintln!("throughput: N={n}, {r} rounds");
        results.push(bench.level(n, r)?);
    }
    let mut idles = Vec::new();
    for n in [10usize, 100] {
        eprintln!("idle memory: {n} sandboxes running sleep");
        idles.push(bench.idle(n)?);
    }

    let mut table = crate::report::Table::new(&[
        "N in parallel",
        "rounds",
        "steps/s (median of rounds)",
        "latency p50",
        "latency p95",
    ]);
    let mut series = Vec::new();
    for l in &results {
        table.row(vec![
            l.n.to_string(),
            l.rounds.to_string(),
            format!("{:.1}", median_f64(&l.rates)),
            fmt_ms(percentile(&l.latencies, 50.0)),
            fmt_ms(percentile(&l.latencies, 95.0)),
        ]);
        series.push(Series {
            name: format!("ours, N={} in parallel (latency per step)", l.n),
            samples: l.latencies.clone(),
        });
    }
    let mut mem = crate::report::Table::new(&[
        "idle sandboxes",
        "processes",
        "PSS per sandbox",
        "RSS per sandbox",
        "MemAvailable drop per sandbox (incl. kernel; noisy)",
    ]);
    for i in &idles {
        let per = |kib: f64| format!("{:.0} KiB", kib / i.n as f64);
        mem.row(vec![
            i.n.to_string(),
            i.processes.to_string(),
            per(i.pss_kib as f64),
            per(i.rss_kib as f64),
            per(i.mem_available_drop_kib as f64),
        ]);
    }
    let body = format!(
        "Machine: {}. Each step is the whole orchestrator lifecycle (atomic gate, rows and \
         events in one SQLite file, create → ship → execute `true` → collect → validate → \
         cleanup) on the native runtime with default isolation; N steps start at once in one \
         run (limits raised to 100: `SMITHERS_MAX_CONCURRENT_SANDBOXES` defaults to 10). One \
         warm-up round per N. steps/s = N / wall time of a round; latency = one `execute` \
         call, over every step of every round.\n\n{}\n\
         Host memory per idle sandbox: N sandboxes run `sleep 300`; once all are executing \
         (+1.5 s), every descendant process of the bench (sandbox init + step) is read from \
         `/proc/<pid>/smaps_rollup` and summed. PSS divides shared pages among their users \
         (the honest per-sandbox figure); RSS counts them in full. Kernel objects (namespaces, \
         overlay mount, cgroups, page tables) are in no process's PSS: the drop of \
         `MemAvailable` over the same interval is shown for them (includes everything else the \
         shared machine did, so an upper bound).\n\n{}\n\
         Chart: `throughput.svg` (p50 latency per step). Command: \
         `cargo build --release -p smithers-runtime-native && cargo run --release -p smithers-bench -- throughput`\n",
        crate::report::machine_line(),
        table.to_markdown(),
        mem.to_markdown(),
    );
    Ok((body, series))
}
