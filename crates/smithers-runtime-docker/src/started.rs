//! Sandboxes started through the engine ([`smithers_runtime::Engine`]) and not yet stopped:
//! their long-lived container, the command prefix that runs this build's binary in it, the
//! egress holder and the watchdog they keep for their life. Kept by the runtime
//! ([`crate::runtime::DockerRuntime`]), used by the engine's verbs (`live`).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::egress::Holder;
use crate::watchdog::Watchdog;

/// The started sandboxes, by container name; and those being started, whose container name
/// is taken until their `start` ends (two starts of one sandbox would make one container
/// name twice, the second removing the first's container).
#[derive(Debug, Default)]
pub(crate) struct StartedSandboxes {
    started: Mutex<HashMap<String, Arc<Started>>>,
    starting: Mutex<HashSet<String>>,
}

impl StartedSandboxes {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Started>>> {
        self.started.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `name` for a start; false when it is started or being started already.
    pub(crate) fn begin(&self, name: &str) -> bool {
        let started = self.lock();
        let mut starting = self.starting.lock().unwrap_or_else(|e| e.into_inner());
        !started.contains_key(name) && starting.insert(name.to_string())
    }

    /// Ends a start: the sandbox is started (`Some`) or not.
    pub(crate) fn finish(&self, name: &str, started: Option<Arc<Started>>) {
        let mut map = self.lock();
        if let Some(s) = started {
            map.insert(name.to_string(), s);
        }
        let mut starting = self.starting.lock().unwrap_or_else(|e| e.into_inner());
        starting.remove(name);
    }
}

/// One started sandbox.
pub(crate) struct Started {
    /// The container's id (its name is the map's key).
    pub(crate) id: String,
    /// `[loader...] /smithers-host/smithers-sandbox __sandbox-init`: the bound binary's init,
    /// which each exec's wrapper and kill are run with.
    pub(crate) prefix: Vec<String>,
    /// With an egress policy: the holder of the network namespace and the engine serving it.
    pub(crate) holder: Mutex<Option<Holder>>,
    /// Kills the container if this process dies before `stop`.
    pub(crate) watchdog: Mutex<Option<Watchdog>>,
    /// Tokens name each exec's files in the container: a random part per sandbox (two
    /// runtimes never pick the same) and a counter.
    token_base: u64,
    next: AtomicU64,
    /// True while the container is paused (`Engine::pause`): the engine refuses an exec into
    /// a paused container, so each of ours waits for the resume first.
    paused: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Started {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started")
            .field("id", &self.id)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Started {
    pub(crate) fn new(
        id: String,
        prefix: Vec<String>,
        holder: Option<Holder>,
        watchdog: Option<Watchdog>,
    ) -> Started {
        // std's RandomState is seeded from the OS's randomness.
        let token_base = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Started {
            id,
            prefix,
            holder: Mutex::new(holder),
            watchdog: Mutex::new(watchdog),
            token_base,
            next: AtomicU64::new(1),
            paused: tokio::sync::watch::Sender::new(false),
        }
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    /// Returns once the container is not paused.
    pub(crate) async fn unpaused(&self) {
        let mut rx = self.paused.subscribe();
        let _ = rx.wait_for(|paused| !*paused).await;
    }

    /// A token no other exec of this sandbox has had.
    pub(crate) fn next_token(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}-{n}", self.token_base)
    }

    pub(crate) fn take_holder(&self) -> Option<Holder> {
        self.holder.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(crate) fn take_watchdog(&self) -> Option<Watchdog> {
        self.watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Once its container is gone: the watchdog dismissed, the egress engine stopped (its
    /// decisions dropped: a sandbox cleaned up without a stop has no bundle to come).
    pub(crate) async fn release(&self) {
        if let Some(w) = self.take_watchdog() {
            w.dismiss().await;
        }
        if let Some(h) = self.take_holder() {
            let _ = h.stop().await;
        }
    }
}
