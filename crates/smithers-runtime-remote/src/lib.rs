//! The `codeplane` runtime: steps run on a remote smithers sandbox host (the
//! `smithers-server` HTTP API, `openapi/smithers-sandbox.yaml`) and behave as they would here.
//!
//! * [`RemoteRuntime`] implements [`smithers_runtime::Runtime`] over that API (feature
//!   `client`, on by default). Base URL from `CODEPLANE_API_URL`, bearer token from
//!   `CODEPLANE_API_KEY` (as in the original), or explicit [`RemoteOptions`].
//! * [`wire`] (the JSON documents both ends exchange) and [`archive`] (a tree packed as a
//!   streamed tar, one unpacked confined) are `smithers-wire`'s, re-exported.
//!
//! # What travels
//!
//! `ship` uploads `rootDir` as a zstd-compressed tar, streamed from disk (never held in
//! memory). `.smithers/` (the project's own state: database, other sandboxes' bundles) is left
//! out, as the spec requires; `.git/` is **included** by default because steps need it (diffs
//! against a base ref, `git status`, build scripts reading the revision) — set
//! [`RemoteOptions::include_git`] to false for a lighter upload. Symlinks travel as links
//! (never followed); sockets, fifos and devices are not data and are left out.
//!
//! # Retries
//!
//! A request that never reached the host (connect error) is always retried. Beyond that only
//! requests that are safe to repeat are: `GET`, `DELETE`, the workspace `PUT` (same content,
//! replaced atomically on the host), the request `PUT`, and `execute` **with its idempotency
//! key** — the host starts a step at most once per sandbox and answers a retried key with the
//! run already started, so a retry can never run the step twice. `create` is not retried once
//! sent; its failure is reported with the cause.
#![forbid(unsafe_code)]

#[cfg(feature = "client")]
mod client;
/// The codeplane runtime as an engine: a session held on the host.
#[cfg(feature = "client")]
mod engine;

#[cfg(feature = "client")]
pub use client::{
    remove_local_leftovers, RemoteOptions, RemoteRuntime, RetryPolicy, ENV_API_KEY, ENV_API_URL,
};
/// The API's documents, archive and event-stream code, which live in `smithers-wire` (shared
/// with the server), re-exported for the runtime's callers.
pub use smithers_wire::{archive, wire, SseFrame, SseParser};
