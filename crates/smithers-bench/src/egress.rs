//! Scenario 9: what the egress engine costs a connection. An origin on this host's loopback
//! is reached directly and through the engine's entry points (HTTP CONNECT, SOCKS5), in the
//! same process and the same rounds: time to a first reply byte per connection, connections
//! per second, and bulk throughput through a tunnel. The engine resolves names with a fixed
//! answer (no resolver in the measurement), so what is measured is the decision, the dial
//! and the splice.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use smithers_egress::engine::{EngineOptions, Resolver};
use smithers_egress::{Engine, Listeners, Policy};

use crate::measure::{fmt_ms, interleaved, median_ratio, Contender};
use crate::report::Table;

/// [`serve_origin`] on this host's loopback; its port.
fn origin() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || serve_origin(l));
    Ok(port)
}

/// An origin that answers each byte it reads with one byte, and sinks bulk uploads (a first
/// byte `B` means "read until EOF, then say how many").
pub(crate) fn serve_origin(l: TcpListener) {
    {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let mut b = [0u8; 64 << 10];
                let mut first = true;
                let mut bulk = false;
                let mut total = 0u64;
                loop {
                    let n = match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if first {
                        bulk = b[0] == b'B';
                        first = false;
                    }
                    if bulk {
                        total += n as u64;
                    } else if s.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
                if bulk {
                    let _ = s.write_all(&total.to_be_bytes());
                }
            });
        }
    }
}

pub(crate) fn connect_via_http(proxy: u16, port: u16) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", proxy))?;
    s.set_nodelay(true)?;
    write!(s, "CONNECT origin.bench:{port} HTTP/1.1\r\n\r\n")?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        anyhow::ensure!(s.read(&mut b)? == 1, "proxy closed");
        head.push(b[0]);
    }
    anyhow::ensure!(head.starts_with(b"HTTP/1.1 200"), "CONNECT refused");
    Ok(s)
}

fn connect_via_socks(proxy: u16, port: u16) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", proxy))?;
    s.set_nodelay(true)?;
    s.write_all(&[5, 1, 0])?;
    let mut m = [0u8; 2];
    s.read_exact(&mut m)?;
    let name = b"origin.bench";
    let mut req = vec![5, 1, 0, 3, name.len() as u8];
    req.extend_from_slice(name);
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req)?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply)?;
    anyhow::ensure!(reply[1] == 0, "SOCKS5 refused: {}", reply[1]);
    Ok(s)
}

fn direct(port: u16) -> anyhow::Result<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// One request byte, one reply byte.
fn ping(mut s: TcpStream) -> anyhow::Result<()> {
    s.write_all(b"p")?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(())
}

/// `bytes` uploaded and acknowledged; the time it took.
pub(crate) fn bulk(mut s: TcpStream, bytes: u64) -> anyhow::Result<Duration> {
    let chunk = vec![b'B'; 256 << 10];
    let started = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let mut total = [0u8; 8];
    s.read_exact(&mut total)?;
    anyhow::ensure!(u64::from_be_bytes(total) == bytes, "short upload");
    Ok(started.elapsed())
}

pub fn run(rounds: usize) -> anyhow::Result<String> {
    let port = origin()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let http = TcpListener::bind("127.0.0.1:0")?;
    let socks = TcpListener::bind("127.0.0.1:0")?;
    let (http_port, socks_port) = (http.local_addr()?.port(), socks.local_addr()?.port());
    let policy = Policy::from_json(&format!(
        r#"{{"allow":[{{"host":"origin.bench","ports":[{port}]}},{{"cidr":"127.0.0.1","ports":[{port}]}}]}}"#
    ))?;
    let mut fixed = HashMap::new();
    fixed.insert(
        "origin.bench".to_string(),
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    );
    let mut opts = EngineOptions {
        resolver: Resolver::Fixed(fixed),
        ..Default::default()
    };
    // Records are kept per connection: the bound must not change what is measured.
    opts.limits.max_records = usize::MAX;
    let engine = rt.block_on(async {
        Engine::start(
            policy,
            Listeners {
                http: Some(http),
                socks: Some(socks),
                ..Default::default()
            },
            opts,
        )
    })?;

    // Time to the first reply byte on a new connection.
    let mut contenders = vec![
        Contender::new("direct", || ping(direct(port)?)),
        Contender::new("ours: HTTP CONNECT", || {
            ping(connect_via_http(http_port, port)?)
        }),
        Contender::new("ours: SOCKS5", || {
            ping(connect_via_socks(socks_port, port)?)
        }),
    ];
    let series = interleaved(&mut contenders, rounds / 10 + 5, rounds)?;
    let mut t = Table::new(&[
        "per connection (connect, 1-byte round trip)",
        "p50",
        "p95",
        "ratio to direct",
    ]);
    for s in &series {
        t.row(vec![
            s.name.clone(),
            fmt_ms(s.median()),
            fmt_ms(s.p95()),
            format!("{:.2}×", median_ratio(s, &series[0])),
        ]);
    }
    let mut body = t.to_markdown();

    // Connections per second, one after another for a fixed time.
    let mut t = Table::new(&["sequential connections", "per second", "ratio to direct"]);
    let per_second = |f: &dyn Fn() -> anyhow::Result<()>| -> anyhow::Result<f64> {
        let started = Instant::now();
        let mut n = 0u32;
        while started.elapsed() < Duration::from_secs(2) {
            f()?;
            n += 1;
        }
        Ok(f64::from(n) / started.elapsed().as_secs_f64())
    };
    let d = per_second(&|| ping(direct(port)?))?;
    let h = per_second(&|| ping(connect_via_http(http_port, port)?))?;
    let s = per_second(&|| ping(connect_via_socks(socks_port, port)?))?;
    for (name, v) in [
        ("direct", d),
        ("ours: HTTP CONNECT", h),
        ("ours: SOCKS5", s),
    ] {
        t.row(vec![
            name.into(),
            format!("{v:.0}"),
            format!("{:.2}×", v / d),
        ]);
    }
    body.push('\n');
    body.push_str(&t.to_markdown());

    // Bulk throughput through a tunnel.
    let bytes = 512u64 << 20;
    let mut t = Table::new(&["512 MiB upload", "MiB/s", "ratio to direct"]);
    let rate = |s: TcpStream| -> anyhow::Result<f64> { Ok(512.0 / bulk(s, bytes)?.as_secs_f64()) };
    let (mut dr, mut hr) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        dr.push(rate(direct(port)?)?);
        hr.push(rate(connect_via_http(http_port, port)?)?);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (d, h) = (med(&mut dr), med(&mut hr));
    t.row(vec!["direct".into(), format!("{d:.0}"), "1.00×".into()]);
    t.row(vec![
        "ours: HTTP CONNECT tunnel".into(),
        format!("{h:.0}"),
        format!("{:.2}×", h / d),
    ]);
    body.push('\n');
    body.push_str(&t.to_markdown());

    let summary = rt.block_on(engine.stop());
    body.push_str(&format!(
        "\nThe engine decided {} connections ({} denied) and kept a record of each.\n",
        summary.allowed + summary.denied,
        summary.denied
    ));
    Ok(body)
}
