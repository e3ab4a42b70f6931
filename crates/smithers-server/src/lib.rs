//! The sandbox host: an HTTP service that runs workflow steps sent from other machines in a
//! runtime of this host (the CLI injects the native namespace runtime), so that a step behaves
//! the same whether it runs here or across the network. The client is the `codeplane` runtime
//! of `smithers-runtime-remote`; the API is `openapi/smithers-sandbox.yaml`, served at
//! `GET /v1/openapi.yaml`.
//!
//! # Lifecycle of a hosted sandbox
//!
//! `POST /v1/sandboxes` (create; the host chooses where the workspace lives) →
//! `PUT …/workspace` (streamed compressed tar, unpacked confined into a staging directory and
//! swapped in whole; repeatable until shipped) → `PUT …/request` (ship) →
//! `POST …/execute` (once; `Idempotency-Key` makes a retried request report the run it already
//! started instead of starting another) → `GET …/events` (SSE, resumable, gap-free) →
//! `GET …/bundle` (tar of the collected bundle) → `DELETE …` (idempotent cleanup).
//!
//! # Safety and robustness
//!
//! * Bearer tokens on `/v1/*` but the OpenAPI document (`SMITHERS_SANDBOX_TOKEN`, and named
//!   ones in `SMITHERS_SANDBOX_TOKENS` or [`ServerConfig::tokens`]), compared in constant time;
//!   without a token the server refuses to listen anywhere but loopback. A sandbox belongs to
//!   the token that created it: to any other token it does not exist (404).
//! * The operator's ceilings ([`Ceilings`]): network only when allowed, resource limits,
//!   timeout and output cap at most the ceiling (an unasked timeout or output cap gets it),
//!   a cap on sandboxes held in all and per token, and idle sandboxes expiring
//!   ([`Limits::idle_expiry`]).
//! * Connection limits (`conn`): a cap on connections served at once (the rest wait in the
//!   accept backlog), a deadline for a request head and for an idle connection (slowloris),
//!   `TCP_NODELAY`.
//! * Body limits (JSON, upload on the wire, unpacked bytes, decoded bytes, entries, path
//!   length), checked while the upload streams in, a deadline
//!   per request, archive rules of [`smithers_wire::archive`]; every refusal is a
//!   documented status with a `{code, message, details}` body.
//! * Graceful shutdown: stop accepting, let running steps finish for a grace period, then
//!   cancel them (the runtime kills every process) and let their bundles be collected; then
//!   every sandbox still held is removed (nobody can reach it once the server is gone).
//! * State is in memory: a restarted host forgets its sandboxes, and cleans up at start what a
//!   previous one left ([`SandboxServer::recover`]: each sandbox's directory holds its runtime
//!   handle).
#![forbid(unsafe_code)]

mod config;
mod conn;
mod error;
mod json;
mod metrics;
mod policy;
mod recovery;
mod review;
mod routes;
mod server;
mod state;
#[cfg(feature = "test-runtime")]
pub mod testing;

pub use config::{Limits, ServerConfig, ENV_TOKEN, ENV_TOKENS, MIN_TOKEN_LENGTH, OPENAPI_YAML};
pub use error::{ApiError, ServerError};
pub use metrics::Metrics;
pub use policy::{parse_tokens, Ceilings, ClientToken, DEFAULT_TOKEN_NAME};
pub use recovery::Recovered;
pub use server::{check_exposure, shutdown_signal, SandboxServer};
