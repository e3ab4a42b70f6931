//! Secrets on egress: a step gets a placeholder in `$NAME`, never the value; the engine swaps
//! the value in only in requests to the hosts the secret is bound to, and swaps it back out
//! of everything that comes back.
//!
//! For a bound host (port 443) the engine terminates the step's TLS with a certificate of the
//! run's own authority ([`authority`]), opens its own TLS to the real host, verified with this
//! host's trust store, and relays HTTP/1.1 message by message ([`http`]):
//!
//! - requests: the placeholder of a secret bound to the host is replaced by its value in the
//!   request's header fields only, in any of its forms ([`placeholder::forms`]: as is,
//!   percent-encoded, base64 at any alignment) and inside `Authorization: Basic` (git's
//!   `user:token`); never in the request line or a body, where an API that stores or repeats
//!   what it is sent (a prompt to a model that can spell it out) would give it back by another
//!   way; the placeholder of a secret *not* bound to the host ends the connection before it is
//!   sent; a `Host` other than the connection's ends it too; `Accept-Encoding` is made
//!   `identity`, so that what comes back can be read;
//! - responses: every secret's value, in any of its forms, and any run of its beginning long
//!   enough to be it (an echo that truncates it), is replaced by its placeholder, streamed
//!   (only a tail that could still become a match is held); a compressed body, which could
//!   not be read, ends the connection;
//! - after an upgrade (WebSocket) the bytes pass both ways through the same swaps.
//!
//! Every swap keeps the length (the placeholder has the value's shape), so framing stays true.
//! A client that pins its own authority fails its handshake: nothing is sent. The values live
//! in this process only; records name the secret, the host and the counts, never a value.

pub mod authority;
pub mod http;
mod intercept;
pub mod placeholder;
pub mod replace;

use std::sync::Arc;

use base64::Engine as _;

pub use intercept::{relay, Relayed};
use replace::Replacer;

/// A secret as the runtime is given it: its variable's name, the hosts it is bound to, its
/// value (read by the runtime from its own environment or a file; never stored).
#[derive(Clone)]
pub struct SecretSpec {
    pub name: String,
    pub hosts: Vec<String>,
    pub value: Vec<u8>,
}

impl std::fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSpec")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

struct Binding {
    name: String,
    hosts: Vec<String>,
    value: Vec<u8>,
    placeholder: Vec<u8>,
}

/// A step's secrets, their placeholders and its authority.
pub struct Secrets {
    bindings: Vec<Binding>,
    authority: authority::Authority,
    upstream: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.bindings.iter().map(|b| b.name.as_str()).collect();
        f.debug_struct("Secrets")
            .field("names", &names)
            .finish_non_exhaustive()
    }
}

/// A variable name a secret may have: a shell's.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a variable name (letters, digits and _, not starting with a digit)",
            crate::policy::escape(name)
        ))
    }
}

/// A host a secret may be bound to: a DNS name, lower-cased (no wildcard, no address: a
/// certificate is made for it).
pub fn check_host(host: &str) -> Result<String, String> {
    let name = crate::policy::normalize_name(host)
        .map_err(|e| format!("{:?}: {e}", crate::policy::escape(host)))?;
    if name.parse::<std::net::IpAddr>().is_ok() || !name.contains('.') {
        return Err(format!(
            "{name}: a secret is bound to a DNS name with a dot in it"
        ));
    }
    Ok(name)
}

impl Secrets {
    /// Checks every secret and makes its placeholder and the run's authority.
    pub fn new(specs: Vec<SecretSpec>) -> Result<Secrets, String> {
        let mut bindings = Vec::new();
        let mut all_hosts: Vec<String> = Vec::new();
        for spec in specs {
            check_name(&spec.name)?;
            placeholder::check_value(&spec.value).map_err(|e| format!("{}: {e}", spec.name))?;
            if bindings.iter().any(|b: &Binding| b.name == spec.name) {
                return Err(format!("{} is given twice", spec.name));
            }
            if spec.hosts.is_empty() {
                return Err(format!("{} is bound to no host", spec.name));
            }
            let hosts = (spec.hosts.iter())
                .map(|h| check_host(h))
                .collect::<Result<Vec<_>, _>>()?;
            for h in &hosts {
                if !all_hosts.contains(h) {
                    all_hosts.push(h.clone());
                }
            }
            let random = random_bytes(spec.value.len())?;
            let placeholder = placeholder::make(&spec.value, &random);
            bindings.push(Binding {
                name: spec.name,
                hosts,
                value: spec.value,
                placeholder,
            });
        }
        Ok(Secrets {
            authority: authority::Authority::new(&all_hosts)?,
            upstream: authority::upstream_config()?,
            bindings,
        })
    }

    /// What the step's environment gets: each secret's name and placeholder.
    pub fn env(&self) -> Vec<(String, String)> {
        (self.bindings.iter())
            .map(|b| {
                (
                    b.name.clone(),
                    String::from_utf8_lossy(&b.placeholder).into_owned(),
                )
            })
            .collect()
    }

    /// The run's authority's certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.authority.pem()
    }

    /// Every host a secret is bound to.
    pub fn hosts(&self) -> Vec<String> {
        let mut out: Vec<String> = self.bindings.iter().flat_map(|b| b.hosts.clone()).collect();
        out.sort();
        out.dedup();
        out
    }

    /// Whether a secret is bound to `host` (lower-case).
    pub fn bound(&self, host: &str) -> bool {
        self.bindings
            .iter()
            .any(|b| b.hosts.iter().any(|h| h == host))
    }

    /// The names of the secrets bound to `host`.
    fn names_for(&self, host: &str) -> Vec<String> {
        (self.bindings.iter())
            .filter(|b| b.hosts.iter().any(|h| h == host))
            .map(|b| b.name.clone())
            .collect()
    }

    /// Placeholder → value, for the secrets bound to `host`.
    fn swap_in(&self, host: &str) -> Replacer {
        let pairs = (self.bindings.iter())
            .filter(|b| b.hosts.iter().any(|h| h == host))
            .flat_map(|b| placeholder::forms(&b.placeholder, &b.value))
            .collect();
        Replacer::new(pairs)
    }

    /// Finds (without changing) the placeholders of the secrets not bound to `host`.
    fn foreign(&self, host: &str) -> Replacer {
        let pairs = (self.bindings.iter())
            .filter(|b| !b.hosts.iter().any(|h| h == host))
            .flat_map(|b| placeholder::forms(&b.placeholder, &b.placeholder))
            .map(|(f, _)| (f.clone(), f))
            .collect();
        Replacer::new(pairs)
    }

    /// A finder of every secret's placeholder (for traffic to a host none is bound to).
    pub fn placeholder_finder(&self) -> Replacer {
        self.foreign("")
    }

    /// Value → placeholder, for every secret (whatever host answers).
    fn swap_out(&self) -> Replacer {
        let mut r = Replacer::new(
            (self.bindings.iter())
                .flat_map(|b| placeholder::forms(&b.value, &b.placeholder))
                .collect(),
        );
        // A run of a value's beginning too (an echo that cuts it short).
        for b in &self.bindings {
            let least = placeholder::prefix_len(&b.value) + placeholder::PARTIAL_MIN;
            r = r.with_beginning(&b.value, &b.placeholder, least);
        }
        r.steady()
    }

    /// A `Basic` credential with the placeholders bound to `host` swapped in, or why not.
    fn basic_auth(&self, host: &str, encoded: &str) -> Result<(String, u64), String> {
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
            return Ok((encoded.to_string(), 0));
        };
        let mut found = self.foreign(host);
        let mut seen = Vec::new();
        found.push(&decoded, &mut seen);
        found.finish(false, &mut seen);
        if found.swaps > 0 {
            return Err(foreign_refusal(host));
        }
        let mut r = self.swap_in(host);
        let mut out = Vec::new();
        r.push(&decoded, &mut out);
        r.finish(false, &mut out);
        Ok((
            base64::engine::general_purpose::STANDARD.encode(out),
            r.swaps,
        ))
    }
}

fn foreign_refusal(host: &str) -> String {
    format!("the placeholder of a secret not bound to {host} was in a request to it: not sent")
}

fn random_bytes(n: usize) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("reading /dev/urandom for a placeholder: {e}"))?;
    Ok(buf)
}
