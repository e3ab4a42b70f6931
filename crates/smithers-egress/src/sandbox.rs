//! What a sandbox with a policy sees of the engine, the same on every runtime: where the
//! listeners are inside its network namespace, the `/etc` files naming our resolver, and the
//! proxy variables; with secrets, the run's authority it trusts and the variables naming it.

/// The HTTP proxy's port on the sandbox's loopback.
pub const HTTP_PROXY_PORT: u16 = 3128;
/// The SOCKS5 proxy's port on the sandbox's loopback.
pub const SOCKS_PORT: u16 = 1080;
/// The resolver's port (UDP and TCP) on the sandbox's loopback.
pub const DNS_PORT: u16 = 53;
/// Most distinct ports a policy may allow (a capture listener, and a descriptor, each).
pub const MAX_CAPTURE_PORTS: usize = 64;
/// The denials file's name, in the request directory (read-only inside, at
/// `/run/smithers/request/` on the native runtime and `/smithers/request/` on docker).
pub const DENIALS_FILE: &str = "egress-denials.ndjson";

/// `/etc/resolv.conf` inside: our resolver.
pub const RESOLV_CONF: &str = "# smithers-sandbox: names are resolved by the runtime's egress engine, outside the sandbox\nnameserver 127.0.0.1\noptions ndots:0 attempts:2 timeout:2\n";
/// `/etc/hosts` inside: localhost only, so that no host entry bypasses our resolver.
pub const HOSTS: &str = "127.0.0.1 localhost\n::1 localhost\n";

/// A step's policy as a runtime receives it (the JSON of `Controls::egress_policy`):
/// parsed, linted, and checked against what a runtime binds ([`capture_ports`]). `Err` is
/// the reason, for the runtime's refusal of the control.
pub fn checked_policy(v: &serde_json::Value) -> Result<crate::Policy, String> {
    let policy = crate::Policy::from_json(&v.to_string()).map_err(|e| e.to_string())?;
    capture_ports(&policy)?;
    Ok(policy)
}

/// The ports a runtime binds for `policy` (checked: at most [`MAX_CAPTURE_PORTS`], none of
/// the engine's own).
pub fn capture_ports(policy: &crate::Policy) -> Result<Vec<u16>, String> {
    let ports = policy
        .allowed_ports(MAX_CAPTURE_PORTS)
        .map_err(|e| format!("{e} (a sandbox captures at most {MAX_CAPTURE_PORTS} ports)"))?;
    if let Some(p) = ports
        .iter()
        .find(|p| [DNS_PORT, HTTP_PROXY_PORT, SOCKS_PORT].contains(p))
    {
        return Err(format!(
            "port {p} inside the sandbox is the egress engine's own (DNS {DNS_PORT}, HTTP proxy {HTTP_PROXY_PORT}, SOCKS5 {SOCKS_PORT}); reach it through a proxy instead"
        ));
    }
    Ok(ports)
}

/// The proxy variables of a step with a policy (a variable the step sets itself wins), and
/// where its denials are readable.
pub fn proxy_env(denials_path: &str) -> Vec<(String, String)> {
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
        denials_path.to_string(),
    ));
    out
}

/// Writes [`RESOLV_CONF`] and [`HOSTS`] into `dir` (once: they never change, so a prepared
/// root made with them is reused), returning `dir`.
pub fn write_etc_files(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    for (name, content) in [("resolv.conf", RESOLV_CONF), ("hosts", HOSTS)] {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).is_ok_and(|s| s == content) {
            continue;
        }
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, content)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(dir.to_path_buf())
}

/// The enforcement row's detail for a sandbox with `policy`.
pub fn report_detail(policy: &crate::Policy) -> String {
    let ports = policy
        .allowed_ports(MAX_CAPTURE_PORTS)
        .unwrap_or_default()
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "egress policy {} ({} mode): the sandbox's own network namespace, whose only ways out are the runtime's listeners, served outside it: DNS at 127.0.0.1:{DNS_PORT} answered by the runtime (a name no rule allows gets NXDOMAIN and never leaves the host), the HTTP proxy at 127.0.0.1:{HTTP_PROXY_PORT} (CONNECT, absolute-form), SOCKS5 at 127.0.0.1:{SOCKS_PORT}, and connections by name captured on port{} {ports}; names resolved and answers checked outside; any other address, UDP other than DNS, ICMP and IPv6 unreachable",
        policy.hash(),
        policy.mode.as_str(),
        if ports.contains(',') { "s" } else { "" },
    )
}

/// The run's authority's certificate, and this host's bundle with it, in the step's request
/// directory (see [`write_authority`]).
pub const CA_FILE: &str = "egress-ca.pem";
pub const CA_BUNDLE: &str = "egress-ca-bundle.pem";

/// The step's secrets made (their placeholders and the run's authority) from `specs`, and
/// the authority written into `request_dir` for the step to trust: its certificate alone
/// ([`CA_FILE`], as `NODE_EXTRA_CA_CERTS` wants it) and after this host's bundle
/// ([`CA_BUNDLE`], for the variables that replace the system's). `None` without any.
pub fn secrets_for(
    specs: Vec<crate::secrets::SecretSpec>,
    request_dir: &std::path::Path,
) -> Result<Option<std::sync::Arc<crate::secrets::Secrets>>, String> {
    if specs.is_empty() {
        return Ok(None);
    }
    let secrets = crate::secrets::Secrets::new(specs)?;
    let ca = secrets.ca_pem();
    let host_bundle = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .unwrap_or_default();
    for (name, content) in [
        (CA_FILE, ca.clone()),
        (CA_BUNDLE, format!("{host_bundle}\n{ca}")),
    ] {
        let path = request_dir.join(name);
        std::fs::write(&path, content).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(Some(std::sync::Arc::new(secrets)))
}

/// What the step's environment gets for its secrets: each placeholder under the secret's
/// name, and the run's authority (under `request_inside`, where the step sees its request
/// directory) named in every variable common clients read.
pub fn secrets_env(s: &crate::secrets::Secrets, request_inside: &str) -> Vec<(String, String)> {
    let bundle = format!("{request_inside}/{CA_BUNDLE}");
    let mut env = s.env();
    for name in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
    ] {
        env.push((name.to_string(), bundle.clone()));
    }
    env.push((
        "NODE_EXTRA_CA_CERTS".to_string(),
        format!("{request_inside}/{CA_FILE}"),
    ));
    env
}

/// What the network row says of a step's secrets, `(name, hosts)` each: names and hosts,
/// never a value. Empty without any.
pub fn secrets_detail<'a>(bindings: impl IntoIterator<Item = (&'a str, &'a [String])>) -> String {
    let each: Vec<String> = (bindings.into_iter())
        .map(|(name, hosts)| format!("{name} for {}", hosts.join(", ")))
        .collect();
    if each.is_empty() {
        return String::new();
    }
    format!(
        "; secrets on egress: {}: the step holds a placeholder of each; the value is swapped in only in HTTPS requests to its hosts (TLS ended by this run's own authority, name-constrained to them; the hosts verified with the runtime's trust store) and swapped out of everything they answer",
        each.join("; ")
    )
}
