//! The engine suite: a sandbox's own life ([`smithers_runtime::Engine`]), which every engine
//! (native, docker) passes. A backend wires it into its tests with one line:
//!
//! ```ignore
//! fn make_env() -> Result<EngineEnv, Skip> { Ok(EngineEnv::new(Arc::new(MyEngine::new()))) }
//! smithers_test_support::engine_tests!(make_env);
//! ```
//!
//! Each case runs real commands in a real sandbox: two execs share the workspace; each
//! exec's environment and working directory are its own; output and stdin are byte-exact;
//! exits and signals are outcomes; a timed-out or cancelled exec leaves the sandbox usable;
//! execs run at once where the engine says they can; stop kills every process, also those
//! that left their command's group; exec out of order is refused; destroy is idempotent; a
//! hundred execs in one sandbox.

pub mod cases;
mod live;

pub use cases::CASES;
pub use live::{gone, host_pids_with, ByteSink, Live, Ran};

use std::sync::Arc;

use smithers_runtime::{Controls, Engine, SandboxConfig};

use crate::conformance::{CaseFuture, Skip};

/// What a backend's test supplies: the engine under test.
#[derive(Debug, Clone)]
pub struct EngineEnv {
    engine: Arc<dyn Engine>,
    image: Option<String>,
    test_name: String,
}

impl EngineEnv {
    pub fn new(engine: Arc<dyn Engine>) -> EngineEnv {
        EngineEnv {
            engine,
            image: None,
            test_name: String::new(),
        }
    }

    /// The image a container engine starts its sandboxes from.
    pub fn with_image(mut self, image: impl Into<String>) -> EngineEnv {
        self.image = Some(image.into());
        self
    }

    pub fn engine(&self) -> &dyn Engine {
        &*self.engine
    }

    pub fn test_name(&self) -> &str {
        &self.test_name
    }

    /// The config of a fresh sandbox over `project` (no network, the suite's safety timeout).
    pub fn config(&self, project: &std::path::Path, sandbox_id: &str) -> SandboxConfig {
        let controls = Controls {
            timeout_ms: Some(crate::conformance::SAFETY_TIMEOUT_MS),
            ..Controls::default()
        };
        SandboxConfig {
            run_id: format!("engine-suite-{}", std::process::id()),
            sandbox_id: sandbox_id.to_string(),
            runtime: kind_of(&self.engine),
            root_dir: project.to_path_buf(),
            image: self.image.clone(),
            controls,
            workspace_layers: Vec::new(),
        }
    }
}

/// The stored runtime kind of an engine's sandboxes (the `runtime` column).
fn kind_of(engine: &Arc<dyn Engine>) -> smithers_runtime::RuntimeKind {
    engine
        .backend()
        .as_str()
        .parse()
        .expect("the engine suite runs engines with a known runtime kind")
}

/// What a backend's `make_env` may return.
pub trait IntoEngineEnv {
    fn into_engine_env(self) -> Result<EngineEnv, Skip>;
}

impl IntoEngineEnv for EngineEnv {
    fn into_engine_env(self) -> Result<EngineEnv, Skip> {
        Ok(self)
    }
}

impl IntoEngineEnv for Result<EngineEnv, Skip> {
    fn into_engine_env(self) -> Result<EngineEnv, Skip> {
        self
    }
}

/// A case as a function pointer.
pub type EngineCaseFn = for<'a> fn(&'a EngineEnv) -> CaseFuture<'a>;

/// Runs one case on a fresh tokio runtime; a [`Skip`] prints `SKIP` (fails under `CI=true`).
pub fn run_engine_case<E: IntoEngineEnv>(test_name: &str, make_env: fn() -> E, case: EngineCaseFn) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build a tokio runtime for the engine suite");
    let result = rt.block_on(async {
        let mut env = make_env().into_engine_env()?;
        env.test_name = test_name.to_string();
        case(&env).await
    });
    if let Err(Skip(reason)) = result {
        crate::skip::skip_or_fail_as(test_name, &reason);
    }
}

/// The engine suite's cases by name, for the macro.
#[doc(hidden)]
#[macro_export]
macro_rules! __engine_case_list {
    ($callback:ident ! ( $($args:tt)* )) => {
        $crate::$callback! { $($args)* [
            execs_share_the_workspace,
            each_exec_has_its_own_env_and_cwd,
            output_and_stdin_are_byte_exact,
            exits_and_signals_are_outcomes,
            a_timed_out_exec_leaves_the_sandbox_usable,
            a_cancelled_exec_leaves_the_sandbox_usable,
            execs_run_at_once,
            stop_kills_every_process,
            exec_out_of_order_is_refused,
            destroy_is_idempotent,
            a_hundred_execs_in_one_sandbox,
            a_pause_holds_every_process_still,
            a_snapshot_restores_and_starts_another,
            a_command_on_a_terminal_is_its_sessions_leader,
        ] }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __engine_tests {
    ($make_env:path, [$($case:ident),* $(,)?]) => {
        $(
            #[test]
            fn $case() {
                fn case(env: &$crate::engine::EngineEnv) -> $crate::conformance::CaseFuture<'_> {
                    ::std::boxed::Box::pin($crate::engine::cases::$case(env))
                }
                let name = $crate::conformance::libtest_name(
                    concat!(module_path!(), "::", stringify!($case)),
                );
                $crate::engine::run_engine_case(&name, $make_env, case);
            }
        )*
    };
}

/// Expands to one `#[test]` per engine case, each against the engine `$make_env` returns.
#[macro_export]
macro_rules! engine_tests {
    ($make_env:path) => {
        $crate::__engine_case_list!(__engine_tests!($make_env,));
    };
}
