//! The shared containment suite (`smithers_runtime::containment`, the 17 rows of
//! security.md) against the native runtime: one `#[test]` per row, each attempted from inside
//! a real sandbox by `smithers-attack` and checked on the host.

use std::sync::Arc;

use smithers_runtime::conformance::SuiteEnv;
use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime};

fn make_env() -> SuiteEnv {
    SuiteEnv::new(Arc::new(NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        ..NativeOptions::default()
    })))
}

smithers_runtime::containment_tests!(
    make_env,
    // Known runtime bug, printed as KNOWN FAILURE on every run until fixed (the test then
    // fails, asking for this entry to go): a result JSON beyond the bundle bounds that the
    // runtime cannot parse (over 5 MiB, or deeper than serde_json's recursion limit) is dropped
    // silently: the bundle says `finished` with no outputs and nothing names the limit.
    known_failures = ["row16_bundle_bomb_rejected"]
);
