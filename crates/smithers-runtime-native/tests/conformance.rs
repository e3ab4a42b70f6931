//! The shared conformance suite (`smithers_test_support::conformance`) against the native runtime:
//! one `#[test]` per case, each in real sandboxes. A host without user namespaces or overlayfs
//! makes `create` fail with `Unavailable`: the cases print `SKIP`, and fail under `CI=true`.

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

smithers_test_support::conformance_tests!(make_env);
