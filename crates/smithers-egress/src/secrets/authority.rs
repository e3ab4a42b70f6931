//! The per-run certificate authority of a step's secrets: made when the step starts, its key
//! only in this process's memory, name-constrained to the hosts its secrets are bound to (a
//! certificate it signed for any other name is refused by every client that checks name
//! constraints, which rustls, OpenSSL, Go, Node and Python do); and the leaf certificate of
//! each bound host, made when first needed. The step trusts it through the bundle and the
//! variables the runtime gives it; the real hosts are verified with this host's own trust store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, GeneralSubtree, IsCa, KeyPair,
    KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// A run's authority.
pub struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
    hosts: Vec<String>,
    /// Each bound host's server configuration, once made.
    servers: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl Authority {
    /// A new authority for `hosts` (lower-case names).
    pub fn new(hosts: &[String]) -> Result<Authority, String> {
        let fail = |e: rcgen::Error| format!("making the secrets' certificate authority: {e}");
        let key = KeyPair::generate().map_err(fail)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            "smithers-sandbox secrets (this run only)",
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: hosts.iter().cloned().map(GeneralSubtree::DnsName).collect(),
            excluded_subtrees: vec![],
        });
        let cert = params.self_signed(&key).map_err(fail)?;
        Ok(Authority {
            cert,
            key,
            hosts: hosts.to_vec(),
            servers: Mutex::new(HashMap::new()),
        })
    }

    /// The authority's certificate, PEM (what the step trusts; never its key).
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// The TLS server configuration that answers as `host` (one of the bound hosts), its
    /// leaf made once.
    pub fn server_for(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        if !self.hosts.iter().any(|h| h == host) {
            return Err(format!("{host} is not a host a secret is bound to"));
        }
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = servers.get(host) {
            return Ok(c.clone());
        }
        let fail = |e: String| format!("making the certificate of {host}: {e}");
        let key = KeyPair::generate().map_err(|e| fail(e.to_string()))?;
        let mut params =
            CertificateParams::new(vec![host.to_string()]).map_err(|e| fail(e.to_string()))?;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(|e| fail(e.to_string()))?;
        let chain = vec![leaf.der().clone(), self.cert.der().clone()];
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| fail(e.to_string()))?;
        // HTTP/1.1 only: its messages are what the swap reads (a client that offers HTTP/2
        // offers HTTP/1.1 too).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        servers.insert(host.to_string(), config.clone());
        Ok(config)
    }
}

/// The TLS client configuration for the real hosts: this host's trust store (the system's,
/// or `SSL_CERT_FILE` / `SSL_CERT_DIR` as OpenSSL, curl and git read them), HTTP/1.1.
pub fn upstream_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(format!(
            "no trusted certificate authority found on this host to verify the real hosts with{}",
            found
                .errors
                .first()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        ));
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
