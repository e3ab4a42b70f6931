//! The shared conformance and containment suites (`smithers_runtime::conformance`,
//! `smithers_runtime::containment`) against the codeplane runtime: each case talks HTTP to a real sandbox host on 127.0.0.1 whose runtime is the
//! native namespace runtime, so the step really runs isolated, across the wire. One host per
//! test process, on a thread of its own (each case builds and drops its own tokio runtime).
//!
//! The host needs the native runtime's init binary: `$SMITHERS_SANDBOX_INIT`, or
//! `smithers-sandbox-init` next to this test binary, or else it is built once with cargo into
//! a target directory of its own. When the native runtime is unusable on this machine the
//! host answers 503 and the cases print `SKIP` (and fail under `CI=true`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use smithers_runtime::conformance::{Skip, SuiteEnv};
use smithers_runtime_native::{InitCommand, NativeOptions, NativeRuntime};
use smithers_runtime_remote::{RemoteOptions, RemoteRuntime};
use smithers_server::{Limits, SandboxServer, ServerConfig};

const TOKEN: &str = "conformance-token-0123456789";

fn init_command() -> Result<InitCommand, String> {
    if let Ok(found) = InitCommand::locate() {
        return Ok(found);
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/deps/<test> → target/suite-init
    let target = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|t| t.join("suite-init"))
        .unwrap_or_else(|| std::env::temp_dir().join("smithers-suite-init"));
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../smithers-runtime-native/Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--bin",
            "smithers-sandbox-init",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .map_err(|e| format!("cannot run cargo to build smithers-sandbox-init: {e}"))?;
    let bin: PathBuf = target.join("debug").join("smithers-sandbox-init");
    if status.success() && bin.is_file() {
        Ok(InitCommand::binary(bin))
    } else {
        Err(format!("building smithers-sandbox-init failed ({status})"))
    }
}

/// The host, started once per test process.
fn host() -> Result<SocketAddr, String> {
    static HOST: OnceLock<Result<SocketAddr, String>> = OnceLock::new();
    HOST.get_or_init(|| {
        let init = init_command()?;
        let data = tempfile::tempdir().map_err(|e| e.to_string())?.keep();
        let runtime = Arc::new(NativeRuntime::new(NativeOptions {
            init: Some(init),
            ..NativeOptions::default()
        }));
        let server = SandboxServer::new(
            ServerConfig {
                token: Some(TOKEN.into()),
                data_dir: data,
                limits: Limits::default(),
                shutdown_grace: Duration::from_secs(5),
            },
            runtime,
        )
        .map_err(|e| e.to_string())?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("host runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let _ = server.serve(listener, std::future::pending()).await;
            });
        });
        Ok(addr)
    })
    .clone()
}

fn make_env() -> Result<SuiteEnv, Skip> {
    let addr = host().map_err(Skip::new)?;
    let runtime = RemoteRuntime::new(RemoteOptions::new(format!("http://{addr}"), TOKEN))
        .map_err(|e| Skip::new(e.to_string()))?;
    Ok(SuiteEnv::new(Arc::new(runtime)))
}

pub(crate) fn env() -> Result<SuiteEnv, Skip> {
    make_env()
}

mod conformance {
    smithers_runtime::conformance_tests!(crate::env);
}

mod containment {
    use smithers_runtime::__suite_tests;

    __suite_tests!(
        crate::env,
        containment,
        &[],
        [
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
            row14_symlink_to_host_file,
            row15_result_path_escapes_rejected,
            row16_bundle_bomb_rejected,
            row17_devices_denied,
        ]
    );

    fn run(name: &str, case: smithers_runtime::conformance::CaseFn) {
        smithers_runtime::conformance::run_case(name, crate::env, case);
    }

    /// Row 11 measures the peak RSS of the whole test process, which here also hosts the
    /// sandbox host serving every other case in parallel (bundles, patches, uploads): the
    /// high-water mark belongs to them, not to output buffering. It passes run alone:
    /// `cargo test -p smithers-runtime-remote --test suites -- --ignored row11`.
    #[test]
    #[ignore = "peak RSS of a process shared with the in-process host and every other case; run alone with --ignored"]
    fn row11_output_flood_capped() {
        fn case(
            env: &smithers_runtime::conformance::SuiteEnv,
        ) -> smithers_runtime::conformance::CaseFuture<'_> {
            Box::pin(smithers_runtime::containment::row11_output_flood_capped(
                env,
            ))
        }
        run("containment::row11_output_flood_capped", case);
    }

    /// Row 13 kills the re-executed test binary acting as orchestrator; in this harness that
    /// process also holds its own in-process host, so the host dies too and the parent cannot
    /// clean up through it. With a separate host, a killed client's sandbox is cancelled by the
    /// host's orphan timeout (no event follower for `ServerConfig::orphan_timeout`), tested in
    /// smithers-server's `orphaned_step_is_cancelled`.
    #[test]
    #[ignore = "the re-executed orchestrator carries its own in-process host; see doc comment"]
    fn row13_survive_host_kill() {
        fn case(
            env: &smithers_runtime::conformance::SuiteEnv,
        ) -> smithers_runtime::conformance::CaseFuture<'_> {
            Box::pin(smithers_runtime::containment::row13_survive_host_kill(env))
        }
        run("containment::row13_survive_host_kill", case);
    }
}
