//! Running one case: the tokio runtime, the known-failure rule, the host secret and the
//! unique markers every case uses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{say, CaseFn, IntoSuiteEnv, Skip, HOST_SECRET_ENV};
use crate::skip::skip_or_fail_as;

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
        skip_or_fail_as(test_name, &reason);
    }
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
