//! The shared containment suite (the 17 rows of security.md) against the native runtime in
//! copy mode (`WorkspaceMode::Copy`): the escapes must fail the same way when /workspace is a
//! copy of the project instead of an overlay (a symlink planted in the copy, a write to
//! `.git`, a read of `.smithers`, ...).

use std::sync::Arc;

use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime, WorkspaceMode};
use smithers_test_support::conformance::SuiteEnv;

fn make_env() -> SuiteEnv {
    SuiteEnv::new(Arc::new(NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        workspace: WorkspaceMode::Copy,
        ..NativeOptions::default()
    })))
}

smithers_test_support::containment_tests!(make_env);
