//! The shared containment suite against a native runtime with a warm pool
//! (`NativeOptions::warm`), filled before each case: every sandbox a case creates that a
//! warm one can serve is a warm one (the others start cold, as they would without a pool).
//! A warm sandbox must pass every case a cold one passes.

use std::sync::Arc;
use std::time::Duration;

use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime};
use smithers_test_support::conformance::SuiteEnv;

fn make_env() -> SuiteEnv {
    let rt = NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        warm: 2,
        ..NativeOptions::default()
    });
    // A host without sandboxes has a pool that never fills: the cases then SKIP (or fail
    // under CI=true) on their own.
    let _ = rt.wait_until_warm(Duration::from_secs(20));
    SuiteEnv::new(Arc::new(rt))
}

smithers_test_support::containment_tests!(make_env);
