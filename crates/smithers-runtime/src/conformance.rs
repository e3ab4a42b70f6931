//! The conformance suite every backend passes, and the harness it shares with the containment
//! suite ([`crate::containment`]).
//!
//! A backend wires both suites into its integration tests with one line each:
//!
//! ```ignore
//! // crates/<backend>/tests/conformance.rs
//! fn make_env() -> Result<smithers_runtime::conformance::SuiteEnv, smithers_runtime::conformance::Skip> {
//!     Ok(SuiteEnv::new(std::sync::Arc::new(MyRuntime::new())))
//! }
//! smithers_runtime::conformance_tests!(make_env);
//! ```
//!
//! The macro expands to one `#[test]` per case (so `cargo test` lists each case by name), each
//! building its own tokio runtime, calling `make_env` and running the case against real
//! sandboxes. A case that cannot run here (the runtime is unavailable on this host) prints
//! `SKIP <case>: <reason>`, and fails instead when `CI=true`.
//!
//! Every case runs commands inside a real sandbox and checks the host afterwards. Limits are
//! "enforced or refused": either `create` refuses the control with
//! [`RuntimeError::ControlUnsupported`], or the outcome reports the limit was hit. A protection
//! an attack gets through must be reported as not enforced by the runtime's enforcement report;
//! a silent pass is a failure.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use smithers_errors::{CodedError, ErrorCode};

use crate::{
    CancellationToken, CollectReport, Controls, EnforcementReport, ExecOutcome, OutputEvent,
    OutputSink, ProtectionStatus, RequestBundle, Runtime, RuntimeError, SandboxConfig,
    SandboxHandle, StepCommand, Termination,
};

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
    runtime: Arc<dyn Runtime>,
    attack_bin: Option<PathBuf>,
    image: Option<String>,
    workspace_dir: String,
    host_processes_visible: bool,
    test_name: String,
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

/// Finds the host `smithers-attack` binary: `$SMITHERS_ATTACK_BIN`, else next to the running
/// test executable (`target/<profile>/` when `cargo test --workspace` built it), else builds
/// it once with cargo into a target directory of its own (a nested cargo must not wait on the
/// lock of the build that is running these tests).
pub fn locate_attack_bin() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    if let Some(p) = std::env::var_os(ATTACK_BIN_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("${ATTACK_BIN_ENV} = {} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<host tuple>/debug/deps/<test> → target/<host tuple>/debug/smithers-attack
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let sibling = profile_dir.join("smithers-attack");
    if sibling.is_file() {
        return Ok(sibling);
    }
    BUILT
        .get_or_init(|| {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("smithers-attack")
                .join("Cargo.toml");
            let target_dir = profile_dir
                .parent()
                .map(|t| t.join("suite-attack"))
                .unwrap_or_else(|| std::env::temp_dir().join("smithers-suite-attack"));
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = std::process::Command::new(cargo)
                .arg("build")
                .arg("--quiet")
                .arg("--manifest-path")
                .arg(&manifest)
                .arg("--target-dir")
                .arg(&target_dir)
                .status()
                .map_err(|e| format!("cannot run cargo to build smithers-attack: {e}"))?;
            // Under <target dir>/<host tuple>/debug, as the workspace's cargo configuration
            // names the target (.cargo/config.toml), or under <target dir>/debug without it.
            let host = profile_dir
                .parent()
                .and_then(Path::file_name)
                .unwrap_or_default();
            let bin = [target_dir.join(host), target_dir.clone()]
                .into_iter()
                .map(|dir| dir.join("debug").join("smithers-attack"))
                .find(|bin| bin.is_file())
                .unwrap_or_default();
            if status.success() && bin.is_file() {
                Ok(bin)
            } else {
                Err(format!(
                    "smithers-attack not found next to {} and building it failed ({status}); \
                     build it with `cargo build -p smithers-attack` or set ${ATTACK_BIN_ENV}",
                    exe.display()
                ))
            }
        })
        .clone()
}

/// Runs one case like [`run_case`], except that a case named in `known_failures` (a runtime
/// bug recorded in the backend's test file) must fail: its failure is printed as
/// `KNOWN FAILURE <case>: <message>`, and a pass fails the test so the entry gets removed.
pub fn run_case_with<E: IntoSuiteEnv>(
    test_name: &str,
    make_env: fn() -> E,
    case: CaseFn,
    known_failures: &[&str],
) {
    let short = test_name.rsplit("::").next().unwrap_or(test_name);
    if !known_failures.contains(&short) {
        return run_case(test_name, make_env, case);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_case(test_name, make_env, case)
    }));
    match outcome {
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            say(&format!("KNOWN FAILURE {test_name}: {msg}"));
        }
        Ok(()) => panic!(
            "{test_name} is listed in known_failures but passes now: remove it from the list"
        ),
    }
}

/// Runs one case: helper-mode dispatch is the case's business; this builds the runtime,
/// applies `make_env`, and turns a [`Skip`] into `SKIP` output (or a failure under `CI=true`).
pub fn run_case<E: IntoSuiteEnv>(test_name: &str, make_env: fn() -> E, case: CaseFn) {
    ensure_host_secret();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build a tokio runtime for the suite");
    let result = rt.block_on(async {
        let mut env = make_env().into_suite_env()?;
        env.test_name = test_name.to_string();
        case(&env).await
    });
    if let Err(Skip(reason)) = result {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{test_name}: required capability missing under CI=true: {reason}");
        }
        say(&format!("SKIP {test_name}: {reason}"));
    }
}

/// Writes a line to the real stderr, past libtest's capture: SKIP and KNOWN FAILURE lines must
/// be seen in a normal `cargo test` run, not only with `--nocapture`.
pub fn say(line: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// Strips the crate name from a `module_path!()`-based name, giving the libtest filter name.
pub fn libtest_name(full: &str) -> String {
    match full.split_once("::") {
        Some((_, rest)) => rest.to_string(),
        None => full.to_string(),
    }
}

fn ensure_host_secret() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if std::env::var_os(HOST_SECRET_ENV).is_none() {
            // Set before this test's runtime starts any thread of ours; the secret is what
            // the env cases look for inside the sandbox.
            std::env::set_var(
                HOST_SECRET_ENV,
                format!("host-secret-{}-{}", std::process::id(), nanos()),
            );
        }
    });
}

/// The secret value of [`HOST_SECRET_ENV`] in this process.
pub fn host_secret() -> String {
    ensure_host_secret();
    std::env::var(HOST_SECRET_ENV).unwrap_or_default()
}

fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// A unique token for marking processes and files of one case.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos() % 1_000_000_000
    )
}

// ---------------------------------------------------------------------------------------------
// Projects, sandboxes and captured output
// ---------------------------------------------------------------------------------------------

/// A fresh temporary project on the host, with a few files and the attack binary.
#[derive(Debug)]
pub struct Project {
    _dir: tempfile::TempDir,
    /// The project root (`rootDir`).
    pub root: PathBuf,
    /// A directory beside the project (outside it) for host-side files of the case.
    pub outside: PathBuf,
    /// Where the attack binary appears inside the sandbox.
    pub attack: String,
}

/// Puts the attack binary at `dest` as a hard link to one copy staged per process (a plain
/// copy across file systems). Why not a fresh copy per project: writing an executable while
/// another test thread forks leaves the write descriptor open in that child until it execs,
/// and executing the new file in that window fails with ETXTBSY. The staged copy is written
/// once, before it is ever executed; links never open it for writing.
fn place_attack_bin(bin: &Path, dest: &Path) {
    static STAGED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let staged = STAGED.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("smithers-suite-attack-")
            .tempdir()
            .expect("create a temp dir")
            .keep();
        let staged = dir.join("smithers-attack");
        std::fs::copy(bin, &staged).unwrap_or_else(|e| panic!("stage {}: {e}", bin.display()));
        set_mode(&staged, 0o755);
        staged
    });
    if std::fs::hard_link(staged, dest).is_err() {
        std::fs::copy(staged, dest)
            .unwrap_or_else(|e| panic!("copy {} into the project: {e}", staged.display()));
        set_mode(dest, 0o755);
    }
}

impl Project {
    pub fn new(env: &SuiteEnv) -> Project {
        let dir = tempfile::Builder::new()
            .prefix("smithers-suite-")
            .tempdir()
            .expect("create a temp dir");
        let root = dir.path().join("project");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("src")).expect("mkdir project");
        std::fs::create_dir_all(&outside).expect("mkdir outside");
        std::fs::write(root.join("README.txt"), "hello from the host project\n").expect("write");
        std::fs::write(root.join("src/lib.rs"), "pub fn answer() -> u32 { 42 }\n").expect("write");
        std::fs::write(root.join("src/gone.txt"), "to be deleted\n").expect("write");
        std::fs::write(root.join("data.bin"), [0u8, 1, 2, 255, 0, 7]).expect("write");
        let dest = root.join("smithers-attack");
        place_attack_bin(&env.attack_bin(), &dest);
        Project {
            _dir: dir,
            attack: format!("{}/smithers-attack", env.workspace_dir),
            root,
            outside,
        }
    }

    /// Every file of the host project but the runtime's own `.smithers/` state.
    pub fn snapshot(&self) -> TreeSnapshot {
        TreeSnapshot::of(&self.root, &[".smithers"])
    }

    /// argv running the attack binary with `args` (several attempts joined by `+`).
    pub fn attack_argv(&self, args: &[&str]) -> Vec<String> {
        std::iter::once(self.attack.clone())
            .chain(args.iter().map(|s| s.to_string()))
            .collect()
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Path → (kind, mode, content or link target). Compared with `==` to prove a tree untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSnapshot(pub BTreeMap<PathBuf, (char, u32, Vec<u8>)>);

impl TreeSnapshot {
    pub fn of(root: &Path, exclude_top: &[&str]) -> TreeSnapshot {
        use std::os::unix::fs::PermissionsExt;
        let mut map = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.filter_map(Result::ok) {
                let path = entry.path();
                let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
                if dir == root
                    && exclude_top
                        .iter()
                        .any(|x| entry.file_name().to_str() == Some(x))
                {
                    continue;
                }
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                let mode = meta.permissions().mode();
                if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(&path).unwrap_or_default();
                    map.insert(
                        rel,
                        ('l', mode, target.as_os_str().as_encoded_bytes().to_vec()),
                    );
                } else if meta.is_dir() {
                    map.insert(rel, ('d', mode, Vec::new()));
                    stack.push(path);
                } else {
                    map.insert(rel, ('f', mode, std::fs::read(&path).unwrap_or_default()));
                }
            }
        }
        TreeSnapshot(map)
    }

    /// Paths added, removed or changed from `self` to `after` (for failure messages).
    pub fn diff(&self, after: &TreeSnapshot) -> Vec<String> {
        let mut out = Vec::new();
        for (path, entry) in &self.0 {
            match after.0.get(path) {
                None => out.push(format!("removed {}", path.display())),
                Some(e) if e != entry => out.push(format!(
                    "changed {} ({}{:o}, {} bytes → {}{:o}, {} bytes)",
                    path.display(),
                    entry.0,
                    entry.1,
                    entry.2.len(),
                    e.0,
                    e.1,
                    e.2.len()
                )),
                Some(_) => {}
            }
        }
        for path in after.0.keys().filter(|p| !self.0.contains_key(*p)) {
            out.push(format!("added {}", path.display()));
        }
        out
    }

    /// Panics with the differences when `after` is not identical.
    pub fn assert_same(&self, after: &TreeSnapshot, what: &str) {
        let diff = self.diff(after);
        assert!(diff.is_empty(), "{what}: {diff:#?}");
    }
}

/// Collects the live output of `execute` (its line events; of the relayed bytes only their
/// count, so that a flood is not held here) and wakes waiters on every line.
#[derive(Debug, Default)]
pub struct Captured {
    events: Mutex<Vec<OutputEvent>>,
    notify: tokio::sync::Notify,
    relayed_stdout: AtomicU64,
    relayed_stderr: AtomicU64,
}

impl OutputSink for Captured {
    fn event(&self, event: OutputEvent) {
        if let OutputEvent::Output { stream, bytes, .. } = &event {
            let count = match stream {
                crate::OutputStream::Stdout => &self.relayed_stdout,
                crate::OutputStream::Stderr => &self.relayed_stderr,
            };
            count.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            return;
        }
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
        self.notify.notify_one();
    }
}

impl Captured {
    pub fn stdout(&self) -> Vec<String> {
        self.lines(true)
    }

    pub fn stderr(&self) -> Vec<String> {
        self.lines(false)
    }

    fn lines(&self, stdout: bool) -> Vec<String> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|e| match (e, stdout) {
                (OutputEvent::Stdout { line, .. }, true) => Some(line.clone()),
                (OutputEvent::Stderr { line, .. }, false) => Some(line.clone()),
                _ => None,
            })
            .collect()
    }

    /// Total bytes of captured lines (plus one newline each) on one stream.
    pub fn bytes(&self, stdout: bool) -> u64 {
        self.lines(stdout).iter().map(|l| l.len() as u64 + 1).sum()
    }

    /// Bytes of one stream relayed as written ([`OutputEvent::Output`]), whatever the caps.
    pub fn relayed(&self, stdout: bool) -> u64 {
        let count = if stdout {
            &self.relayed_stdout
        } else {
            &self.relayed_stderr
        };
        count.load(Ordering::Relaxed)
    }

    /// Waits until a stdout line contains `needle` (bounded by `limit`, a safety net only).
    pub async fn wait_for_stdout(&self, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.stdout().iter().any(|l| l.contains(needle)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ =
                tokio::time::timeout(left.min(Duration::from_millis(200)), self.notify.notified())
                    .await;
        }
    }

    /// The attack result lines (`{"attempt":..}`) printed on either stream.
    pub fn attempts(&self) -> Vec<Value> {
        self.stdout()
            .into_iter()
            .chain(self.stderr())
            .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
            .filter(|v| v.get("attempt").is_some())
            .collect()
    }

    /// Everything printed, for failure messages.
    pub fn dump(&self) -> String {
        let cut = |v: Vec<String>| {
            let s = v.join("\n");
            if s.len() > 4000 {
                format!(
                    "{}… ({} bytes)",
                    &s[..s.floor_char_boundary_compat(4000)],
                    s.len()
                )
            } else {
                s
            }
        };
        format!(
            "--- stdout ---\n{}\n--- stderr ---\n{}",
            cut(self.stdout()),
            cut(self.stderr())
        )
    }
}

trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorCharBoundary for String {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        i = i.min(self.len());
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

/// One execute's result: the outcome and the captured output.
#[derive(Debug)]
pub struct Exec {
    pub outcome: ExecOutcome,
    pub output: Arc<Captured>,
}

impl Exec {
    /// The result line of `attempt`; panics with the whole output when it is missing.
    pub fn attempt(&self, attempt: &str) -> Value {
        self.attempts(attempt)
            .into_iter()
            .next()
            .unwrap_or_else(|| {
                panic!(
                    "no result line for attempt {attempt:?}; outcome {:?}\n{}",
                    self.outcome,
                    self.output.dump()
                )
            })
    }

    /// Every result line of `attempt`, in order.
    pub fn attempts(&self, attempt: &str) -> Vec<Value> {
        self.output
            .attempts()
            .into_iter()
            .filter(|v| v["attempt"] == attempt)
            .collect()
    }
}

/// A created sandbox. Cleaned up on drop if the case did not (a failing case must not leak).
#[derive(Debug)]
pub struct Sandbox<'e> {
    pub env: &'e SuiteEnv,
    pub handle: SandboxHandle,
    pub config: SandboxConfig,
    cleaned: bool,
}

impl<'e> Sandbox<'e> {
    /// `create` over `project`; `Err` is the runtime's refusal, returned for the case to judge.
    pub async fn create(
        env: &'e SuiteEnv,
        project: &Project,
        controls: Controls,
    ) -> Result<Sandbox<'e>, RuntimeError> {
        let config = env.config(&project.root, &unique("sbx"), controls);
        let handle = create_placed(env, &config).await?;
        Ok(Sandbox {
            env,
            handle,
            config,
            cleaned: false,
        })
    }

    /// `ship` with a request carrying `input`.
    pub async fn ship(&self, input: Value) {
        let request = RequestBundle {
            request: json!({
                "status": "pending",
                "sandboxId": self.config.sandbox_id,
                "runtime": self.config.runtime.as_str(),
                "input": input,
            }),
        };
        self.env
            .runtime()
            .ship(&self.handle, &request)
            .await
            .unwrap_or_else(|e| panic!("ship failed: {}", e.report()));
    }

    /// `execute` of `argv` (panics on a runtime error: commands are outcomes, not errors).
    pub async fn exec(&self, argv: Vec<String>) -> Exec {
        self.exec_with(argv, CancellationToken::new())
            .await
            .unwrap_or_else(|e| panic!("execute failed: {}", e.report()))
    }

    /// `execute` with a caller-owned cancellation token; returns the runtime error, if any.
    pub async fn exec_with(
        &self,
        argv: Vec<String>,
        cancel: CancellationToken,
    ) -> Result<Exec, RuntimeError> {
        let output = Arc::new(Captured::default());
        let command = StepCommand {
            argv,
            cwd: None,
            stdin: Default::default(),
        };
        let outcome = self
            .env
            .runtime()
            .execute(&self.handle, &command, cancel, output.as_ref())
            .await?;
        if std::env::var_os(VERBOSE_ENV).is_some() {
            // For a person checking what the attacks really met, not for the assertions.
            println!(
                "[{}] {:?} exit={:?} signal={:?}",
                self.env.test_name, outcome.termination, outcome.exit_code, outcome.signal
            );
            for a in output.attempts() {
                println!("[{}]   {a}", self.env.test_name);
            }
        }
        Ok(Exec { outcome, output })
    }

    pub async fn collect(&self) -> Result<CollectReport, RuntimeError> {
        let r = self.env.runtime().collect(&self.handle).await;
        if std::env::var_os(VERBOSE_ENV).is_some() {
            match &r {
                Ok(report) => {
                    let readme = std::fs::read_to_string(report.bundle_path.join("README.md"))
                        .unwrap_or_default();
                    let cut = &readme[..readme.len().min(300)];
                    println!(
                        "[{}] collect ok: {} patches; README {} bytes: {}",
                        self.env.test_name,
                        report.patch_count,
                        readme.len(),
                        cut.replace('\n', " ")
                    );
                }
                Err(e) => println!("[{}] collect error: {}", self.env.test_name, e.report()),
            }
        }
        r
    }

    /// `cleanup`, which must succeed.
    pub async fn cleanup(&mut self) {
        self.cleaned = true;
        self.env
            .runtime()
            .cleanup(&self.handle)
            .await
            .unwrap_or_else(|e| panic!("cleanup failed: {}", e.report()));
    }
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // Best effort on the failure path: the case already panicked or returned early.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let runtime = self.env.runtime.clone();
            let handle = self.handle.clone();
            tokio::task::block_in_place(|| {
                let _ = rt.block_on(runtime.cleanup(&handle));
            });
        }
    }
}

/// Creates, ships and executes `argv` over a fresh project: the usual shape of a case.
/// `Err(Skip)` when the runtime is unavailable on this host.
pub async fn start<'e>(
    env: &'e SuiteEnv,
    project: &Project,
    controls: Controls,
) -> Result<Sandbox<'e>, Skip> {
    match Sandbox::create(env, project, controls).await {
        Ok(s) => Ok(s),
        Err(e) => Err(unavailable_or_panic(e)),
    }
}

/// `create` then `place`, as the orchestrator does (a fleet's lease is granted in `place`);
/// a sandbox whose place failed is cleaned up before the error is returned.
pub async fn create_placed(
    env: &SuiteEnv,
    config: &SandboxConfig,
) -> Result<SandboxHandle, RuntimeError> {
    let handle = env.runtime().create(config).await?;
    match env
        .runtime()
        .place(handle.clone(), &crate::types::NoPlacementEvents)
        .await
    {
        Ok((placed, _)) => Ok(placed),
        Err(e) => {
            let _ = env.runtime().cleanup(&handle).await;
            Err(e)
        }
    }
}

/// A runtime that is unavailable on this host is a skip; any other create error is a failure.
pub fn unavailable_or_panic(e: RuntimeError) -> Skip {
    match e {
        RuntimeError::Unavailable {
            runtime,
            reason,
            fix,
        } => Skip(format!(
            "the {runtime} runtime is unavailable here: {reason}{}",
            fix.map(|f| format!(" (fix: {f})")).unwrap_or_default()
        )),
        other => panic!("create failed unexpectedly: {}", other.report()),
    }
}

// ---------------------------------------------------------------------------------------------
// Host-side checks shared by both suites
// ---------------------------------------------------------------------------------------------

/// Host pids whose command line contains `marker` (zombies have none and are not counted).
pub fn host_marker_pids(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline
            .windows(marker.len())
            .any(|w| w == marker.as_bytes())
        {
            pids.push(pid);
        }
    }
    pids
}

/// Kills leftovers after a failed check so one failing case does not poison the host.
pub fn kill_host_pids(pids: &[u32]) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .arg("-9")
            .arg(pid.to_string())
            .status();
    }
}

/// Asserts no process carrying `marker` survives, killing any survivors after failing.
pub fn assert_no_marker_processes(marker: &str, when: &str) {
    let pids = host_marker_pids(marker);
    if !pids.is_empty() {
        let cmdlines: Vec<String> = pids
            .iter()
            .map(|p| {
                let raw = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                format!("{p}: {}", String::from_utf8_lossy(&raw).replace('\0', " "))
            })
            .collect();
        kill_host_pids(&pids);
        panic!("{when}: sandbox processes still alive on the host: {cmdlines:?}");
    }
}

/// A validated bundle: the manifest and the concatenated text of its patch files.
#[derive(Debug, Clone)]
pub struct BundleCheck {
    pub manifest: Value,
    pub patch_text: String,
    pub files: Vec<PathBuf>,
}

/// Checks a bundle directory against spec section 2 (independently of the bundle crate, so a
/// bug there cannot hide here): README.md a regular file ≤ 5 MiB holding a JSON object with a
/// valid status and a `patches` array; every patch path strictly inside `patches/`; no symlink
/// anywhere; total ≤ 100 MiB.
pub fn check_bundle(bundle: &Path) -> BundleCheck {
    let readme = bundle.join("README.md");
    let meta = std::fs::symlink_metadata(&readme)
        .unwrap_or_else(|e| panic!("bundle {} has no README.md: {e}", bundle.display()));
    assert!(
        meta.file_type().is_file(),
        "README.md must be a regular file"
    );
    assert!(meta.len() <= 5 * 1024 * 1024, "README.md exceeds 5 MiB");
    let text = std::fs::read_to_string(&readme).expect("read README.md");
    let manifest: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("README.md is not JSON: {e}\n{text}"));
    assert!(
        manifest.is_object(),
        "manifest must be an object: {manifest}"
    );
    let status = manifest["status"].as_str().unwrap_or_default();
    assert!(
        matches!(status, "finished" | "failed" | "cancelled"),
        "manifest status must be finished|failed|cancelled: {manifest}"
    );
    let patches = manifest["patches"]
        .as_array()
        .unwrap_or_else(|| panic!("manifest must have a patches array: {manifest}"));
    let mut files = Vec::new();
    let mut total = 0u64;
    let mut stack = vec![bundle.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read bundle dir") {
            let entry = entry.expect("bundle entry");
            let ft = entry.file_type().expect("file type");
            assert!(
                !ft.is_symlink(),
                "bundle contains a symlink: {}",
                entry.path().display()
            );
            if ft.is_dir() {
                stack.push(entry.path());
            } else {
                total += entry.metadata().map(|m| m.len()).unwrap_or(0);
                files.push(
                    entry
                        .path()
                        .strip_prefix(bundle)
                        .unwrap_or(&entry.path())
                        .to_path_buf(),
                );
            }
        }
    }
    assert!(total <= 100 * 1024 * 1024, "bundle exceeds 100 MiB");
    let mut patch_text = String::new();
    for p in patches {
        let p = p
            .as_str()
            .unwrap_or_else(|| panic!("patch entry not a string: {p}"));
        let rel = Path::new(p);
        let mut comps = rel.components();
        assert!(
            comps.next() == Some(Component::Normal("patches".as_ref()))
                && rel.components().count() > 1
                && rel.components().all(|c| matches!(c, Component::Normal(_))),
            "manifest patch path escapes patches/: {p}"
        );
        let text = std::fs::read(bundle.join(rel))
            .unwrap_or_else(|e| panic!("manifest names patch {p} that cannot be read: {e}"));
        patch_text.push_str(&String::from_utf8_lossy(&text));
        patch_text.push('\n');
    }
    files.sort();
    BundleCheck {
        manifest,
        patch_text,
        files,
    }
}

/// When an attack got through, the runtime must have said the protection was not in force:
/// in the outcome's enforcement report or in its probe. Returns the names found not enforced;
/// panics (naming the attempts) when the runtime claimed everything was enforced.
pub async fn assert_reported_not_enforced(
    env: &SuiteEnv,
    row: &str,
    protections: &[&str],
    outcome: Option<&ExecOutcome>,
    breaches: &[Value],
) {
    if breaches.is_empty() {
        return;
    }
    let probe = env.runtime().probe().await;
    let empty = EnforcementReport::default();
    let reports = [outcome.map(|o| &o.enforcement).unwrap_or(&empty), &probe];
    let admitted: Vec<String> = reports
        .iter()
        .flat_map(|r| r.protections.iter())
        .filter(|p| protections.contains(&p.name.as_str()))
        .filter(|p| p.status != ProtectionStatus::Enforced)
        .map(|p| format!("{}={:?} ({})", p.name, p.status, p.detail))
        .collect();
    if admitted.is_empty() {
        panic!(
            "{row}: the attack got through and the runtime did not report any of {protections:?} \
             as degraded/unavailable.\nbreaches: {}\nprobe: {}",
            serde_json::to_string_pretty(breaches).unwrap_or_default(),
            serde_json::to_string(&probe).unwrap_or_default()
        );
    }
    say(&format!(
        "{row}: not enforced on this host, and reported as such: {admitted:?}"
    ));
}

/// The attempts among `results` that got through (`"ok": true`).
pub fn breaches(results: &[Value]) -> Vec<Value> {
    results
        .iter()
        .filter(|v| v["ok"] == Value::Bool(true))
        .cloned()
        .collect()
}

/// Runs `argv` in a fresh sandbox with default controls, then collects and cleans up.
/// Returns the exec and the collect result.
pub async fn run_once(
    env: &SuiteEnv,
    project: &Project,
    controls: Controls,
    argv: Vec<String>,
) -> Result<(Exec, Result<CollectReport, RuntimeError>), Skip> {
    let mut sandbox = start(env, project, controls).await?;
    sandbox.ship(json!({})).await;
    let exec = sandbox.exec(argv).await;
    let collected = sandbox.collect().await;
    sandbox.cleanup().await;
    Ok((exec, collected))
}

/// A limit control was either refused up front with `ControlUnsupported` naming it (returns
/// `None`), or accepted (returns the sandbox). Any other create error fails the case.
pub async fn create_or_refused<'e>(
    env: &'e SuiteEnv,
    project: &Project,
    controls: Controls,
    control: &str,
) -> Result<Option<Sandbox<'e>>, Skip> {
    match Sandbox::create(env, project, controls).await {
        Ok(s) => Ok(Some(s)),
        Err(RuntimeError::ControlUnsupported {
            runtime,
            control: named,
            reason,
        }) => {
            let e = RuntimeError::ControlUnsupported {
                runtime,
                control: named,
                reason: reason.clone(),
            };
            assert_eq!(e.code(), ErrorCode::TaskRuntimeUnavailable);
            assert!(
                named
                    .to_ascii_lowercase()
                    .contains(&control.to_ascii_lowercase()),
                "refusal must name the control {control:?}, named {named:?}"
            );
            say(&format!(
                "{control}: refused by the runtime on this host: {reason}"
            ));
            Ok(None)
        }
        Err(e) => Err(unavailable_or_panic(e)),
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

// ---------------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------------

/// Calls `$callback!` with the list of conformance case names (the one list both the test macro
/// and [`CASES`] are generated from).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_case_list {
    ($callback:ident ! ( $($args:tt)* )) => {
        $crate::$callback! { $($args)* [
            exit_code_is_an_outcome,
            network_denied_by_default,
            write_outside_workspace_denied,
            host_tree_unchanged_and_changes_become_patches,
            request_and_result_paths,
            result_from_stdout,
            env_cleared_except_allowlist,
            memory_limit_enforced_or_refused,
            pids_limit_enforced_or_refused,
            cpu_limit_enforced_or_refused,
            timeout_kills_everything,
            cancellation_kills_everything,
            cleanup_idempotent_and_complete,
            cleanup_after_create_only,
            bundle_for_failed_run,
            create_refuses_invalid_controls,
            create_twice_is_an_error,
        ] }
    };
}

/// Expands to one `#[test]` per case of `$module` (`conformance` or `containment`).
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    ($make_env:path, $module:ident, [$($case:ident),* $(,)?]) => {
        $crate::__suite_tests!($make_env, $module, &[], [$($case),*]);
    };
    ($make_env:path, $module:ident, $known:expr, [$($case:ident),* $(,)?]) => {
        $(
            #[test]
            fn $case() {
                fn case(env: &$crate::conformance::SuiteEnv) -> $crate::conformance::CaseFuture<'_> {
                    ::std::boxed::Box::pin($crate::$module::$case(env))
                }
                let name = $crate::conformance::libtest_name(
                    concat!(module_path!(), "::", stringify!($case)),
                );
                $crate::conformance::run_case_with(&name, $make_env, case, $known);
            }
        )*
    };
}

/// Expands to one `#[test]` per conformance case, each running against the runtime that
/// `$make_env` (a `fn() -> SuiteEnv` or `fn() -> Result<SuiteEnv, Skip>`) returns.
#[macro_export]
macro_rules! conformance_tests {
    ($make_env:path) => {
        $crate::conformance_tests!($make_env, known_failures = []);
    };
    ($make_env:path, known_failures = [$($known:literal),* $(,)?]) => {
        $crate::__conformance_case_list!(__suite_tests!($make_env, conformance, &[$($known),*],));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_table {
    ($module:ident, [$($case:ident),* $(,)?]) => {
        &[$((stringify!($case), {
            fn case(env: &$crate::conformance::SuiteEnv) -> $crate::conformance::CaseFuture<'_> {
                ::std::boxed::Box::pin($crate::$module::$case(env))
            }
            case as $crate::conformance::CaseFn
        })),*]
    };
}

/// Every conformance case by name, for a backend that drives them itself.
pub const CASES: &[(&str, CaseFn)] = __conformance_case_list!(__case_table!(conformance,));

/// Runs every case in order (a single-test alternative to the macro); panics on the first
/// failure, returns the skipped cases with their reasons.
pub async fn run_all(env: &SuiteEnv) -> Vec<(&'static str, Skip)> {
    run_table(env, CASES).await
}

pub(crate) async fn run_table(
    env: &SuiteEnv,
    table: &[(&'static str, CaseFn)],
) -> Vec<(&'static str, Skip)> {
    let mut skipped = Vec::new();
    for (name, case) in table {
        if let Err(skip) = case(env).await {
            say(&format!("SKIP {name}: {}", skip.0));
            skipped.push((*name, skip));
        }
    }
    skipped
}

/// Echo and exit codes: a non-zero exit and a signal are outcomes, never errors; both streams
/// are captured; /workspace is the project.
pub async fn exit_code_is_an_outcome(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        sh("cat README.txt; echo to-stderr >&2; echo discarded > /dev/null; exit 7"),
    )
    .await?;
    let o = &exec.outcome;
    assert_eq!(
        o.termination,
        Termination::Exited,
        "{o:?}\n{}",
        exec.output.dump()
    );
    assert_eq!(o.exit_code, Some(7), "{o:?}");
    assert!(!o.succeeded());
    assert!(
        exec.output
            .stdout()
            .iter()
            .any(|l| l.contains("hello from the host project")),
        "/workspace must show the project; {}",
        exec.output.dump()
    );
    assert!(exec.output.stderr().iter().any(|l| l.contains("to-stderr")));

    let project = Project::new(env);
    let (exec, _) = run_once(env, &project, env.controls(), sh("echo fine")).await?;
    assert!(exec.outcome.succeeded(), "{:?}", exec.outcome);
    assert_eq!(exec.output.stdout(), vec!["fine".to_string()]);

    let project = Project::new(env);
    let (exec, _) = run_once(env, &project, env.controls(), sh("kill -KILL $$")).await?;
    assert_eq!(
        exec.outcome.termination,
        Termination::Signaled,
        "{:?}",
        exec.outcome
    );
    assert_eq!(exec.outcome.signal, Some(9));
    Ok(())
}

/// No network by default: no interface but loopback, no route (checked with a UDP `connect`,
/// which sends nothing), and a host TCP listener on 127.0.0.1 unreachable.
pub async fn network_denied_by_default(env: &SuiteEnv) -> CaseResult {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind host listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port().to_string();
    let project = Project::new(env);
    let (exec, _) = run_once(
        env,
        &project,
        env.controls(),
        project.attack_argv(&[
            "net-info",
            "+",
            "udp-route",
            "192.0.2.1",
            "53",
            "+",
            "udp-route",
            "2001:db8::1",
            "53",
            "+",
            "connect-tcp",
            "127.0.0.1",
            &port,
        ]),
    )
    .await?;
    let results = exec.output.attempts();
    assert_eq!(results.len(), 4, "{}", exec.output.dump());
    assert!(
        listener.accept().is_err(),
        "the host listener on 127.0.0.1:{port} accepted a connection from the sandbox"
    );
    assert_reported_not_enforced(
        env,
        "network",
        &["network"],
        Some(&exec.outcome),
        &breaches(&results),
    )
    .await;
    Ok(())
}

/// Writes outside /workspace, /result and /tmp fail; writes inside them work.
pub async fn write_outside_workspace_denied(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let name = unique("smithers-suite-write");
    let outside: Vec<String> = ["/etc", "/usr", "/"]
        .iter()
        .map(|d| format!("{}/{name}", d.trim_end_matches('/')))
        .collect();
    let mut args: Vec<String> = Vec::new();
    for p in &outside {
        args.extend(["write-file".into(), p.clone(), "x".into(), "+".into()]);
    }
    for p in [
        format!("{}/inside.txt", env.workspace_dir()),
        format!("/tmp/{name}"),
        "/result/inside.txt".to_string(),
    ] {
        args.extend(["write-file".into(), p, "x".into(), "+".into()]);
    }
    args.pop();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (exec, _) = run_once(env, &project, env.controls(), project.attack_argv(&args)).await?;
    let results = exec.attempts("write-file");
    assert_eq!(results.len(), 6, "{}", exec.output.dump());
    let (denied, allowed) = results.split_at(3);
    for r in allowed {
        assert_eq!(r["ok"], true, "writing inside must work: {r}");
    }
    // The sandbox's /tmp is its own: the file written there must not be on the host's /tmp.
    let host_tmp = format!("/tmp/{name}");
    let appeared: Vec<&String> = outside
        .iter()
        .chain(std::iter::once(&host_tmp))
        .filter(|p| Path::new(p).exists())
        .collect();
    for p in &appeared {
        let _ = std::fs::remove_file(p);
    }
    assert!(
        appeared.is_empty(),
        "files appeared on the host after the sandbox wrote them: {appeared:?}"
    );
    assert_reported_not_enforced(
        env,
        "write outside workspace",
        &["filesystem", "landlock", "mount-namespace"],
        Some(&exec.outcome),
        &breaches(denied),
    )
    .await;
    Ok(())
}

/// The host project is byte-identical after a run that changed /workspace, and the changes
/// (modify, add, delete) are in the bundle's patches.
pub async fn host_tree_unchanged_and_changes_become_patches(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = project.snapshot();
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        sh(
            "echo changed-by-sandbox >> README.txt && echo brand-new > new-file.txt \
            && rm src/gone.txt && mkdir -p made/deep && echo deep > made/deep/f.txt",
        ),
    )
    .await?;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    before.assert_same(
        &project.snapshot(),
        "the host project changed before any patch was applied",
    );
    let report = collected.unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(bundle.manifest["status"], "finished", "{}", bundle.manifest);
    assert!(report.patch_count >= 1, "{report:?}");
    for needle in [
        "README.txt",
        "changed-by-sandbox",
        "new-file.txt",
        "brand-new",
        "src/gone.txt",
        "made/deep/f.txt",
    ] {
        assert!(
            bundle.patch_text.contains(needle),
            "patches do not mention {needle:?}:\n{}",
            bundle.patch_text
        );
    }
    assert!(
        !bundle.patch_text.contains("smithers-attack"),
        "an unchanged file appeared in the patches"
    );
    Ok(())
}

/// The request JSON is readable at $SMITHERS_SANDBOX_REQUEST_PATH; the result JSON written at
/// $SMITHERS_SANDBOX_RESULT_PATH is picked up (outcome and bundle outputs).
pub async fn request_and_result_paths(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let nonce = unique("input");
    let mut sandbox = start(env, &project, env.controls()).await?;
    sandbox.ship(json!({ "nonce": nonce })).await;
    let exec = sandbox
        .exec(sh("cat \"$SMITHERS_SANDBOX_REQUEST_PATH\"; echo; \
             printf '%s' '{\"status\":\"finished\",\"outputs\":{\"answer\":42}}' \
             > \"$SMITHERS_SANDBOX_RESULT_PATH\""))
        .await;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    let printed = exec.output.stdout().join("\n");
    assert!(
        printed.contains(&nonce),
        "request JSON not readable inside: {printed}"
    );
    // The whole stdout is the request file (compact or pretty-printed, both fine).
    let request: Value = serde_json::from_str(printed.trim())
        .unwrap_or_else(|e| panic!("request is not JSON ({e}): {printed}"));
    assert_eq!(request["input"]["nonce"], nonce.as_str());
    assert_eq!(request["sandboxId"], sandbox.config.sandbox_id.as_str());
    let result = exec.outcome.result.clone().expect("result JSON picked up");
    assert_eq!(result["outputs"]["answer"], 42, "{result}");
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(
        bundle.manifest["outputs"]["answer"], 42,
        "{}",
        bundle.manifest
    );
    assert_eq!(bundle.manifest["status"], "finished");
    sandbox.cleanup().await;
    Ok(())
}

/// A result JSON printed as the step's stdout is picked up.
pub async fn result_from_stdout(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        sh("echo '{\"status\":\"finished\",\"outputs\":{\"via\":\"stdout\"}}'"),
    )
    .await?;
    let result = exec
        .outcome
        .result
        .clone()
        .unwrap_or_else(|| panic!("stdout result not picked up: {:?}", exec.outcome));
    assert_eq!(result["outputs"]["via"], "stdout");
    let report = collected.unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(
        bundle.manifest["outputs"]["via"], "stdout",
        "{}",
        bundle.manifest
    );
    Ok(())
}

/// The environment is cleared but for the allowlist and the step's own env: a host variable
/// (a secret) set in the test process is not visible.
pub async fn env_cleared_except_allowlist(env: &SuiteEnv) -> CaseResult {
    let secret = host_secret();
    let project = Project::new(env);
    let mut controls = env.controls();
    controls.env.insert("STEP_VAR".into(), "step-value".into());
    let (exec, _) = run_once(env, &project, controls, project.attack_argv(&["env"])).await?;
    let inside = exec.attempt("env")["env"].clone();
    let inside = inside.as_object().expect("env object");
    assert_eq!(inside.get("STEP_VAR"), Some(&json!("step-value")));
    assert!(
        inside.contains_key("SMITHERS_SANDBOX_REQUEST_PATH")
            && inside.contains_key("SMITHERS_SANDBOX_RESULT_PATH"),
        "request/result path variables missing: {inside:?}"
    );
    assert!(
        !inside.values().any(|v| v.as_str() == Some(secret.as_str())),
        "the host secret is visible inside"
    );
    let leaked: Vec<&String> = std::env::vars()
        .filter(|(k, v)| {
            !ENV_ALLOWLIST.contains(&k.as_str())
                && !k.starts_with("SMITHERS_SANDBOX_")
                && inside.get(k).and_then(Value::as_str) == Some(v.as_str())
        })
        .filter_map(|(k, _)| inside.keys().find(|ik| **ik == k))
        .collect();
    assert!(
        leaked.is_empty(),
        "host variables leaked into the sandbox: {leaked:?}"
    );
    Ok(())
}

/// A memory limit is enforced (a hog ends as `Memory`) or refused.
pub async fn memory_limit_enforced_or_refused(env: &SuiteEnv) -> CaseResult {
    memory_hog_case(env, "memory limit").await
}

pub(crate) async fn memory_hog_case(env: &SuiteEnv, row: &str) -> CaseResult {
    let project = Project::new(env);
    let mut controls = env.controls();
    controls.memory_limit_bytes = Some(64 << 20);
    let Some(mut sandbox) = create_or_refused(env, &project, controls, "memory").await? else {
        return Ok(());
    };
    sandbox.ship(json!({})).await;
    let exec = sandbox
        .exec(project.attack_argv(&["memory-hog", "1024"]))
        .await;
    assert!(
        exec.attempts("memory-hog").is_empty(),
        "{row}: the hog allocated 1 GiB under a 64 MiB limit: {:?}",
        exec.outcome
    );
    assert_eq!(
        exec.outcome.termination,
        Termination::Memory,
        "{row}: the outcome must report the memory limit: {:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect after OOM failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(bundle.manifest["status"], "failed", "{}", bundle.manifest);
    sandbox.cleanup().await;
    Ok(())
}

/// A pids limit is enforced (a fork bomb is capped, reported as `Pids`) or refused.
pub async fn pids_limit_enforced_or_refused(env: &SuiteEnv) -> CaseResult {
    fork_bomb_case(env, "pids limit").await
}

pub(crate) async fn fork_bomb_case(env: &SuiteEnv, row: &str) -> CaseResult {
    let project = Project::new(env);
    let mut controls = env.controls();
    controls.pids_limit = Some(32);
    let Some(mut sandbox) = create_or_refused(env, &project, controls, "pids").await? else {
        return Ok(());
    };
    sandbox.ship(json!({})).await;
    let exec = sandbox
        .exec(project.attack_argv(&["fork-bomb", "5000"]))
        .await;
    let bomb = exec.attempt("fork-bomb");
    assert_eq!(bomb["ok"], false, "{row}: 5000 forks under pids=32: {bomb}");
    let forked = bomb["forked"].as_u64().unwrap_or(u64::MAX);
    assert!(forked < 32, "{row}: {forked} processes under a limit of 32");
    assert_eq!(
        exec.outcome.termination,
        Termination::Pids,
        "{row}: the outcome must report the pids limit: {:?}",
        exec.outcome
    );
    sandbox.cleanup().await;
    Ok(())
}

/// A CPU limit is accepted and shown in the enforcement report, or refused. (Enforcement of a
/// share of CPU time is a timing property, measured by the benchmark, not asserted here.)
pub async fn cpu_limit_enforced_or_refused(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let mut controls = env.controls();
    controls.cpu_limit = Some(0.5);
    let Some(mut sandbox) = create_or_refused(env, &project, controls, "cpu").await? else {
        return Ok(());
    };
    sandbox.ship(json!({})).await;
    let exec = sandbox.exec(sh("true")).await;
    assert!(exec.outcome.succeeded(), "{:?}", exec.outcome);
    let cpu = exec
        .outcome
        .enforcement
        .protections
        .iter()
        .find(|p| p.name.contains("cpu"))
        .unwrap_or_else(|| {
            panic!(
                "a cpu limit was accepted but the enforcement report does not mention it: {:?}",
                exec.outcome.enforcement
            )
        });
    assert!(
        matches!(
            cpu.status,
            ProtectionStatus::Enforced | ProtectionStatus::Degraded
        ),
        "accepted cpu limit reported as {:?}",
        cpu.status
    );
    sandbox.cleanup().await;
    Ok(())
}

/// The timeout ends the run as `Timeout`, kills every process (daemons, setsid, SIGTERM-
/// ignoring ones) before execute returns, and a bundle is still produced.
pub async fn timeout_kills_everything(env: &SuiteEnv) -> CaseResult {
    outlive_case(env, "timeout", true).await
}

pub(crate) async fn outlive_case(env: &SuiteEnv, row: &str, wait: bool) -> CaseResult {
    if !env.host_processes_visible() {
        return Err(Skip::new(
            "sandbox processes are not visible in this host's /proc",
        ));
    }
    let project = Project::new(env);
    let marker = unique("smithers-suite-marker");
    let mut controls = env.controls();
    controls.timeout_ms = Some(3_000);
    let mut sandbox = start(env, &project, controls).await?;
    sandbox.ship(json!({})).await;
    let mut args = vec!["daemonize", marker.as_str(), "600"];
    if wait {
        args.extend(["+", "sleep", marker.as_str(), "600"]);
    }
    let exec = sandbox.exec(project.attack_argv(&args)).await;
    assert_no_marker_processes(&marker, &format!("{row}: when execute returned"));
    let d = exec.attempt("daemonize");
    assert_eq!(d["ok"], true, "the daemons were not started: {d}");
    if wait {
        assert_eq!(
            exec.outcome.termination,
            Termination::Timeout,
            "{row}: {:?}",
            exec.outcome
        );
    } else {
        assert!(exec.outcome.succeeded(), "{row}: {:?}", exec.outcome);
    }
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect after {row} failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    let expected = if wait { "failed" } else { "finished" };
    assert_eq!(bundle.manifest["status"], expected, "{}", bundle.manifest);
    sandbox.cleanup().await;
    assert_no_marker_processes(&marker, &format!("{row}: after cleanup"));
    Ok(())
}

/// Cancelling the token ends the run as `Cancelled`, kills every process, and the bundle says
/// `cancelled`.
pub async fn cancellation_kills_everything(env: &SuiteEnv) -> CaseResult {
    if !env.host_processes_visible() {
        return Err(Skip::new(
            "sandbox processes are not visible in this host's /proc",
        ));
    }
    let project = Project::new(env);
    let marker = unique("smithers-suite-marker");
    let mut sandbox = start(env, &project, env.controls()).await?;
    sandbox.ship(json!({})).await;
    let cancel = CancellationToken::new();
    let output = Arc::new(Captured::default());
    let command = StepCommand {
        argv: project.attack_argv(&["daemonize", &marker, "600", "+", "sleep", &marker, "600"]),
        cwd: None,
        stdin: Default::default(),
    };
    let execute = env
        .runtime()
        .execute(&sandbox.handle, &command, cancel.clone(), output.as_ref());
    let canceller = async {
        let ready = output
            .wait_for_stdout("\"ready\":true", Duration::from_secs(60))
            .await;
        cancel.cancel();
        ready
    };
    let (outcome, ready) = tokio::join!(execute, canceller);
    let outcome = outcome.unwrap_or_else(|e| panic!("execute failed: {}", e.report()));
    assert!(ready, "the command never got ready: {}", output.dump());
    assert_eq!(outcome.termination, Termination::Cancelled, "{outcome:?}");
    assert_no_marker_processes(&marker, "cancellation: when execute returned");
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect after cancellation failed: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(
        bundle.manifest["status"], "cancelled",
        "{}",
        bundle.manifest
    );
    sandbox.cleanup().await;
    Ok(())
}

/// Absolute paths in the handle's backend state that belong to this sandbox: those containing
/// its id, and cgroup directories (other than this process's own): what a backend created on
/// the host for it.
fn backend_paths(handle: &SandboxHandle) -> Vec<PathBuf> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(o) => o.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut strings = Vec::new();
    walk(&handle.backend, &mut strings);
    // Our own cgroups (a backend may record the parent it created its groups under).
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let own_cgroup = |s: &str| {
        Path::new(s)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| own.contains(&format!("/{n}")))
    };
    strings
        .into_iter()
        .filter(|s| s.starts_with('/'))
        .filter(|s| {
            s.contains(&handle.sandbox_id)
                || (s.starts_with("/sys/fs/cgroup/")
                    && s.len() > "/sys/fs/cgroup/".len()
                    && !own_cgroup(s))
        })
        .map(PathBuf::from)
        .collect()
}

/// Everything under `dir` that is not inside `keep`.
fn leftovers(dir: &Path, keep: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.starts_with(keep) {
                continue;
            }
            if keep.starts_with(&path) {
                // An ancestor of the bundle: allowed, look inside.
                stack.push(path);
                continue;
            }
            out.push(path);
        }
    }
    out
}

/// Cleanup twice is fine, works from a handle read back from JSON (another process), leaves
/// no process and nothing of the sandbox on the host but the bundle.
pub async fn cleanup_idempotent_and_complete(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let marker = unique("smithers-suite-marker");
    let mut sandbox = start(env, &project, env.controls()).await?;
    sandbox.ship(json!({})).await;
    let exec = sandbox
        .exec(project.attack_argv(&[
            "daemonize",
            &marker,
            "600",
            "+",
            "write-file",
            &format!("/tmp/{marker}"),
            "x",
            "+",
            "write-file",
            &format!("{}/added.txt", env.workspace_dir()),
            "x",
        ]))
        .await;
    assert!(
        exec.outcome.succeeded(),
        "{:?}\n{}",
        exec.outcome,
        exec.output.dump()
    );
    if env.host_processes_visible() {
        assert_no_marker_processes(&marker, "cleanup: when execute returned");
    }
    let report = sandbox
        .collect()
        .await
        .unwrap_or_else(|e| panic!("collect failed: {}", e.report()));
    let paths = backend_paths(&sandbox.handle);
    if std::env::var_os(VERBOSE_ENV).is_some() {
        println!(
            "[{}] sandbox root {} and backend paths checked after cleanup: {paths:?}",
            env.test_name,
            sandbox.handle.sandbox_root.display()
        );
    }
    let json = serde_json::to_string(&sandbox.handle).expect("handle serialises");
    sandbox.cleanup().await;
    sandbox.cleanup().await;
    let reread: SandboxHandle = serde_json::from_str(&json).expect("handle deserialises");
    env.runtime()
        .cleanup(&reread)
        .await
        .unwrap_or_else(|e| panic!("cleanup from a re-read handle failed: {}", e.report()));
    check_bundle(&report.bundle_path);
    let left = leftovers(&sandbox.handle.sandbox_root, &report.bundle_path);
    assert!(
        left.is_empty(),
        "cleanup left host state of the sandbox behind: {left:?}"
    );
    let left: Vec<&PathBuf> = paths
        .iter()
        .filter(|p| !p.starts_with(&report.bundle_path) && !report.bundle_path.starts_with(p))
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    assert!(
        left.is_empty(),
        "backend paths still exist after cleanup: {left:?}"
    );
    Ok(())
}

/// Cleanup right after create (nothing ran) works twice and leaves nothing.
pub async fn cleanup_after_create_only(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = project.snapshot();
    let mut sandbox = start(env, &project, env.controls()).await?;
    let paths = backend_paths(&sandbox.handle);
    sandbox.cleanup().await;
    sandbox.cleanup().await;
    let left: Vec<&PathBuf> = paths
        .iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    assert!(
        left.is_empty(),
        "backend paths still exist after cleanup: {left:?}"
    );
    let left = leftovers(&sandbox.handle.sandbox_root, &sandbox.handle.result_path);
    assert!(left.is_empty(), "cleanup left: {left:?}");
    before.assert_same(&project.snapshot(), "create + cleanup changed the project");
    Ok(())
}

/// A failed run still produces a valid bundle with status `failed`.
pub async fn bundle_for_failed_run(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let (exec, collected) = run_once(
        env,
        &project,
        env.controls(),
        sh("echo partial > partial.txt; exit 3"),
    )
    .await?;
    assert_eq!(exec.outcome.exit_code, Some(3));
    let report = collected.unwrap_or_else(|e| panic!("collect of a failed run: {}", e.report()));
    let bundle = check_bundle(&report.bundle_path);
    assert_eq!(bundle.manifest["status"], "failed", "{}", bundle.manifest);
    assert!(bundle.patch_text.contains("partial.txt"));
    Ok(())
}

/// `create` refuses invalid controls with INVALID_INPUT before touching anything.
pub async fn create_refuses_invalid_controls(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let before = TreeSnapshot::of(&project.root, &[]);
    let mut bad_env = env.controls();
    bad_env.env.insert("1BAD-KEY".into(), "x".into());
    let mut bad_volume = env.controls();
    bad_volume.volumes.push(crate::VolumeMount {
        host: project.outside.clone(),
        container: "/workspace/shadow".into(),
        readonly: true,
    });
    let mut bad_memory = env.controls();
    bad_memory.memory_limit_bytes = Some(0);
    let mut bad_ports = env.controls();
    bad_ports.ports.push(crate::PortMapping {
        host: 8080,
        container: 80,
    });
    let cases = [
        (
            "env key",
            env.config(&project.root, &unique("sbx"), bad_env),
        ),
        (
            "volume over /workspace",
            env.config(&project.root, &unique("sbx"), bad_volume),
        ),
        (
            "zero memory",
            env.config(&project.root, &unique("sbx"), bad_memory),
        ),
        (
            "ports without network",
            env.config(&project.root, &unique("sbx"), bad_ports),
        ),
        (
            "sandbox id",
            env.config(&project.root, "../escape", env.controls()),
        ),
    ];
    for (what, config) in cases {
        match env.runtime().create(&config).await {
            Ok(handle) => {
                let _ = env.runtime().cleanup(&handle).await;
                panic!("create accepted an invalid {what}");
            }
            Err(e) => assert_eq!(
                e.code(),
                ErrorCode::InvalidInput,
                "invalid {what}: expected INVALID_INPUT, got {}",
                e.report()
            ),
        }
    }
    before.assert_same(
        &TreeSnapshot::of(&project.root, &[]),
        "create wrote to the project before refusing",
    );
    Ok(())
}

/// `create` twice for the same entity id is an error, not a reuse.
pub async fn create_twice_is_an_error(env: &SuiteEnv) -> CaseResult {
    let project = Project::new(env);
    let mut sandbox = start(env, &project, env.controls()).await?;
    let again = env.runtime().create(&sandbox.config).await;
    if let Ok(handle) = &again {
        if handle.sandbox_root != sandbox.handle.sandbox_root {
            let _ = env.runtime().cleanup(handle).await;
        }
    }
    assert!(again.is_err(), "create accepted the same entity id twice");
    sandbox.cleanup().await;
    Ok(())
}

/// Names of protections each kind of breach must be reported under when not enforced.
pub const PROTECTION_NAMES: &[(&str, &[&str])] = &[
    ("network", &["network"]),
    ("filesystem", &["filesystem", "landlock", "mount-namespace"]),
    ("processes", &["pid-namespace"]),
    (
        "privileges",
        &["seccomp", "no-new-privs", "capabilities", "user-namespace"],
    ),
    ("devices", &["devices"]),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_names_drop_the_crate() {
        assert_eq!(libtest_name("containment::row13_x"), "row13_x");
        assert_eq!(libtest_name("conformance::native::case"), "native::case");
        assert_eq!(libtest_name("bare"), "bare");
    }

    #[test]
    fn snapshots_see_every_kind_of_change() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a"), "1").unwrap();
        std::fs::create_dir(root.join(".smithers")).unwrap();
        let before = TreeSnapshot::of(root, &[".smithers"]);
        assert!(before
            .diff(&TreeSnapshot::of(root, &[".smithers"]))
            .is_empty());
        std::fs::write(root.join(".smithers/state"), "ignored").unwrap();
        assert!(before
            .diff(&TreeSnapshot::of(root, &[".smithers"]))
            .is_empty());
        std::fs::write(root.join("a"), "2").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("l")).unwrap();
        let diff = before.diff(&TreeSnapshot::of(root, &[".smithers"]));
        assert_eq!(diff.len(), 2, "{diff:?}");
        assert!(diff[0].starts_with("changed a"));
        assert!(diff[1].starts_with("added l"));
    }

    fn bundle(manifest: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("patches")).unwrap();
        std::fs::write(dir.path().join("patches/0.patch"), "--- a/x\n+++ b/x\n").unwrap();
        std::fs::write(dir.path().join("README.md"), manifest).unwrap();
        dir
    }

    #[test]
    fn a_valid_bundle_passes() {
        let b = bundle(r#"{"outputs":{},"status":"finished","patches":["patches/0.patch"]}"#);
        let check = check_bundle(b.path());
        assert!(check.patch_text.contains("+++ b/x"));
        assert_eq!(check.files.len(), 2);
    }

    #[test]
    #[should_panic(expected = "escapes patches/")]
    fn an_escaping_patch_path_fails() {
        let b = bundle(r#"{"status":"finished","patches":["patches/../README.md"]}"#);
        check_bundle(b.path());
    }

    #[test]
    #[should_panic(expected = "symlink")]
    fn a_symlink_in_the_bundle_fails() {
        let b = bundle(r#"{"status":"failed","patches":[]}"#);
        std::os::unix::fs::symlink("/etc/passwd", b.path().join("patches/leak")).unwrap();
        check_bundle(b.path());
    }

    #[test]
    #[should_panic(expected = "status")]
    fn a_bad_status_fails() {
        let b = bundle(r#"{"status":"done","patches":[]}"#);
        check_bundle(b.path());
    }

    #[test]
    fn case_tables_list_every_case_once() {
        let names: Vec<&str> = CASES.iter().map(|(n, _)| *n).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(names.len(), unique.len());
        assert_eq!(crate::containment::CASES.len(), 17);
        for (i, (name, _)) in crate::containment::CASES.iter().enumerate() {
            assert!(name.starts_with(&format!("row{:02}_", i + 1)), "{name}");
        }
    }
}
