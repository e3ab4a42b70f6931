//! Warm leases: a pool of idle leases kept ready (`RayOptions::warm`), so that the next step
//! that fits one ([`crate::lease::fits_warm`]) skips the ~0.8 s a Ray job takes to start.
//!
//! A warm lease is a Ray job under a random `smithers-warm-…` id running `serve` with its
//! default ceilings and no reservation beyond the slot. A step claims one at `create` by
//! submitting a *claim record* under its own derived id (so a second create of the same
//! sandbox is refused by Ray exactly as for a cold lease, and a client that finds only the row
//! reaches the warm lease through the claim's metadata); `place` then makes the sandbox on
//! the claimed server at once. Each claim starts a replacement in the background.
//!
//! The pool is this process's: leases it started and nobody claimed end by themselves after
//! `warm_idle_exit` (`serve --exit-when-idle`), or at [`RayRuntime::shutdown_warm`]. Two
//! processes never share one: a lease's server holds one sandbox, so a second claim of the
//! same server would be refused by the server itself.
//!
//! The refills run on a runtime of their own (one thread for the process), not the caller's:
//! a client driving a current-thread executor only while a step runs would otherwise leave
//! them stalled between steps.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use smithers_runtime::{NoPlacementEvents, RuntimeError, SandboxConfig};

use crate::jobs::JobStatus;
use crate::lease;
use crate::pool::WarmLease;
use crate::runtime::RayRuntime;

/// The process's runtime for pool refills.
fn keeper() -> &'static tokio::runtime::Handle {
    static KEEPER: OnceLock<tokio::runtime::Handle> = OnceLock::new();
    KEEPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("smithers-ray-warm".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the warm pool's runtime");
                let _ = tx.send(rt.handle().clone());
                rt.block_on(std::future::pending::<()>());
            })
            .expect("the warm pool's thread");
        rx.recv().expect("the warm pool's runtime handle")
    })
}

impl RayRuntime {
    /// Starts warm leases until the pool holds `RayOptions::warm` of them (ready or starting).
    /// Whether a ready lease is too close to ending by itself (`warm_idle_exit`) to be given
    /// to a step.
    fn stale(&self, w: &WarmLease) -> bool {
        w.ready_at.elapsed() >= self.options.warm_idle_exit.mul_f64(0.75)
    }

    /// A copy of this runtime for the keeper thread, with an HTTP client of its own: pooled
    /// connections belong to the runtime that opened them, and the caller's may be gone by
    /// the time the keeper reuses one.
    fn for_keeper(&self) -> RayRuntime {
        let mut this = self.clone();
        if let Ok(jobs) = crate::jobs::JobsClient::new(
            self.jobs.base(),
            self.options.token.clone(),
            self.options.api_timeout,
        ) {
            this.jobs = jobs;
        }
        this
    }

    pub(crate) fn fill_warm(&self) {
        let want = self.options.warm;
        if want == 0 {
            return;
        }
        let (missing, stale) = {
            let mut pool = self.pool.lock().expect("warm pool");
            if pool.closed {
                return;
            }
            // Leases about to end by themselves go first, and are replaced.
            let (stale, fresh): (Vec<_>, Vec<_>) =
                pool.ready.drain(..).partition(|w| self.stale(w));
            pool.ready = fresh.into();
            for w in &stale {
                pool.owned.retain(|o| o != &w.id);
            }
            let have = pool.ready.len() + pool.starting;
            let missing = want.saturating_sub(have);
            pool.starting += missing;
            (missing, stale)
        };
        if !stale.is_empty() {
            let this = self.for_keeper();
            keeper().spawn(async move {
                for w in stale {
                    let _ = this.end_lease(&w.id).await;
                }
            });
        }
        for _ in 0..missing {
            let this = self.for_keeper();
            keeper().spawn(async move {
                let started = this.start_warm().await;
                let late = {
                    let mut pool = this.pool.lock().expect("warm pool");
                    pool.starting -= 1;
                    match started {
                        Ok(w) if pool.closed => {
                            pool.owned.retain(|o| o != &w.id);
                            Some(w.id)
                        }
                        Ok(w) => {
                            pool.ready.push_back(w);
                            None
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "a warm lease did not start");
                            None
                        }
                    }
                };
                if let Some(id) = late {
                    let _ = this.end_lease(&id).await;
                }
            });
        }
    }

    async fn start_warm(&self) -> Result<WarmLease, RuntimeError> {
        let id = lease::warm_id();
        let job = lease::warm_job(&self.options, &id, &lease::new_token());
        if let Err(e) = self
            .submit("submit a warm lease", &job, &NoPlacementEvents)
            .await
        {
            // A reply lost after Ray took the job would leave it holding a slot: ended, in
            // case (a job Ray does not know is ended already).
            let _ = self.end_lease(&id).await;
            return Err(RuntimeError::spawn("submit a warm lease", e));
        }
        self.pool.lock().expect("warm pool").owned.push(id.clone());
        match self.wait_running(&id, &NoPlacementEvents).await {
            Ok((remote, node_ip, record, _)) => Ok(WarmLease {
                id,
                remote,
                node_ip,
                record,
                ready_at: Instant::now(),
            }),
            Err(e) => {
                // Submitted but not usable: it must not hold a slot for nobody.
                self.disown(&id);
                let _ = self.end_lease(&id).await;
                Err(e)
            }
        }
    }

    /// Fills the pool and waits until all of it is ready (or `timeout` passes): for a client
    /// that wants its first step warm too.
    pub async fn warm_up(&self, timeout: Duration) -> Result<(), RuntimeError> {
        self.fill_warm();
        let deadline = Instant::now() + timeout;
        loop {
            let ready = self.warm_ready();
            let starting = self.pool.lock().expect("warm pool").starting;
            if ready >= self.options.warm {
                return Ok(());
            }
            if starting == 0 {
                // A start failed: start again (bounded by the deadline).
                self.fill_warm();
            }
            if Instant::now() >= deadline {
                return Err(RuntimeError::Unavailable {
                    runtime: "ray",
                    reason: format!(
                        "{ready} of {} warm leases were ready after {timeout:?}",
                        self.options.warm
                    ),
                    fix: Some("add sandbox slots to the cluster, or ask fewer warm leases".into()),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many warm leases are ready now.
    pub fn warm_ready(&self) -> usize {
        let pool = self.pool.lock().expect("warm pool");
        pool.ready.iter().filter(|w| !self.stale(w)).count()
    }

    /// Claims a ready warm lease for `config` when it fits one (and starts its replacement);
    /// `None` means a cold lease. A ready lease whose job has ended is dropped.
    pub(crate) async fn claim_warm(
        &self,
        config: &SandboxConfig,
    ) -> Result<Option<WarmLease>, RuntimeError> {
        if self.options.warm == 0 || !lease::fits_warm(&config.controls) {
            return Ok(None);
        }
        loop {
            let next = self.pool.lock().expect("warm pool").ready.pop_front();
            let Some(w) = next else {
                // None ready: this step goes cold; the pool fills for the next.
                self.fill_warm();
                return Ok(None);
            };
            self.disown(&w.id);
            // The replacement is started once the claim is confirmed (`create`), so that a
            // claim given back (a refused duplicate) does not leave the pool over its size.
            if self.stale(&w) {
                let _ = self.end_lease(&w.id).await;
                continue;
            }
            match self.jobs.get(&w.id).await {
                Ok(Some(r)) if r.status == JobStatus::Running => return Ok(Some(w)),
                _ => {
                    let _ = self.end_lease(&w.id).await;
                }
            }
        }
    }

    /// Puts back a lease claimed for a create that did not happen.
    pub(crate) fn return_warm(&self, w: WarmLease) {
        let mut pool = self.pool.lock().expect("warm pool");
        if pool.closed {
            drop(pool);
            let this = self.for_keeper();
            keeper().spawn(async move {
                let _ = this.end_lease(&w.id).await;
            });
            return;
        }
        pool.owned.push(w.id.clone());
        pool.ready.push_front(w);
    }

    fn disown(&self, id: &str) {
        self.pool
            .lock()
            .expect("warm pool")
            .owned
            .retain(|o| o != id);
    }

    /// Ends every warm lease this runtime started and nobody claimed (ready or starting).
    pub async fn shutdown_warm(&self) {
        let owned = {
            let mut pool = self.pool.lock().expect("warm pool");
            pool.closed = true;
            pool.ready.clear();
            std::mem::take(&mut pool.owned)
        };
        for id in owned {
            let _ = self.end_lease(&id).await;
        }
    }
}
