//! Scenario 9 over a link of a real speed: the origin in a network namespace of its own,
//! behind a veth pair whose host side is shaped to 1 and to 10 Gbit/s (`tc` token bucket), reached
//! directly and through the engine's CONNECT tunnel (spliced in the kernel: no secret is
//! bound). On loopback (the table before) every byte crosses the TCP stack twice through the
//! tunnel on the same two cores as the client and the origin, so the ratio there is the
//! machine's, not a link's; here it is what a step downloading or uploading over a real
//! link keeps. Needs root, `ip` and `tc`; without them the table says so.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;

use smithers_egress::engine::{EngineOptions, Resolver};
use smithers_egress::{Engine, Listeners, Policy};

use crate::egress::{bulk, connect_via_http, serve_origin};
use crate::report::Table;

/// The links' rates, as `tc` reads them, and in words.
const RATES: [(&str, &str); 2] = [("1gbit", "1 Gbit/s"), ("10gbit", "10 Gbit/s")];
const ORIGIN: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 2);
const UPLOAD_MIB: u64 = 256;

/// The namespace and the veth pair, removed when dropped.
struct Link {
    ns: String,
    host_if: String,
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
    }
}

fn sh(args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(args[0]).args(&args[1..]).status()?;
    anyhow::ensure!(status.success(), "{} failed", args.join(" "));
    Ok(())
}

impl Link {
    fn up() -> anyhow::Result<Link> {
        let pid = std::process::id();
        let link = Link {
            ns: format!("smithers-bench-link-{pid}"),
            host_if: format!("sbl{}", pid % 10_000_000),
        };
        let peer = format!("{}p", link.host_if);
        let (ns, host_if) = (link.ns.as_str(), link.host_if.as_str());
        sh(&["ip", "netns", "add", ns])?;
        sh(&[
            "ip", "link", "add", host_if, "type", "veth", "peer", "name", &peer,
        ])?;
        sh(&["ip", "link", "set", &peer, "netns", ns])?;
        sh(&["ip", "addr", "add", "10.203.0.1/30", "dev", host_if])?;
        sh(&["ip", "link", "set", host_if, "up"])?;
        sh(&["ip", "-n", ns, "addr", "add", "10.203.0.2/30", "dev", &peer])?;
        sh(&["ip", "-n", ns, "link", "set", &peer, "up"])?;
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        Ok(link)
    }

    /// Toward the origin (what an upload crosses), a token bucket at `rate` (as `tc` reads
    /// it), in place of the one before.
    fn shape(&self, rate: &str) -> anyhow::Result<()> {
        sh(&[
            "tc",
            "qdisc",
            "replace",
            "dev",
            &self.host_if,
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "2mb",
            "latency",
            "20ms",
        ])
    }

    /// [`serve_origin`] on a thread that entered the link's namespace; its port.
    fn origin(&self) -> anyhow::Result<u16> {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.ns))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: setns on this thread only, with a namespace descriptor it holds open;
            // the listener (and the threads it spawns) live in that namespace.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            let bound = match r {
                0 => TcpListener::bind((ORIGIN, 0)).map_err(anyhow::Error::from),
                _ => Err(std::io::Error::last_os_error().into()),
            };
            match bound {
                Ok(l) => {
                    let _ = tx.send(l.local_addr().map(|a| a.port()).map_err(Into::into));
                    serve_origin(l);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
        rx.recv()?
    }
}

/// The table, or why it was not measured.
pub fn run() -> anyhow::Result<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(
            "Over a shaped link: not measured (needs root for a network namespace and `tc`).\n"
                .into(),
        );
    }
    let link = match Link::up() {
        Ok(l) => l,
        Err(e) => return Ok(format!("Over a shaped link: not measured ({e}).\n")),
    };
    let port = link.origin()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let http = TcpListener::bind("127.0.0.1:0")?;
    let http_port = http.local_addr()?.port();
    let policy = Policy::from_json(&format!(
        r#"{{"allow":[{{"host":"origin.bench","ports":[{port}]}},{{"cidr":"{ORIGIN}","ports":[{port}]}}]}}"#
    ))?;
    let fixed = HashMap::from([("origin.bench".to_string(), vec![IpAddr::V4(ORIGIN)])]);
    let opts = EngineOptions {
        resolver: Resolver::Fixed(fixed),
        ..Default::default()
    };
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
    let direct = || -> anyhow::Result<TcpStream> {
        let s = TcpStream::connect((ORIGIN, port))?;
        s.set_nodelay(true)?;
        Ok(s)
    };
    let rate = |s: TcpStream| -> anyhow::Result<f64> {
        Ok(UPLOAD_MIB as f64 / bulk(s, UPLOAD_MIB << 20)?.as_secs_f64())
    };
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut table = Table::new(&[
        "256 MiB upload over a shaped link (veth, tbf)",
        "MiB/s",
        "ratio to direct",
    ]);
    for (tc_rate, words) in RATES {
        link.shape(tc_rate)?;
        let (mut d, mut t) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            d.push(rate(direct()?)?);
            t.push(rate(connect_via_http(http_port, port)?)?);
        }
        let (d, t) = (med(&mut d), med(&mut t));
        table.row(vec![
            format!("{words}: direct"),
            format!("{d:.0}"),
            "1.00×".into(),
        ]);
        table.row(vec![
            format!("{words}: ours, HTTP CONNECT tunnel (spliced)"),
            format!("{t:.0}"),
            format!("{:.2}×", t / d),
        ]);
    }
    let _ = rt.block_on(engine.stop());
    drop(link);
    Ok(table.to_markdown())
}
