//! One sandboxed step through the `Runtime` trait, the way the orchestrator drives it:
//! create → ship → execute → collect → cleanup, with the default isolation and limits on.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smithers_runtime::{
    CancellationToken, Controls, NullSink, RequestBundle, Runtime, RuntimeKind, SandboxConfig,
    StepCommand, Termination,
};

/// A runtime plus the project it runs steps on, and a single-threaded async executor (what a
/// CLI invocation has; no thread-pool start-up in the measured path).
pub struct RoundTrip {
    runtime: Arc<dyn Runtime>,
    kind: RuntimeKind,
    project: std::path::PathBuf,
    image: Option<String>,
    executor: tokio::runtime::Runtime,
    counter: AtomicU64,
    /// Time spent in each verb, per completed round trip (create, ship, execute, collect,
    /// cleanup), so a report can say where a round trip's time goes.
    phases: Mutex<Vec<[Duration; 5]>>,
    /// Result bundles made so far and not yet discarded.
    bundles: Mutex<Vec<std::path::PathBuf>>,
    /// Round trips whose sandbox was placed on a warm lease (a fleet's pool).
    warm_placements: AtomicU64,
    /// No memory or pids limit of the step's own (the runtime's defaults hold): what a warm
    /// lease, which reserved nothing for one step, can take.
    unlimited: bool,
}

/// The verbs of a round trip, in the order of [`RoundTrip::phases`].
pub const PHASES: [&str; 5] = ["create", "ship", "execute", "collect", "cleanup"];

impl RoundTrip {
    pub fn native(project: &Path, _scratch: &Path) -> anyhow::Result<Self> {
        Self::native_with(project, Default::default())
    }

    /// The native runtime executing its init binary for every sandbox (no zygote).
    pub fn native_without_zygote(project: &Path) -> anyhow::Result<Self> {
        Self::native_with(
            project,
            smithers_runtime_native::NativeOptions {
                zygote: false,
                ..Default::default()
            },
        )
    }

    fn native_with(
        project: &Path,
        options: smithers_runtime_native::NativeOptions,
    ) -> anyhow::Result<Self> {
        let runtime = smithers_runtime_native::NativeRuntime::new(options);
        Self::new(Arc::new(runtime), RuntimeKind::Bubblewrap, project, None)
    }

    /// Steps as fleet leases on the Ray cluster `options` names.
    pub fn ray(project: &Path, options: smithers_runtime_ray::RayOptions) -> anyhow::Result<Self> {
        let runtime = smithers_runtime_ray::RayRuntime::new(options)?;
        Self::new(Arc::new(runtime), RuntimeKind::Ray, project, None)
    }

    /// Steps on the fleet with a pool of `warm` leases kept ready (filled before returning).
    pub fn ray_warm(
        project: &Path,
        mut options: smithers_runtime_ray::RayOptions,
        warm: usize,
    ) -> anyhow::Result<(Self, smithers_runtime_ray::RayRuntime)> {
        options.warm = warm;
        let runtime = smithers_runtime_ray::RayRuntime::new(options)?;
        let mut trip = Self::new(Arc::new(runtime.clone()), RuntimeKind::Ray, project, None)?;
        trip.unlimited = true;
        trip.executor
            .block_on(runtime.warm_up(Duration::from_secs(120)))?;
        Ok((trip, runtime))
    }

    /// Round trips placed on a warm lease so far (warm-up included).
    pub fn warm_placements(&self) -> u64 {
        self.warm_placements.load(Ordering::Relaxed)
    }

    /// Runs `fut` on this round trip's executor (e.g. a pool's shutdown).
    pub fn block_on<F: std::future::Future>(&self, fut: F) -> F::Output {
        self.executor.block_on(fut)
    }

    pub fn docker(project: &Path, image: &str) -> anyhow::Result<Self> {
        let runtime = smithers_runtime_docker::DockerRuntime::new(Default::default());
        Self::new(
            Arc::new(runtime),
            RuntimeKind::Docker,
            project,
            Some(image.to_string()),
        )
    }

    fn new(
        runtime: Arc<dyn Runtime>,
        kind: RuntimeKind,
        project: &Path,
        image: Option<String>,
    ) -> anyhow::Result<Self> {
        let executor = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(RoundTrip {
            runtime,
            kind,
            project: std::fs::canonicalize(project)?,
            image,
            executor,
            counter: AtomicU64::new(0),
            phases: Mutex::new(Vec::new()),
            bundles: Mutex::new(Vec::new()),
            warm_placements: AtomicU64::new(0),
            unlimited: false,
        })
    }

    /// Removes the result bundles made so far. A bundle is the product of a round trip, kept
    /// in real use for review; a benchmark discards it outside the timed region.
    pub fn discard_bundles(&self) {
        let bundles = std::mem::take(&mut *self.bundles.lock().unwrap_or_else(|p| p.into_inner()));
        for bundle in bundles {
            let _ = std::fs::remove_dir_all(bundle);
        }
    }

    /// Per-verb durations of every round trip so far (warm-up included).
    pub fn phases(&self) -> Vec<[Duration; 5]> {
        self.phases.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// One full round trip of `argv`; fails unless the command exits 0.
    pub fn run(&self, argv: &[&str]) -> anyhow::Result<()> {
        self.round_trip(argv).map(|_| ())
    }

    fn round_trip(&self, argv: &[&str]) -> anyhow::Result<usize> {
        // Unique in the process, not only in this round trip: two round trips on one fleet
        // must not name the same sandbox (a lease's id is derived from it).
        static EVERY: AtomicU64 = AtomicU64::new(0);
        self.counter.fetch_add(1, Ordering::Relaxed);
        let n = EVERY.fetch_add(1, Ordering::Relaxed);
        let config = SandboxConfig {
            run_id: format!("bench-{}", std::process::id()),
            sandbox_id: format!("s{n}"),
            runtime: self.kind,
            root_dir: self.project.clone(),
            image: self.image.clone(),
            controls: if self.unlimited {
                Controls {
                    timeout_ms: Some(60_000),
                    ..Controls::default()
                }
            } else {
                Controls {
                    memory_limit_bytes: Some(512 << 20),
                    pids_limit: Some(256),
                    timeout_ms: Some(60_000),
                    ..Controls::default()
                }
            },
            workspace_layers: Vec::new(),
        };
        let command = StepCommand {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            stdin: Default::default(),
        };
        let rt = &self.runtime;
        let mut spent = [Duration::ZERO; 5];
        let mut clock = Instant::now();
        let mut lap = |i: usize| {
            let now = Instant::now();
            spent[i] = now - clock;
            clock = now;
        };
        let patches = self.executor.block_on(async {
            let handle = rt.create(&config).await?;
            // A fleet's lease is granted in `place` (counted with create: lease to sandbox);
            // local runtimes return at once.
            let handle = match rt.place(handle.clone(), &smithers_runtime::NoPlacementEvents).await {
                Ok((placed, placement)) => {
                    if placement.is_some_and(|p| p.warm) {
                        self.warm_placements.fetch_add(1, Ordering::Relaxed);
                    }
                    placed
                }
                Err(e) => {
                    let _ = rt.cleanup(&handle).await;
                    return Err(e.into());
                }
            };
            lap(0);
            let result = async {
                let request = RequestBundle {
                    request: serde_json::json!({"status": "pending", "sandboxId": config.sandbox_id, "runtime": self.kind, "input": null}),
                };
                rt.ship(&handle, &request).await?;
                lap(1);
                let outcome = rt.execute(&handle, &command, CancellationToken::new(), &NullSink).await?;
                lap(2);
                let collected = rt.collect(&handle).await?;
                lap(3);
                anyhow::ensure!(
                    outcome.termination == Termination::Exited && outcome.exit_code == Some(0),
                    "step did not succeed: {outcome:?}"
                );
                // The bundle is the product of a round trip; removing it is the caller's job
                // (`discard_bundles`, untimed).
                if let Ok(mut bundles) = self.bundles.lock() {
                    bundles.push(collected.bundle_path.clone());
                }
                Ok(collected.patch_count)
            }
            .await;
            let cleaned = rt.cleanup(&handle).await;
            lap(4);
            let patches = result?;
            cleaned?;
            Ok::<_, anyhow::Error>(patches)
        })?;
        if let Ok(mut phases) = self.phases.lock() {
            phases.push(spent);
        }
        Ok(patches)
    }
}
