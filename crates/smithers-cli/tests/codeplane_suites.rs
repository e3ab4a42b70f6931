//! The shared conformance and containment suites (`smithers_test_support::conformance`,
//! `smithers_test_support::containment`) against the `codeplane` runtime: every case talks HTTP to a
//! real `smithers-sandbox serve` child process on 127.0.0.1 — the product binary, whose runtime
//! is the native namespace runtime — so the step really runs isolated, across the wire, in
//! another process than the client. One server per test process (started by the first case
//! and stopped when the test binary exits); row 11 gets a server of its own so the peak memory
//! it bounds is the host's under that row alone.
//!
//! * Row 11 bounds the peak RSS of the server process (`SuiteEnv::with_host_pid`), which
//!   receives the flood, not of this test process.
//! * Row 13 re-executes this test binary as the orchestrator; it reaches the same server
//!   (`SuiteEnv::with_helper_env`), starts a step and is SIGKILLed. The server notices that
//!   nobody follows the step any more (its event stream closed) and cancels it after
//!   `--orphan-timeout-ms`, as a local step dies with its orchestrator; cleanup from the stored
//!   handle then removes it.
//!
//! When the native runtime is unusable on this machine the server answers 503 and the cases
//! print `SKIP` (and fail under `CI=true`).

mod support;

use std::sync::{Arc, OnceLock};

use smithers_runtime_remote::{RemoteOptions, RemoteRuntime};
use smithers_test_support::conformance::{Skip, SuiteEnv};
use support::serve::{data_dir, keep_for_process, ServeOptions};

const TOKEN: &str = "conformance-token-0123456789";

/// `<url> <pid>` of the shared server, for row 13's re-executed orchestrator.
const HOST_ENV: &str = "SMITHERS_CODEPLANE_SUITE_HOST";

/// The server's orphan timeout: short, so row 13's killed client is noticed well within the
/// row's wait; long enough that a live client (which opens its event stream right after
/// execute is accepted) is never taken for gone on a busy machine.
const ORPHAN_TIMEOUT_MS: &str = "5000";

fn start(name: &str) -> Result<(String, u32), String> {
    let data = data_dir(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), name);
    let (addr, pid) = keep_for_process(ServeOptions {
        token: TOKEN.into(),
        data_dir: data,
        args: vec![
            "--orphan-timeout-ms".into(),
            ORPHAN_TIMEOUT_MS.into(),
            "--keepalive-ms".into(),
            "1000".into(),
        ],
        env: Vec::new(),
        wrapper: Vec::new(),
    })?;
    Ok((format!("http://{addr}"), pid))
}

/// The server of this test process, or the one of the process that re-executed us.
fn shared_host() -> Result<(String, u32), String> {
    static HOST: OnceLock<Result<(String, u32), String>> = OnceLock::new();
    HOST.get_or_init(|| {
        if let Ok(given) = std::env::var(HOST_ENV) {
            let (url, pid) = given
                .split_once(' ')
                .ok_or_else(|| format!("malformed {HOST_ENV}: {given:?}"))?;
            let pid = pid
                .parse()
                .map_err(|_| format!("malformed {HOST_ENV}: {given:?}"))?;
            return Ok((url.to_string(), pid));
        }
        start("codeplane-suites")
    })
    .clone()
}

/// Row 11's own server.
fn row11_host() -> Result<(String, u32), String> {
    static HOST: OnceLock<Result<(String, u32), String>> = OnceLock::new();
    HOST.get_or_init(|| start("codeplane-row11")).clone()
}

fn env_for((url, pid): (String, u32)) -> Result<SuiteEnv, Skip> {
    let runtime = RemoteRuntime::new(RemoteOptions::new(&url, TOKEN))
        .map_err(|e| Skip::new(e.to_string()))?;
    Ok(SuiteEnv::new(Arc::new(runtime))
        .with_host_pid(pid)
        .with_helper_env(HOST_ENV, format!("{url} {pid}")))
}

pub(crate) fn env() -> Result<SuiteEnv, Skip> {
    env_for(shared_host().map_err(Skip::new)?)
}

pub(crate) fn row11_env() -> Result<SuiteEnv, Skip> {
    env_for(row11_host().map_err(Skip::new)?)
}

mod conformance {
    smithers_test_support::conformance_tests!(crate::env);
}

mod containment {
    use smithers_test_support::__suite_tests;

    /// The rows that share the one server: every row of the suite but row 11 (below). The
    /// list is written out because row 11 needs an environment of its own; the test
    /// `every_row_runs` fails when the suite gains a row this list lacks.
    macro_rules! shared_rows {
        ($($row:ident),* $(,)?) => {
            __suite_tests!(crate::env, containment, &[], [$($row),*]);
            const SHARED_ROWS: &[&str] = &[$(stringify!($row)),*];
        };
    }

    shared_rows!(
        row01_host_loopback_unreachable,
        row02_no_route_outside,
        row03_host_project_tree_untouched,
        row04_system_dirs_read_only,
        row05_host_secrets_invisible,
        row06_host_processes_invisible,
        row07_privilege_gain_denied,
        row08_fork_bomb_capped,
        row09_memory_hog_killed,
        row10_disk_fill_capped,
        row12_outlive_timeout,
        row13_survive_host_kill,
        row14_symlink_to_host_file,
        row15_result_path_escapes_rejected,
        row16_bundle_bomb_rejected,
        row17_devices_denied,
    );

    #[test]
    fn every_row_runs() {
        let mut here: Vec<&str> = SHARED_ROWS.to_vec();
        here.push("row11_output_flood_capped");
        here.sort_unstable();
        let mut suite: Vec<&str> = smithers_test_support::containment::CASES
            .iter()
            .map(|(name, _)| *name)
            .collect();
        suite.sort_unstable();
        assert_eq!(
            here, suite,
            "the codeplane suite must run every containment row"
        );
    }

    /// Row 11 against a server of its own: the high-water mark of its memory is then the
    /// flood's doing or nobody's, not that of the other cases' uploads and bundles.
    #[test]
    fn row11_output_flood_capped() {
        fn case(
            env: &smithers_test_support::conformance::SuiteEnv,
        ) -> smithers_test_support::conformance::CaseFuture<'_> {
            Box::pin(smithers_test_support::containment::row11_output_flood_capped(env))
        }
        smithers_test_support::conformance::run_case(
            "containment::row11_output_flood_capped",
            crate::row11_env,
            case,
        );
    }
}
