//! The engine on real sockets: listeners and origins on this host's loopback, names pinned
//! by a fixed resolver (the network-namespace world of `smithers-cli/tests/egress_world.rs`
//! covers the system resolver and a real sandbox). Each case checks what the client saw and
//! what the origins saw.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use smithers_egress::engine::{EngineOptions, Resolver};
use smithers_egress::{dns, Engine, Listeners, Policy};

/// An origin on 127.0.0.1 that answers every connection with `banner` and counts them.
fn origin(banner: &'static [u8]) -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            h.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(banner);
            let mut buf = [0u8; 1024];
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = s.read(&mut buf);
        }
    });
    (port, hits)
}

fn listener() -> (std::net::TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = l.local_addr().unwrap().port();
    (l, p)
}

fn read_all(mut s: TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_point_decides_the_same_and_says_why() {
    let (port, hits) = origin(b"SSH-2.0-origin\r\n");
    // "allowed.test" resolves to the origin (loopback, so it needs its cidr rule);
    // "private.test" to loopback with no such rule.
    let policy = Policy::from_json(&format!(
        r#"{{"allow":[{{"host":"allowed.test","ports":[{port}]}},{{"host":"private.test","ports":[{port}]}},
                     {{"cidr":"127.0.0.1","ports":[{port}]}}],
            "deny":[{{"cidr":"127.0.0.1","ports":[1]}}]}}"#
    ))
    .unwrap();
    let mut fixed = HashMap::new();
    fixed.insert(
        "allowed.test".to_string(),
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    );
    fixed.insert(
        "private.test".to_string(),
        vec!["10.0.0.1".parse().unwrap()],
    );
    let (http, http_port) = listener();
    let (socks, socks_port) = listener();
    let dns_sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dns_port = dns_sock.local_addr().unwrap().port();
    let engine = Engine::start(
        policy,
        Listeners {
            dns_udp: Some(dns_sock),
            http: Some(http),
            socks: Some(socks),
            ..Default::default()
        },
        EngineOptions {
            resolver: Resolver::Fixed(fixed),
            ..Default::default()
        },
    )
    .unwrap();

    let result = tokio::task::spawn_blocking(move || {
        // HTTP CONNECT, allowed: the tunnel carries the origin's banner.
        let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
        write!(s, "CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").unwrap();
        let got = read_all(s);
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.contains("SSH-2.0-origin"), "{got}");
        // Denied name: a 403 whose JSON says why, with the policy header.
        let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
        write!(s, "CONNECT denied.test:{port} HTTP/1.1\r\n\r\n").unwrap();
        let got = read_all(s);
        assert!(got.starts_with("HTTP/1.1 403"), "{got}");
        assert!(got.contains("X-Smithers-Egress-Policy: sha256:"), "{got}");
        assert!(got.contains("no rule allows denied.test"), "{got}");
        // An allowed name on a port not allowed: the reason names the port.
        let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
        write!(s, "CONNECT allowed.test:1 HTTP/1.1\r\n\r\n").unwrap();
        let got = read_all(s);
        assert!(got.contains("not on port 1"), "{got}");
        // An allowed name whose answer is special-use space no rule names.
        let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
        write!(s, "CONNECT private.test:{port} HTTP/1.1\r\n\r\n").unwrap();
        let got = read_all(s);
        assert!(
            got.starts_with("HTTP/1.1 403") && got.contains("private (10.0.0.0/8)"),
            "{got}"
        );
        // A TLS hello for another name through an allowed tunnel: closed, no origin dialed.
        let before = hits.load(Ordering::SeqCst);
        let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
        write!(s, "CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").unwrap();
        s.write_all(&smithers_egress::proxy::minimal_client_hello(
            "evil.example",
        ))
        .unwrap();
        let got = read_all(s);
        assert!(!got.contains("SSH-2.0-origin"), "{got}");
        assert_eq!(hits.load(Ordering::SeqCst), before, "the origin was dialed");
        // A ClientHello naming the tunnel's host, written in pieces: read whole, let through.
        let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
        write!(s, "CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").unwrap();
        let h = smithers_egress::proxy::minimal_client_hello("allowed.test");
        s.write_all(&h[..7]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        s.write_all(&h[7..]).unwrap();
        let got = read_all(s);
        assert!(
            got.contains("SSH-2.0-origin"),
            "a split hello was refused: {got}"
        );
        // SOCKS5, allowed and denied.
        let mut s = TcpStream::connect(("127.0.0.1", socks_port)).unwrap();
        s.write_all(&[5, 1, 0]).unwrap();
        let name = b"allowed.test";
        let mut req = vec![5, 1, 0, 3, name.len() as u8];
        req.extend_from_slice(name);
        req.extend_from_slice(&port.to_be_bytes());
        s.write_all(&req).unwrap();
        let got = read_all(s);
        assert!(
            got.as_bytes()[..2] == [5, 0] && got.contains("SSH-2.0-origin"),
            "{got:?}"
        );
        let mut s = TcpStream::connect(("127.0.0.1", socks_port)).unwrap();
        s.write_all(&[5, 1, 0]).unwrap();
        let mut req = vec![5, 1, 0, 1, 11, 0, 0, 1];
        req.extend_from_slice(&port.to_be_bytes());
        s.write_all(&req).unwrap();
        let mut reply = [0u8; 12];
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.read_exact(&mut reply).unwrap();
        assert_eq!(reply[3], 2, "not allowed by ruleset: {reply:?}");
        // DNS: an allowed name gets a synthetic loopback address, a denied one NXDOMAIN.
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let ask = |name: &str, qtype: u16| {
            u.send_to(&dns::query(1, name, qtype), ("127.0.0.1", dns_port))
                .unwrap();
            let mut buf = [0u8; 512];
            let n = u.recv(&mut buf).unwrap();
            dns::parse_response(&buf[..n]).unwrap()
        };
        assert_eq!(
            ask("allowed.test", 1),
            (0, vec![Ipv4Addr::new(127, 100, 0, 1)])
        );
        assert_eq!(ask("allowed.test", 28), (0, vec![]));
        assert_eq!(ask("denied.test", 1), (3, vec![]));
        hits.load(Ordering::SeqCst)
    })
    .await
    .unwrap();
    assert_eq!(result, 3, "three tunnels reached the origin");
    let summary = engine.stop().await;
    let verdicts: Vec<(&str, &str, &str)> = summary
        .records
        .iter()
        .map(|r| (r.entry, r.host.as_str(), r.verdict))
        .collect();
    for want in [
        ("http-connect", "allowed.test", "allow"),
        ("http-connect", "denied.test", "deny"),
        ("http-connect", "private.test", "deny"),
        ("socks5", "allowed.test", "allow"),
        ("socks5", "11.0.0.1", "deny"),
        ("dns", "allowed.test", "allow"),
        ("dns", "denied.test", "deny"),
    ] {
        assert!(verdicts.contains(&want), "{want:?} not in {verdicts:?}");
    }
    let tunnelled = summary
        .records
        .iter()
        .find(|r| r.entry == "socks5" && r.verdict == "allow")
        .unwrap();
    assert!(tunnelled.bytes_down >= 16, "{tunnelled:?}");
    assert_eq!(
        tunnelled.address.as_deref(),
        Some(&*format!("127.0.0.1:{port}"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cap_and_slow_heads_are_bounded() {
    let policy = Policy::from_allow_hosts(&["allowed.test"]).unwrap();
    let (http, http_port) = listener();
    let mut opts = EngineOptions::default();
    opts.limits.max_connections = 4;
    opts.limits.handshake = Duration::from_millis(300);
    let engine = Engine::start(
        policy,
        Listeners {
            http: Some(http),
            ..Default::default()
        },
        opts,
    )
    .unwrap();
    let refused = tokio::task::spawn_blocking(move || {
        // Four slow clients hold the slots; the fifth is told at once.
        let slow: Vec<TcpStream> = (0..4)
            .map(|_| {
                let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
                s.write_all(b"CONNECT allowed.test:443 HTTP/1.1\r\n")
                    .unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let fifth = read_all(TcpStream::connect(("127.0.0.1", http_port)).unwrap());
        // The slow ones are cut off at the handshake bound, each with a 400 that says so.
        let cut: Vec<String> = slow.into_iter().map(read_all).collect();
        (fifth, cut)
    })
    .await
    .unwrap();
    assert!(refused.0.starts_with("HTTP/1.1 429"), "{}", refused.0);
    for c in &refused.1 {
        assert!(c.contains("did not arrive within"), "{c}");
    }
    let summary = engine.stop().await;
    assert_eq!(summary.over_connection_cap, 1);
}

/// A TCP listener with SO_REUSEPORT, so a wildcard capture listener and a specific origin
/// can share a port (the kernel prefers the specific address for it).
fn reuseport_listener(addr: std::net::SocketAddrV4) -> TcpListener {
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    let one: libc::c_int = 1;
    // SAFETY: SO_REUSEPORT takes an int that outlives the call; `fd` is ours.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEPORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    // SAFETY: sockaddr_in is plain old data; zeroed is a valid value.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = addr.port().to_be();
    sin.sin_addr.s_addr = u32::from_ne_bytes(addr.ip().octets());
    // SAFETY: `sin` is a valid sockaddr_in of the size given; `fd` is ours.
    let r = unsafe {
        libc::bind(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "bind {addr}: {}", std::io::Error::last_os_error());
    // SAFETY: listen(2) on our bound socket.
    assert_eq!(unsafe { libc::listen(fd, 128) }, 0);
    // SAFETY: `fd` is a listening socket we own and hand over.
    unsafe { TcpListener::from_raw_fd(fd) }
}

/// The same destinations decided through every entry point (HTTP CONNECT, absolute-form
/// HTTP, SOCKS5, DNS then a captured connection) give the answer `Policy::decide` gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_point_agrees_with_the_decision_function() {
    // The capture listener first (wildcard), then the origin on 127.0.0.1, same port.
    let capture = reuseport_listener("0.0.0.0:0".parse().unwrap());
    let port = capture.local_addr().unwrap().port();
    let origin_l = reuseport_listener(format!("127.0.0.1:{port}").parse().unwrap());
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for s in origin_l.incoming() {
            let Ok(mut s) = s else { continue };
            h.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(b"ORIGIN\r\n");
        }
    });
    let policy = Policy::from_json(&format!(
        r#"{{"allow":[{{"host":"a.test","ports":[{port}]}},{{"host":"*.wild.test","ports":[{port}]}},
                     {{"cidr":"127.0.0.1","ports":[{port}]}}],
            "deny":[{{"host":"bad.wild.test"}}]}}"#
    ))
    .unwrap();
    let names = [
        "a.test",
        "x.wild.test",
        "bad.wild.test",
        "wild.test",
        "other.test",
    ];
    let mut fixed = HashMap::new();
    for n in names {
        fixed.insert(n.to_string(), vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]);
    }
    let mut dests: Vec<(String, u16)> = names.iter().map(|n| (n.to_string(), port)).collect();
    dests.push(("a.test".into(), 1));
    dests.push(("127.0.0.1".into(), port));
    dests.push(("11.0.0.9".into(), port));
    let expected: Vec<bool> = dests
        .iter()
        .map(|(h, p)| policy.decide(h, *p).allowed)
        .collect();
    assert_eq!(
        expected,
        [true, true, false, false, false, false, true, false]
    );

    let (http, http_port) = listener();
    let (socks, socks_port) = listener();
    let dns_sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dns_port = dns_sock.local_addr().unwrap().port();
    let engine = Engine::start(
        policy,
        Listeners {
            dns_udp: Some(dns_sock),
            http: Some(http),
            socks: Some(socks),
            capture: vec![capture],
            ..Default::default()
        },
        EngineOptions {
            resolver: Resolver::Fixed(fixed),
            ..Default::default()
        },
    )
    .unwrap();
    let seen = tokio::task::spawn_blocking(move || {
        let reached = |s: TcpStream| read_all(s).contains("ORIGIN");
        let mut rows = Vec::new();
        for (host, p) in &dests {
            let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
            write!(s, "CONNECT {host}:{p} HTTP/1.1\r\n\r\n").unwrap();
            let connect = reached(s);
            let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
            write!(s, "GET http://{host}:{p}/ HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let absolute = reached(s);
            let mut s = TcpStream::connect(("127.0.0.1", socks_port)).unwrap();
            s.write_all(&[5, 1, 0]).unwrap();
            let mut req = vec![5, 1, 0, 3, host.len() as u8];
            req.extend_from_slice(host.as_bytes());
            req.extend_from_slice(&p.to_be_bytes());
            s.write_all(&req).unwrap();
            let socks = reached(s);
            // DNS, then a connection to the address it gave (names only: a literal is never
            // captured, it is dialed by the step, which the sandbox's namespace refuses).
            let captured = if host.parse::<IpAddr>().is_ok() {
                None
            } else {
                let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                u.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                u.send_to(&dns::query(1, host, 1), ("127.0.0.1", dns_port))
                    .unwrap();
                let mut buf = [0u8; 512];
                let n = u.recv(&mut buf).unwrap();
                let (_, addrs) = dns::parse_response(&buf[..n]).unwrap();
                Some(match addrs.first() {
                    None => false,
                    Some(a) => match TcpStream::connect((*a, *p)) {
                        Ok(s) => reached(s),
                        Err(_) => false,
                    },
                })
            };
            rows.push((connect, absolute, socks, captured));
        }
        rows
    })
    .await
    .unwrap();
    let _ = engine.stop().await;
    for (i, (connect, absolute, socks, captured)) in seen.iter().enumerate() {
        let want = expected[i];
        let dest = &expected_dest(i, port);
        assert_eq!(*connect, want, "CONNECT {dest}");
        assert_eq!(*absolute, want, "absolute-form {dest}");
        assert_eq!(*socks, want, "SOCKS5 {dest}");
        if let Some(c) = captured {
            assert_eq!(*c, want, "captured {dest}");
        }
    }
    assert!(
        hits.load(Ordering::SeqCst) >= 3 * 3,
        "the origin saw the allowed ones"
    );
}

fn expected_dest(i: usize, port: u16) -> String {
    let names = [
        "a.test",
        "x.wild.test",
        "bad.wild.test",
        "wild.test",
        "other.test",
    ];
    match i {
        0..=4 => format!("{}:{port}", names[i]),
        5 => "a.test:1".into(),
        6 => format!("127.0.0.1:{port}"),
        _ => format!("11.0.0.9:{port}"),
    }
}

/// A client that stays silent past `first_flight` gets its origin dialed; its first bytes,
/// a ClientHello for another name, still close the tunnel and never reach the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_hello_for_another_name_never_reaches_the_origin() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let received = Arc::new(std::sync::Mutex::new(Vec::new()));
    let got = received.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let got = got.clone();
            std::thread::spawn(move || {
                let mut b = [0u8; 4096];
                while let Ok(n) = s.read(&mut b) {
                    if n == 0 {
                        break;
                    }
                    got.lock().unwrap().extend_from_slice(&b[..n]);
                }
            });
        }
    });
    let policy = Policy::from_json(&format!(
        r#"{{"allow":[{{"host":"allowed.test","ports":[{port}]}},{{"cidr":"127.0.0.1","ports":[{port}]}}]}}"#
    ))
    .unwrap();
    let mut fixed = HashMap::new();
    fixed.insert(
        "allowed.test".to_string(),
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    );
    let (http, http_port) = listener();
    let mut opts = EngineOptions {
        resolver: Resolver::Fixed(fixed),
        ..Default::default()
    };
    opts.limits.first_flight = Duration::from_millis(50);
    let engine = Engine::start(
        policy,
        Listeners {
            http: Some(http),
            ..Default::default()
        },
        opts,
    )
    .unwrap();
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
        write!(s, "CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        s.write_all(&smithers_egress::proxy::minimal_client_hello(
            "evil.example",
        ))
        .unwrap();
        let got = read_all(s);
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    })
    .await
    .unwrap();
    let summary = engine.stop().await;
    assert!(
        received.lock().unwrap().is_empty(),
        "the origin got the hello"
    );
    let r = summary
        .records
        .iter()
        .find(|r| r.entry == "http-connect")
        .unwrap();
    assert!(
        r.verdict == "deny" && r.reason.contains("server name"),
        "{r:?}"
    );
}

/// An origin on 127.0.0.1 that keeps all each connection sent, once it ends; and how many
/// connections it accepted.
type Received = Arc<std::sync::Mutex<Vec<Vec<u8>>>>;
fn recording_origin() -> (u16, Received, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let received = Received::default();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (got, n) = (received.clone(), accepted.clone());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            n.fetch_add(1, Ordering::SeqCst);
            let got = got.clone();
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let mut all = Vec::new();
                let _ = s.read_to_end(&mut all);
                got.lock().unwrap().push(all);
            });
        }
    });
    (port, received, accepted)
}

/// The minimal ClientHello naming `name` as two TLS records, cut where the first holds
/// everything but the extensions (so the first record alone names no server).
fn split_hello(name: &str) -> (Vec<u8>, Vec<u8>) {
    let hs = smithers_egress::proxy::minimal_client_hello(name)[5..].to_vec();
    let cut = 4 + 2 + 32 + 1 + 4 + 2; // handshake header, version, random, ids, suites, compression
    let record = |part: &[u8]| {
        let mut r = vec![0x16, 3, 1];
        r.extend_from_slice(&(part.len() as u16).to_be_bytes());
        r.extend_from_slice(part);
        r
    };
    (record(&hs[..cut]), record(&hs[cut..]))
}

/// A CONNECT tunnel to `allowed.test` through the engine's HTTP listener.
fn connect(http_port: u16, port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
    write!(s, "CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").unwrap();
    s
}

/// Writes `parts` with a pause between them, so each arrives as its own read.
fn send_in_parts(s: &mut TcpStream, parts: &[&[u8]]) {
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        s.write_all(p).unwrap();
    }
}

/// A ClientHello split over TLS records is read whole before anything reaches the origin:
/// one naming a denied host through a tunnel to an allowed one, or one never completed
/// (closed, or stalled past the handshake time), sends the origin no byte and is recorded
/// as a denial; one naming the tunnel's host is forwarded byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hello_split_over_records_is_checked_whole() {
    let (port, received, accepted) = recording_origin();
    let policy = Policy::from_json(&format!(
        r#"{{"allow":[{{"host":"allowed.test","ports":[{port}]}},{{"cidr":"127.0.0.1","ports":[{port}]}}]}}"#
    ))
    .unwrap();
    assert!(!policy.decide("denied.test", port).allowed);
    let mut fixed = HashMap::new();
    fixed.insert(
        "allowed.test".to_string(),
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    );
    let (http, http_port) = listener();
    let (socks, socks_port) = listener();
    let mut opts = EngineOptions {
        resolver: Resolver::Fixed(fixed),
        ..Default::default()
    };
    opts.limits.first_flight = Duration::from_millis(50);
    opts.limits.handshake = Duration::from_millis(500);
    let engine = Engine::start(
        policy,
        Listeners {
            http: Some(http),
            socks: Some(socks),
            ..Default::default()
        },
        opts,
    )
    .unwrap();
    let allowed_flight = tokio::task::spawn_blocking(move || {
        let (evil1, evil2) = split_hello("denied.test");
        let (good1, good2) = split_hello("allowed.test");
        // CONNECT: a denied name in the second record.
        let mut s = connect(http_port, port);
        send_in_parts(&mut s, &[&evil1, &evil2]);
        read_all(s);
        // SOCKS5 (the origin is dialed before the first flight): the same.
        let mut s = TcpStream::connect(("127.0.0.1", socks_port)).unwrap();
        s.write_all(&[5, 1, 0]).unwrap();
        let mut req = vec![5, 1, 0, 3, 12];
        req.extend_from_slice(b"allowed.test");
        req.extend_from_slice(&port.to_be_bytes());
        s.write_all(&req).unwrap();
        send_in_parts(&mut s, &[&evil1, &evil2]);
        read_all(s);
        // Silent past the first-flight wait (the origin dialed), then the same.
        let mut s = connect(http_port, port);
        std::thread::sleep(Duration::from_millis(300));
        send_in_parts(&mut s, &[&evil1, &evil2]);
        read_all(s);
        // The first record of a hello, then the client's end of stream.
        let mut s = connect(http_port, port);
        s.write_all(&good1).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        read_all(s);
        // The first record of a hello, then nothing past the handshake time.
        let mut s = connect(http_port, port);
        s.write_all(&good1).unwrap();
        read_all(s);
        // The tunnel's own name, split, then early data: every byte forwarded, in order.
        let mut s = connect(http_port, port);
        let early_data = [0x17, 3, 3, 0, 3, b'a', b'b', b'c'];
        send_in_parts(&mut s, &[&good1, &good2, &early_data]);
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let got = read_all(s);
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        [good1, good2, early_data.to_vec()].concat()
    })
    .await
    .unwrap();
    let summary = engine.stop().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while received.lock().unwrap().len() < accepted.load(Ordering::SeqCst)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent: Vec<Vec<u8>> = received
        .lock()
        .unwrap()
        .iter()
        .filter(|b| !b.is_empty())
        .cloned()
        .collect();
    assert_eq!(
        sent,
        vec![allowed_flight.clone()],
        "the origin got bytes other than the allowed hello's"
    );
    let denials: Vec<&str> = summary
        .records
        .iter()
        .filter(|r| r.verdict == "deny")
        .map(|r| r.reason.as_str())
        .collect();
    assert_eq!(denials.len(), 5, "{denials:?}");
    let named = |what: &str| denials.iter().filter(|r| r.contains(what)).count();
    assert_eq!(named("server name \"denied.test\""), 3, "{denials:?}");
    assert_eq!(
        named("closed before its TLS ClientHello was whole"),
        1,
        "{denials:?}"
    );
    assert_eq!(named("ClientHello was not whole within"), 1, "{denials:?}");
    let forwarded = summary
        .records
        .iter()
        .find(|r| r.verdict == "allow")
        .unwrap();
    assert_eq!(
        forwarded.bytes_up,
        allowed_flight.len() as u64,
        "{forwarded:?}"
    );
}

/// A first flight that begins with a TLS record other than a handshake is refused before
/// anything reaches the origin: a server may skip a warning alert or a change_cipher_spec
/// sent before the ClientHello, so a hello behind one, naming a denied host through a
/// tunnel to an allowed one, would otherwise go unchecked. Another protocol's first bytes
/// (ssh) are still forwarded as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_record_before_the_client_hello_is_refused() {
    let (port, received, accepted) = recording_origin();
    let policy = Policy::from_json(&format!(
        r#"{{"allow":[{{"host":"allowed.test","ports":[{port}]}},{{"cidr":"127.0.0.1","ports":[{port}]}}]}}"#
    ))
    .unwrap();
    assert!(!policy.decide("denied.test", port).allowed);
    let mut fixed = HashMap::new();
    fixed.insert(
        "allowed.test".to_string(),
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    );
    let (http, http_port) = listener();
    let (socks, socks_port) = listener();
    let mut opts = EngineOptions {
        resolver: Resolver::Fixed(fixed),
        ..Default::default()
    };
    opts.limits.first_flight = Duration::from_millis(50);
    opts.limits.handshake = Duration::from_millis(500);
    let engine = Engine::start(
        policy,
        Listeners {
            http: Some(http),
            socks: Some(socks),
            ..Default::default()
        },
        opts,
    )
    .unwrap();
    let ssh = b"SSH-2.0-client\r\n".to_vec();
    let ssh_sent = ssh.clone();
    tokio::task::spawn_blocking(move || {
        let evil = smithers_egress::proxy::minimal_client_hello("denied.test");
        let alert: &[u8] = &[0x15, 3, 3, 0, 2, 1, 0]; // warning, close_notify
        let ccs: &[u8] = &[0x14, 3, 3, 0, 1, 1];
        // The record, then the hello as a read of its own; the engine may have reset the
        // tunnel by then, which the hello's write then meets.
        let then = |s: &mut TcpStream, record: &[u8], hello: &[u8]| {
            s.write_all(record).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let _ = s.write_all(hello);
        };
        // CONNECT: a warning alert, then a hello naming a denied host.
        let mut s = connect(http_port, port);
        then(&mut s, alert, &evil);
        read_all(s);
        // CONNECT: the same in one write.
        let mut s = connect(http_port, port);
        s.write_all(&[alert, &evil].concat()).unwrap();
        read_all(s);
        // SOCKS5 (the origin is dialed before the first flight): a change_cipher_spec first.
        let mut s = TcpStream::connect(("127.0.0.1", socks_port)).unwrap();
        s.write_all(&[5, 1, 0]).unwrap();
        let mut req = vec![5, 1, 0, 3, 12];
        req.extend_from_slice(b"allowed.test");
        req.extend_from_slice(&port.to_be_bytes());
        s.write_all(&req).unwrap();
        then(&mut s, ccs, &evil);
        read_all(s);
        // Silent past the first-flight wait (the origin dialed), then the alert and hello.
        let mut s = connect(http_port, port);
        std::thread::sleep(Duration::from_millis(300));
        then(&mut s, alert, &evil);
        read_all(s);
        // Another protocol: forwarded as it is.
        let mut s = connect(http_port, port);
        s.write_all(&ssh).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let got = read_all(s);
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    })
    .await
    .unwrap();
    let summary = engine.stop().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while received.lock().unwrap().len() < accepted.load(Ordering::SeqCst)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent: Vec<Vec<u8>> = received
        .lock()
        .unwrap()
        .iter()
        .filter(|b| !b.is_empty())
        .cloned()
        .collect();
    assert_eq!(
        sent,
        vec![ssh_sent.clone()],
        "the origin got bytes other than the ssh client's"
    );
    let denials: Vec<&str> = summary
        .records
        .iter()
        .filter(|r| r.verdict == "deny")
        .map(|r| r.reason.as_str())
        .collect();
    assert_eq!(denials.len(), 4, "{denials:?}");
    let named = |what: &str| denials.iter().filter(|r| r.contains(what)).count();
    assert_eq!(
        named("a TLS alert record came before the ClientHello: closed before any byte"),
        3,
        "{denials:?}"
    );
    assert_eq!(
        named("a TLS change_cipher_spec record came before the ClientHello"),
        1,
        "{denials:?}"
    );
    let allowed: Vec<_> = summary
        .records
        .iter()
        .filter(|r| r.verdict == "allow")
        .collect();
    assert_eq!(allowed.len(), 1, "{allowed:?}");
    assert_eq!(allowed[0].bytes_up, ssh_sent.len() as u64, "{allowed:?}");
    assert!(allowed[0].error.is_none(), "{allowed:?}");
}

/// A request the proxy cannot take is answered with why (an HTTP 400 whose JSON says so)
/// and recorded, naming what it could read of the destination; a connection that sent
/// nothing made no request and leaves no record. The same for SOCKS5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_proxy_cannot_take_is_answered_and_recorded() {
    let policy = Policy::from_allow_hosts(&["allowed.test"]).unwrap();
    let (http, http_port) = listener();
    let (socks, socks_port) = listener();
    let mut opts = EngineOptions::default();
    opts.limits.handshake = Duration::from_millis(500);
    let engine = Engine::start(
        policy,
        Listeners {
            http: Some(http),
            socks: Some(socks),
            ..Default::default()
        },
        opts,
    )
    .unwrap();
    let heads: [(&[u8], &str); 6] = [
        (b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n", "absolute-form"),
        (b"GET ftp://files.test/ HTTP/1.1\r\n\r\n", "not \\\"ftp://"),
        (b"GET \xff\xfe HTTP/1.1\r\n\r\n", "not UTF-8"),
        (b"\x16\x03\x01\x00\x05hello", "plain HTTP"),
        (b"CONNECT half.test:443 HTTP/1.1\r\n", "closed before"),
        (
            b"CONNECT slow.test:443 HTTP/1.1\r\n",
            "did not arrive within",
        ),
    ];
    let answers = tokio::task::spawn_blocking(move || {
        let mut answers = Vec::new();
        for (i, (head, _)) in heads.iter().enumerate() {
            let mut s = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
            s.write_all(head).unwrap();
            if i == 4 {
                s.shutdown(std::net::Shutdown::Write).unwrap();
            }
            answers.push(read_all(s));
        }
        // Nothing sent, closed: no request.
        drop(TcpStream::connect(("127.0.0.1", http_port)).unwrap());
        drop(TcpStream::connect(("127.0.0.1", socks_port)).unwrap());
        // SOCKS4, and a SOCKS5 BIND.
        let mut s = TcpStream::connect(("127.0.0.1", socks_port)).unwrap();
        s.write_all(&[4, 1, 0, 80, 11, 0, 0, 1, 0]).unwrap();
        let _ = read_all(s);
        let mut s = TcpStream::connect(("127.0.0.1", socks_port)).unwrap();
        s.write_all(&[5, 1, 0, 5, 2, 0, 1, 11, 0, 0, 1, 0, 80])
            .unwrap();
        let _ = read_all(s);
        std::thread::sleep(Duration::from_millis(200));
        answers
    })
    .await
    .unwrap();
    for ((_, says), got) in heads.iter().zip(&answers) {
        assert!(got.starts_with("HTTP/1.1 400"), "{got}");
        assert!(got.contains(says), "{says}: {got}");
        assert!(got.contains("X-Smithers-Egress-Policy: sha256:"), "{got}");
    }
    let summary = engine.stop().await;
    let records: Vec<(&str, &str, u16, &str)> = summary
        .records
        .iter()
        .map(|r| (r.entry, r.host.as_str(), r.port, r.verdict))
        .collect();
    assert_eq!(summary.records.len(), 8, "{records:?}");
    for r in &summary.records {
        assert_eq!(r.verdict, "deny", "{r:?}");
        assert!(
            r.reason
                .starts_with("the proxy could not take the request: "),
            "{r:?}"
        );
    }
    for want in [
        ("http", "half.test", 443),
        ("http", "slow.test", 443),
        ("http", "", 0),
        ("socks5", "", 0),
    ] {
        assert!(
            records.iter().any(|(e, h, p, _)| (*e, *h, *p) == want),
            "{want:?} not in {records:?}"
        );
    }
    assert!(summary
        .records
        .iter()
        .any(|r| r.entry == "socks5" && r.reason.contains("SOCKS4")));
    assert!(summary
        .records
        .iter()
        .any(|r| r.entry == "socks5" && r.reason.contains("command 2")));
}
