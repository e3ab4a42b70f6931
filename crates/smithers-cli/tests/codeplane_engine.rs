//! The engine suite (`smithers_test_support::engine`) against the codeplane runtime: each
//! sandbox is created and shipped over HTTP to a real `smithers-sandbox serve` child process
//! on 127.0.0.1, started there as a session, sent its commands (each answered by a stream of
//! its output and its end), stopped and destroyed: the host's native engine across the wire.
//! One server per test process. When the native runtime is unusable here the host answers 503
//! and the cases print `SKIP` (and fail under `CI=true`).

mod support;

use std::sync::{Arc, OnceLock};

use smithers_runtime_remote::{RemoteOptions, RemoteRuntime};
use smithers_test_support::conformance::Skip;
use smithers_test_support::engine::EngineEnv;
use support::serve::{data_dir, keep_for_process, ServeOptions};

const TOKEN: &str = "engine-suite-token-0123456789";

fn host() -> Result<String, String> {
    static HOST: OnceLock<Result<String, String>> = OnceLock::new();
    HOST.get_or_init(|| {
        let data = data_dir(
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
            "codeplane-engine",
        );
        let (addr, _pid) = keep_for_process(ServeOptions {
            token: TOKEN.into(),
            data_dir: data,
            args: Vec::new(),
            env: Vec::new(),
            wrapper: Vec::new(),
        })?;
        Ok(format!("http://{addr}"))
    })
    .clone()
}

fn make_env() -> Result<EngineEnv, Skip> {
    let url = host().map_err(|e| Skip::new(format!("no sandbox host: {e}")))?;
    let runtime = RemoteRuntime::new(RemoteOptions::new(&url, TOKEN))
        .map_err(|e| Skip::new(e.to_string()))?;
    Ok(EngineEnv::new(Arc::new(runtime)))
}

smithers_test_support::engine_tests!(make_env);
