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

use smithers_egress::engine::EngineOptions;
use smithers_egress::{Engine, Listeners, Policy};
use smithers_runtime::{Controls, RuntimeError};
use smithers_sandbox_init::plan::EgressListen;

/// The HTTP proxy's port on the sandbox's loopback.
pub(crate) const HTTP_PROXY_PORT: u16 = 3128;
/// The SOCKS5 proxy's port on the sandbox's loopback.
pub(crate) const SOCKS_PORT: u16 = 1080;
/// Most distinct ports a policy may allow (a capture listener, and a descriptor, each).
pub(crate) const MAX_CAPTURE_PORTS: usize = 64;
/// The denials file, under the request directory (bound read-only at /run/smithers/request).
pub(crate) const DENIALS_FILE: &str = "egress-denials.ndjson";
/// The hosts file the sandbox sees with a policy: every other name goes to our resolver.
const HOSTS: &str = "127.0.0.1 localhost\n::1 localhost\n";
/// The resolver configuration the sandbox sees with a policy.
const RESOLV_CONF: &str = "# smithers-sandbox: names are resolved by the runtime's egress engine, outside the sandbox\nnameserver 127.0.0.1\noptions ndots:0 attempts:2 timeout:2\n";

/// The step's policy, checked; `None` without one. Refused when it does not parse or lint,
/// or when it needs what this runtime reserves (the proxies' ports, port 53) or more capture
/// listeners than it binds.
pub(crate) fn policy(c: &Controls) -> Result<Option<Policy>, RuntimeError> {
    let Some(v) = &c.egress_policy else {
        return Ok(None);
    };
    let refuse = |reason: String| RuntimeError::InvalidControl {
        control: "egressPolicy",
        reason,
    };
    let policy = Policy::from_json(&v.to_string()).map_err(|e| refuse(e.to_string()))?;
    let ports = policy.allowed_ports(MAX_CAPTURE_PORTS).map_err(|e| {
        refuse(format!(
            "{e} (the native runtime captures at most {MAX_CAPTURE_PORTS} ports)"
        ))
    })?;
    if let Some(p) = ports
        .iter()
        .find(|p| [53, HTTP_PROXY_PORT, SOCKS_PORT].contains(p))
    {
        return Err(refuse(format!(
            "port {p} inside the sandbox is the egress engine's own (DNS 53, HTTP proxy {HTTP_PROXY_PORT}, SOCKS5 {SOCKS_PORT}); reach it through a proxy instead"
        )));
    }
    Ok(Some(policy))
}

/// What P0 binds for `policy`.
pub(crate) fn listen_plan(policy: &Policy) -> EgressListen {
    EgressListen {
        dns: true,
        http_port: HTTP_PROXY_PORT,
        socks_port: SOCKS_PORT,
        capture_ports: policy.allowed_ports(MAX_CAPTURE_PORTS).unwrap_or_default(),
    }
}

/// The proxy variables of a step with a policy (a variable the step sets itself wins).
pub(crate) fn proxy_env() -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{HTTP_PROXY_PORT}");
    let socks = format!("socks5h://127.0.0.1:{SOCKS_PORT}");
    let mut out = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        out.push((name.to_string(), http.clone()));
    }
    out.push(("ALL_PROXY".to_string(), socks.clone()));
    out.push(("all_proxy".to_string(), socks));
    for name in ["NO_PROXY", "no_proxy"] {
        out.push((name.to_string(), "localhost,127.0.0.1".to_string()));
    }
    out.push((
        "SMITHERS_EGRESS_DENIALS".to_string(),
        format!("/run/smithers/request/{DENIALS_FILE}"),
    ));
    out
}

/// The directory of the `/etc` files a sandbox with a policy sees instead of the host's
/// (`resolv.conf` naming our resolver, a `hosts` with localhost only), written once under
/// the state root: their content never changes, so a prepared root made with them is reused.
pub(crate) fn etc_files(state_root: &Path) -> std::io::Result<PathBuf> {
    let dir = state_root.join("egress-etc");
    for (name, content) in [("resolv.conf", RESOLV_CONF), ("hosts", HOSTS)] {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).is_ok_and(|s| s == content) {
            continue;
        }
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, content)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(dir)
}

/// Starts the engine on the descriptors of P0's `egress` line, named by `names` in order.
pub(crate) fn start(
    policy: Policy,
    names: &[String],
    fds: Vec<OwnedFd>,
    denials: PathBuf,
    live: tokio::sync::mpsc::UnboundedSender<smithers_egress::EgressRecord>,
) -> Result<Engine, String> {
    if names.len() != fds.len() {
        return Err(format!(
            "the init sent {} egress descriptors for {} listeners",
            fds.len(),
            names.len()
        ));
    }
    let mut l = Listeners::default();
    for (name, fd) in names.iter().zip(fds) {
        match name.as_str() {
            "dnsUdp" => l.dns_udp = Some(std::net::UdpSocket::from(fd)),
            "dnsTcp" => l.dns_tcp = Some(std::net::TcpListener::from(fd)),
            "http" => l.http = Some(std::net::TcpListener::from(fd)),
            "socks" => l.socks = Some(std::net::TcpListener::from(fd)),
            n if n.starts_with("capture:") => l.capture.push(std::net::TcpListener::from(fd)),
            other => return Err(format!("unknown egress listener {other:?}")),
        }
    }
    // An empty file from the start: the step can tell "no denials" from "no policy".
    let _ = std::fs::write(&denials, b"");
    Engine::start(
        policy,
        l,
        EngineOptions {
            denials_file: Some(denials),
            live: Some(live),
            ..Default::default()
        },
    )
    .map_err(|e| format!("starting the egress engine: {e}"))
}

/// The enforcement row's detail for a sandbox with `policy`.
pub(crate) fn report_detail(policy: &Policy) -> String {
    let ports = policy
        .allowed_ports(MAX_CAPTURE_PORTS)
        .unwrap_or_default()
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "egress policy {} ({} mode): the sandbox's own network namespace, whose only ways out are the runtime's listeners, served outside it: DNS at 127.0.0.1:53 answered by the runtime (a name no rule allows gets NXDOMAIN and never leaves the host), the HTTP proxy at 127.0.0.1:{HTTP_PROXY_PORT} (CONNECT, absolute-form), SOCKS5 at 127.0.0.1:{SOCKS_PORT}, and connections by name captured on port{} {ports}; names resolved and answers checked outside; any other address, UDP other than DNS, ICMP and IPv6 unreachable",
        policy.hash(),
        policy.mode.as_str(),
        if ports.contains(',') { "s" } else { "" },
    )
}
