//! The leak suite, at the engine's relay: a real TLS client that trusts only the run's
//! authority, the relay, and a real TLS origin (its certificate from a test authority named in
//! `SSL_CERT_FILE`, as the runtime's own trust store) that records what arrives and answers
//! with whatever the case says. For every case: the origin got the real value exactly where
//! the step put its placeholder (and nothing else changed), and no byte the step got back holds
//! the value in any form.
//!
//! One test (one process): `SSL_CERT_FILE` is set once, before any relay reads it.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use smithers_egress::secrets::{relay, Relayed, SecretSpec, Secrets};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HOST: &str = "api.bound.test";
const VALUE: &str = "sk-test-api01-Zq7RkW2mVn9XpT4sLc8Hd3Jf/Ab+Yu6Ge=";
const OTHER: &str = "ghp_OtherSecretValue0123456789abcdefXYZ";

struct World {
    secrets: Arc<Secrets>,
    placeholder: String,
    other_placeholder: String,
    origin_tls: Arc<rustls::ServerConfig>,
    client_tls: Arc<rustls::ClientConfig>,
    _dir: std::path::PathBuf,
}

/// What the origin answers, in parts written with a pause between them.
#[derive(Clone)]
struct Answer {
    parts: Vec<Vec<u8>>,
}

fn answer(text: &str) -> Answer {
    Answer {
        parts: vec![text.as_bytes().to_vec()],
    }
}

fn body(text: &str) -> Answer {
    answer(&format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    ))
}

struct Seen {
    /// What the origin received (empty: nothing reached it).
    origin: Vec<u8>,
    /// What the step got back.
    client: Vec<u8>,
    relayed: Relayed,
}

fn world() -> World {
    let dir = std::env::temp_dir().join(format!("secrets-leaks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The origin's authority, trusted by "this host" through SSL_CERT_FILE only.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("origin-ca.pem"), ca.pem()).unwrap();
    // SAFETY-free: this is the only test of this binary; nothing else reads the environment.
    std::env::set_var("SSL_CERT_FILE", dir.join("origin-ca.pem"));
    std::env::remove_var("SSL_CERT_DIR");
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![HOST.to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let origin_tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let secrets = Secrets::new(vec![
        SecretSpec {
            name: "API_KEY".into(),
            hosts: vec![HOST.into()],
            value: VALUE.as_bytes().to_vec(),
        },
        SecretSpec {
            name: "GH_TOKEN".into(),
            hosts: vec!["github.test".into()],
            value: OTHER.as_bytes().to_vec(),
        },
    ])
    .unwrap();
    let env: std::collections::HashMap<String, String> = secrets.env().into_iter().collect();
    let mut roots = rustls::RootCertStore::empty();
    let ca_der = rustls::pki_types::CertificateDer::from(pem_der(&secrets.ca_pem()));
    roots.add(ca_der).unwrap();
    let client_tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    World {
        placeholder: env["API_KEY"].clone(),
        other_placeholder: env["GH_TOKEN"].clone(),
        secrets: Arc::new(secrets),
        origin_tls: Arc::new(origin_tls),
        client_tls: Arc::new(client_tls),
        _dir: dir,
    }
}

fn pem_der(pem: &str) -> Vec<u8> {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

/// Reads one request (head, and a body by its length or chunks), or what came before EOF.
async fn read_request<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let want = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse::<usize>().unwrap());
            let done = match want {
                Some(n) => got.len() >= end + 4 + n,
                None if head.contains("transfer-encoding: chunked") => got.ends_with(b"0\r\n\r\n"),
                None => true,
            };
            if done {
                return got;
            }
        }
        match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return got,
        }
    }
}

impl World {
    /// One connection: the step sends `requests` (each written whole, with a pause between),
    /// the origin answers each with `answer`.
    async fn case(
        &self,
        requests: &[Vec<u8>],
        reply: Answer,
        client_tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Seen {
        let step_side = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin_side = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (step_addr, origin_addr) = (
            step_side.local_addr().unwrap(),
            origin_side.local_addr().unwrap(),
        );
        let origin_tls = self.origin_tls.clone();
        let n_requests = requests.len();
        let origin = tokio::spawn(async move {
            let (tcp, _) = origin_side.accept().await.unwrap();
            let Ok(mut tls) = tokio_rustls::TlsAcceptor::from(origin_tls)
                .accept(tcp)
                .await
            else {
                return Vec::new();
            };
            let mut all = Vec::new();
            for _ in 0..n_requests {
                let got = read_request(&mut tls).await;
                if got.is_empty() {
                    break;
                }
                all.extend_from_slice(&got);
                for part in &reply.parts {
                    if tls.write_all(part).await.is_err() {
                        return all;
                    }
                    let _ = tls.flush().await;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
            }
            let _ = tls.shutdown().await;
            all
        });
        let client_tls = client_tls.unwrap_or_else(|| self.client_tls.clone());
        let requests = requests.to_vec();
        let client = tokio::spawn(async move {
            let tcp = TcpStream::connect(step_addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from(HOST).unwrap();
            let Ok(mut tls) = tokio_rustls::TlsConnector::from(client_tls)
                .connect(name, tcp)
                .await
            else {
                return Vec::new();
            };
            for r in &requests {
                if tls.write_all(r).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            let mut got = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut got)).await;
            got
        });
        let (step_tcp, _) = step_side.accept().await.unwrap();
        let origin_tcp = TcpStream::connect(origin_addr).await.unwrap();
        let relayed = tokio::time::timeout(
            Duration::from_secs(20),
            relay(
                &self.secrets,
                step_tcp,
                Vec::new(),
                origin_tcp,
                HOST,
                Duration::from_secs(5),
            ),
        )
        .await
        .expect("the relay ended");
        Seen {
            origin: origin.await.unwrap(),
            client: client.await.unwrap(),
            relayed,
        }
    }
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: {HOST}\r\n{extra}\r\n").into_bytes()
}

fn post(path: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {HOST}\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Every form the value could come back in.
fn forms_of(value: &str) -> Vec<Vec<u8>> {
    let v = value.as_bytes();
    let mut out = vec![v.to_vec()];
    for e in [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::URL_SAFE,
    ] {
        for lead in ["", "a", "ab"] {
            let enc = e.encode([lead.as_bytes(), v].concat());
            // The part that depends on the value alone.
            let skip = (lead.len() * 4).div_ceil(3) + 1;
            out.push(enc.as_bytes()[skip..enc.len() - 4].to_vec());
        }
    }
    out.push(
        value
            .replace('/', "%2F")
            .replace('+', "%2B")
            .replace('=', "%3D")
            .into_bytes(),
    );
    out.push(value.replace('/', "\\/").into_bytes());
    // A truncated echo of it (its prefix and 12 more characters).
    out.push(v[..26].to_vec());
    out
}

fn leaks(bytes: &[u8]) -> Vec<String> {
    forms_of(VALUE)
        .iter()
        .filter(|f| bytes.windows(f.len()).any(|w| w == f.as_slice()))
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect()
}

fn has(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_case_of_the_leak_suite_leaks() {
    let w = world();
    let p = w.placeholder.clone();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut results: Vec<(&str, bool, String)> = Vec::new();
    let mut check = |name: &'static str, seen: &Seen, origin_must: &dyn Fn(&[u8]) -> bool| {
        let leaked = leaks(&seen.client);
        let ok = leaked.is_empty() && origin_must(&seen.origin);
        results.push((
            name,
            ok,
            format!(
                "leaked {leaked:?}; origin {:?}; client {:?}; {:?}",
                String::from_utf8_lossy(&seen.origin),
                String::from_utf8_lossy(&seen.client),
                seen.relayed
            ),
        ));
    };
    let value_in = |s: &[u8]| has(s, VALUE);

    // Requests: the placeholder becomes the value where the step put it.
    let s = w
        .case(
            &[get("/", &format!("Authorization: Bearer {p}\r\n"))],
            body("ok"),
            None,
        )
        .await;
    check("bearer header swapped in", &s, &|o| {
        has(o, &format!("Bearer {VALUE}"))
    });
    let s = w
        .case(
            &[get("/", &format!("x-api-key: {p}\r\n"))],
            body("ok"),
            None,
        )
        .await;
    check("api key header swapped in", &s, &|o| {
        has(o, &format!("x-api-key: {VALUE}"))
    });
    let s = w
        .case(&[get(&format!("/?key={p}"), "")], body("ok"), None)
        .await;
    // Never in the request line or a body: an API that stores or repeats what it is sent
    // (a model asked to spell it out) would give it back another way.
    let stays = |o: &[u8]| !o.is_empty() && !has(o, VALUE);
    check("a placeholder in the request line stays one", &s, &|o| {
        stays(o) && has(o, &p)
    });
    let s = w
        .case(
            &[post(
                "/",
                "",
                &format!("{{\"key\":\"{}\"}}", p.replace('/', "\\/")),
            )],
            body("ok"),
            None,
        )
        .await;
    check("a json-escaped placeholder in a body stays one", &s, &|o| {
        stays(o) && !has(o, &VALUE.replace('/', "\\/"))
    });
    let pct = |s: &str| {
        s.replace('/', "%2F")
            .replace('+', "%2B")
            .replace('=', "%3D")
    };
    let s = w
        .case(
            &[post("/", "", &format!("key={}", pct(&p)))],
            body("ok"),
            None,
        )
        .await;
    check(
        "a percent-encoded placeholder in a body stays one",
        &s,
        &|o| stays(o) && !has(o, &pct(VALUE)),
    );
    let s = w
        .case(
            &[get("/", &format!("x-api-key: {}\r\n", pct(&p)))],
            body("ok"),
            None,
        )
        .await;
    check("a percent-encoded credential swapped in", &s, &|o| {
        has(o, &pct(VALUE))
    });
    // A field that is no credential's (one an API may store or repeat) keeps it as it is.
    let s = w
        .case(&[get("/", &format!("Cookie: k={p}\r\n"))], body("ok"), None)
        .await;
    check(
        "a placeholder in another header field stays one",
        &s,
        &|o| stays(o) && has(o, &p),
    );
    // Heads an origin could read otherwise are never sent.
    for bad in [
        format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nX-Pad: 1\n\nx-api-key: {p}\r\n\r\n"),
        format!("GET https://evil.test/ HTTP/1.1\r\nHost: {HOST}\r\nx-api-key: {p}\r\n\r\n"),
        format!("GET / HTTP/1.1\r\nx-api-key: {p}\r\n\r\n"),
    ] {
        let s = w.case(&[bad.into_bytes()], body("ok"), None).await;
        check(
            "a head an origin could read otherwise is not sent",
            &s,
            &|o| o.is_empty(),
        );
    }
    let s = w
        .case(
            &[get(
                "/",
                &format!(
                    "Authorization: Basic {}\r\n",
                    b64(&format!("x-access-token:{p}"))
                ),
            )],
            body("ok"),
            None,
        )
        .await;
    check("git's basic auth swapped in", &s, &|o| {
        has(o, &b64(&format!("x-access-token:{VALUE}")))
    });
    for lead in ["", "a", "ab"] {
        let s = w
            .case(
                &[post("/", "", &b64(&format!("{lead}{p}tail")))],
                body("ok"),
                None,
            )
            .await;
        let want = b64(&format!("{lead}{VALUE}tail"));
        check("a base64 placeholder in a body stays one", &s, &move |o| {
            !o.is_empty() && !has(o, &want[4..want.len() - 8])
        });
    }
    let chunked = format!(
        "POST / HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        10, &p[..10], p.len() - 10, &p[10..]
    );
    let s = w.case(&[chunked.into_bytes()], body("ok"), None).await;
    check("a placeholder split across chunks stays one", &s, &|o| {
        stays(o) && has(o, &p[10..])
    });
    let whole = get("/", &format!("Authorization: Bearer {p}\r\n"));
    let (a, b) = whole.split_at(30);
    let s = w.case(&[a.to_vec(), b.to_vec()], body("ok"), None).await;
    check("placeholder split across writes swapped in", &s, &value_in);
    let s = w
        .case(
            &[get("/", "Accept-Encoding: gzip, br\r\n")],
            body("ok"),
            None,
        )
        .await;
    check("accept-encoding made identity", &s, &|o| {
        has(o, "accept-encoding: identity") || has(o, "Accept-Encoding: identity")
    });
    let s = w
        .case(
            &[
                [
                    get("/a", &format!("x-api-key: {p}\r\n")),
                    get("/b", &format!("x-api-key: {p}\r\n")),
                ]
                .concat(),
                Vec::new(),
            ],
            body("ok"),
            None,
        )
        .await;
    check("pipelined requests both swapped in", &s, &|o| {
        o.windows(VALUE.len())
            .filter(|w| *w == VALUE.as_bytes())
            .count()
            == 2
    });
    let s = w
        .case(
            &[
                b"HEAD / HTTP/1.1\r\nHost: api.bound.test\r\n\r\n".to_vec(),
                get("/", &format!("x-api-key: {p}\r\n")),
            ],
            answer("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
            None,
        )
        .await;
    check(
        "a HEAD's answer has no body, the next request is read",
        &s,
        &value_in,
    );

    // Refusals: nothing after the cause reaches the origin.
    let other = w.other_placeholder.clone();
    let s = w
        .case(
            &[get("/", &format!("Authorization: Bearer {other}\r\n"))],
            body("ok"),
            None,
        )
        .await;
    check("another host's placeholder is not sent", &s, &|o| {
        !has(o, &other) && !has(o, OTHER)
    });
    let s = w
        .case(
            &[b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n".to_vec()],
            body("ok"),
            None,
        )
        .await;
    check("a request for another host is not sent", &s, &|o| {
        o.is_empty()
    });
    let pinned = {
        let mut roots = rustls::RootCertStore::empty();
        let other_ca = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap();
        roots.add(other_ca.der().clone()).unwrap();
        Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
        )
    };
    let s = w
        .case(
            &[get("/", &format!("x-api-key: {p}\r\n"))],
            body("ok"),
            Some(pinned),
        )
        .await;
    check(
        "a client that pins its own authority sends nothing",
        &s,
        &|o| o.is_empty(),
    );

    // Responses: the value, in any form, comes back as the placeholder.
    let s = w
        .case(&[get("/", "")], body(&format!("your key is {VALUE}")), None)
        .await;
    check("reflected in a body", &s, &|_| true);
    let s = w
        .case(
            &[get("/", "")],
            answer(&format!(
                "HTTP/1.1 200 OK\r\nX-Echo: {VALUE}\r\nContent-Length: 2\r\n\r\nok"
            )),
            None,
        )
        .await;
    check("reflected in a header", &s, &|_| true);
    let s = w.case(&[get("/", "")], answer(&format!("HTTP/1.1 302 Found\r\nLocation: https://other.test/?k={}\r\nContent-Length: 0\r\n\r\n", pct(VALUE))), None).await;
    check("reflected in a redirect to another host", &s, &|_| true);
    for lead in ["", "a", "ab"] {
        let s = w
            .case(
                &[get("/", "")],
                body(&b64(&format!("{lead}{VALUE}!"))),
                None,
            )
            .await;
        check("reflected base64-encoded", &s, &|_| true);
    }
    let s = w
        .case(
            &[get("/", "")],
            body(&base64::engine::general_purpose::URL_SAFE.encode(VALUE)),
            None,
        )
        .await;
    check("reflected url-safe base64", &s, &|_| true);
    let s = w
        .case(
            &[get("/", "")],
            body(&format!("{{\"k\":\"{}\"}}", VALUE.replace('/', "\\/"))),
            None,
        )
        .await;
    check("reflected json-escaped", &s, &|_| true);
    let s = w
        .case(
            &[get("/", "")],
            body(&format!("key {}... is invalid", &VALUE[..30])),
            None,
        )
        .await;
    check("reflected truncated", &s, &|_| true);
    let (x, y) = VALUE.split_at(20);
    let s = w
        .case(
            &[get("/", "")],
            Answer {
                parts: vec![
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{x}",
                        VALUE.len()
                    )
                    .into_bytes(),
                    y.as_bytes().to_vec(),
                ],
            },
            None,
        )
        .await;
    check("reflected split across writes", &s, &|_| true);
    let s = w
        .case(
            &[get("/", "")],
            Answer {
                parts: vec![
                    format!(
                        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{x}\r\n",
                        x.len()
                    )
                    .into_bytes(),
                    format!("{:x}\r\n{y}\r\n0\r\n\r\n", y.len()).into_bytes(),
                ],
            },
            None,
        )
        .await;
    check("reflected split across chunks", &s, &|_| true);
    let s = w
        .case(
            &[get("/", "")],
            Answer {
                parts: vec![
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: hello\n\n"
                        .to_vec(),
                    format!("data: {VALUE}\n\n").into_bytes(),
                ],
            },
            None,
        )
        .await;
    check(
        "reflected in an event stream read until the close",
        &s,
        &|_| true,
    );
    let s = w
        .case(
            &[get("/", "")],
            Answer {
                parts: vec![
                    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nends with ".to_vec(),
                    VALUE.as_bytes()[..24].to_vec(),
                ],
            },
            None,
        )
        .await;
    check("cut off at the close", &s, &|_| true);
    let s = w.case(&[get("/", "Upgrade: websocket\r\nConnection: Upgrade\r\n")], Answer { parts: vec![b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".to_vec(), format!("\u{1}frame {VALUE}").into_bytes()] }, None).await;
    check("reflected after an upgrade", &s, &|_| true);
    let s = w
        .case(
            &[get("/", "")],
            answer(&format!(
                "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n{VALUE}",
                VALUE.len()
            )),
            None,
        )
        .await;
    check("a compressed answer is cut, never passed", &s, &|_| true);
    assert!(
        !has(&s.client, "200 OK") || s.relayed.refused.is_some(),
        "{:?}",
        s.relayed
    );
    let s = w
        .case(
            &[get("/", "")],
            body(&format!("the placeholder {p} stays one")),
            None,
        )
        .await;
    check("a reflected placeholder stays a placeholder", &s, &|_| true);
    assert!(has(&s.client, &p));

    let failed: Vec<String> = (results.iter())
        .filter(|(_, ok, _)| !ok)
        .map(|(n, _, why)| format!("{n}: {why}"))
        .collect();
    println!(
        "leak suite: {} cases, {} failed",
        results.len(),
        failed.len()
    );
    assert!(results.len() >= 30, "{} cases", results.len());
    assert!(failed.is_empty(), "{failed:#?}");
}
