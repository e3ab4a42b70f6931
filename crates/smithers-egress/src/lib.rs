//! The egress engine: the network a step may reach, decided in the trusted process.
//!
//! A sandbox with an egress policy keeps its own network namespace (only its loopback), and
//! the runtime binds, inside it, the only ways out: a DNS resolver on `127.0.0.1:53` that
//! answers allowed names with synthetic loopback addresses and denied names with NXDOMAIN
//! (no query the step makes leaves the host), an HTTP proxy (CONNECT and absolute-form),
//! a SOCKS5 proxy, and a capture listener on each allowed port for clients that ignore proxy
//! variables (they connect to the synthetic address, which names the host they meant).
//! Every connection arriving on those listeners is decided here by [`Policy::decide`], the
//! name resolved here (never in the sandbox), the answer checked by
//! [`Policy::decide_resolved`], and the checked address dialed. Each decision is an
//! [`EgressRecord`].
//!
//! - [`policy`]: the rules, their two forms, the lint, the decision function.
//! - [`addr`]: special-use address space and the host's own addresses.
//! - [`suffix`]: public suffixes (a wildcard over one is refused).
//! - [`dns`]: the resolver's wire format (bounded parsing, our own answers).
//! - [`proxy`]: the entry points' protocols (HTTP head, SOCKS5, TLS server name).
//! - [`engine`]: the listeners served, the caps, the records.
//! - [`sandbox`]: what a sandbox sees of it (ports, `/etc` files, proxy variables).
//! - [`secrets`]: secrets on egress (placeholders inside, values swapped in for bound hosts).
//! - [`tls`]: TLS to an origin for an absolute-form `https://` request (busybox `wget`).

pub mod addr;
pub mod dns;
pub mod engine;
pub mod fdpass;
mod kernel_splice;
pub mod policy;
pub mod proxy;
pub mod sandbox;
pub mod secrets;
pub mod suffix;
pub mod tls;

pub use engine::{EgressLimits, EgressRecord, Engine, Listeners, SecretsUse, Summary};
pub use policy::{Decision, Fix, Mode, Policy, PolicyError};
