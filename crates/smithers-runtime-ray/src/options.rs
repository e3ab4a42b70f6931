//! What the `ray` runtime is told: how to reach the cluster and what a lease asks of it
//! ([`RayOptions`]), read from the environment by the names Ray's own tools use. Plain data
//! (it holds placement's retry policy, `crate::retry::ApiRetry`) below the lease and the
//! runtime, which read it from here rather than through the crate root.

use std::time::Duration;

use smithers_runtime::RuntimeError;
use smithers_runtime_remote::RetryPolicy;

use crate::retry;

/// The Jobs API URL (the dashboard, e.g. `http://head:8265`), as Ray's own tools name it.
pub const ENV_ADDRESS: &str = "RAY_ADDRESS";
/// The cluster's token (`RAY_AUTH_MODE=token`), as Ray's own tools name it.
pub const ENV_TOKEN: &str = "RAY_AUTH_TOKEN";
/// The path of `smithers-sandbox` on the nodes (default: found on the node's PATH).
pub const ENV_SERVE_BIN: &str = "SMITHERS_RAY_SERVE_BIN";
/// The pool a step's lease is placed in: nodes labelled `smithers-pool=<name>`.
pub const ENV_POOL: &str = "SMITHERS_RAY_POOL";

/// Warm leases to keep ready (a long-lived client: the library, `serve` in front of a fleet).
pub const ENV_WARM: &str = "SMITHERS_RAY_WARM";
/// How long a node's `serve` lets a step run that nobody follows (its client died or was cut
/// off), in milliseconds (default 120000, at least 1000).
pub const ENV_ORPHAN_TIMEOUT_MS: &str = "SMITHERS_RAY_ORPHAN_TIMEOUT_MS";

/// How to reach the cluster and what a lease asks of it.
#[derive(Debug, Clone)]
pub struct RayOptions {
    /// The Jobs API URL, without a trailing `/`.
    pub address: String,
    pub token: Option<String>,
    /// `smithers-sandbox` as the nodes find it.
    pub serve_binary: String,
    /// The custom resource a lease holds one of.
    pub slot_resource: String,
    /// Place leases only on nodes whose `pool_label` is this.
    pub pool: Option<String>,
    pub pool_label: String,
    /// What the node's `serve` listens on (port 0: any free one, read back from its log).
    pub node_listen: String,
    /// Where the node's `serve` keeps its state.
    pub node_state_dir: String,
    /// The node's `serve` cancels a step nobody has followed for this long.
    pub orphan_timeout: Duration,
    /// The longest a lease waits in Ray's queue.
    pub queue_timeout: Duration,
    /// The longest between the job running and its server saying where it listens.
    pub start_timeout: Duration,
    /// How often a pending lease is looked at.
    pub poll_interval: Duration,
    /// How often a lease is checked while a step holds it (how soon NODE_LOST is said,
    /// after Ray's own health checks find the node dead).
    pub watch_interval: Duration,
    /// How long a node that stopped answering is given for Ray to declare it dead (its
    /// health checks) before the failure is reported as the network's, not NODE_LOST.
    pub loss_grace: Duration,
    /// Warm leases kept ready per runtime (for its pool): claimed by the next step that fits
    /// one ([`crate::lease::fits_warm`]), refilled in the background. 0: every lease is cold.
    pub warm: usize,
    /// A warm lease nobody claimed for this long gives its slot back (and is refilled).
    pub warm_idle_exit: Duration,
    /// A cold lease whose server holds no sandbox for this long (its client vanished between
    /// the lease and the sandbox) gives its slot back.
    pub lease_idle_exit: Duration,
    /// How long cleanup waits for a stopped job to end.
    pub stop_timeout: Duration,
    /// Timeout of one Jobs API call.
    pub api_timeout: Duration,
    /// How placement (the lease's submit, the reads of its job and log until its server
    /// listens) rides out a Jobs API that fails transiently (5xx, refused or reset
    /// connections, timeouts): asked again with backoff within this window, each wait told
    /// (a `SandboxQueued` event and the log); a refusal (4xx) fails at once.
    pub api_retry: retry::ApiRetry,
    /// Retries of safe requests to a node (few: a node that does not answer is watched).
    pub node_retry: RetryPolicy,
    pub node_event_idle_timeout: Duration,
}

impl RayOptions {
    pub fn new(address: impl Into<String>, token: Option<String>) -> Self {
        RayOptions {
            address: address.into().trim_end_matches('/').to_string(),
            token,
            serve_binary: "smithers-sandbox".into(),
            slot_resource: "sandbox_slot".into(),
            pool: None,
            pool_label: "smithers-pool".into(),
            node_listen: "0.0.0.0:0".into(),
            node_state_dir: "/tmp".into(),
            orphan_timeout: Duration::from_secs(120),
            queue_timeout: Duration::from_secs(3600),
            start_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_millis(100),
            watch_interval: Duration::from_millis(500),
            // Ray's default health checks declare a node dead after about 30 s (5 × 3 s
            // period + timeouts); tuned clusters much sooner.
            loss_grace: Duration::from_secs(45),
            warm: 0,
            warm_idle_exit: Duration::from_secs(300),
            lease_idle_exit: Duration::from_secs(600),
            stop_timeout: Duration::from_secs(30),
            api_timeout: Duration::from_secs(15),
            api_retry: retry::ApiRetry::default(),
            node_retry: RetryPolicy {
                max_attempts: 3,
                initial_backoff: Duration::from_millis(200),
                max_backoff: Duration::from_secs(2),
            },
            node_event_idle_timeout: Duration::from_secs(60),
        }
    }

    /// From `RAY_ADDRESS` (required), `RAY_AUTH_TOKEN`, `SMITHERS_RAY_SERVE_BIN` and
    /// `SMITHERS_RAY_POOL`.
    pub fn from_env() -> Result<Self, RuntimeError> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let Some(address) = get(ENV_ADDRESS) else {
            return Err(RuntimeError::Unavailable {
                runtime: "ray",
                reason: format!("{ENV_ADDRESS} is not set"),
                fix: Some(format!(
                    "set {ENV_ADDRESS} to the Ray Jobs API (the dashboard, e.g. http://head:8265) and {ENV_TOKEN} to the cluster's token"
                )),
            });
        };
        if !address.starts_with("http://") && !address.starts_with("https://") {
            return Err(RuntimeError::Unavailable {
                runtime: "ray",
                reason: format!("{ENV_ADDRESS}={address:?} is not the Jobs API's http(s) URL"),
                fix: Some(format!(
                    "set {ENV_ADDRESS} to e.g. http://head:8265 (the dashboard port)"
                )),
            });
        }
        let mut options = RayOptions::new(address, get(ENV_TOKEN));
        if let Some(bin) = get(ENV_SERVE_BIN) {
            options.serve_binary = bin;
        }
        options.pool = get(ENV_POOL);
        if let Some(n) = get(ENV_WARM) {
            options.warm = n.parse().map_err(|_| RuntimeError::InvalidControl {
                control: "SMITHERS_RAY_WARM",
                reason: format!("{n:?} is not a number of leases"),
            })?;
        }
        if let Some(ms) = get(ENV_ORPHAN_TIMEOUT_MS) {
            let ms: u64 = ms.parse().map_err(|_| RuntimeError::InvalidControl {
                control: "SMITHERS_RAY_ORPHAN_TIMEOUT_MS",
                reason: format!("{ms:?} is not a number of milliseconds"),
            })?;
            options.orphan_timeout = Duration::from_millis(ms.max(1000));
        }
        Ok(options)
    }
}
