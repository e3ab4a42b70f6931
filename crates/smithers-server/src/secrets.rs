//! A client's secrets on this host: it sends each value with its create (read on its own
//! machine); the host keeps it in a sealed memory file of its own process (`memfd`), never
//! on disk, in a log or in a reply, and points the binding at it, where the native runtime
//! reads it when the step starts. The file closes with the sandbox's entry.
//!
//! The path a binding names (`/proc/self/fd/N`) is this entry's own descriptor, good only
//! while the entry holds it: nothing gives a binding to another sandbox (this host forks no
//! session), and a sandbox recovered after a restart is only cleaned up, never run (see
//! `crate::recovery`), so a number reused by another file is never read as a secret.
//!
//! Everything here is the client's and hostile: a binding naming a file (a path of this
//! host) is refused, as is a value with no binding, a binding with no value, or a value that
//! is not base64 or is over [`MAX_VALUE`].

use std::io::Write as _;
use std::os::fd::{AsRawFd, OwnedFd};

use base64::Engine as _;
use smithers_runtime::Controls;
use smithers_wire::wire::SecretValues;

use crate::error::ApiError;

/// The largest value (as the native runtime bounds a secret's file).
const MAX_VALUE: usize = 64 << 10;
/// The most secrets one sandbox may hold (each is a descriptor of this process for the
/// sandbox's life: a client must not exhaust them for every other).
pub(crate) const MAX_SECRETS: usize = smithers_runtime::MAX_SECRETS;

/// The sealed files holding a sandbox's secrets' values, open for its life.
#[derive(Debug, Default)]
pub(crate) struct SecretFiles(#[allow(dead_code)] Vec<OwnedFd>);

/// Gives each of `controls.secrets` its value from `values`, in a sealed memory file of this
/// process that the binding names (`/proc/self/fd/N`); refused as a malformed request when a
/// binding names a file, a value is missing, extra, not base64 or too large.
pub(crate) fn take(
    controls: &mut Controls,
    mut values: SecretValues,
) -> Result<SecretFiles, ApiError> {
    if controls.secrets.len() > MAX_SECRETS || values.0.len() > MAX_SECRETS {
        return Err(ApiError::malformed(format!(
            "a sandbox holds at most {MAX_SECRETS} secrets"
        )));
    }
    let mut files = Vec::new();
    for binding in &mut controls.secrets {
        let name = smithers_egress::policy::escape(&binding.name);
        if binding.file.is_some() {
            return Err(ApiError::malformed(format!(
                "secret {name} names a file: a file of this host is not a client's to read; send its value in secretValues"
            )));
        }
        let Some(encoded) = values.0.remove(&binding.name) else {
            return Err(ApiError::malformed(format!(
                "secret {name} has no value in secretValues"
            )));
        };
        if encoded.len() > MAX_VALUE / 3 * 4 + 4 {
            return Err(ApiError::malformed(format!(
                "secret {name}'s value is over {MAX_VALUE} bytes"
            )));
        }
        let value = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_bytes())
            .map_err(|_| {
                ApiError::malformed(format!("secret {name}'s value is not standard base64"))
            })?;
        if value.is_empty() || value.len() > MAX_VALUE {
            return Err(ApiError::malformed(format!(
                "secret {name}'s value is empty or over {MAX_VALUE} bytes"
            )));
        }
        // Checked now as the runtime will when the step starts (a key's shape), so that a
        // create that cannot run is refused as one.
        let end = (value.iter())
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |i| i + 1);
        smithers_egress::secrets::placeholder::check_value(&value[..end])
            .map_err(|why| ApiError::malformed(format!("secret {name}: {why}")))?;
        let fd = sealed_file(&value)
            .map_err(|e| ApiError::internal(format!("hold secret {name}'s value: {e}")))?;
        binding.file = Some(format!("/proc/self/fd/{}", fd.as_raw_fd()).into());
        files.push(fd);
    }
    if let Some(extra) = values.0.keys().next() {
        return Err(ApiError::malformed(format!(
            "secretValues holds {}, which no secret in controls.secrets names",
            smithers_egress::policy::escape(extra)
        )));
    }
    Ok(SecretFiles(files))
}

/// A memory file of this process holding `value`, sealed against any change.
fn sealed_file(value: &[u8]) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        c"smithers-secret",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut file = std::fs::File::from(fd);
    file.write_all(value)?;
    let fd = OwnedFd::from(file);
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smithers_runtime::SecretBinding;

    fn controls(names: &[&str]) -> Controls {
        Controls {
            secrets: (names.iter())
                .map(|n| SecretBinding {
                    name: n.to_string(),
                    hosts: vec!["api.example.com".into()],
                    file: None,
                })
                .collect(),
            ..Controls::default()
        }
    }

    fn values(pairs: &[(&str, &str)]) -> SecretValues {
        SecretValues(
            (pairs.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn each_value_is_held_in_a_sealed_file_of_this_process_that_its_binding_names() {
        let mut c = controls(&["API_KEY"]);
        let value = b"sk-test-0123456789abcdefghij";
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        let files = take(&mut c, values(&[("API_KEY", &encoded)])).unwrap();
        assert_eq!(files.0.len(), 1);
        assert_eq!(c.secrets[0].value().unwrap(), value);
        let path = c.secrets[0].file.clone().unwrap();
        assert!(path.starts_with("/proc/self/fd/"), "{path:?}");
        // Sealed: not even this process can change it.
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert!(f.write_all(b"x").is_err());
        drop(files);
        assert!(c.secrets[0].value().is_err(), "closed with its entry");
    }

    #[test]
    fn a_file_a_missing_an_extra_or_a_malformed_value_is_refused() {
        let mut named = controls(&["A"]);
        named.secrets[0].file = Some("/etc/shadow".into());
        let cases = [
            (named, values(&[("A", "eA==")])),
            (controls(&["A"]), values(&[])),
            (controls(&["A"]), values(&[("A", "eA=="), ("B", "eA==")])),
            (controls(&["A"]), values(&[("A", "not base64!")])),
            (controls(&["A"]), values(&[("A", "")])),
            (
                controls(&["A"]),
                values(&[("A", &"QUFB".repeat(MAX_VALUE / 3 + 2))]),
            ),
            // Not a key's shape (too short, a space).
            (controls(&["A"]), values(&[("A", "eA==")])),
            (
                controls(&["A"]),
                values(&[("A", "c2stdGVzdCAwMTIzNDU2Nzg5YWJjZGVmZ2hpag==")]),
            ),
        ];
        for (mut c, v) in cases {
            let before = c.clone();
            assert!(take(&mut c, v).is_err(), "{before:?}");
        }
    }

    #[test]
    fn a_sandbox_holds_a_bounded_number_of_secrets() {
        let names: Vec<String> = (0..=MAX_SECRETS).map(|i| format!("K{i}")).collect();
        let mut c = controls(&names.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(take(&mut c, values(&[])).is_err());
    }

    #[test]
    fn debug_shows_names_never_values() {
        let v = values(&[("API_KEY", "c2stdmFsdWU=")]);
        let shown = format!("{v:?}");
        assert!(
            shown.contains("API_KEY") && !shown.contains("c2st"),
            "{shown}"
        );
    }
}
