//! A step's egress policy on the native runtime: P0 binds the engine's listeners inside the
//! sandbox's network namespace and sends them up the control socket (see the init's
//! `EgressListen`); this process serves them with [`smithers_egress::Engine`]. The sandbox
//! keeps its own network namespace with only `lo`: the listeners are its only way out, and
//! no process, rule or credential of ours runs inside it.
//!
//! Inside, the step sees `/etc/resolv.conf` naming `127.0.0.1` (our resolver), the usual
//! proxy variables naming the HTTP and SOCKS5 listeners, and its denials so far in
//! `/run/smithers/request/egress-denials.ndjson` (read-only).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use smithers_egress::engine::EngineOptions;
use smithers_egress::secrets::{SecretSpec, Secrets};
use smithers_egress::{Engine, Listeners, Policy, Summary};
use smithers_runtime::{Controls, RuntimeError};
use smithers_sandbox_init::plan::EgressListen;

use smithers_egress::sandbox::{HTTP_PROXY_PORT, SOCKS_PORT};

/// The denials file, under the request directory (bound read-only at /run/smithers/request).
pub(crate) const DENIALS_FILE: &str = smithers_egress::sandbox::DENIALS_FILE;

/// The step's policy, checked; `None` without one. Refused when it does not parse or lint,
/// or when it needs what this runtime reserves (the proxies' ports, port 53) or more capture
/// listeners than it binds.
pub(crate) fn policy(c: &Controls) -> Result<Option<Policy>, RuntimeError> {
    let Some(v) = &c.egress_policy else {
        return Ok(None);
    };
    smithers_egress::sandbox::checked_policy(v)
        .map(Some)
        .map_err(|reason| RuntimeError::InvalidControl {
            control: "egressPolicy",
            reason,
        })
}

/// What P0 binds for `policy`.
pub(crate) fn listen_plan(policy: &Policy) -> EgressListen {
    EgressListen {
        dns: true,
        http_port: HTTP_PROXY_PORT,
        socks_port: SOCKS_PORT,
        capture_ports: smithers_egress::sandbox::capture_ports(policy).unwrap_or_default(),
    }
}

/// The proxy variables of a step with a policy (a variable the step sets itself wins).
pub(crate) fn proxy_env() -> Vec<(String, String)> {
    smithers_egress::sandbox::proxy_env(&format!("/run/smithers/request/{DENIALS_FILE}"))
}

/// The directory of the `/etc` files a sandbox with a policy sees instead of the host's
/// (`resolv.conf` naming our resolver, a `hosts` with localhost only), under the state root.
pub(crate) fn etc_files(state_root: &Path) -> std::io::Result<PathBuf> {
    smithers_egress::sandbox::write_etc_files(&state_root.join("egress-etc"))
}

/// A policy as the engine serves it, with the step's secrets.
#[derive(Debug)]
pub(crate) struct Served {
    pub(crate) policy: Policy,
    pub(crate) secrets: Option<Arc<Secrets>>,
}

/// Where the step sees its request directory (the authority's files are in it).
const REQUEST_INSIDE: &str = "/run/smithers/request";

/// The step's secrets (`Controls::secrets`), their values read from this process's
/// environment or their files, their placeholders made, the run's authority written for the
/// step to trust; `None` without any.
pub(crate) fn secrets(
    c: &Controls,
    request_dir: &Path,
) -> Result<Option<Arc<Secrets>>, RuntimeError> {
    let specs = (c.secret_values()?.into_iter())
        .map(|s| SecretSpec {
            name: s.name,
            hosts: s.hosts,
            value: s.value,
        })
        .collect();
    smithers_egress::sandbox::secrets_for(specs, request_dir).map_err(|reason| {
        RuntimeError::InvalidControl {
            control: "secrets",
            reason,
        }
    })
}

/// What the step's environment gets for its secrets (see
/// [`smithers_egress::sandbox::secrets_env`]).
pub(crate) fn secrets_env(s: &Secrets) -> Vec<(String, String)> {
    smithers_egress::sandbox::secrets_env(s, REQUEST_INSIDE)
}

/// Starts the engine on the descriptors of P0's `egress` line, named by `names` in order.
pub(crate) fn start(
    served: Served,
    names: &[String],
    fds: Vec<OwnedFd>,
    denials: PathBuf,
    live: tokio::sync::mpsc::UnboundedSender<smithers_egress::EgressRecord>,
) -> Result<Engine, String> {
    let l = Listeners::from_named(names, fds)?;
    // An empty file from the start: the step can tell "no denials" from "no policy".
    let _ = std::fs::write(&denials, b"");
    Engine::start(
        served.policy,
        l,
        EngineOptions {
            denials_file: Some(denials),
            live: Some(live),
            secrets: served.secrets,
            ..Default::default()
        },
    )
    .map_err(|e| format!("starting the egress engine: {e}"))
}

/// The enforcement row's detail for a sandbox with `policy`.
pub(crate) fn report_detail(policy: &Policy) -> String {
    smithers_egress::sandbox::report_detail(policy)
}

/// The log lines of what the engine decided: one record per decision, and how many it did
/// not keep (so that what is left out is named).
pub(crate) fn log_lines(summary: &Summary) -> Vec<String> {
    let mut lines: Vec<String> = (summary.records.iter())
        .filter_map(|r| serde_json::to_string(r).ok())
        .collect();
    if summary.records_dropped > 0 {
        lines.push(
            serde_json::json!({"type": "egressRecordsDropped", "timestampMs": crate::clock::now_ms(), "count": summary.records_dropped})
                .to_string(),
        );
    }
    lines
}
