//! Scenario 9, the secret path beside the tunnel: an HTTPS origin on this host's loopback at
//! port 443 (the port a secret's hosts are relayed on; so the bench needs root), reached
//! directly, through the engine's CONNECT tunnel as a host no secret is bound to (TLS end to
//! end, the engine copying bytes), and as a host a secret is bound to (TLS ended by the run's
//! authority, the request's placeholder swapped in, the answer scrubbed, TLS again to the
//! origin). Per connection: connect, handshake, one request with the placeholder, its answer.
//! Throughput: one 256 MiB answer.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use smithers_egress::engine::{EngineOptions, Resolver};
use smithers_egress::secrets::{SecretSpec, Secrets};
use smithers_egress::{Engine, Listeners, Policy};

use crate::measure::{fmt_ms, interleaved, median_ratio, Contender};
use crate::report::Table;

const BULK: u64 = 256 << 20;
const VALUE: &str = "sk-bench-api01-Abc123Def456Ghi789Jkl012Mno345";

/// The origin's TLS, and a client configuration that trusts `pem` (a CA certificate).
fn tls_configs() -> anyhow::Result<(Arc<rustls::ServerConfig>, String)> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let names = vec!["secret.bench".to_string(), "plain.bench".to_string()];
    let leaf = rcgen::CertificateParams::new(names)?.signed_by(&key, &ca, &ca_key)?;
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )?;
    Ok((Arc::new(server), ca.pem()))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client_trusting(pems: &[&str]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for pem in pems {
        use rustls::pki_types::pem::PemObject;
        for der in rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(der?)?;
        }
    }
    Ok(Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

/// The origin: each request (a head) answered with one byte, or `GET /bulk` with [`BULK`].
fn origin(config: Arc<rustls::ServerConfig>) -> anyhow::Result<()> {
    let l = TcpListener::bind("127.0.0.1:443")?;
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let config = config.clone();
            std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, s);
                let mut head = Vec::new();
                let mut b = [0u8; 4096];
                loop {
                    let Ok(n) = tls.read(&mut b) else { return };
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&b[..n]);
                    if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        let bulk = head.starts_with(b"GET /bulk");
                        head.drain(..end + 4);
                        let _ = if bulk {
                            send_bulk(&mut tls)
                        } else {
                            tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx")
                        };
                        let _ = tls.flush();
                    }
                }
            });
        }
    });
    Ok(())
}

fn send_bulk(w: &mut impl Write) -> std::io::Result<()> {
    write!(w, "HTTP/1.1 200 OK\r\nContent-Length: {BULK}\r\n\r\n")?;
    let chunk = vec![b'a'; 64 << 10];
    let mut left = BULK;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        w.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// A TLS connection as `name` over `tcp`, one request with `key` sent, its answer read.
fn one_request(
    tcp: TcpStream,
    name: &str,
    client: &Arc<rustls::ClientConfig>,
    key: &str,
    path: &str,
) -> anyhow::Result<u64> {
    tcp.set_nodelay(true)?;
    let server = rustls::pki_types::ServerName::try_from(name.to_string())?;
    let conn = rustls::ClientConnection::new(client.clone(), server)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: {name}\r\nx-api-key: {key}\r\n\r\n"
    )?;
    tls.flush()?;
    let mut got = Vec::new();
    let mut b = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let n = tls.read(&mut b)?;
        anyhow::ensure!(n > 0, "the connection ended early");
        // The head is in the first bytes; the body is only counted.
        if got.len() < 4096 {
            got.extend_from_slice(&b[..n.min(4096)]);
        }
        total += n as u64;
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: u64 = (head.lines())
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if total >= end as u64 + 4 + len {
                return Ok(len);
            }
        }
    }
}

fn via_connect(proxy: u16, name: &str) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", proxy))?;
    write!(s, "CONNECT {name}:443 HTTP/1.1\r\n\r\n")?;
    let mut b = [0u8; 512];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut b)?;
        anyhow::ensure!(n > 0, "the proxy closed");
        got.extend_from_slice(&b[..n]);
    }
    anyhow::ensure!(got.starts_with(b"HTTP/1.1 200"), "CONNECT refused");
    Ok(s)
}

pub fn run(rounds: usize) -> anyhow::Result<String> {
    let (server, origin_ca) = tls_configs()?;
    if let Err(e) = origin(server) {
        return Ok(format!(
            "\nThe secret path needs an origin at 127.0.0.1:443 (root): not measured ({e}).\n"
        ));
    }
    // The engine verifies the origin with "this host's" trust store: the bench's CA.
    let ca_file = std::env::temp_dir().join(format!("bench-origin-ca-{}.pem", std::process::id()));
    std::fs::write(&ca_file, &origin_ca)?;
    std::env::set_var("SSL_CERT_FILE", &ca_file);
    let secrets = Secrets::new(vec![SecretSpec {
        name: "BENCH_KEY".into(),
        hosts: vec!["secret.bench".into()],
        value: VALUE.as_bytes().to_vec(),
    }])
    .map_err(anyhow::Error::msg)?;
    let placeholder = secrets.env()[0].1.clone();
    let step_client = client_trusting(&[&origin_ca, &secrets.ca_pem()])?;
    let direct_client = client_trusting(&[&origin_ca])?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let http = TcpListener::bind("127.0.0.1:0")?;
    let http_port = http.local_addr()?.port();
    let policy = Policy::from_json(
        r#"{"allow":[{"host":"secret.bench","ports":[443]},{"host":"plain.bench","ports":[443]},{"cidr":"127.0.0.1","ports":[443]}]}"#,
    )?;
    let mut fixed = HashMap::new();
    for name in ["secret.bench", "plain.bench"] {
        fixed.insert(name.to_string(), vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]);
    }
    let mut opts = EngineOptions {
        resolver: Resolver::Fixed(fixed),
        secrets: Some(Arc::new(secrets)),
        ..Default::default()
    };
    opts.limits.max_records = usize::MAX;
    let engine = rt.block_on(async {
        Engine::start(
            policy,
            Listeners {
                http: Some(http),
                ..Default::default()
            },
            opts,
        )
    })?;
    let direct = || TcpStream::connect("127.0.0.1:443").map_err(anyhow::Error::from);
    let p = placeholder.as_str();
    let mut contenders = vec![
        Contender::new("direct TLS", || {
            one_request(direct()?, "secret.bench", &direct_client, p, "/").map(drop)
        }),
        Contender::new("ours: tunnel, no secret (TLS end to end)", || {
            one_request(
                via_connect(http_port, "plain.bench")?,
                "plain.bench",
                &step_client,
                p,
                "/",
            )
            .map(drop)
        }),
        Contender::new("ours: secret path (TLS ended, swapped, scrubbed)", || {
            one_request(
                via_connect(http_port, "secret.bench")?,
                "secret.bench",
                &step_client,
                p,
                "/",
            )
            .map(drop)
        }),
    ];
    let series = interleaved(&mut contenders, rounds / 10 + 5, rounds)?;
    let mut t = Table::new(&[
        "per HTTPS connection (connect, handshake, one request)",
        "p50",
        "p95",
        "ratio to direct",
        "added to the tunnel's p50",
    ]);
    for s in &series {
        let added = s.median().as_secs_f64() - series[1].median().as_secs_f64();
        t.row(vec![
            s.name.clone(),
            fmt_ms(s.median()),
            fmt_ms(s.p95()),
            format!("{:.2}×", median_ratio(s, &series[0])),
            format!("{:+.2} ms", added * 1e3),
        ]);
    }
    let mut body = String::from("\n");
    body.push_str(&t.to_markdown());
    let mut t = Table::new(&["256 MiB answer over HTTPS", "MiB/s", "ratio to direct"]);
    let rate =
        |tcp: TcpStream, name: &str, client: &Arc<rustls::ClientConfig>| -> anyhow::Result<f64> {
            let started = Instant::now();
            let got = one_request(tcp, name, client, p, "/bulk")?;
            anyhow::ensure!(got == BULK, "the answer was cut at {got}");
            Ok((BULK >> 20) as f64 / started.elapsed().as_secs_f64())
        };
    let (mut d, mut tu, mut se) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        d.push(rate(direct()?, "secret.bench", &direct_client)?);
        tu.push(rate(
            via_connect(http_port, "plain.bench")?,
            "plain.bench",
            &step_client,
        )?);
        se.push(rate(
            via_connect(http_port, "secret.bench")?,
            "secret.bench",
            &step_client,
        )?);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (d, tu, se) = (med(&mut d), med(&mut tu), med(&mut se));
    for (name, v) in [
        ("direct TLS", d),
        ("ours: tunnel, no secret", tu),
        ("ours: secret path", se),
    ] {
        t.row(vec![
            name.into(),
            format!("{v:.0}"),
            format!("{:.2}×", v / d),
        ]);
    }
    body.push('\n');
    body.push_str(&t.to_markdown());
    let summary = rt.block_on(engine.stop());
    let swapped: u64 = (summary.records.iter())
        .filter_map(|r| r.secrets.as_ref())
        .map(|s| s.swapped)
        .sum();
    body.push_str(&format!(
        "\nThe secret path swapped the placeholder for the value {swapped} times (one per request through it).\n"
    ));
    let _ = std::fs::remove_file(ca_file);
    Ok(body)
}
