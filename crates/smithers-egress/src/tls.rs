//! TLS to an origin, for the one request form that needs the proxy to speak it: an
//! absolute-form `GET https://host/path` sent in plain text to the HTTP proxy, as busybox
//! `wget` (1.35) sends every https URL when `http_proxy` is set (it has no CONNECT). The
//! engine dials the checked address, verifies the origin's certificate for the name the
//! step asked for against the host's trust store, and relays the request over it.
//!
//! The trust store is the host's, never the step's: `SSL_CERT_FILE` of the process that
//! serves the engine when set, else the first system bundle found. It is read once per
//! process, bounded.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The system bundles, in the order distributions place them (Debian and derivatives,
/// Fedora and RHEL 6, openSUSE, RHEL 7+, Alpine).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Largest trust bundle read (the system's are a few hundred KiB).
const MAX_BUNDLE_BYTES: u64 = 32 << 20;

/// Where the trust store comes from: `SSL_CERT_FILE`, else the first system bundle.
fn bundle_path() -> Result<std::path::PathBuf, String> {
    if let Some(p) = std::env::var_os("SSL_CERT_FILE").filter(|p| !p.is_empty()) {
        return Ok(p.into());
    }
    SYSTEM_BUNDLES
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no trust store on this host (SSL_CERT_FILE unset, none of {})",
                SYSTEM_BUNDLES.join(", ")
            )
        })
}

fn load_roots() -> Result<RootCertStore, String> {
    use std::io::Read;
    let path = bundle_path()?;
    let mut pem = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_BUNDLE_BYTES).read_to_end(&mut pem))
        .map_err(|e| format!("cannot read the trust store {}: {e}", path.display()))?;
    let mut roots = RootCertStore::empty();
    // A bundle may hold certificates rustls cannot use (old or odd ones): those are left
    // out, as every TLS client does, and the rest trusted.
    let certs = CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok);
    let (added, _skipped) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!(
            "the trust store {} holds no usable certificate",
            path.display()
        ));
    }
    Ok(roots)
}

/// The client configuration (HTTP/1.1 only: the request relayed is an HTTP/1.1 head),
/// made once; `Err` says why there is none, for every request that would need it.
fn client_config() -> Result<Arc<ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = load_roots()?;
            // The provider is named, not taken from a process default another crate may
            // have set differently (or left ambiguous).
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS configuration: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
}

/// The TLS handshake with an origin already dialed (its address checked), verifying its
/// certificate for `host` (a name, or the IPv4 literal a cidr rule allowed), within
/// `within`. `Err` is why, for the step's 502 and the record.
pub async fn connect(
    tcp: TcpStream,
    host: &str,
    within: Duration,
) -> Result<TlsStream<TcpStream>, String> {
    let config = client_config()?;
    let name = match host.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host:?} is not a TLS server name: {e}"))?,
    };
    let handshake = TlsConnector::from(config).connect(name, tcp);
    match tokio::time::timeout(within, handshake).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!(
            "TLS with {host} failed (the origin is verified against the host's trust store): {e}"
        )),
        Err(_) => Err(format!(
            "the TLS handshake with {host} took over {within:?}"
        )),
    }
}
