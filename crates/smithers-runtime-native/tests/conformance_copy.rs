//! The shared conformance suite against the native runtime in copy mode
//! (`WorkspaceMode::Copy`): /workspace is a copy of the project made at ship and compared
//! with the project at collect, instead of an overlay. Every case must hold as with the
//! overlay (host tree untouched, changes become patches, cleanup leaves nothing, ...).

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

smithers_test_support::conformance_tests!(make_env);
