//! `smithers-sandbox doctor`: what the native runtime can enforce on this host, found by
//! actually trying each mechanism in throwaway namespaces.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use smithers_runtime::{ProtectionStatus, Runtime};

/// Arguments of `doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {}

/// Protections without which the native runtime cannot run at all.
const REQUIRED: &[&str] = &[
    "user-namespace",
    "mount-namespace",
    "pid-namespace",
    "workspace-cow",
];

/// Runs `doctor`: a table (or `--json`); exit 1 when the runtime is unusable here.
pub fn run(_args: &DoctorArgs, json: bool) -> anyhow::Result<ExitCode> {
    let runtime = super::run::native_runtime()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = rt.block_on(runtime.probe());
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
    let usable = REQUIRED.iter().all(|n| report.is_enforced(n));
    if !usable && !json {
        eprintln!("the native (bubblewrap) runtime cannot run sandboxes on this host");
    }
    Ok(if usable {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
