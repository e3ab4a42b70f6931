//! The `ray` runtime: steps across a fleet, on Ray.
//!
//! A sandbox is a **lease**: a Ray job that reserves one `sandbox_slot` (plus the step's CPU
//! and memory, and an optional pool label) and runs `smithers-sandbox serve` on the node Ray
//! chose. Ray decides where and when (a step with no free slot waits in Ray's queue: the
//! orchestrator's `SandboxQueued` events), and watches the nodes. The client reads the node's
//! address from the job record, the port from the job's log and the lease's token from the
//! job's environment, then speaks the codeplane API to that node with
//! [`smithers_runtime_remote::RemoteRuntime`].
//!
//! A lease that ends under a step (its node died or was cut off, so Ray failed the job; or
//! someone stopped it) ends the step with `NODE_LOST` carrying Ray's words. It is never
//! retried here and a bundle from it is never kept; the node's own `serve` bounds a step
//! nobody follows (`--orphan-timeout-ms`).
//!
//! A lease also holds a session for its life ([`smithers_runtime::Engine`], `engine`): the
//! node's `serve` starts it and takes its commands, watched as a step is.
//!
//! See docs/scaling.md for running a fleet and ../shared/design/fleet.md for the design.

#![forbid(unsafe_code)]

mod engine;
pub mod jobs;
pub mod lease;
mod options;
mod pool;
pub mod retry;
mod runtime;
mod waited;
mod warm;

pub use options::{
    RayOptions, ENV_ADDRESS, ENV_ORPHAN_TIMEOUT_MS, ENV_POOL, ENV_SERVE_BIN, ENV_TOKEN, ENV_WARM,
};
pub use runtime::RayRuntime;
