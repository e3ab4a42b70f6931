//! No code: this crate exists for its test, `tests/crate_graph.rs`, which reads every
//! workspace member's `Cargo.toml` and fails when a dependency edge that ARCHITECTURE.md
//! forbids appears (a runtime depending on the store, the bundle format depending on a
//! runtime, the orchestrator depending on a concrete backend, ...).
#![forbid(unsafe_code)]
