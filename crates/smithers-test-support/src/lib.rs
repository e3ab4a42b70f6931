//! What the workspace's tests share; only ever a dev-dependency.
//!
//! * [`skip`]: the one CI-aware skip. A test that needs a capability this host lacks prints
//!   `SKIP <test>: <reason>` where a plain `cargo test` shows it, and fails under `CI=true`.
//! * [`conformance`] and [`containment`]: the suites every backend passes, wired into a
//!   backend's integration tests with [`conformance_tests!`] and [`containment_tests!`].
//! * [`engine`]: the engine suite, a sandbox's own life (start, many execs, stop, destroy),
//!   wired in with [`engine_tests!`].

#![forbid(unsafe_code)]

pub mod conformance;
pub mod containment;
pub mod engine;
pub mod skip;

pub use skip::{in_ci, say, skip_optional, skip_or_fail, skip_or_fail_as, test_name};
