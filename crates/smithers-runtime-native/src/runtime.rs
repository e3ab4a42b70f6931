//! [`NativeRuntime`]: its options, what it found about the host, its zygote and warm
//! sandboxes. Its verbs are in modules of their own (see [`crate::verbs`]).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use smithers_runtime::EnforcementReport;

use crate::backend::Backend;
use crate::host::{self, Defaults, HostCaps};
use crate::launcher;
use crate::options::{NativeOptions, WorkspaceMode};
use crate::report::OverlayCheck;
use crate::threads::blocking;
use crate::warm::{self, WarmStatus};

/// How long `create` waits for the warm sandbox [`NativeRuntime::prestart`] is making before
/// it starts a cold one: making one takes a few milliseconds, so a longer wait means the
/// making is stuck, and a cold start is no slower than that.
pub const PRESTART_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// The native runtime. Cheap to clone through `Arc`; host facts are cached inside.
#[derive(Debug)]
pub struct NativeRuntime {
    pub(crate) options: NativeOptions,
    /// Shared with the thread [`NativeRuntime::prestart`] starts, which may detect them first.
    pub(crate) caps: Arc<OnceLock<Arc<HostCaps>>>,
    /// What the init found in probe mode (run once, on the first probe or create that needs
    /// it).
    pub(crate) findings: tokio::sync::OnceCell<Result<serde_json::Value, String>>,
    pub(crate) probe: tokio::sync::OnceCell<EnforcementReport>,
    /// Whether overlayfs works here, decided once per runtime (see `overlay_check`).
    pub(crate) overlay: tokio::sync::OnceCell<OverlayCheck>,
    /// The zygote, started at the first execute (with `NativeOptions::zygote`). Shared with
    /// the blocking thread that talks to it (see `launcher::spawn_init`).
    pub(crate) zygote: launcher::ZygoteSlot,
    /// The warm pool (`NativeOptions::warm`), started at the first create or `warm_up`;
    /// `Err` says why this host cannot have one.
    pub(crate) warm_pool: OnceLock<Result<Arc<warm::WarmPool>, String>>,
    /// The one warm sandbox [`NativeRuntime::prestart`] asked for, if it did.
    pub(crate) prestarted: OnceLock<Arc<warm::WarmPool>>,
    /// Set once this runtime found the container probe's success (remembered or run): a
    /// process's confinement only tightens, and a tighter one fails at execute, named.
    /// Checking the remembered key reads five files, ~0.1 ms of every create.
    pub(crate) container_probe_ok: OnceLock<()>,
    /// Warm inits claimed at create, by the claiming sandbox's state directory, until its
    /// first execute (or its cleanup).
    pub(crate) attached:
        Arc<std::sync::Mutex<std::collections::HashMap<PathBuf, warm::ClaimedWarm>>>,
    /// Sandboxes started through the engine and not stopped.
    pub(crate) live: crate::live::LiveSandboxes,
}

impl Default for NativeRuntime {
    fn default() -> Self {
        NativeRuntime::new(NativeOptions::default())
    }
}

impl NativeRuntime {
    pub fn new(options: NativeOptions) -> NativeRuntime {
        NativeRuntime {
            options,
            caps: Arc::new(OnceLock::new()),
            findings: tokio::sync::OnceCell::new(),
            probe: tokio::sync::OnceCell::new(),
            overlay: tokio::sync::OnceCell::new(),
            zygote: launcher::ZygoteSlot::default(),
            warm_pool: OnceLock::new(),
            prestarted: OnceLock::new(),
            container_probe_ok: OnceLock::new(),
            attached: Default::default(),
            live: Default::default(),
        }
    }

    /// The warm pool, started on first use; `None` without `NativeOptions::warm`.
    pub(crate) fn warm_pool(&self) -> Option<Result<Arc<warm::WarmPool>, String>> {
        if self.options.warm == 0 {
            return None;
        }
        Some(
            self.warm_pool
                .get_or_init(|| {
                    let caps = self.caps();
                    if !self.options.zygote || !self.options.prepared_root {
                        return Err("a warm pool needs the zygote and the prepared root".into());
                    }
                    caps.init.as_ref().map_err(Clone::clone)?;
                    caps.seccomp.as_ref().map_err(Clone::clone)?;
                    caps.userns.as_ref().map_err(|(reason, _)| reason.clone())?;
                    let limits = self
                        .defaults()
                        .limits(&caps, &smithers_runtime::Controls::default());
                    let pool = warm::WarmPool::start(
                        self.options.warm,
                        caps,
                        self.zygote.clone(),
                        limits,
                        self.defaults(),
                    );
                    if self.options.warm_refill_after_step {
                        pool.refill_when_steps_end();
                    }
                    Ok(Arc::new(pool))
                })
                .clone(),
        )
    }

    /// The steps that claimed warm sandboxes are over: with
    /// [`NativeOptions::warm_refill_after_step`], the pool refills now.
    pub fn steps_over(&self) {
        if let Some(Ok(pool)) = self.warm_pool.get() {
            pool.step_over();
        }
    }

    /// Starts making one warm sandbox now, on a thread of its own, for the next `create` of
    /// a sandbox with these controls (one a warm sandbox can serve: no network, egress
    /// policy, disk or CPU limit, or volumes; otherwise nothing is started). Never refilled.
    /// For a process that runs one step, such as the CLI's `run`: the sandbox's init, its
    /// namespaces, cgroups and step-independent mounts are made on the other core while the
    /// process opens its store and records the step, and `create` waits for it (up to
    /// [`PRESTART_PATIENCE`]) instead of starting cold. Does nothing where the host cannot
    /// have warm sandboxes (`create` then starts cold, as without it), or when already asked.
    pub fn prestart(&self, controls: &smithers_runtime::Controls) {
        if !warm::eligible_controls(controls)
            || !self.options.zygote
            || !self.options.prepared_root
            || self.prestarted.get().is_some()
        {
            return;
        }
        // What this host has is found on the pool's thread too (the first of the two to
        // ask detects it; `create` finds it done).
        let (cell, options, defaults) = (self.caps.clone(), self.options.clone(), self.defaults());
        let setup = move || {
            let caps = cell
                .get_or_init(|| Arc::new(host::detect(&options)))
                .clone();
            caps.init.as_ref().map_err(Clone::clone)?;
            caps.seccomp.as_ref().map_err(Clone::clone)?;
            caps.userns.as_ref().map_err(|(reason, _)| reason.clone())?;
            let limits = defaults.limits(&caps, &smithers_runtime::Controls::default());
            // The step's bundle will be written durably: its fsync threads start here, on
            // this thread, rather than on the step's critical path at collect.
            smithers_bundle::start_sync_threads();
            Ok((caps, limits))
        };
        // When the init is this very binary and this process is still single-threaded (the
        // CLI asks before its async runtime or store exist), the init is forked from here at
        // once, before the host is even looked at: no zygote is executed (~2 ms) and the
        // init waits for its prelude while the pool's thread detects the host. Otherwise the
        // zygote forks it, as for any warm sandbox.
        let preforked = self
            .options
            .init
            .as_ref()
            .filter(|init| init.is_current_exe_subcommand())
            .and_then(|_| warm::PreForked::fork().ok());
        let _ = self.prestarted.set(Arc::new(warm::WarmPool::start_once(
            Box::new(setup),
            self.zygote.clone(),
            preforked,
        )));
    }

    /// What became of the warm sandbox [`NativeRuntime::prestart`] started: `None` when none
    /// was started (not asked, or a step it could not serve).
    pub fn prestart_status(&self) -> Option<WarmStatus> {
        self.prestarted.get().map(|pool| pool.status())
    }

    /// Starts the warm pool (if `NativeOptions::warm` asks for one) and waits until it is
    /// full or `timeout` passes. `None` without a pool; a status with `last_error` when the
    /// pool cannot fill (or this host cannot have one).
    pub async fn warm_up(&self, timeout: std::time::Duration) -> Option<WarmStatus> {
        let pool = match self.warm_pool()? {
            Ok(pool) => pool,
            Err(reason) => return Some(self.unavailable_pool(reason)),
        };
        blocking("wait for the warm pool", move || pool.wait_full(timeout))
            .await
            .ok()
    }

    /// [`NativeRuntime::warm_up`] for a caller that is not async (it blocks its thread).
    pub fn wait_until_warm(&self, timeout: std::time::Duration) -> Option<WarmStatus> {
        match self.warm_pool()? {
            Ok(pool) => Some(pool.wait_full(timeout)),
            Err(reason) => Some(self.unavailable_pool(reason)),
        }
    }

    /// What the warm pool holds now; `None` without `NativeOptions::warm`.
    pub fn warm_status(&self) -> Option<WarmStatus> {
        match self.warm_pool()? {
            Ok(pool) => Some(pool.status()),
            Err(reason) => Some(self.unavailable_pool(reason)),
        }
    }

    fn unavailable_pool(&self, reason: String) -> WarmStatus {
        WarmStatus {
            size: self.options.warm,
            ready: 0,
            made: 0,
            claimed: 0,
            last_error: Some(reason),
            armed: 0,
            claimed_armed: 0,
            served_armed: 0,
            last_arm_error: None,
            last_adopt_error: None,
            waiting: vec![],
        }
    }

    pub(crate) fn defaults(&self) -> Defaults {
        Defaults {
            pids: self.options.default_pids_limit,
            memory: self.options.default_memory_limit,
        }
    }

    pub(crate) fn take_attached(&self, backend: &Backend) -> Option<warm::ClaimedWarm> {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&backend.state_dir)
    }

    pub(crate) fn caps(&self) -> Arc<HostCaps> {
        self.caps
            .get_or_init(|| Arc::new(host::detect(&self.options)))
            .clone()
    }

    /// The workspace mode of this runtime (`NativeOptions::workspace`).
    pub fn workspace_mode(&self) -> WorkspaceMode {
        self.options.workspace
    }
}
