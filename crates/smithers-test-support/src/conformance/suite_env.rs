//! What a backend's test supplies to the suites (the runtime under test, how to reach the
//! attack binary), what a case returns, and the environment variables the suites use.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use smithers_runtime::{Controls, Runtime, SandboxConfig};

use super::locate_attack_bin;

/// Environment variable set (only in the test process) to a secret value that must never be
/// visible inside a sandbox.
pub const HOST_SECRET_ENV: &str = "SMITHERS_SUITE_HOST_SECRET";
/// Overrides where the `smithers-attack` binary is found on the host.
pub const ATTACK_BIN_ENV: &str = "SMITHERS_ATTACK_BIN";
/// Set in a re-executed test binary to run a helper mode instead of the case (row 13).
pub const HELPER_ENV: &str = "SMITHERS_SUITE_HELPER";

/// When set, every execute prints its termination and the attack result lines.
pub const VERBOSE_ENV: &str = "SMITHERS_SUITE_VERBOSE";

/// Safety net on every command the suites run without a timeout of their own, so a broken
/// runtime fails the case instead of hanging the test binary. Not a timing assertion.
pub const SAFETY_TIMEOUT_MS: u64 = 120_000;

/// Environment variables a runtime may legitimately pass or set inside a sandbox (the spec's
/// allowlist, generously read). Any other host variable visible inside is a leak.
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "TMPDIR",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "HOSTNAME",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "COLORTERM",
];

/// Why a case could not run on this host (never used for a failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip(pub String);

impl Skip {
    pub fn new(reason: impl Into<String>) -> Self {
        Skip(reason.into())
    }
}

/// What a case returns: `Ok` when it passed, `Err(Skip)` when it could not run here. Failures
/// panic with a message saying what was expected and what happened.
pub type CaseResult = Result<(), Skip>;

/// A boxed case future borrowing the environment.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseResult> + Send + 'a>>;

/// A case as a function pointer, for [`run_case`] and the per-suite `CASES` tables.
pub type CaseFn = for<'a> fn(&'a SuiteEnv) -> CaseFuture<'a>;

/// What a backend's test supplies: the runtime under test and how to reach the attack binary.
#[derive(Debug, Clone)]
pub struct SuiteEnv {
    pub(crate) runtime: Arc<dyn Runtime>,
    attack_bin: Option<PathBuf>,
    image: Option<String>,
    pub(crate) workspace_dir: String,
    host_processes_visible: bool,
    pub(crate) test_name: String,
    base_controls: Controls,
    host_pid: Option<u32>,
    helper_env: Vec<(String, String)>,
}

impl SuiteEnv {
    /// A local runtime whose sandbox processes are visible in the host's `/proc` (namespaces,
    /// a local container engine). The attack binary is located by [`locate_attack_bin`].
    pub fn new(runtime: Arc<dyn Runtime>) -> Self {
        SuiteEnv {
            runtime,
            attack_bin: None,
            image: None,
            workspace_dir: "/workspace".to_string(),
            host_processes_visible: true,
            test_name: String::new(),
            base_controls: Controls::default(),
            host_pid: None,
            helper_env: Vec::new(),
        }
    }

    /// Uses this host path for the `smithers-attack` binary.
    pub fn with_attack_bin(mut self, path: impl Into<PathBuf>) -> Self {
        self.attack_bin = Some(path.into());
        self
    }

    /// The image every sandbox is created with (container runtimes).
    pub fn with_image(mut self, image: impl Into<String>) -> Self {
        self.image = Some(image.into());
        self
    }

    /// For runtimes whose processes run elsewhere (remote): rows that verify process death
    /// from the host's `/proc` then skip with a reason.
    pub fn with_host_processes_visible(mut self, visible: bool) -> Self {
        self.host_processes_visible = visible;
        self
    }

    /// Controls every sandbox of the suite starts from (before the case adds its own).
    pub fn with_base_controls(mut self, controls: Controls) -> Self {
        self.base_controls = controls;
        self
    }

    /// The process that supervises the sandboxes and receives their output when it is not
    /// this one (a sandbox host serving a remote runtime): row 11 bounds its peak memory.
    pub fn with_host_pid(mut self, pid: u32) -> Self {
        self.host_pid = Some(pid);
        self
    }

    /// An environment variable for the processes a case re-executes from this test binary
    /// (row 13's orchestrator), e.g. how to reach a host this process started rather than
    /// start another.
    pub fn with_helper_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.helper_env.push((key.into(), value.into()));
        self
    }

    /// See [`SuiteEnv::with_host_pid`]: `None` means this process.
    pub fn host_pid(&self) -> Option<u32> {
        self.host_pid
    }

    /// See [`SuiteEnv::with_helper_env`].
    pub fn helper_env(&self) -> &[(String, String)] {
        &self.helper_env
    }

    pub fn runtime(&self) -> &dyn Runtime {
        self.runtime.as_ref()
    }

    /// Whether sandbox processes appear in this host's `/proc`.
    pub fn host_processes_visible(&self) -> bool {
        self.host_processes_visible
    }

    /// The libtest name of the running case (`row13_...` or `module::row13_...`).
    pub fn test_name(&self) -> &str {
        &self.test_name
    }

    /// Where the project appears inside the sandbox.
    pub fn workspace_dir(&self) -> &str {
        &self.workspace_dir
    }

    /// The host path of the attack binary (explicit, located, or built on demand).
    pub fn attack_bin(&self) -> PathBuf {
        match &self.attack_bin {
            Some(p) => p.clone(),
            None => locate_attack_bin().unwrap_or_else(|e| panic!("{e}")),
        }
    }

    /// Controls for a case: the base controls plus the safety timeout.
    pub fn controls(&self) -> Controls {
        let mut c = self.base_controls.clone();
        if c.timeout_ms.is_none() {
            c.timeout_ms = Some(SAFETY_TIMEOUT_MS);
        }
        c
    }

    /// The config of a fresh sandbox over `project` with `controls`.
    pub fn config(&self, project: &Path, sandbox_id: &str, controls: Controls) -> SandboxConfig {
        SandboxConfig {
            run_id: format!("suite-run-{}", std::process::id()),
            sandbox_id: sandbox_id.to_string(),
            runtime: self.runtime.kind(),
            root_dir: project.to_path_buf(),
            image: self.image.clone(),
            controls,
            workspace_layers: Vec::new(),
        }
    }
}

/// What a backend's `make_env` may return.
pub trait IntoSuiteEnv {
    fn into_suite_env(self) -> Result<SuiteEnv, Skip>;
}

impl IntoSuiteEnv for SuiteEnv {
    fn into_suite_env(self) -> Result<SuiteEnv, Skip> {
        Ok(self)
    }
}

impl IntoSuiteEnv for Result<SuiteEnv, Skip> {
    fn into_suite_env(self) -> Result<SuiteEnv, Skip> {
        self
    }
}
