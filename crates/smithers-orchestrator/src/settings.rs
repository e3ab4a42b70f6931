//! Process-wide settings: the concurrency limits and the review mode.

use smithers_store::{parse_limit, parse_max_concurrent};

/// Default limit over every run sharing one database, when `SMITHERS_MAX_HOST_SANDBOXES` is
/// unset or invalid (parsed like `SMITHERS_MAX_CONCURRENT_SANDBOXES`).
pub const DEFAULT_MAX_HOST_SANDBOXES: u32 = 64;

/// The reason recorded by the fail-closed review mode (the JavaScript text).
pub const FAIL_CLOSED_REJECT_REASON: &str =
    "Diff review approval is required before applying sandbox patches.";

/// What happens to patches that need review and are not auto-accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewMode {
    /// The sandbox waits in a durable review (row `review`); [`Orchestrator::accept`] or
    /// [`Orchestrator::reject`] decide later, from any process.
    ///
    /// [`Orchestrator::accept`]: crate::Orchestrator::accept
    /// [`Orchestrator::reject`]: crate::Orchestrator::reject
    Durable,
    /// 0.16: SandboxDiffRejected, then INVALID_INPUT "Sandbox produced patches that require
    /// review approval.".
    FailClosed,
}

/// Process-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Active sandboxes per run (`SMITHERS_MAX_CONCURRENT_SANDBOXES`).
    pub per_run_max: u32,
    /// Active sandboxes over every run in the database (`SMITHERS_MAX_HOST_SANDBOXES`).
    pub host_max: u32,
    pub review_mode: ReviewMode,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            per_run_max: parse_max_concurrent(None),
            host_max: DEFAULT_MAX_HOST_SANDBOXES,
            review_mode: ReviewMode::Durable,
        }
    }
}

impl Settings {
    /// Reads the limits from the environment, parsed like the JavaScript package.
    pub fn from_env() -> Self {
        let per_run = std::env::var("SMITHERS_MAX_CONCURRENT_SANDBOXES").ok();
        let host = std::env::var("SMITHERS_MAX_HOST_SANDBOXES").ok();
        Settings {
            per_run_max: parse_max_concurrent(per_run.as_deref()),
            host_max: parse_limit(host.as_deref(), DEFAULT_MAX_HOST_SANDBOXES),
            review_mode: ReviewMode::Durable,
        }
    }
}
