//! The shared containment suite (`smithers_test_support::containment`, the 17 rows of
//! security.md) against the native runtime: one `#[test]` per row, each attempted from inside
//! a real sandbox by `smithers-attack` and checked on the host.

use std::sync::Arc;

use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime};
use smithers_test_support::conformance::SuiteEnv;

fn make_env() -> SuiteEnv {
    SuiteEnv::new(Arc::new(NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        ..NativeOptions::default()
    })))
}

smithers_test_support::containment_tests!(make_env);
