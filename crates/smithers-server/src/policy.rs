//! What the operator allows: the ceilings every client's controls are checked against, and
//! the client tokens (a sandbox belongs to the token that created it).
//!
//! The client's controls are never trusted to be modest: a control above its ceiling is
//! refused with a 422 naming the ceiling and the operator flag that raises it (never silently
//! lowered, so the client knows the step would not have run as asked), and the controls every
//! runtime enforces by itself (timeout, output cap) default to the ceiling when not asked.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use sha2::{Digest, Sha256};
use smithers_errors::ErrorCode;
use smithers_runtime::Controls;
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// The operator's ceilings on one sandbox's controls. `None` means no ceiling on that control.
#[derive(Debug, Clone, PartialEq)]
pub struct Ceilings {
    /// Whether a client may ask for `allowNetwork` (the host's network) at all.
    pub allow_network: bool,
    /// The operator's egress policy: a client's `egressPolicy` is confined to it
    /// ([`smithers_egress::Policy::within`]); without it (and without `allow_network`) a
    /// client's policy is refused.
    pub egress: Option<smithers_egress::Policy>,
    /// Host ports a client with network may publish; empty refuses every port.
    pub allowed_ports: Vec<u16>,
    pub max_memory_bytes: Option<u64>,
    pub max_cpus: Option<f64>,
    pub max_pids: Option<u32>,
    pub max_disk_bytes: Option<u64>,
    /// Longest `timeoutMs`; a step asking none gets this one.
    pub max_timeout: Duration,
    /// Largest `maxOutputBytes` per stream (what a sandbox's log and line events keep; its
    /// output is relayed whole, and a step is stopped at the cap only with
    /// `failOnOutputCap`); a step asking none gets the runtime's default (1 MiB) or this,
    /// whichever is smaller.
    pub max_output_bytes: u64,
    /// Largest `maxOutputLines` per stream, likewise (the runtime's default is 100000).
    pub max_output_lines: u64,
}

impl Default for Ceilings {
    /// Safe defaults: no network, 8 GiB of memory, 4 cores, 4096 processes, 16 GiB of disk,
    /// one hour, 16 MiB of output per stream.
    fn default() -> Self {
        Ceilings {
            allow_network: false,
            egress: None,
            allowed_ports: Vec::new(),
            max_memory_bytes: Some(8 << 30),
            max_cpus: Some(4.0),
            max_pids: Some(4096),
            max_disk_bytes: Some(16 << 30),
            max_timeout: Duration::from_secs(3600),
            max_output_bytes: 16 << 20,
            max_output_lines: 1_000_000,
        }
    }
}

/// A refusal naming the ceiling, what was asked and the operator flag that would allow it.
fn over(control: &'static str, flag: &'static str, asked: String, max: String) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::InvalidInput,
        format!(
            "{control} {asked} exceeds this host's ceiling of {max} (set by the operator with `serve {flag}`)"
        ),
    )
    .details(json!({
        "control": control,
        "asked": asked,
        "ceiling": max,
        "operatorFlag": flag,
    }))
}

fn check_max<T: PartialOrd + std::fmt::Display>(
    asked: Option<T>,
    max: Option<T>,
    control: &'static str,
    flag: &'static str,
) -> Result<(), ApiError> {
    match (asked, max) {
        (Some(a), Some(m)) if a > m => Err(over(control, flag, a.to_string(), m.to_string())),
        _ => Ok(()),
    }
}

impl Ceilings {
    /// Checks `controls` against the ceilings and fills the defaults. `asked_output` says
    /// whether the client's JSON named `maxOutputBytes` (serde fills in a default for it,
    /// which must not count as asking).
    pub fn apply(&self, controls: &mut Controls, asked_output: bool) -> Result<(), ApiError> {
        self.check_network(controls)?;
        check_max(
            controls.memory_limit_bytes,
            self.max_memory_bytes,
            "memoryLimit",
            "--max-memory",
        )?;
        check_max(controls.cpu_limit, self.max_cpus, "cpuLimit", "--max-cpus")?;
        check_max(
            controls.pids_limit,
            self.max_pids,
            "pidsLimit",
            "--max-pids",
        )?;
        check_max(
            controls.disk_limit_bytes,
            self.max_disk_bytes,
            "diskLimit",
            "--max-disk",
        )?;
        let max_timeout_ms = self.max_timeout.as_millis() as u64;
        check_max(
            controls.timeout_ms,
            Some(max_timeout_ms),
            "timeoutMs",
            "--max-timeout",
        )?;
        controls.timeout_ms.get_or_insert(max_timeout_ms);
        if asked_output {
            check_max(
                Some(controls.max_output_bytes),
                Some(self.max_output_bytes),
                "maxOutputBytes",
                "--max-output",
            )?;
        } else {
            controls.max_output_bytes = controls.max_output_bytes.min(self.max_output_bytes);
        }
        Ok(())
    }

    /// Checks `maxOutputLines` against its ceiling when the client named it (`asked`), and
    /// fills in the runtime's default or the ceiling, whichever is smaller, when it did not.
    pub fn apply_output_lines(&self, controls: &mut Controls, asked: bool) -> Result<(), ApiError> {
        if asked {
            check_max(
                Some(controls.max_output_lines),
                Some(self.max_output_lines),
                "maxOutputLines",
                "--max-output-lines",
            )
        } else {
            controls.max_output_lines = controls.max_output_lines.min(self.max_output_lines);
            Ok(())
        }
    }

    fn check_network(&self, controls: &mut Controls) -> Result<(), ApiError> {
        if let (Some(asked), Some(ceiling)) = (&controls.egress_policy, &self.egress) {
            // Confined to the operator's policy: what reaches the runtime allows only what
            // both allow (and its hash, in every record, names the pair).
            let client = smithers_egress::Policy::from_json(&asked.to_string()).map_err(|e| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::InvalidInput,
                    e.to_string(),
                )
                .details(json!({ "control": "egressPolicy" }))
            })?;
            controls.egress_policy = Some(client.within(ceiling.clone()).to_json());
            // With allowNetwork too (which the controls refuse anyway), the checks below.
            if !controls.allow_network && controls.egress.is_none() {
                return self.check_ports(controls);
            }
        }
        let refuse = |message: String, control: &str| {
            ApiError::new(StatusCode::FORBIDDEN, ErrorCode::InvalidInput, message)
                .details(json!({ "control": control, "operatorFlag": "--allow-network" }))
        };
        // An egress policy without an operator's ceiling to confine it is network access
        // on the client's terms: it needs the same permission as allowNetwork.
        let wants_network =
            controls.allow_network || controls.egress.is_some() || controls.egress_policy.is_some();
        if wants_network && !self.allow_network {
            return Err(refuse(
                "this host does not give sandboxes network access (allowNetwork/egress/egressPolicy); its operator must start `serve --allow-network`".into(),
                if controls.allow_network {
                    "allowNetwork"
                } else if controls.egress_policy.is_some() {
                    "egressPolicy"
                } else {
                    "egress"
                },
            ));
        }
        self.check_ports(controls)
    }

    fn check_ports(&self, controls: &Controls) -> Result<(), ApiError> {
        let refuse = |message: String, control: &str| {
            ApiError::new(StatusCode::FORBIDDEN, ErrorCode::InvalidInput, message)
                .details(json!({ "control": control, "operatorFlag": "--allow-network" }))
        };
        if let Some(p) = controls
            .ports
            .iter()
            .find(|p| !self.allowed_ports.contains(&p.host))
        {
            return Err(refuse(
                format!(
                    "host port {} is not one this host publishes; its operator allows them with `serve --allow-network --allow-port {}`",
                    p.host, p.host
                ),
                "ports",
            ));
        }
        Ok(())
    }
}

/// A client token: its name is what sandboxes record and what logs show; the secret is kept
/// only as a SHA-256 digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientToken {
    pub name: String,
    pub secret: String,
}

impl ClientToken {
    pub fn new(name: impl Into<String>, secret: impl Into<String>) -> Self {
        ClientToken {
            name: name.into(),
            secret: secret.into(),
        }
    }
}

/// The name the single `SMITHERS_SANDBOX_TOKEN` goes by.
pub const DEFAULT_TOKEN_NAME: &str = "default";

/// Parses `name:token` pairs separated by commas, whitespace or newlines (the format of
/// `SMITHERS_SANDBOX_TOKENS` and of a tokens file, where `#` starts a comment line).
pub fn parse_tokens(text: &str) -> Result<Vec<ClientToken>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        for pair in line.split(|c: char| c == ',' || c.is_whitespace()) {
            if pair.is_empty() {
                continue;
            }
            let Some((name, secret)) = pair.split_once(':') else {
                // Never echo the text: it holds secrets.
                return Err(format!("entry {} is not name:token", out.len() + 1));
            };
            out.push(ClientToken::new(name, secret));
        }
    }
    Ok(out)
}

/// The configured tokens, as digests, checked for shape once at start.
#[derive(Debug, Default)]
pub(crate) struct TokenSet {
    entries: Vec<(String, [u8; 32])>,
}

impl TokenSet {
    pub fn new(tokens: &[ClientToken], min_len: usize) -> Result<Self, String> {
        let mut entries: Vec<(String, [u8; 32])> = Vec::new();
        for t in tokens {
            let valid_name = !t.name.is_empty()
                && t.name.len() <= 64
                && t.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !valid_name {
                return Err(format!(
                    "token name {:?} must be 1-64 characters of [A-Za-z0-9._-]",
                    t.name
                ));
            }
            if t.secret.trim().len() < min_len {
                return Err(format!(
                    "the token named {} must be at least {min_len} characters",
                    t.name
                ));
            }
            let digest: [u8; 32] = Sha256::digest(t.secret.trim().as_bytes()).into();
            if entries.iter().any(|(n, _)| n == &t.name) {
                return Err(format!("two tokens are named {}", t.name));
            }
            if entries.iter().any(|(_, d)| d == &digest) {
                return Err(format!("the token named {} repeats another token", t.name));
            }
            entries.push((t.name.clone(), digest));
        }
        Ok(TokenSet { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The name of the token `given` is, compared in constant time against every token (no
    /// early exit, so the time does not say which one matched or how far).
    pub fn authenticate(&self, given: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(given.trim().as_bytes()).into();
        let mut found = None;
        for (name, expected) in &self.entries {
            if bool::from(digest.ct_eq(expected)) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_above_a_ceiling_are_refused_naming_it() {
        let ceilings = Ceilings::default();
        let mut c = Controls {
            memory_limit_bytes: Some(9 << 30),
            ..Controls::default()
        };
        let err = ceilings.apply(&mut c, false).unwrap_err();
        assert_eq!(err.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(
            err.report.message.contains("--max-memory"),
            "{}",
            err.report.message
        );
        let mut c = Controls {
            allow_network: true,
            ..Controls::default()
        };
        let err = ceilings.apply(&mut c, false).unwrap_err();
        assert_eq!(err.status, StatusCode::FORBIDDEN);
        assert!(err.report.message.contains("--allow-network"));
        let mut c = Controls {
            max_output_bytes: 17 << 20,
            ..Controls::default()
        };
        assert!(ceilings.apply(&mut c, true).is_err());
        let mut c = Controls {
            max_output_lines: 2_000_000,
            ..Controls::default()
        };
        let err = ceilings.apply_output_lines(&mut c, true).unwrap_err();
        assert!(
            err.report.message.contains("--max-output-lines"),
            "{}",
            err.report.message
        );
        let small = Ceilings {
            max_output_lines: 10,
            ..Ceilings::default()
        };
        let mut c = Controls::default();
        small.apply_output_lines(&mut c, false).unwrap();
        assert_eq!(c.max_output_lines, 10);
    }

    #[test]
    fn a_client_egress_policy_is_confined_to_the_operators() {
        let asked = json!({"allow": [{"host": "api.example.com", "ports": [443]},
                                     {"host": "evil.test", "ports": [443]}]});
        let client = || Controls {
            egress_policy: Some(asked.clone()),
            ..Controls::default()
        };
        // No ceiling, no --allow-network: refused, naming the control.
        let err = Ceilings::default().apply(&mut client(), false).unwrap_err();
        assert_eq!(err.status, StatusCode::FORBIDDEN);
        assert!(
            err.report.message.contains("egressPolicy"),
            "{}",
            err.report.message
        );
        // With the operator's ceiling: what reaches the runtime allows only what both do.
        let ceilings = Ceilings {
            egress: Some(smithers_egress::Policy::from_allow_hosts(&["*.example.com"]).unwrap()),
            ..Ceilings::default()
        };
        let mut c = client();
        ceilings.apply(&mut c, false).unwrap();
        let confined =
            smithers_egress::Policy::from_json(&c.egress_policy.unwrap().to_string()).unwrap();
        assert!(confined.decide("api.example.com", 443).allowed);
        assert!(!confined.decide("evil.test", 443).allowed);
        // A policy that does not parse is refused as input.
        let mut bad = Controls {
            egress_policy: Some(json!({"allow": [{"host": "*.com", "ports": [443]}]})),
            ..Controls::default()
        };
        let err = ceilings.apply(&mut bad, false).unwrap_err();
        assert_eq!(err.status, StatusCode::UNPROCESSABLE_ENTITY);
    }

    #[test]
    fn unasked_timeout_and_output_get_the_ceiling() {
        let ceilings = Ceilings {
            max_output_bytes: 1000,
            max_timeout: Duration::from_secs(5),
            ..Ceilings::default()
        };
        let mut c = Controls::default();
        ceilings.apply(&mut c, false).unwrap();
        assert_eq!(c.timeout_ms, Some(5000));
        assert_eq!(c.max_output_bytes, 1000);
    }

    #[test]
    fn ports_need_the_operator_to_allow_each_one() {
        let ceilings = Ceilings {
            allow_network: true,
            allowed_ports: vec![8080],
            ..Ceilings::default()
        };
        let port = |host| smithers_runtime::PortMapping {
            host,
            container: host,
        };
        let mut c = Controls {
            allow_network: true,
            ports: vec![port(8080)],
            ..Controls::default()
        };
        ceilings.apply(&mut c, false).unwrap();
        c.ports = vec![port(22)];
        assert_eq!(
            ceilings.apply(&mut c, false).unwrap_err().status,
            StatusCode::FORBIDDEN
        );
    }

    #[test]
    fn tokens_parse_and_authenticate_by_name() {
        let tokens =
            parse_tokens("# clients\nalice:aaaaaaaaaaaaaaaaaaaa, bob:bbbbbbbbbbbbbbbbbbbb\n")
                .unwrap();
        let set = TokenSet::new(&tokens, 16).unwrap();
        assert_eq!(set.authenticate("bbbbbbbbbbbbbbbbbbbb"), Some("bob"));
        assert_eq!(set.authenticate("aaaaaaaaaaaaaaaaaaaa"), Some("alice"));
        assert_eq!(set.authenticate("cccccccccccccccccccc"), None);
        assert!(parse_tokens("justasecret").is_err());
        assert!(TokenSet::new(&[ClientToken::new("a", "short")], 16).is_err());
        let dup = [
            ClientToken::new("a", "aaaaaaaaaaaaaaaaaaaa"),
            ClientToken::new("b", "aaaaaaaaaaaaaaaaaaaa"),
        ];
        assert!(TokenSet::new(&dup, 16).is_err());
    }
}
