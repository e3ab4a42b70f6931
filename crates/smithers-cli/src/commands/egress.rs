//! `egress check`: what a policy would decide for a destination, and why, without running
//! anything: the decision function the engine asks for every connection, then, for an
//! allowed destination, the name resolved and each answer decided by the engine's own code
//! (so a name that resolves into special-use space is denied here as it would be there).
//! Also the policy of `run`'s `--allow-host`, `--allow-cidr` and `--egress-policy` flags.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use smithers_egress::{Decision, Policy};
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
    /// why, as the egress engine would: an allowed name is resolved here, with the engine's
    /// resolver, and each answer checked (one in special-use space, or one of this host's
    /// own addresses, needs a cidr rule). A denial names the rule that would lift it. Exit 0
    /// when allowed (audit mode: also when it would deny, which it says), 1 when denied.
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

/// The policy of `run`'s flags: the file's rules and the `--allow-host` and `--allow-cidr`
/// ones together; `None` when none was given.
pub fn policy_of_flags(
    file: Option<&Path>,
    hosts: &[String],
    cidrs: &[String],
) -> anyhow::Result<Option<Policy>> {
    let from_hosts = if hosts.is_empty() && cidrs.is_empty() {
        None
    } else {
        // Each problem names its flag.
        Some(
            Policy::from_flags(hosts, cidrs)
                .map_err(|e| coded_error(ErrorCode::InvalidInput, e.to_string(), Value::Null))?,
        )
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
        } => check(policy, destination, json_out),
    }
}

/// What the engine would meet for an allowed destination: the addresses that passed their
/// check, or the decision that refused an answer, or why the name did not resolve.
struct Resolved {
    addresses: Vec<std::net::SocketAddr>,
    refusal: Option<Decision>,
    error: Option<String>,
}

/// Resolves `host` as the engine does (its resolver, its bound, this host's addresses)
/// and decides each answer with the engine's own function.
fn resolve_as_the_engine(p: &Policy, host: &str, port: u16) -> anyhow::Result<Resolved> {
    use smithers_egress::engine::{resolve_checked, EgressLimits, Resolver};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let within = EgressLimits::default().connect;
    let host_addrs = smithers_egress::addr::host_addresses();
    let got = rt.block_on(resolve_checked(
        p,
        &Resolver::System,
        within,
        &host_addrs,
        host,
        port,
    ));
    Ok(match got {
        Ok(addresses) => Resolved {
            addresses,
            refusal: None,
            error: None,
        },
        Err((refusal, reason)) => Resolved {
            addresses: Vec::new(),
            error: refusal.is_none().then_some(reason),
            refusal,
        },
    })
}

fn check(policy: &Path, destination: &str, json_out: bool) -> anyhow::Result<ExitCode> {
    let p = read_policy(policy)?;
    let (host, port) = smithers_egress::proxy::split_authority(destination, Some(443))
        .map_err(|e| coded_error(ErrorCode::InvalidInput, e, Value::Null))?;
    let first = p.decide(&host, port);
    // As the engine: only an allowed destination is resolved (a denied name never is).
    let resolved = if first.allowed {
        Some(resolve_as_the_engine(&p, &host, port)?)
    } else {
        None
    };
    let refusal = resolved.as_ref().and_then(|r| r.refusal.clone());
    let d = refusal.unwrap_or(first);
    let addresses: Vec<String> = resolved
        .iter()
        .flat_map(|r| r.addresses.iter().map(|a| a.ip().to_string()))
        .collect();
    let error = resolved.as_ref().and_then(|r| r.error.clone());
    if json_out {
        println!(
            "{}",
            json!({
                "host": host, "port": port, "verdict": d.verdict(), "allowed": d.allowed,
                "rule": d.rule, "reason": d.reason, "fix": d.fix, "policy": p.hash(),
                "mode": p.mode.as_str(), "addresses": addresses, "resolveError": error,
            })
        );
    } else {
        println!("{} {}:{port}", d.verdict(), inert(&host));
        println!("  {}", inert(&d.reason));
        if let Some(rule) = &d.rule {
            println!("  rule   {}", inert(rule));
        }
        if let Some(fix) = &d.fix {
            println!("  fix    {}", inert(&fix.describe()));
        }
        if !addresses.is_empty() {
            println!(
                "  resolves to {} (each answer checked, as a connection's would be)",
                addresses.join(", ")
            );
        }
        if let Some(e) = &error {
            println!(
                "  not resolved here: {} (a connection would be allowed, then fail with 502)",
                inert(e)
            );
        }
        println!("  policy {} ({} mode)", p.hash(), p.mode.as_str());
    }
    Ok(if d.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
