//! What a sandbox is asked to be: identity, runtime, project root and the controls normalised
//! from the step's config (spec section 4). Validation here is pure and shared by every backend,
//! so a bad control is rejected the same way whichever runtime was picked.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

/// Maximum length of an environment variable name.
pub const ENV_KEY_MAX_LENGTH: usize = 128;
/// Maximum size of an environment variable value in bytes.
pub const ENV_VALUE_MAX_BYTES: usize = 64 * 1024;
/// Default cap on captured stdout + stderr, per stream.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1024 * 1024;
/// Default cap on the log records (lines) of a step's output kept per stream: a megabyte of
/// newlines would otherwise be a million records, each held until the bundle is written.
pub const DEFAULT_MAX_OUTPUT_LINES: u64 = 100_000;

/// The runtimes named by the spec. The string forms are the contract (`runtime` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// Local Linux namespaces (named after the original's use of bubblewrap; ours needs no binary).
    Bubblewrap,
    /// A container engine reached through its API socket.
    Docker,
    /// A remote sandbox service over HTTP.
    Codeplane,
    /// A fleet: each sandbox is a lease (a Ray job holding a `sandbox_slot`) running a
    /// sandbox host on the node Ray chose, spoken to with the codeplane API.
    Ray,
}

impl RuntimeKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Bubblewrap => "bubblewrap",
            RuntimeKind::Docker => "docker",
            RuntimeKind::Codeplane => "codeplane",
            RuntimeKind::Ray => "ray",
        }
    }
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RuntimeKind {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bubblewrap" => Ok(RuntimeKind::Bubblewrap),
            "docker" => Ok(RuntimeKind::Docker),
            "codeplane" => Ok(RuntimeKind::Codeplane),
            "ray" => Ok(RuntimeKind::Ray),
            other => Err(RuntimeError::InvalidControl {
                control: "runtime",
                reason: format!(
                    "unknown runtime {other:?} (expected bubblewrap, docker, codeplane or ray)"
                ),
            }),
        }
    }
}

/// A published port: only meaningful with `allow_network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    pub host: u16,
    pub container: u16,
}

/// An extra bind mount. Never over `/workspace` or `/result`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    pub host: PathBuf,
    pub container: PathBuf,
    #[serde(default)]
    pub readonly: bool,
}

/// Persistent workspace settings for remote runtimes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    #[serde(default)]
    pub persistence: WorkspacePersistence,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspacePersistence {
    #[default]
    Ephemeral,
    Sticky,
}

/// Egress proxy settings. A runtime that cannot route through a proxy must refuse these.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificate: Option<String>,
    /// Secret name → environment variable. Values are never stored.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secret_bindings: BTreeMap<String, String>,
}

/// The controls of a sandbox, already parsed into units (bytes, cores, durations).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Controls {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub ports: Vec<PortMapping>,
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
    /// Memory limit in bytes.
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// CPU limit in cores (0.5 = half a core).
    #[serde(default)]
    pub cpu_limit: Option<f64>,
    /// Maximum number of processes/threads.
    #[serde(default)]
    pub pids_limit: Option<u32>,
    /// Maximum bytes the step may add to its workspace/tmp (the copy-on-write upper layer).
    #[serde(default)]
    pub disk_limit_bytes: Option<u64>,
    #[serde(default)]
    pub allow_network: bool,
    /// Cap on what is KEPT of each output stream (the log, the live line events): past it
    /// the log is truncated and says how much it did not keep. The step is not stopped and
    /// its output is still relayed whole, unless `fail_on_output_cap`.
    #[serde(default = "default_max_output")]
    pub max_output_bytes: u64,
    /// Cap on the log records (lines; a line over 64 KiB is kept in pieces) kept per stream,
    /// like `max_output_bytes`.
    #[serde(default = "default_max_output_lines")]
    pub max_output_lines: u64,
    /// Stop the step (termination `output`) when a stream passes either cap, instead of only
    /// truncating what is kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_on_output_cap: bool,
    /// Wall-clock timeout of `execute`, in milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub workspace: Option<WorkspaceSpec>,
    #[serde(default)]
    pub egress: Option<EgressConfig>,
    /// Mounts over sensitive host paths (credentials, system trees, daemons' sockets, a
    /// whole home: [`crate::mounts::sensitive_reason`]) are refused unless this is set: the
    /// caller's explicit choice, recorded in the config and the enforcement report.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_sensitive_mounts: bool,
    /// A persistent home: the step's `$HOME` is the named home this runtime keeps for its
    /// user across runs and sessions (never the host's own home, never part of the
    /// patches), instead of an empty tmpfs. A name, never a path: the runtime places it.
    /// Refused by a runtime that keeps no homes (a remote host's would be shared by its
    /// clients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    /// The network the step may reach, by name and port (the `smithers-egress` policy in
    /// its JSON form): enforced outside the sandbox by a runtime that can, refused at create
    /// by one that cannot. Exclusive with `allow_network`. From the caller only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_policy: Option<serde_json::Value>,
    /// Secrets on egress (`--secret NAME@HOST`): the step's `$NAME` holds a placeholder of
    /// the value's shape; the value, read by the runtime when the step starts (from its own
    /// environment or a file, never stored), is swapped in only in requests to the bound
    /// hosts, and swapped out of what comes back. Needs an egress policy. Refused by a
    /// runtime that cannot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretBinding>,
}

/// The most secrets a sandbox may be given.
pub const MAX_SECRETS: usize = 32;

/// One secret: its variable, the hosts it is bound to, where its value is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretBinding {
    pub name: String,
    pub hosts: Vec<String>,
    /// A file holding the value (its trailing newline dropped); `None`: the runtime's own
    /// `$NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<std::path::PathBuf>,
}

impl SecretBinding {
    /// The value, read now (by the runtime, in its own process).
    pub fn value(&self) -> Result<Vec<u8>, String> {
        let raw = match &self.file {
            Some(path) => {
                use std::io::Read as _;
                let fail = |e: std::io::Error| format!("{}: {}: {e}", self.name, path.display());
                let mut raw = Vec::new();
                // Bounded as read (a file that grows after a look at its size stays bounded).
                (std::fs::File::open(path).map_err(fail)?)
                    .take((64 << 10) + 1)
                    .read_to_end(&mut raw)
                    .map_err(fail)?;
                if raw.len() > 64 << 10 {
                    return Err(format!("{}: {} is over 64 KiB", self.name, path.display()));
                }
                raw
            }
            None => std::env::var_os(&self.name)
                .map(std::os::unix::ffi::OsStringExt::into_vec)
                .ok_or_else(|| format!("${} is not set in the runtime's environment", self.name))?,
        };
        let end = raw
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |i| i + 1);
        Ok(raw[..end].to_vec())
    }
}

/// A secret with its value read by the runtime: given to its egress engine, never
/// serialized; `Debug` leaves the value out.
pub struct ReadSecret {
    pub name: String,
    pub hosts: Vec<String>,
    pub value: Vec<u8>,
}

impl fmt::Debug for ReadSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadSecret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl Controls {
    /// Each secret with its value, read now (by the runtime, in its own process); refused as
    /// the `secrets` control, naming the one that cannot be read.
    pub fn secret_values(&self) -> Result<Vec<ReadSecret>, RuntimeError> {
        (self.secrets.iter())
            .map(|b| {
                let value = b.value().map_err(|reason| RuntimeError::InvalidControl {
                    control: "secrets",
                    reason,
                })?;
                Ok(ReadSecret {
                    name: b.name.clone(),
                    hosts: b.hosts.clone(),
                    value,
                })
            })
            .collect()
    }
}

fn default_max_output() -> u64 {
    DEFAULT_MAX_OUTPUT_BYTES
}

fn default_max_output_lines() -> u64 {
    DEFAULT_MAX_OUTPUT_LINES
}

impl Default for Controls {
    fn default() -> Self {
        Controls {
            env: BTreeMap::new(),
            ports: Vec::new(),
            volumes: Vec::new(),
            memory_limit_bytes: None,
            cpu_limit: None,
            pids_limit: None,
            disk_limit_bytes: None,
            allow_network: false,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_output_lines: DEFAULT_MAX_OUTPUT_LINES,
            fail_on_output_cap: false,
            timeout_ms: None,
            workspace: None,
            egress: None,
            allow_sensitive_mounts: false,
            home: None,
            egress_policy: None,
            secrets: Vec::new(),
        }
    }
}

impl Controls {
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout_ms.map(Duration::from_millis)
    }

    /// Checks every control against the rules of spec section 4. Backends call this in
    /// `create` before doing anything, then refuse the controls they cannot enforce.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        for (key, value) in &self.env {
            validate_env_entry(key, value)?;
        }
        if let Some(name) = &self.home {
            validate_id("home", name)?;
        }
        if self.secrets.len() > MAX_SECRETS {
            return Err(invalid(
                "secrets",
                format!("a sandbox holds at most {MAX_SECRETS} secrets"),
            ));
        }
        for s in &self.secrets {
            let named = !s.name.is_empty()
                && !s.name.starts_with(|c: char| c.is_ascii_digit())
                && s.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !named || s.hosts.is_empty() {
                return Err(invalid(
                    "secrets",
                    format!(
                        "{:?}: a secret is a variable name bound to at least one host",
                        s.name
                    ),
                ));
            }
            if self.egress_policy.is_none() {
                return Err(invalid(
                    "secrets",
                    "a secret is given only under an egress policy (its hosts allowed on 443)"
                        .to_string(),
                ));
            }
        }
        if let Some(policy) = &self.egress_policy {
            if !policy.is_object() {
                return Err(invalid(
                    "egressPolicy",
                    "an egress policy is a JSON object ({\"allow\": [...], \"deny\": [...]})"
                        .to_string(),
                ));
            }
            if self.allow_network {
                return Err(invalid(
                    "egressPolicy",
                    "allowNetwork shares the host's whole network, so a policy would mean nothing: choose one".to_string(),
                ));
            }
        }
        for port in &self.ports {
            if port.host == 0 || port.container == 0 {
                return Err(invalid("ports", "port numbers must be 1-65535".to_string()));
            }
        }
        if !self.ports.is_empty() && !self.allow_network {
            return Err(invalid(
                "ports",
                "publishing ports requires allowNetwork: true".to_string(),
            ));
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        for volume in &self.volumes {
            validate_volume(volume)?;
            if !self.allow_sensitive_mounts {
                if let Some(reason) = crate::mounts::sensitive_reason(&volume.host, home.as_deref())
                {
                    return Err(invalid(
                        "volumes",
                        format!(
                            "mount of {} refused: {reason}; if the step must have it, allow it explicitly (--allow-sensitive-mount, allowSensitiveMounts: true)",
                            volume.host.display()
                        ),
                    ));
                }
            }
        }
        if let Some(cpu) = self.cpu_limit {
            if !(cpu.is_finite() && cpu > 0.0) {
                return Err(invalid(
                    "cpuLimit",
                    format!("must be a positive number, got {cpu}"),
                ));
            }
        }
        if self.memory_limit_bytes == Some(0) {
            return Err(invalid(
                "memoryLimit",
                "must be greater than zero".to_string(),
            ));
        }
        if self.pids_limit == Some(0) {
            return Err(invalid(
                "pidsLimit",
                "must be greater than zero".to_string(),
            ));
        }
        if self.max_output_bytes == 0 {
            return Err(invalid(
                "maxOutputBytes",
                "must be greater than zero".to_string(),
            ));
        }
        if self.max_output_lines == 0 {
            return Err(invalid(
                "maxOutputLines",
                "must be greater than zero".to_string(),
            ));
        }
        Ok(())
    }
}

fn invalid(control: &'static str, reason: String) -> RuntimeError {
    RuntimeError::InvalidControl { control, reason }
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`, ≤128 chars; value ≤64 KiB without NUL.
pub fn validate_env_entry(key: &str, value: &str) -> Result<(), RuntimeError> {
    let mut chars = key.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(invalid(
            "env",
            format!("invalid variable name {key:?}: must match ^[A-Za-z_][A-Za-z0-9_]*$"),
        ));
    }
    if key.len() > ENV_KEY_MAX_LENGTH {
        return Err(invalid(
            "env",
            format!("variable name {key:?} exceeds {ENV_KEY_MAX_LENGTH} characters"),
        ));
    }
    if value.len() > ENV_VALUE_MAX_BYTES {
        return Err(invalid(
            "env",
            format!("value of {key} exceeds {ENV_VALUE_MAX_BYTES} bytes"),
        ));
    }
    if value.contains('\0') {
        return Err(invalid(
            "env",
            format!("value of {key} contains a NUL byte"),
        ));
    }
    Ok(())
}

fn validate_volume(volume: &VolumeMount) -> Result<(), RuntimeError> {
    if !volume.host.is_absolute() || !volume.container.is_absolute() {
        return Err(invalid(
            "volumes",
            format!(
                "volume paths must be absolute: {} -> {}",
                volume.host.display(),
                volume.container.display()
            ),
        ));
    }
    if volume
        .container
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(invalid(
            "volumes",
            format!(
                "container path may not contain '..': {}",
                volume.container.display()
            ),
        ));
    }
    for reserved in ["/workspace", "/result", "/run/smithers"] {
        let reserved = Path::new(reserved);
        // Targeting the reserved dir, a path beneath it, or a parent of it (which would shadow
        // it) are all refused.
        if volume.container.starts_with(reserved) || reserved.starts_with(&volume.container) {
            return Err(invalid(
                "volumes",
                format!(
                    "volume {} would target or shadow {}",
                    volume.container.display(),
                    reserved.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Parses a `512m`-style memory size: a number with an optional unit b, k, m, g, t (binary
/// multiples, case-insensitive, an optional trailing `b`/`ib` accepted: `512MiB`, `1g`, `2048`).
pub fn parse_memory_limit(text: &str) -> Result<u64, RuntimeError> {
    let t = text.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim();
    let multiplier: u64 = match unit {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(invalid(
                "memoryLimit",
                format!("unrecognised size {text:?} (expected e.g. 512m, 2g)"),
            ))
        }
    };
    let value: f64 = number.parse().map_err(|_| {
        invalid(
            "memoryLimit",
            format!("unrecognised size {text:?} (expected e.g. 512m, 2g)"),
        )
    })?;
    let bytes = value * multiplier as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(invalid(
            "memoryLimit",
            format!("size {text:?} out of range"),
        ));
    }
    Ok(bytes as u64)
}

/// Parses a `0.5`-style CPU limit in cores.
pub fn parse_cpu_limit(text: &str) -> Result<f64, RuntimeError> {
    let value: f64 = text.trim().parse().map_err(|_| {
        invalid(
            "cpuLimit",
            format!("unrecognised CPU limit {text:?} (expected e.g. 0.5, 2)"),
        )
    })?;
    if !(value.is_finite() && value > 0.0) {
        return Err(invalid(
            "cpuLimit",
            format!("must be positive, got {text:?}"),
        ));
    }
    Ok(value)
}

/// Everything `create` needs. Plain data, serialisable, so it can be stored and sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxConfig {
    pub run_id: String,
    pub sandbox_id: String,
    pub runtime: RuntimeKind,
    /// The project on the host; appears at `/workspace` as a copy-on-write view.
    pub root_dir: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default)]
    pub controls: Controls,
    /// A session forked from a checkpoint: the frozen layers (ids of the engine's own store,
    /// top first) its workspace starts from, over the project. Never read from or written
    /// to JSON: a config that came from a client or a file must not name another sandbox's
    /// layers; only this process's own session code sets it. Refused by an engine that
    /// cannot stack layers.
    #[serde(skip)]
    pub workspace_layers: Vec<String>,
}

impl SandboxConfig {
    /// The entity id `"<runId>:<sandboxId>"` every runtime is keyed by.
    pub fn entity_id(&self) -> String {
        format!("{}:{}", self.run_id, self.sandbox_id)
    }

    /// Refuses [`Controls::home`] for a runtime that keeps no homes.
    pub fn refuse_home(&self, runtime: &'static str) -> Result<(), RuntimeError> {
        match &self.controls.home {
            None => Ok(()),
            Some(_) => Err(RuntimeError::ControlUnsupported {
                runtime,
                control: "home",
                reason: "a persistent home is kept by the native runtime on this machine only"
                    .into(),
            }),
        }
    }

    /// Refuses [`Controls::secrets`] for a runtime that cannot swap them on egress (rather
    /// than giving the step the placeholder with nothing to swap it, or the value).
    pub fn refuse_secrets(&self, runtime: &'static str) -> Result<(), RuntimeError> {
        if self.controls.secrets.is_empty() {
            return Ok(());
        }
        Err(RuntimeError::ControlUnsupported {
            runtime,
            control: "secrets",
            reason:
                "secrets on egress are swapped by the native runtime's egress engine only (yet)"
                    .into(),
        })
    }

    /// Refuses [`SandboxConfig::workspace_layers`] for a runtime that cannot stack layers
    /// (rather than starting the sandbox from the project and losing the fork's state).
    pub fn refuse_layers(&self, runtime: &'static str) -> Result<(), RuntimeError> {
        if self.workspace_layers.is_empty() {
            return Ok(());
        }
        Err(RuntimeError::ControlUnsupported {
            runtime,
            control: "checkpoint",
            reason: "this runtime cannot start a sandbox from a checkpoint's layers".into(),
        })
    }

    /// Checks ids (they become path components) and every control.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        validate_id("runId", &self.run_id)?;
        validate_id("sandboxId", &self.sandbox_id)?;
        if !self.root_dir.is_absolute() {
            return Err(invalid(
                "rootDir",
                format!("must be an absolute path, got {}", self.root_dir.display()),
            ));
        }
        self.controls.validate()?;
        for volume in self.controls.volumes.iter().filter(|v| !v.readonly) {
            if let Some(reason) = crate::mounts::project_overlap(&volume.host, &self.root_dir) {
                return Err(invalid("volumes", reason));
            }
        }
        Ok(())
    }
}

/// Ids become directory names on the host and in remote URLs: keep them boring.
pub fn validate_id(what: &'static str, id: &str) -> Result<(), RuntimeError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            what,
            format!("{id:?} must be 1-128 characters of [A-Za-z0-9._-], not '.' or '..'"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory_limit("512m").unwrap(), 512 << 20);
        assert_eq!(parse_memory_limit("1G").unwrap(), 1 << 30);
        assert_eq!(parse_memory_limit("2048").unwrap(), 2048);
        assert_eq!(parse_memory_limit("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_memory_limit("64MiB").unwrap(), 64 << 20);
        assert!(parse_memory_limit("lots").is_err());
        assert!(parse_memory_limit("0").is_err());
        assert!(parse_memory_limit("-1m").is_err());
    }

    #[test]
    fn env_rules() {
        assert!(validate_env_entry("PATH", "/bin").is_ok());
        assert!(validate_env_entry("_X1", "").is_ok());
        assert!(validate_env_entry("1X", "").is_err());
        assert!(validate_env_entry("A-B", "").is_err());
        assert!(validate_env_entry("", "").is_err());
        assert!(validate_env_entry(&"A".repeat(129), "").is_err());
        assert!(validate_env_entry("A", &"x".repeat(64 * 1024 + 1)).is_err());
        assert!(validate_env_entry("A", "a\0b").is_err());
    }

    #[test]
    fn volumes_never_shadow_workspace_or_result() {
        let mk = |c: &str| VolumeMount {
            host: "/data".into(),
            container: c.into(),
            readonly: true,
        };
        assert!(validate_volume(&mk("/data")).is_ok());
        assert!(validate_volume(&mk("/workspace")).is_err());
        assert!(validate_volume(&mk("/workspace/sub")).is_err());
        assert!(validate_volume(&mk("/result")).is_err());
        assert!(validate_volume(&mk("/")).is_err());
        assert!(validate_volume(&mk("/data/../workspace")).is_err());
        assert!(validate_volume(&mk("relative")).is_err());
    }

    #[test]
    fn ports_need_network() {
        let mut c = Controls {
            ports: vec![PortMapping {
                host: 8080,
                container: 80,
            }],
            ..Controls::default()
        };
        assert!(c.validate().is_err());
        c.allow_network = true;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn ids() {
        assert!(validate_id("runId", "run-1.a_b").is_ok());
        assert!(validate_id("runId", "..").is_err());
        assert!(validate_id("runId", "a/b").is_err());
        assert!(validate_id("runId", "").is_err());
    }
}
