//! The engine suite (`smithers_test_support::engine`) against the native runtime: a sandbox
//! started once, sent many commands (at once too), stopped and destroyed, in real namespaces.
//! A host without user namespaces or overlayfs makes `create` fail with `Unavailable`: the
//! cases print `SKIP`, and fail under `CI=true`.

use std::sync::Arc;

use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime};
use smithers_test_support::engine::EngineEnv;

fn make_env() -> EngineEnv {
    EngineEnv::new(Arc::new(NativeRuntime::new(NativeOptions {
        init: Some(InitCommand::binary(env!(
            "CARGO_BIN_EXE_smithers-sandbox-init"
        ))),
        ..NativeOptions::default()
    })))
}

smithers_test_support::engine_tests!(make_env);
