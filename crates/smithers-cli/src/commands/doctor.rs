//! `smithers-sandbox doctor`: what the native runtime can enforce on this host, found by
//! actually trying each mechanism in throwaway namespaces; `--runtime docker` asks the Docker
//! engine instead.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use smithers_runtime::{ProtectionStatus, Runtime};

/// Arguments of `doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Which runtime to check: the native one (default) or the Docker engine's.
    #[arg(long, value_enum, default_value = "bubblewrap")]
    pub runtime: super::backend::RuntimeChoice,
    /// The native runtime's workspace mode to report for (see `run --workspace`).
    #[arg(long, value_enum, env = smithers_runtime_native::WORKSPACE_ENV, default_value = "auto")]
    pub workspace: super::backend::WorkspaceChoice,
}

/// Protections without which the docker runtime cannot run at all.
const DOCKER_REQUIRED: &[&str] = &["engine", "workspace_cow"];

/// Protections without which the native runtime cannot run at all.
const REQUIRED: &[&str] = &[
    "user-namespace",
    "mount-namespace",
    "pid-namespace",
    "workspace-cow",
];

/// The docker runtime's probe: engine version, API, cgroup driver, and what it enforces
/// (with the fix when the engine is not reachable).
fn docker_probe(rt: &tokio::runtime::Runtime) -> smithers_runtime::EnforcementReport {
    use smithers_runtime_docker::{DockerOptions, DockerRuntime};
    rt.block_on(DockerRuntime::new(DockerOptions::default()).probe())
}

/// Runs `doctor`: a table (or `--json`); exit 1 when the runtime is unusable here.
pub fn run(args: &DoctorArgs, json: bool) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let docker = args.runtime == super::backend::RuntimeChoice::Docker;
    let report = if docker {
        docker_probe(&rt)
    } else {
        rt.block_on(super::backend::native_runtime_with(args.workspace.mode())?.probe())
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let width = report
            .protections
            .iter()
            .map(|p| p.name.len())
            .max()
            .unwrap_or(10);
        println!("{:width$}  {:11}  DETAIL", "PROTECTION", "STATUS");
        for p in &report.protections {
            let status = match p.status {
                ProtectionStatus::Enforced => "enforced",
                ProtectionStatus::Degraded => "degraded",
                ProtectionStatus::Unavailable => "unavailable",
                ProtectionStatus::Disabled => "disabled",
            };
            println!("{:width$}  {status:11}  {}", p.name, p.detail);
            if let Some(fix) = &p.fix {
                if p.status != ProtectionStatus::Enforced {
                    println!("{:width$}  {:11}  fix: {fix}", "", "");
                }
            }
        }
    }
    let required = if docker { DOCKER_REQUIRED } else { REQUIRED };
    // A copy workspace (overlayfs unavailable, or copy asked for) is degraded, not unusable.
    let usable = required.iter().all(|n| {
        report.is_enforced(n)
            || (!docker
                && *n == "workspace-cow"
                && report
                    .get(n)
                    .is_some_and(|p| p.status == ProtectionStatus::Degraded))
    });
    if !usable && !json {
        if docker {
            eprintln!("the docker runtime cannot run sandboxes on this host");
        } else {
            eprintln!("the native (bubblewrap) runtime cannot run sandboxes on this host");
        }
    }
    Ok(if usable {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
