//! Sandboxes started through the engine ([`smithers_runtime::Engine`]) and not yet stopped:
//! their long-lived container, the command prefix that runs this build's binary in it, the
//! egress holder and the watchdog they keep for their life. Kept by the runtime
//! ([`crate::runtime::DockerRuntime`]), used by the engine's verbs (`live`).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::egress::Holder;
use crate::watchdog::Watchdog;

/// The started sandboxes, by container name.
#[derive(Debug, Default)]
pub(crate) struct StartedSandboxes(Mutex<HashMap<String, Arc<Started>>>);

impl StartedSandboxes {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Started>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
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
        }
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
}
