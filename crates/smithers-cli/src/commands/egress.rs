//! `egress check`: what a policy would decide for a destination, and why, without running
//! anything (the same decision function the engine asks for every connection).
//! Also the policy of `run`'s `--allow-host` and `--egress-policy` flags.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use smithers_egress::Policy;
use smithers_errors::ErrorCode;

use crate::output::{coded_error, inert};

/// Arguments of `egress`.
#[derive(Debug, Args)]
pub struct EgressArgs {
    #[command(subcommand)]
    pub command: EgressCommand,
}

#[derive(Debug, Subcommand)]
pub enum EgressCommand {
    /// What POLICY (a JSON policy file) decides for HOST[:PORT] (port 443 when omitted), and
    /// why. Exit 0 when allowed (audit mode: also when it would deny, which it says), 1 when
    /// denied.
    Check {
        /// The policy file.
        policy: PathBuf,
        /// The destination: a name or an IPv4 address, with an optional port.
        destination: String,
    },
}

/// Reads a policy file (bounded) and checks it.
pub fn read_policy(path: &Path) -> anyhow::Result<Policy> {
    use std::io::Read;
    let refuse = |message: String| {
        coded_error(
            ErrorCode::InvalidInput,
            message,
            json!({ "policy": path.display().to_string() }),
        )
    };
    let f = std::fs::File::open(path).map_err(|e| {
        refuse(format!(
            "cannot read the egress policy {}: {e}",
            inert(&path.display().to_string())
        ))
    })?;
    let mut text = String::new();
    f.take(smithers_egress::policy::MAX_POLICY_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| refuse(format!("the egress policy is not UTF-8 text: {e}")))?;
    Policy::from_json(&text).map_err(|e| refuse(e.to_string()))
}

/// The policy of `run`'s flags: the file's rules and the `--allow-host` ones together;
/// `None` when neither was given.
pub fn policy_of_flags(file: Option<&Path>, hosts: &[String]) -> anyhow::Result<Option<Policy>> {
    let from_hosts = if hosts.is_empty() {
        None
    } else {
        Some(Policy::from_allow_hosts(hosts).map_err(|e| {
            coded_error(
                ErrorCode::InvalidInput,
                format!("--allow-host: {e}"),
                Value::Null,
            )
        })?)
    };
    Ok(match (file.map(read_policy).transpose()?, from_hosts) {
        (None, None) => None,
        (Some(p), None) | (None, Some(p)) => Some(p),
        (Some(f), Some(h)) => Some(f.merge(h)),
    })
}

pub fn run(args: &EgressArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    match &args.command {
        EgressCommand::Check {
            policy,
            destination,
        } => {
            let p = read_policy(policy)?;
            let (host, port) = smithers_egress::proxy::split_authority(destination, Some(443))
                .map_err(|e| coded_error(ErrorCode::InvalidInput, e, Value::Null))?;
            let d = p.decide(&host, port);
            if json_out {
                println!(
                    "{}",
                    json!({
                        "host": host, "port": port, "verdict": d.verdict(), "allowed": d.allowed,
                        "rule": d.rule, "reason": d.reason, "policy": p.hash(), "mode": p.mode.as_str(),
                    })
                );
            } else {
                println!("{} {}:{port}", d.verdict(), inert(&host));
                println!("  {}", inert(&d.reason));
                if let Some(rule) = &d.rule {
                    println!("  rule   {}", inert(rule));
                }
                println!("  policy {} ({} mode)", p.hash(), p.mode.as_str());
                if d.allowed && !d.would_deny {
                    println!("  (a connection is still refused if the name resolves into special-use space no cidr rule names)");
                }
            }
            Ok(if d.allowed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}
