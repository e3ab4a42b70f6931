//! Scenario 10: the fleet. Leases on the Ray cluster of `scripts/ray/cluster.sh` (a head and
//! two workers, two `sandbox_slot`s each, in network namespaces of this machine) against the
//! same steps on this host's native runtime, side by side in one run:
//!
//! * lease to first exec, cold: create (the Ray job) + place (Ray starts it, `serve` listens,
//!   the node's sandbox is made) + ship + execute `true`, then collect and cleanup;
//! * steps per second: 8 CPU-bound steps, 4 at a time, across the two workers against 4 at a
//!   time on one host. Here the "machines" share this host's cores, so the fleet cannot be
//!   faster: the row measures what the fleet's hops cost, not what more machines would buy;
//! * node death to `NODE_LOST`: a worker SIGKILLed mid-step, until `execute` returns it.
//!
//! * warm: the same with a pool of 2 warm leases kept ready (the report says how many rounds
//!   really found one ready).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

use smithers_runtime::{
    CancellationToken, Controls, NoPlacementEvents, NullSink, RequestBundle, Runtime, RuntimeError,
    RuntimeKind, SandboxConfig, StepCommand,
};
use smithers_runtime_ray::{RayOptions, RayRuntime};

use crate::measure::{fmt_ms, interleaved, median_ratio, Contender};
use crate::report::{machine_line, Table};
use crate::roundtrip::RoundTrip;

fn cluster_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ray/cluster.sh")
}

fn cluster(args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("bash")
        .arg(cluster_script())
        .args(args)
        .status()?;
    anyhow::ensure!(status.success(), "cluster.sh {args:?}: {status}");
    Ok(())
}

/// The cluster from `RAY_ADDRESS`/`RAY_AUTH_TOKEN`, else the one `scripts/ray/cluster.sh up`
/// started; `serve` on the nodes is `SMITHERS_RAY_SERVE_BIN`, else the release binary.
fn options() -> anyhow::Result<RayOptions> {
    let mut o = match RayOptions::from_env() {
        Ok(o) => o,
        Err(_) => {
            let state = std::env::var("SMITHERS_RAY_STATE")
                .unwrap_or_else(|_| "/tmp/smithers-ray-cluster".into());
            let token = std::fs::read_to_string(Path::new(&state).join("token")).map_err(|e| {
                anyhow::anyhow!(
                    "no Ray cluster (scripts/ray/cluster.sh up, or set RAY_ADDRESS): {e}"
                )
            })?;
            RayOptions::new("http://10.88.0.10:8265", Some(token.trim().to_string()))
        }
    };
    if std::env::var_os(smithers_runtime_ray::ENV_SERVE_BIN).is_none() {
        // The CLI built with this bench (same profile and target directory).
        let release = crate::whole_cli::cli_binary().context(
            "build the product first (cargo build --release -p smithers-cli) or set SMITHERS_RAY_SERVE_BIN",
        )?;
        o.serve_binary = std::fs::canonicalize(release)?.display().to_string();
    }
    o.orphan_timeout = Duration::from_secs(5);
    o.watch_interval = Duration::from_millis(100);
    Ok(o)
}

/// `steps` CPU-bound steps, `at_once` at a time (each thread its own client), on `make`'s
/// runtime; steps per second.
fn throughput(
    steps: usize,
    at_once: usize,
    make: &(dyn Fn() -> anyhow::Result<RoundTrip> + Sync),
) -> anyhow::Result<f64> {
    const BUSY: &str = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";
    let started = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..at_once)
            .map(|t| {
                scope.spawn(move || -> anyhow::Result<()> {
                    let trip = make()?;
                    for _ in (t..steps).step_by(at_once) {
                        trip.run(&["sh", "-c", BUSY])?;
                        trip.discard_bundles();
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok(())
    })?;
    Ok(steps as f64 / started.elapsed().as_secs_f64())
}

/// One node death mid-step: the time from the SIGKILL to `execute` returning NODE_LOST.
fn node_death(options: &RayOptions, project: &Path, n: usize) -> anyhow::Result<Duration> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let runtime = RayRuntime::new(options.clone())?;
    rt.block_on(async {
        let config = SandboxConfig {
            run_id: format!("bench-death-{}", std::process::id()),
            sandbox_id: format!("d{n}"),
            runtime: RuntimeKind::Ray,
            root_dir: project.to_path_buf(),
            image: None,
            controls: Controls::default(),
            workspace_layers: Vec::new(),
        };
        let handle = runtime.create(&config).await?;
        let (handle, placement) = runtime.place(handle, &NoPlacementEvents).await?;
        let node_ip = placement.map(|p| p.node).unwrap_or_default();
        let node = match node_ip.as_str() {
            "10.88.0.11" => "w1",
            "10.88.0.12" => "w2",
            other => anyhow::bail!("placed on an unknown node {other:?}"),
        };
        let request = RequestBundle {
            request: serde_json::json!({"status": "pending", "sandboxId": config.sandbox_id, "runtime": "ray", "input": null}),
        };
        runtime.ship(&handle, &request).await?;
        let command = StepCommand {
            argv: vec!["sleep".into(), "600".into()],
            cwd: None,
            stdin: Default::default(),
        };
        let exec = {
            let runtime = runtime.clone();
            let handle = handle.clone();
            tokio::spawn(async move {
                runtime
                    .execute(&handle, &command, CancellationToken::new(), &NullSink)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let killed = Instant::now();
        cluster(&["kill", node])?;
        let result = exec.await?;
        let took = killed.elapsed();
        let _ = runtime.cleanup(&handle).await;
        cluster(&["start", node])?;
        match result {
            Err(RuntimeError::NodeLost { .. }) => Ok(took),
            other => anyhow::bail!("expected NODE_LOST, got {other:?}"),
        }
    })
}

fn wait_whole() -> anyhow::Result<()> {
    // `up` on a running cluster waits for all its slots.
    cluster(&["up"])
}

/// The median time of a round trip's create + place (the lease), warm-up rounds left out.
fn lease_median(trip: &RoundTrip) -> Duration {
    let mut lease: Vec<Duration> = trip.phases().iter().skip(2).map(|p| p[0]).collect();
    lease.sort();
    lease.get(lease.len() / 2).copied().unwrap_or_default()
}

/// Runs the scenario; its Markdown section.
pub fn run(scratch: &Path, rounds: usize) -> anyhow::Result<String> {
    let options = options()?;
    let project = scratch.join("fleet-project");
    std::fs::create_dir_all(&project)?;
    for i in 0..20 {
        std::fs::write(project.join(format!("f{i}.txt")), format!("file {i}\n"))?;
    }
    let ray = RoundTrip::ray(&project, options.clone())?;
    let (warm, pool) = RoundTrip::ray_warm(&project, options.clone(), 2)?;
    let local = RoundTrip::native(&project, scratch)?;
    let mut contenders = vec![
        Contender::new("ours: ray lease, cold", || ray.run(&["true"]))
            .with_after(|| ray.discard_bundles()),
        Contender::new("ours: ray lease, warm", || warm.run(&["true"]))
            .with_after(|| warm.discard_bundles()),
        Contender::new("ours: native, this host", || local.run(&["true"]))
            .with_after(|| local.discard_bundles()),
    ];
    let series = interleaved(&mut contenders, 2, rounds);
    drop(contenders);
    // The pool's leases end whatever happened (they would hold the cluster's slots).
    warm.block_on(pool.shutdown_warm());
    let series = series?;
    let warm_rounds = warm.warm_placements();
    let warm_median = lease_median(&warm);
    let lease_median = lease_median(&ray);

    let fleet_rate = throughput(8, 4, &|| RoundTrip::ray(&project, options.clone()))?;
    let host_rate = throughput(8, 4, &|| RoundTrip::native(&project, scratch))?;

    let mut deaths = Vec::new();
    for n in 0..3 {
        deaths.push(node_death(&options, &project, n)?);
        wait_whole()?;
    }
    deaths.sort();

    let mut table = Table::new(&["measure", "fleet (ray)", "one host (native)", "ratio"]);
    table.row(vec![
        "round trip `true` (create … cleanup), cold lease, p50".into(),
        fmt_ms(series[0].median()),
        fmt_ms(series[2].median()),
        format!("{:.1}×", median_ratio(&series[0], &series[2])),
    ]);
    table.row(vec![
        format!(
            "round trip `true`, warm lease (pool of 2; {warm_rounds} of {} rounds warm), p50",
            rounds + 2
        ),
        fmt_ms(series[1].median()),
        fmt_ms(series[2].median()),
        format!("{:.1}×", median_ratio(&series[1], &series[2])),
    ]);
    table.row(vec![
        "lease to sandbox (create + place), p50".into(),
        fmt_ms(lease_median),
        "—".into(),
        "—".into(),
    ]);
    table.row(vec![
        "lease to sandbox, warm (create + place), p50".into(),
        fmt_ms(warm_median),
        "—".into(),
        "—".into(),
    ]);
    table.row(vec![
        "steps per second (8 CPU-bound steps, 4 at a time)".into(),
        format!("{fleet_rate:.2}"),
        format!("{host_rate:.2}"),
        format!("{:.2}×", fleet_rate / host_rate),
    ]);
    table.row(vec![
        "node SIGKILL to NODE_LOST (3 deaths: min / median / max)".into(),
        format!(
            "{} / {} / {}",
            fmt_ms(deaths[0]),
            fmt_ms(deaths[1]),
            fmt_ms(deaths[2])
        ),
        "—".into(),
        "—".into(),
    ]);
    Ok(format!(
        "{}\n\n{rounds} interleaved rounds (2 warm-up). The cluster: `scripts/ray/cluster.sh` \
         (head + 2 workers, 2 slots each, in network namespaces of this machine; Ray's health \
         checks tuned to 1 s × 3). The workers share this machine's cores, so the fleet's \
         steps per second measure the fleet's own cost, not what real machines would add.\n\n{}",
        machine_line(),
        table.to_markdown()
    ))
}
