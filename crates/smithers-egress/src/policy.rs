//! The policy: the names, address ranges and ports a step may reach, from the caller only,
//! and the one decision function every entry point asks.
//!
//! Two forms: the CLI's `--allow-host NAME[:PORTS]` and `--allow-cidr NET[:PORTS]` (port 443
//! when omitted; PORTS a comma-separated list of ports and `lo-hi` ranges) and a JSON file:
//!
//! ```json
//! {"mode": "enforce",
//!  "allow": [{"host": "api.example.com", "ports": [443]},
//!            {"host": "*.example.org", "ports": [443, 22]},
//!            {"cidr": "11.0.0.0/24", "ports": ["8000-8100"]}],
//!  "deny":  [{"host": "uploads.example.org"}]}
//! ```
//!
//! Deny rules win over allow rules; what no rule allows is denied. `*.example.org` matches
//! the names below `example.org`, not `example.org` itself. An allow rule names its ports;
//! a deny rule without ports covers all of them. IP literals are matched by `cidr` rules
//! only. The lint refuses what would not mean what it says: wildcards over public suffixes,
//! names that are not valid host names, allow rules without ports, `0.0.0.0/0`, IPv6.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::addr::{other_machines, special_use};
use crate::suffix::is_public_suffix;

/// Most rules a policy may hold (each is checked on every connection).
pub const MAX_RULES: usize = 1000;
/// Largest policy file read.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;

/// Enforce the policy, or allow everything and record what it would have denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    Audit,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        }
    }
}

/// What a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One host name, exactly.
    Name(String),
    /// Every name strictly below this one (`*.example.com`).
    Below(String),
    /// An IPv4 range (IP literals and, for allow rules, special-use answers of allowed names).
    Cidr(Ipv4Net),
}

impl Target {
    fn matches_name(&self, name: &str) -> bool {
        match self {
            Target::Name(n) => n == name,
            Target::Below(base) => name
                .strip_suffix(base.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Target::Cidr(_) => false,
        }
    }

    fn matches_ip(&self, ip: Ipv4Addr) -> bool {
        matches!(self, Target::Cidr(net) if net.contains(&ip))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Name(n) => write!(f, "{n}"),
            Target::Below(n) => write!(f, "*.{n}"),
            Target::Cidr(c) => write!(f, "{c}"),
        }
    }
}

/// Inclusive port ranges; `None` = every port (deny rules only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports(Option<Vec<(u16, u16)>>);

impl Ports {
    fn contains(&self, port: u16) -> bool {
        match &self.0 {
            None => true,
            Some(r) => r.iter().any(|(lo, hi)| (*lo..=*hi).contains(&port)),
        }
    }

    /// Every single port named (for the listeners a runtime binds); `None` for "all" or
    /// for a range wider than `max`.
    pub fn listed(&self, max: usize) -> Option<Vec<u16>> {
        let mut out = Vec::new();
        for (lo, hi) in self.0.as_ref()? {
            for p in *lo..=*hi {
                if out.len() == max {
                    return None;
                }
                out.push(p);
            }
        }
        Some(out)
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => write!(f, "any port"),
            Some(r) => {
                let parts: Vec<String> = r
                    .iter()
                    .map(|(lo, hi)| {
                        if lo == hi {
                            lo.to_string()
                        } else {
                            format!("{lo}-{hi}")
                        }
                    })
                    .collect();
                write!(f, "{}", parts.join(","))
            }
        }
    }
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub target: Target,
    pub ports: Ports,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ports {}", self.target, self.ports)
    }
}

/// A checked policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    pub mode: Mode,
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    /// The operator's policy this one is confined to ([`Policy::within`]): a destination
    /// is allowed only if both allow it. Its own mode applies to its own denials, so a
    /// client's audit mode never lets through what the host's ceiling denies.
    pub ceiling: Option<Box<Policy>>,
}

/// Why a policy was refused: every problem found, not only the first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("egress policy refused: {}", .problems.join("; "))]
pub struct PolicyError {
    pub problems: Vec<String>,
}

fn refused(problem: impl Into<String>) -> PolicyError {
    PolicyError {
        problems: vec![problem.into()],
    }
}

/// The file form, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileForm {
    #[serde(default)]
    version: Option<u32>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    allow: Vec<FileRule>,
    #[serde(default)]
    deny: Vec<FileRule>,
    /// A ceiling is written by `to_json` and read back (it only ever narrows the policy).
    #[serde(default)]
    ceiling: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRule {
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    cidr: Option<String>,
    #[serde(default)]
    ports: Option<Vec<PortSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PortSpec {
    One(u32),
    Range(String),
}

/// Checks a host name as a policy or a client may write it: lower-cased, one trailing dot
/// dropped; LDH labels of 1–63 bytes, 253 in all; ASCII only (IDNA names in punycode).
pub fn normalize_name(raw: &str) -> Result<String, String> {
    let name = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
    if name.is_empty() || name.len() > 253 {
        return Err(format!(
            "{:?} is not a host name (1 to 253 bytes)",
            escape(raw)
        ));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!(
                "{:?} is not a host name (letters, digits, '-' and '_' in dot-separated labels of 1 to 63; a name in another script is written in its punycode form)",
                escape(raw)
            ));
        }
    }
    Ok(name)
}

/// A hostile name, bounded and escaped for a message or a record.
pub fn escape(raw: &str) -> String {
    let mut s: String = raw
        .chars()
        .take(260)
        .flat_map(char::escape_default)
        .collect();
    if raw.chars().count() > 260 {
        s.push('…');
    }
    s
}

fn host_target(raw: &str) -> Result<Target, String> {
    if raw.parse::<IpAddr>().is_ok() || raw.starts_with('[') {
        return Err(format!(
            "{raw:?} is an address, not a name: write it as a cidr rule"
        ));
    }
    if let Some(base) = raw.strip_prefix("*.") {
        let base = normalize_name(base)?;
        if is_public_suffix(&base) {
            return Err(format!(
                "\"*.{base}\" is a wildcard over a public suffix: it would allow every domain registered under {base}; name the domains"
            ));
        }
        return Ok(Target::Below(base));
    }
    if raw.contains('*') {
        return Err(format!(
            "{raw:?}: a wildcard is only a whole leftmost label (\"*.example.com\")"
        ));
    }
    normalize_name(raw).map(Target::Name)
}

fn cidr_target(raw: &str) -> Result<Target, String> {
    let net: Ipv4Net = match raw.parse() {
        Ok(n) => n,
        Err(_) => match raw.parse::<Ipv4Addr>() {
            Ok(a) => Ipv4Net::from(a),
            Err(_) if raw.contains(':') => {
                return Err(format!(
                    "{raw:?}: IPv6 is not carried (names are dialed over IPv4)"
                ))
            }
            Err(_) => return Err(format!("{raw:?} is not an IPv4 address or range")),
        },
    };
    Ok(Target::Cidr(net.trunc()))
}

fn port_range(spec: &PortSpec) -> Result<(u16, u16), String> {
    let one = |n: u32| -> Result<u16, String> {
        u16::try_from(n)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("port {n} is not 1–65535"))
    };
    match spec {
        PortSpec::One(n) => one(*n).map(|p| (p, p)),
        PortSpec::Range(s) => {
            let (lo, hi) = s.split_once('-').unwrap_or((s, s));
            let parse = |t: &str| {
                t.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{s:?} is not a port or a range \"lo-hi\""))
                    .and_then(one)
            };
            let (lo, hi) = (parse(lo)?, parse(hi)?);
            if lo > hi {
                return Err(format!("port range {s:?} is empty"));
            }
            Ok((lo, hi))
        }
    }
}

/// One `--allow-host NAME[:PORTS]` (`cidr` false; an IPv4 address there is a one-address
/// range) or `--allow-cidr NET[:PORTS]` (`cidr` true) flag as an allow rule.
fn flag_rule(spec: &str, cidr: bool) -> Result<Rule, String> {
    if spec.starts_with('[') || spec.matches(':').count() > 1 {
        return Err("IPv6 is not carried (names are dialed over IPv4)".to_string());
    }
    let (target, ports) = match spec.split_once(':') {
        Some((t, p)) => (t, flag_ports(p)?),
        None => (spec, Ports(Some(vec![(443, 443)]))),
    };
    let target = if cidr || target.parse::<Ipv4Addr>().is_ok() {
        cidr_target(target)?
    } else if target.contains('/') {
        return Err("an address range is a cidr rule: write it as --allow-cidr".to_string());
    } else {
        host_target(target)?
    };
    Ok(Rule { target, ports })
}

/// The PORTS of a flag: `443`, `80,443`, `8000-8100`, `22,8000-8100`.
fn flag_ports(text: &str) -> Result<Ports, String> {
    if text.is_empty() {
        return Err("no port after ':'".to_string());
    }
    let mut ranges = Vec::new();
    for part in text.split(',') {
        if ranges.len() == MAX_RULES {
            return Err(format!("more than {MAX_RULES} port ranges"));
        }
        ranges.push(port_range(&PortSpec::Range(part.to_string()))?);
    }
    Ok(Ports(Some(ranges)))
}

impl Policy {
    /// The policy of `--allow-host` flags: each `NAME[:PORTS]` (an IPv4 address becomes a
    /// one-address cidr rule).
    pub fn from_allow_hosts<S: AsRef<str>>(hosts: &[S]) -> Result<Policy, PolicyError> {
        Policy::from_flags(hosts, &[] as &[&str])
    }

    /// The policy of `--allow-host NAME[:PORTS]` and `--allow-cidr NET[:PORTS]` flags, PORTS
    /// a comma-separated list of ports and `lo-hi` ranges, 443 when omitted. Every problem
    /// is reported, each naming its flag.
    pub fn from_flags<H: AsRef<str>, C: AsRef<str>>(
        hosts: &[H],
        cidrs: &[C],
    ) -> Result<Policy, PolicyError> {
        let mut policy = Policy::default();
        let mut problems = Vec::new();
        let specs = hosts
            .iter()
            .map(|h| (h.as_ref(), false))
            .chain(cidrs.iter().map(|c| (c.as_ref(), true)));
        for (spec, cidr) in specs {
            match flag_rule(spec, cidr) {
                Ok(rule) => policy.allow.push(rule),
                Err(e) => {
                    let flag = if cidr { "--allow-cidr" } else { "--allow-host" };
                    problems.push(format!("{flag} {:?}: {e}", escape(spec)));
                }
            }
        }
        if problems.is_empty() {
            policy.check()?;
            Ok(policy)
        } else {
            Err(PolicyError { problems })
        }
    }

    /// The policy of a JSON file's text (see the module's documentation).
    pub fn from_json(text: &str) -> Result<Policy, PolicyError> {
        if text.len() as u64 > MAX_POLICY_BYTES {
            return Err(refused(format!(
                "the policy is {} bytes, over {MAX_POLICY_BYTES}",
                text.len()
            )));
        }
        let form: FileForm = serde_json::from_str(text).map_err(|e| refused(e.to_string()))?;
        if form.version.is_some_and(|v| v != 1) {
            return Err(refused("only version 1 of the policy format exists"));
        }
        let mut problems = Vec::new();
        let mut rules = |list: &[FileRule], allow: bool| -> Vec<Rule> {
            let kind = if allow { "allow" } else { "deny" };
            let mut out = Vec::new();
            for (i, r) in list.iter().enumerate() {
                let at = format!("{kind}[{i}]");
                let target = match (&r.host, &r.cidr) {
                    (Some(h), None) => host_target(h),
                    (None, Some(c)) => cidr_target(c),
                    _ => Err("needs exactly one of \"host\" and \"cidr\"".to_string()),
                };
                let ports = match &r.ports {
                    None if allow => {
                        Err("an allow rule names its ports (\"ports\": [443])".to_string())
                    }
                    None => Ok(Ports(None)),
                    Some(p) if p.is_empty() => Err("\"ports\" is empty".to_string()),
                    Some(p) => p
                        .iter()
                        .map(port_range)
                        .collect::<Result<_, _>>()
                        .map(|v| Ports(Some(v))),
                };
                match (target, ports) {
                    (Ok(target), Ok(ports)) => out.push(Rule { target, ports }),
                    (t, p) => {
                        for e in [t.err(), p.err()].into_iter().flatten() {
                            problems.push(format!("{at}: {e}"));
                        }
                    }
                }
            }
            out
        };
        let allow = rules(&form.allow, true);
        let deny = rules(&form.deny, false);
        if !problems.is_empty() {
            return Err(PolicyError { problems });
        }
        let ceiling = match &form.ceiling {
            None => None,
            Some(c) => Some(Box::new(Policy::from_json(&c.to_string()).map_err(
                |e| {
                    PolicyError {
                        problems: e
                            .problems
                            .into_iter()
                            .map(|p| format!("ceiling: {p}"))
                            .collect(),
                    }
                },
            )?)),
        };
        let policy = Policy {
            mode: form.mode,
            allow,
            deny,
            ceiling,
        };
        policy.check()?;
        Ok(policy)
    }

    /// What every form must satisfy.
    fn check(&self) -> Result<(), PolicyError> {
        let mut problems = Vec::new();
        if self.allow.len() + self.deny.len() > MAX_RULES {
            problems.push(format!("more than {MAX_RULES} rules"));
        }
        for r in &self.allow {
            if let Target::Cidr(net) = &r.target {
                if net.prefix_len() == 0 {
                    problems.push(
                        "allow 0.0.0.0/0 is every address: that is --allow-network, not a policy"
                            .to_string(),
                    );
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(PolicyError { problems })
        }
    }

    /// This policy confined to `ceiling` (the operator's): allowed only what both allow.
    /// A ceiling already there is confined further, never replaced.
    pub fn within(mut self, ceiling: Policy) -> Policy {
        let confined = match self.ceiling.take() {
            None => ceiling,
            Some(existing) => existing.within(ceiling),
        };
        self.ceiling = Some(Box::new(confined));
        self
    }

    /// This policy and `other` together (allow rules of both, deny rules of both, audit if
    /// either asks for it): `--allow-host` flags added to a policy file.
    pub fn merge(mut self, other: Policy) -> Policy {
        self.allow.extend(other.allow);
        self.deny.extend(other.deny);
        if other.mode == Mode::Audit {
            self.mode = Mode::Audit;
        }
        self
    }

    /// The policy as canonical JSON (the file form; the `--allow-host` form written out).
    pub fn to_json(&self) -> serde_json::Value {
        let rule = |r: &Rule| {
            let mut v = serde_json::Map::new();
            match &r.target {
                Target::Cidr(c) => v.insert("cidr".into(), c.to_string().into()),
                t => v.insert("host".into(), t.to_string().into()),
            };
            if let Some(ranges) = &r.ports.0 {
                let ports: Vec<serde_json::Value> = ranges
                    .iter()
                    .map(|(lo, hi)| {
                        if lo == hi {
                            serde_json::Value::from(*lo)
                        } else {
                            format!("{lo}-{hi}").into()
                        }
                    })
                    .collect();
                v.insert("ports".into(), ports.into());
            }
            serde_json::Value::Object(v)
        };
        let mut v = serde_json::json!({
            "version": 1,
            "mode": self.mode,
            "allow": self.allow.iter().map(rule).collect::<Vec<_>>(),
            "deny": self.deny.iter().map(rule).collect::<Vec<_>>(),
        });
        if let Some(c) = &self.ceiling {
            v["ceiling"] = c.to_json();
        }
        v
    }

    /// `sha256:` and the hex digest of [`Policy::to_json`]: which policy decided, in every
    /// record and in the enforcement report.
    pub fn hash(&self) -> String {
        let digest = Sha256::digest(self.to_json().to_string().as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    /// Every port an allow rule names (bounded by `max`: a runtime binds a capture listener
    /// per port); `Err` names a rule whose ranges are wider. (A ceiling only removes ports:
    /// a capture listener for a port it denies refuses every connection.)
    pub fn allowed_ports(&self, max: usize) -> Result<Vec<u16>, String> {
        let mut ports = std::collections::BTreeSet::new();
        for r in &self.allow {
            let listed = r.ports.listed(max).ok_or_else(|| {
                format!("allow rule {r} names more than {max} ports, more than a sandbox captures")
            })?;
            ports.extend(listed);
            if ports.len() > max {
                return Err(format!("the allow rules name more than {max} ports"));
            }
        }
        Ok(ports.into_iter().collect())
    }

    /// The decision for a destination a step named: a host name or an IP literal, and a
    /// port. This is the only place a verdict is made; every entry point asks it.
    pub fn decide(&self, host: &str, port: u16) -> Decision {
        let verdict = self.verdict(host, port);
        self.confined(self.in_mode(verdict), |c| c.decide(host, port))
    }

    /// `own`, unless the ceiling denies what `own` lets through.
    fn confined(&self, own: Decision, ceiling: impl Fn(&Policy) -> Decision) -> Decision {
        match &self.ceiling {
            Some(c) if own.allowed => {
                let theirs = ceiling(c);
                if theirs.allowed && !theirs.would_deny {
                    own
                } else {
                    Decision {
                        reason: format!("the host's ceiling: {}", theirs.reason),
                        fix: theirs.fix.map(Fix::in_ceiling),
                        ..theirs
                    }
                }
            }
            _ => own,
        }
    }

    /// The decision for a name alone, as the sandbox's resolver must make it (a query has
    /// no port): allowed when an allow rule names it on some port and no deny rule names it
    /// on every port. A connection to it is still decided, with its port, by
    /// [`Policy::decide`].
    pub fn decide_name(&self, host: &str) -> Decision {
        let verdict = (|| {
            let name = match normalize_name(host) {
                Ok(n) => n,
                Err(e) => return Verdict::deny(None, e),
            };
            if host.parse::<IpAddr>().is_ok() {
                return Verdict::deny(None, format!("{name} is an address, not a name"));
            }
            if let Some(r) = self
                .deny
                .iter()
                .find(|r| r.target.matches_name(&name) && r.ports.0.is_none())
            {
                return Verdict::deny(Some(r), format!("{name} is denied by rule {r}"));
            }
            match self.allow.iter().find(|r| r.target.matches_name(&name)) {
                Some(r) => Verdict::allow(Some(r), format!("{name} is named by rule {r}")),
                // A query has no port: the fix names the flag's default, 443.
                None => Verdict::deny(None, format!("no rule allows {name}"))
                    .fixed_by(Fix::host(&name, 443)),
            }
        })();
        self.confined(self.in_mode(verdict), |c| c.decide_name(host))
    }

    /// The decision for the address an allowed name resolved to, before it is dialed: an
    /// answer in special-use space, or one of the host's own addresses, needs a cidr rule
    /// that names it.
    pub fn decide_resolved(&self, ip: IpAddr, port: u16, host_addrs: &[IpAddr]) -> Decision {
        let verdict = (|| {
            let why = match special_use(ip) {
                Some(what) => what.to_string(),
                None if host_addrs.contains(&ip) => "one of the host's own addresses".to_string(),
                None => return Verdict::allow(None, format!("{ip} is a public address")),
            };
            let IpAddr::V4(v4) = ip else {
                return Verdict::deny(None, format!("the name resolved to {ip}: {why}"));
            };
            match self.ip_verdict(v4, port) {
                v if v.allowed => v,
                // A deny rule names the address: no allow rule lifts that.
                Verdict {
                    rule: Some(rule), ..
                } => Verdict::deny(
                    None,
                    format!("the name resolved to {ip}, {why}, which is denied by rule {rule}"),
                ),
                _ => {
                    let denied = Verdict::deny(
                        None,
                        format!(
                            "the name resolved to {ip}, {why}, which no cidr rule names on port {port}"
                        ),
                    );
                    // The host's own services and cloud metadata are not suggested.
                    if other_machines(v4) && !host_addrs.contains(&ip) {
                        denied.fixed_by(Fix::cidr(v4, port))
                    } else {
                        denied
                    }
                }
            }
        })();
        self.confined(self.in_mode(verdict), |c| {
            c.decide_resolved(ip, port, host_addrs)
        })
    }

    fn in_mode(&self, v: Verdict) -> Decision {
        match (self.mode, v.allowed) {
            (Mode::Audit, false) => Decision {
                allowed: true,
                would_deny: true,
                rule: v.rule,
                reason: v.reason,
                fix: v.fix,
            },
            _ => Decision {
                allowed: v.allowed,
                would_deny: false,
                rule: v.rule,
                reason: v.reason,
                fix: v.fix,
            },
        }
    }

    fn verdict(&self, host: &str, port: u16) -> Verdict {
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = host.parse::<IpAddr>() {
            return match ip {
                IpAddr::V4(v4) => self.ip_verdict(v4, port),
                IpAddr::V6(_) => Verdict::deny(
                    None,
                    format!("{ip} is an IPv6 literal: IPv6 is not carried"),
                ),
            };
        }
        let name = match normalize_name(host) {
            Ok(n) => n,
            Err(e) => return Verdict::deny(None, e),
        };
        if let Some(r) = self
            .deny
            .iter()
            .find(|r| r.target.matches_name(&name) && r.ports.contains(port))
        {
            return Verdict::deny(Some(r), format!("{name}:{port} is denied by rule {r}"));
        }
        if let Some(r) = self
            .allow
            .iter()
            .find(|r| r.target.matches_name(&name) && r.ports.contains(port))
        {
            return Verdict::allow(Some(r), format!("{name}:{port} is allowed by rule {r}"));
        }
        let other_ports: Vec<String> = self
            .allow
            .iter()
            .filter(|r| r.target.matches_name(&name))
            .map(|r| r.ports.to_string())
            .collect();
        let denied = if other_ports.is_empty() {
            Verdict::deny(None, format!("no rule allows {name}"))
        } else {
            Verdict::deny(
                None,
                format!(
                    "{name} is allowed on port {} only, not on port {port}",
                    other_ports.join(",")
                ),
            )
        };
        denied.fixed_by(Fix::host(&name, port))
    }

    fn ip_verdict(&self, ip: Ipv4Addr, port: u16) -> Verdict {
        if let Some(r) = self
            .deny
            .iter()
            .find(|r| r.target.matches_ip(ip) && r.ports.contains(port))
        {
            return Verdict::deny(Some(r), format!("{ip}:{port} is denied by rule {r}"));
        }
        if let Some(r) = self
            .allow
            .iter()
            .find(|r| r.target.matches_ip(ip) && r.ports.contains(port))
        {
            return Verdict::allow(Some(r), format!("{ip}:{port} is allowed by rule {r}"));
        }
        let denied = Verdict::deny(
            None,
            format!("no cidr rule allows {ip}:{port} (an IP literal needs a cidr rule)"),
        );
        // Loopback and link-local (metadata) literals are not suggested; see `other_machines`.
        if other_machines(ip) {
            denied.fixed_by(Fix::cidr(ip, port))
        } else {
            denied
        }
    }
}

/// A verdict before the mode is applied.
struct Verdict {
    allowed: bool,
    rule: Option<String>,
    reason: String,
    fix: Option<Fix>,
}

impl Verdict {
    fn allow(rule: Option<&Rule>, reason: String) -> Verdict {
        Verdict {
            allowed: true,
            rule: rule.map(Rule::to_string),
            reason,
            fix: None,
        }
    }
    fn deny(rule: Option<&Rule>, reason: String) -> Verdict {
        Verdict {
            allowed: false,
            rule: rule.map(Rule::to_string),
            reason,
            fix: None,
        }
    }
    /// A denial that one more allow rule would lift.
    fn fixed_by(mut self, fix: Fix) -> Verdict {
        self.fix = Some(fix);
        self
    }
}

/// The rule that would allow what was denied, so a denial says how to lift it: as the flag
/// of `run` that adds it and as the policy file's rule (for `--egress-policy`, `serve
/// --egress-ceiling` and a client's `egressPolicy`). None is offered where an added allow
/// rule would not help: a deny rule that names the destination, an IPv6 literal, a name
/// that is not one, a TLS server name other than the tunnel's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fix {
    /// `--allow-host NAME[:PORT]` or `--allow-cidr NET[:PORT]`; none when the rule belongs
    /// in the operator's ceiling, which no flag of the step's widens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flag: Option<String>,
    /// The same rule in the file form: `{"host": NAME, "ports": [PORT]}` or `{"cidr": NET,
    /// "ports": [PORT]}`.
    pub rule: serde_json::Value,
    /// Whose policy needs it: `step` (the step's own) or `ceiling` (the operator's).
    pub scope: &'static str,
}

impl Fix {
    /// Allow `name` on `port` (443, the flag's default, is left implicit).
    pub fn host(name: &str, port: u16) -> Fix {
        let flag = if port == 443 {
            format!("--allow-host {name}")
        } else {
            format!("--allow-host {name}:{port}")
        };
        Fix {
            flag: Some(flag),
            rule: serde_json::json!({"host": name, "ports": [port]}),
            scope: "step",
        }
    }

    /// Allow the one address `ip` on `port` (the narrowest range that lifts the denial; a
    /// wider one is the operator's choice).
    pub fn cidr(ip: Ipv4Addr, port: u16) -> Fix {
        let net = format!("{ip}/32");
        Fix {
            flag: Some(format!("--allow-cidr {net}:{port}")),
            rule: serde_json::json!({"cidr": net, "ports": [port]}),
            scope: "step",
        }
    }

    /// The same rule, needed in the operator's ceiling instead.
    fn in_ceiling(self) -> Fix {
        Fix {
            flag: None,
            scope: "ceiling",
            ..self
        }
    }

    /// One line for a person: the flag, or where the rule goes.
    pub fn describe(&self) -> String {
        match &self.flag {
            Some(flag) => format!("{flag} (policy file: {})", self.rule),
            None => format!(
                "the host's ceiling (serve --egress-ceiling) must allow it too: {}",
                self.rule
            ),
        }
    }
}

/// What the policy decided for one destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Whether the connection goes ahead (in audit mode, always).
    pub allowed: bool,
    /// Audit mode: enforcing would have denied it.
    pub would_deny: bool,
    /// The rule that decided, if one did (a default deny names none).
    pub rule: Option<String>,
    /// Why, in words a step's agent can act on.
    pub reason: String,
    /// For a denial an allow rule would lift: that rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<Fix>,
}

impl Decision {
    /// `allow`, `deny` or `would-deny`.
    pub fn verdict(&self) -> &'static str {
        match (self.allowed, self.would_deny) {
            (true, false) => "allow",
            (true, true) => "would-deny",
            (false, _) => "deny",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str) -> Policy {
        Policy::from_json(json).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn allow_hosts_default_to_443_and_wildcards_match_below_only() {
        let p =
            Policy::from_allow_hosts(&["api.example.com", "*.example.org", "git.example.net:22"])
                .unwrap();
        assert!(p.decide("api.example.com", 443).allowed);
        assert!(p.decide("API.Example.COM.", 443).allowed);
        let d = p.decide("api.example.com", 80);
        assert!(!d.allowed);
        assert!(d.reason.contains("port 443 only"), "{}", d.reason);
        assert!(p.decide("a.b.example.org", 443).allowed);
        assert!(!p.decide("example.org", 443).allowed);
        assert!(!p.decide("badexample.org", 443).allowed);
        assert!(p.decide("git.example.net", 22).allowed);
        assert!(!p.decide("git.example.net", 443).allowed);
        assert!(!p.decide("other.com", 443).allowed);
    }

    #[test]
    fn deny_wins_and_literals_need_cidr_rules() {
        let p = file(
            r#"{"allow":[{"host":"*.example.com","ports":[443]},{"cidr":"11.0.0.0/24","ports":["8000-8100"]}],
                "deny":[{"host":"uploads.example.com"},{"cidr":"11.0.0.9"}]}"#,
        );
        assert!(p.decide("www.example.com", 443).allowed);
        let d = p.decide("uploads.example.com", 443);
        assert!(!d.allowed && d.rule.is_some(), "{d:?}");
        assert!(p.decide("11.0.0.5", 8080).allowed);
        assert!(!p.decide("11.0.0.9", 8080).allowed);
        assert!(!p.decide("11.0.0.5", 443).allowed);
        assert!(!p.decide("11.0.1.5", 8080).allowed);
        assert!(!p.decide("[::1]", 443).allowed);
        assert!(!p.decide("::ffff:11.0.0.5", 8080).allowed);
    }

    #[test]
    fn lint_refuses_what_would_not_mean_what_it_says() {
        for (json, says) in [
            (
                r#"{"allow":[{"host":"*.com","ports":[443]}]}"#,
                "public suffix",
            ),
            (
                r#"{"allow":[{"host":"*.github.io","ports":[443]}]}"#,
                "public suffix",
            ),
            (
                r#"{"allow":[{"host":"*.co.uk","ports":[443]}]}"#,
                "public suffix",
            ),
            (
                r#"{"allow":[{"host":"api.example.com"}]}"#,
                "names its ports",
            ),
            (
                r#"{"allow":[{"host":"a*.example.com","ports":[443]}]}"#,
                "leftmost",
            ),
            (
                r#"{"allow":[{"host":"10.0.0.1","ports":[443]}]}"#,
                "cidr rule",
            ),
            (
                r#"{"allow":[{"cidr":"0.0.0.0/0","ports":[443]}]}"#,
                "--allow-network",
            ),
            (r#"{"allow":[{"cidr":"fd00::/8","ports":[443]}]}"#, "IPv6"),
            (
                r#"{"allow":[{"host":"a b","ports":[443]}]}"#,
                "not a host name",
            ),
            (
                r#"{"allow":[{"host":"x.example.com","ports":[0]}]}"#,
                "1–65535",
            ),
            (r#"{"allow":[],"proxy":true}"#, "unknown field"),
        ] {
            let e = Policy::from_json(json).unwrap_err().to_string();
            assert!(e.contains(says), "{json}: {e}");
        }
        assert!(Policy::from_allow_hosts(&["*.com"]).is_err());
        assert!(Policy::from_allow_hosts(&["x.example.com:0"]).is_err());
        assert!(Policy::from_allow_hosts(&["[::1]:443"]).is_err());
    }

    #[test]
    fn special_use_answers_need_a_cidr_rule() {
        let p = file(
            r#"{"allow":[{"host":"internal.example.com","ports":[443]},{"cidr":"10.1.0.0/16","ports":[443]}]}"#,
        );
        let host = ["11.9.9.9".parse().unwrap()];
        assert!(
            p.decide_resolved("93.184.216.34".parse().unwrap(), 443, &host)
                .allowed
        );
        assert!(
            !p.decide_resolved("127.0.0.1".parse().unwrap(), 443, &host)
                .allowed
        );
        assert!(
            !p.decide_resolved("169.254.169.254".parse().unwrap(), 443, &host)
                .allowed
        );
        assert!(
            !p.decide_resolved("11.9.9.9".parse().unwrap(), 443, &host)
                .allowed
        );
        assert!(
            p.decide_resolved("10.1.2.3".parse().unwrap(), 443, &host)
                .allowed
        );
        assert!(
            !p.decide_resolved("10.2.2.3".parse().unwrap(), 443, &host)
                .allowed
        );
    }

    #[test]
    fn flags_take_port_lists_and_ranges_of_addresses() {
        let p = Policy::from_flags(
            &["a.example:80,443", "b.example:8000-8002"],
            &["10.1.2.0/24:443", "10.9.9.9", "11.0.0.7:22,80"],
        )
        .unwrap();
        assert!(p.decide("a.example", 80).allowed && p.decide("a.example", 443).allowed);
        assert!(p.decide("b.example", 8001).allowed && !p.decide("b.example", 8003).allowed);
        assert!(p.decide("10.1.2.7", 443).allowed && !p.decide("10.1.2.7", 80).allowed);
        assert!(p.decide("11.0.0.7", 22).allowed && !p.decide("11.0.0.8", 22).allowed);
        // A name that resolves into the range, on the range's ports.
        let host: [IpAddr; 0] = [];
        assert!(
            p.decide_resolved("10.1.2.7".parse().unwrap(), 443, &host)
                .allowed
        );
        assert!(
            p.decide_resolved("10.9.9.9".parse().unwrap(), 443, &host)
                .allowed
        );
        assert!(
            !p.decide_resolved("10.9.9.9".parse().unwrap(), 80, &host)
                .allowed
        );
        let none: [&str; 0] = [];
        for (hosts, cidrs, says) in [
            (&none[..], &["0.0.0.0/0:443"][..], "--allow-network"),
            (&none, &["fd00::/8"], "IPv6"),
            (&none, &["10.1.2.0/24:0"], "1–65535"),
            (&none, &["10.1.2.0/24:"], "no port"),
            (&none, &["x.example"], "IPv4"),
            (&["10.0.0.0/8"], &none, "--allow-cidr"),
            (&["a.example:9-1"], &none, "empty"),
            (&["[::1]:443"], &none, "IPv6"),
        ] {
            let e = Policy::from_flags(hosts, cidrs).unwrap_err().to_string();
            assert!(e.contains(says), "{hosts:?} {cidrs:?}: {e}");
        }
        // Each problem names its flag.
        let e = Policy::from_flags(&["a b"], &["x"]).unwrap_err();
        assert_eq!(e.problems.len(), 2, "{e}");
        assert!(
            e.problems[0].starts_with("--allow-host") && e.problems[1].starts_with("--allow-cidr")
        );
    }

    #[test]
    fn a_denial_names_the_rule_that_would_lift_it() {
        let none: [&str; 0] = [];
        let p = Policy::from_flags(&["a.example:80"], &none).unwrap();
        let flag = |d: Decision| d.fix.and_then(|f| f.flag);
        let host: [IpAddr; 1] = ["11.9.9.9".parse().unwrap()];
        for (d, want) in [
            (p.decide("b.example", 443), "--allow-host b.example"),
            (p.decide("a.example", 8080), "--allow-host a.example:8080"),
            (p.decide("11.0.0.3", 22), "--allow-cidr 11.0.0.3/32:22"),
            (p.decide_name("c.example"), "--allow-host c.example"),
            (
                p.decide_resolved("10.1.2.3".parse().unwrap(), 80, &host),
                "--allow-cidr 10.1.2.3/32:80",
            ),
        ] {
            assert!(!d.allowed, "{d:?}");
            assert_eq!(flag(d).as_deref(), Some(want));
        }
        // The host's own address, its loopback and cloud metadata: denied, no rule offered
        // (a policy may still name them, deliberately).
        for d in [
            p.decide_resolved("11.9.9.9".parse().unwrap(), 80, &host),
            p.decide_resolved("127.0.0.1".parse().unwrap(), 80, &host),
            p.decide_resolved("169.254.169.254".parse().unwrap(), 80, &host),
            p.decide("127.0.0.1", 80),
            p.decide("169.254.169.254", 80),
        ] {
            assert!(!d.allowed && d.fix.is_none(), "{d:?}");
        }
        // The fix, taken, lifts the denial; its file form is a rule the file form reads.
        let d = p.decide_resolved("10.1.2.3".parse().unwrap(), 80, &host);
        let fix = d.fix.unwrap();
        let fixed = p
            .clone()
            .merge(Policy::from_flags(&none, &["10.1.2.3/32:80"]).unwrap());
        assert!(
            fixed
                .decide_resolved("10.1.2.3".parse().unwrap(), 80, &host)
                .allowed
        );
        let as_file = serde_json::json!({"allow": [fix.rule]}).to_string();
        assert!(
            Policy::from_json(&as_file)
                .unwrap()
                .decide("10.1.2.3", 80)
                .allowed
        );
        // Where an allow rule would not help, none is offered.
        let q = file(
            r#"{"allow":[{"host":"*.example.com","ports":[443]},{"cidr":"10.0.0.0/8","ports":[443]}],
                "deny":[{"host":"uploads.example.com"},{"cidr":"10.0.0.9"}]}"#,
        );
        assert_eq!(q.decide("uploads.example.com", 443).fix, None);
        assert_eq!(q.decide("10.0.0.9", 443).fix, None);
        let d = q.decide_resolved("10.0.0.9".parse().unwrap(), 443, &host);
        assert!(!d.allowed && d.fix.is_none(), "{d:?}");
        assert_eq!(q.decide("[::1]", 443).fix, None);
        assert_eq!(q.decide("a b", 443).fix, None);
        // The ceiling's denial: its rule, in the ceiling, and no flag of the step's.
        let c = Policy::from_flags(&["a.example:80", "b.example:80"], &none)
            .unwrap()
            .within(Policy::from_flags(&["a.example:80"], &none).unwrap());
        let fix = c.decide("b.example", 80).fix.unwrap();
        assert_eq!((fix.flag, fix.scope), (None, "ceiling"));
        assert_eq!(
            fix.rule,
            serde_json::json!({"host": "b.example", "ports": [80]})
        );
        // Audit mode: allowed, would deny, and the same fix.
        let a = file(r#"{"mode":"audit","allow":[{"host":"a.example","ports":[443]}]}"#);
        let d = a.decide("b.example", 443);
        assert!(d.would_deny);
        assert_eq!(flag(d).as_deref(), Some("--allow-host b.example"));
    }

    #[test]
    fn audit_allows_and_says_it_would_deny() {
        let p = file(r#"{"mode":"audit","allow":[{"host":"a.example.com","ports":[443]}]}"#);
        let d = p.decide("b.example.com", 443);
        assert!(d.allowed && d.would_deny);
        assert_eq!(d.verdict(), "would-deny");
        assert_eq!(p.decide("a.example.com", 443).verdict(), "allow");
    }

    #[test]
    fn a_ceiling_only_narrows() {
        let client = file(
            r#"{"mode":"audit","allow":[{"host":"*.example.com","ports":[443]},{"host":"evil.test","ports":[443]}]}"#,
        );
        let host = file(
            r#"{"allow":[{"host":"*.example.com","ports":[443]}],"deny":[{"host":"secret.example.com"}]}"#,
        );
        let p = client.within(host);
        assert!(p.decide("api.example.com", 443).allowed);
        // The client's audit mode does not let the ceiling's denials through.
        for (h, port) in [("evil.test", 443), ("secret.example.com", 443)] {
            let d = p.decide(h, port);
            assert!(
                !d.allowed && d.reason.starts_with("the host's ceiling"),
                "{h}: {d:?}"
            );
        }
        assert!(!p.decide_name("evil.test").allowed);
        // What the client denies stays its own (audit: would-deny), inside the ceiling.
        let d = p.decide("other.example.com", 80);
        assert!(!d.allowed || d.would_deny, "{d:?}");
        // The ceiling travels with the policy, and a client cannot widen it.
        let again = Policy::from_json(&p.to_json().to_string()).unwrap();
        assert_eq!(again, p);
        let wider = again.within(file(r#"{"allow":[{"host":"evil.test","ports":[443]}]}"#));
        assert!(!wider.decide("evil.test", 443).allowed);
        assert!(!wider.decide("api.example.com", 443).allowed);
    }

    #[test]
    fn canonical_form_round_trips_and_hash_is_stable() {
        let p = file(
            r#"{"allow":[{"host":"*.example.com","ports":[443,"8000-8001"]}],"deny":[{"cidr":"11.0.0.0/8"}]}"#,
        );
        let again = Policy::from_json(&p.to_json().to_string()).unwrap();
        assert_eq!(p, again);
        assert_eq!(p.hash(), again.hash());
        assert!(p.hash().starts_with("sha256:"));
        assert_eq!(p.allowed_ports(16).unwrap(), vec![443, 8000, 8001]);
        assert!(p.allowed_ports(2).is_err());
    }
}
