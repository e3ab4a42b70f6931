//! The engine: serves the listeners a runtime bound inside a sandbox's network namespace,
//! from the trusted process, one task per connection, within per-sandbox caps; every
//! decision becomes an [`EgressRecord`].
//!
//! Order of a connection, whatever its entry point: the destination the step named is
//! decided ([`Policy::decide`]); the name is resolved here; each IPv4 answer is decided
//! ([`Policy::decide_resolved`]) and only an address that passed is dialed; a tunnel's
//! first flight that begins a TLS handshake is held until its ClientHello is whole
//! (reassembled across records, within bounds), and one that never is, cannot be read or
//! names another server than the destination closes the tunnel before any of its bytes
//! reaches the origin, as does one that begins with a TLS record other than a handshake
//! (an alert, a change_cipher_spec: a server may skip it and read a hello behind it). A
//! denial is answered at once, in the entry point's own terms: an HTTP 403 with a JSON
//! reason, a SOCKS5 "not allowed by ruleset", a reset for a captured connection, NXDOMAIN
//! in DNS. A request the proxy cannot take is answered with why too (an HTTP 400 whose JSON
//! says so) and recorded as a denial: no request goes unrecorded.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::dns::{self, Answer};
use crate::policy::{escape, normalize_name, Decision, Fix, Policy};
use crate::proxy::{self, socks_reply, FirstFlight, HttpTarget};

/// The first synthetic address the resolver gives (127.100.0.1, then upward). Inside the
/// sandbox's namespace all of 127.0.0.0/8 is its own loopback, so a client connecting to one
/// reaches the capture listener of that port, which maps the address back to the name.
pub const SYNTHETIC_BASE: Ipv4Addr = Ipv4Addr::new(127, 100, 0, 1);

/// ssh, whose server speaks first: a tunnel to this port does not wait for the client's
/// first bytes (no TLS to check there).
const SSH_PORT: u16 = 22;
/// The port a secret's hosts are relayed on.
const HTTPS_PORT: u16 = 443;

/// Per-sandbox bounds: the proxy parses hostile input in a trusted process.
#[derive(Debug, Clone)]
pub struct EgressLimits {
    /// Connections open at once (every entry point together); past it, refused at once.
    pub max_connections: usize,
    /// Time for a client to send its request head, greeting or first flight.
    pub handshake: Duration,
    /// Time to resolve and connect to an origin.
    pub connect: Duration,
    /// Largest HTTP request head.
    pub max_head_bytes: usize,
    /// Names the resolver hands synthetic addresses to.
    pub max_names: usize,
    /// DNS queries answered in the sandbox's life; past it, dropped (and counted).
    pub max_dns_queries: u64,
    /// Records kept; past it, counted only.
    pub max_records: usize,
    /// Lines of the denials file inside the sandbox.
    pub max_denial_lines: usize,
    /// How long a CONNECT or SOCKS5 tunnel waits for the client's first bytes (to check a
    /// TLS server name before dialing) before it dials for a protocol whose server speaks
    /// first (ssh).
    pub first_flight: Duration,
}

impl Default for EgressLimits {
    fn default() -> Self {
        EgressLimits {
            max_connections: 256,
            handshake: Duration::from_secs(10),
            connect: Duration::from_secs(10),
            max_head_bytes: 16 << 10,
            max_names: 4096,
            max_dns_queries: 100_000,
            max_records: 10_000,
            max_denial_lines: 1000,
            first_flight: Duration::from_millis(300),
        }
    }
}

/// The sockets a runtime bound inside the sandbox's network namespace (each optional: a
/// test may serve only some).
#[derive(Debug, Default)]
pub struct Listeners {
    pub dns_udp: Option<std::net::UdpSocket>,
    pub dns_tcp: Option<std::net::TcpListener>,
    pub http: Option<std::net::TcpListener>,
    pub socks: Option<std::net::TcpListener>,
    /// One per allowed port, bound to `0.0.0.0:PORT`.
    pub capture: Vec<std::net::TcpListener>,
}

impl Listeners {
    /// The listeners of descriptors a runtime's init or holder sent, named in order as the
    /// init's `EgressListen::names` gives them (`dnsUdp`, `dnsTcp`, `http`, `socks`,
    /// `capture:PORT`).
    pub fn from_named(
        names: &[String],
        fds: Vec<std::os::fd::OwnedFd>,
    ) -> Result<Listeners, String> {
        if names.len() != fds.len() {
            return Err(format!(
                "{} egress descriptors arrived for {} listeners",
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
                other => return Err(format!("unknown egress listener {:?}", escape(other))),
            }
        }
        Ok(l)
    }
}

/// Where names are resolved: the host's resolver, or fixed answers (a caller that pins
/// names, and the engine's own tests).
#[derive(Debug, Clone, Default)]
pub enum Resolver {
    #[default]
    System,
    Fixed(HashMap<String, Vec<IpAddr>>),
}

/// What the engine is given besides its listeners.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    pub limits: EgressLimits,
    pub resolver: Resolver,
    /// A host file the sandbox sees read-only: one JSON line per denial (bounded).
    pub denials_file: Option<PathBuf>,
    /// Records as they are made (for `serve`'s live events).
    pub live: Option<mpsc::UnboundedSender<EgressRecord>>,
    /// The step's secrets: connections to their hosts on port 443 are relayed with the
    /// swaps ([`crate::secrets`]); their placeholders are kept from every other host the
    /// engine can read (plain HTTP).
    pub secrets: Option<Arc<crate::secrets::Secrets>>,
}

/// One decision, as data: for the bundle's log, the step's result and live events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressRecord {
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Milliseconds since the Unix epoch, when the decision was made.
    pub timestamp_ms: u64,
    /// `dns`, `http-connect`, `http`, `https` (an absolute-form `https://` request, relayed
    /// over TLS the engine speaks), `socks5` or `capture`.
    pub entry: &'static str,
    /// As the step wrote it, bounded and escaped.
    pub host: String,
    pub port: u16,
    /// `allow`, `deny` or `would-deny` (audit mode).
    pub verdict: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    pub reason: String,
    /// The address dialed (after its check), for an allowed connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// How long the connection lasted (0 for a denial).
    pub ms: u64,
    /// An allowed connection that still failed (resolution, dial).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// For a denial an allow rule would lift: that rule ([`Fix`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<Fix>,
    /// A connection to a host secrets are bound to: which, and the swaps made (never a value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secrets: Option<SecretsUse>,
}

/// What a connection to a bound host did with its secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretsUse {
    /// The secrets bound to the host.
    pub names: Vec<String>,
    /// Placeholders swapped for values in what the step sent.
    pub swapped: u64,
    /// Values (in any of their forms) swapped for placeholders in what came back.
    pub scrubbed: u64,
}

/// Per destination, for the step's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationSummary {
    pub host: String,
    pub port: u16,
    pub verdict: &'static str,
    pub count: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// A denial's reason (denials of one destination for different reasons are apart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The rule that would lift the denial, where one would.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<Fix>,
}

/// What the engine did over a sandbox's life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub policy: String,
    pub mode: &'static str,
    pub allowed: u64,
    pub denied: u64,
    pub would_deny: u64,
    /// Connections refused because `max_connections` were open.
    pub over_connection_cap: u64,
    pub dns_queries: u64,
    /// Records past `max_records`, counted only.
    pub records_dropped: u64,
    /// At most 100 destinations, denials first.
    pub destinations: Vec<DestinationSummary>,
    #[serde(skip)]
    pub records: Vec<EgressRecord>,
}

struct Names {
    by_addr: HashMap<Ipv4Addr, String>,
    by_name: HashMap<String, Ipv4Addr>,
}

#[derive(Default)]
struct Records {
    list: Vec<EgressRecord>,
    dropped: u64,
    dns_seen: HashSet<(String, &'static str)>,
    denial_lines: usize,
}

struct Shared {
    policy: Policy,
    hash: String,
    opts: EngineOptions,
    host_addrs: Vec<IpAddr>,
    names: Mutex<Names>,
    records: Mutex<Records>,
    slots: Arc<Semaphore>,
    over_cap: AtomicU64,
    dns_queries: AtomicU64,
    tasks: Mutex<JoinSet<()>>,
}

/// A running engine. [`Engine::stop`] ends every connection and returns the summary.
pub struct Engine {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy", &self.shared.hash)
            .finish()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Engine {
    /// Starts serving `listeners` on the current tokio runtime.
    pub fn start(
        policy: Policy,
        listeners: Listeners,
        opts: EngineOptions,
    ) -> std::io::Result<Engine> {
        let shared = Arc::new(Shared {
            hash: policy.hash(),
            policy,
            host_addrs: crate::addr::host_addresses(),
            names: Mutex::new(Names {
                by_addr: HashMap::new(),
                by_name: HashMap::new(),
            }),
            records: Mutex::new(Records::default()),
            slots: Arc::new(Semaphore::new(opts.limits.max_connections)),
            over_cap: AtomicU64::new(0),
            dns_queries: AtomicU64::new(0),
            tasks: Mutex::new(JoinSet::new()),
            opts,
        });
        let tcp = |l: std::net::TcpListener| -> std::io::Result<TcpListener> {
            l.set_nonblocking(true)?;
            TcpListener::from_std(l)
        };
        if let Some(u) = listeners.dns_udp {
            u.set_nonblocking(true)?;
            let u = UdpSocket::from_std(u)?;
            spawn(&shared, serve_dns_udp(shared.clone(), u));
        }
        if let Some(l) = listeners.dns_tcp {
            let l = tcp(l)?;
            spawn(&shared, accept_loop(shared.clone(), l, Entry::DnsTcp));
        }
        if let Some(l) = listeners.http {
            let l = tcp(l)?;
            spawn(&shared, accept_loop(shared.clone(), l, Entry::Http));
        }
        if let Some(l) = listeners.socks {
            let l = tcp(l)?;
            spawn(&shared, accept_loop(shared.clone(), l, Entry::Socks));
        }
        for l in listeners.capture {
            let l = tcp(l)?;
            spawn(&shared, accept_loop(shared.clone(), l, Entry::Capture));
        }
        Ok(Engine { shared })
    }

    /// The policy's hash ([`Policy::hash`]).
    pub fn policy_hash(&self) -> &str {
        &self.shared.hash
    }

    /// Records made so far (a copy).
    pub fn records(&self) -> Vec<EgressRecord> {
        self.shared
            .records
            .lock()
            .map(|r| r.list.clone())
            .unwrap_or_default()
    }

    /// Ends every listener and connection (each open connection's record is completed with
    /// its bytes so far) and returns what happened.
    pub async fn stop(self) -> Summary {
        let mut tasks = std::mem::take(&mut *self.shared.tasks.lock().expect("tasks lock"));
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        let shared = &self.shared;
        let rec = shared.records.lock().expect("records lock");
        type Key = (bool, String, u16, &'static str, Option<String>);
        let mut by_dest: BTreeMap<Key, DestinationSummary> = BTreeMap::new();
        let (mut allowed, mut denied, mut would) = (0, 0, 0);
        for r in rec.list.iter() {
            match r.verdict {
                "allow" => allowed += 1,
                "would-deny" => would += 1,
                _ => denied += 1,
            }
            let allowed = r.verdict == "allow";
            // A denial is told with its reason, so its reasons are kept apart.
            let reason = (!allowed).then(|| r.reason.clone());
            let key = (allowed, r.host.clone(), r.port, r.verdict, reason.clone());
            let d = by_dest.entry(key).or_insert_with(|| DestinationSummary {
                host: r.host.clone(),
                port: r.port,
                verdict: r.verdict,
                count: 0,
                bytes_up: 0,
                bytes_down: 0,
                fix: r.fix.clone().filter(|_| !allowed),
                reason,
            });
            d.count += 1;
            d.bytes_up += r.bytes_up;
            d.bytes_down += r.bytes_down;
        }
        Summary {
            policy: shared.hash.clone(),
            mode: shared.policy.mode.as_str(),
            allowed,
            denied,
            would_deny: would,
            over_connection_cap: shared.over_cap.load(Ordering::Relaxed),
            dns_queries: shared.dns_queries.load(Ordering::Relaxed),
            records_dropped: rec.dropped,
            destinations: by_dest.into_values().take(100).collect(),
            records: rec.list.clone(),
        }
    }
}

fn spawn<F>(shared: &Arc<Shared>, fut: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut tasks = shared.tasks.lock().expect("tasks lock");
    // Reap what has finished, so the set holds only live tasks.
    while tasks.try_join_next().is_some() {}
    tasks.spawn(fut);
}

#[derive(Clone, Copy)]
enum Entry {
    DnsTcp,
    Http,
    Socks,
    Capture,
}

impl Shared {
    fn record(&self, r: EgressRecord) {
        let Ok(mut rec) = self.records.lock() else {
            return;
        };
        if r.verdict != "allow" && rec.denial_lines < self.opts.limits.max_denial_lines {
            if let Some(path) = &self.opts.denials_file {
                rec.denial_lines += 1;
                let mut line = serde_json::json!({
                    "host": r.host, "port": r.port, "entry": r.entry,
                    "verdict": r.verdict, "reason": r.reason, "policy": self.hash,
                });
                if let Some(fix) = &r.fix {
                    line["fix"] = serde_json::json!(fix);
                }
                let mut line = line.to_string();
                if rec.denial_lines == self.opts.limits.max_denial_lines {
                    line.push_str("\n{\"note\":\"later denials are in the bundle's log only\"}");
                }
                line.push('\n');
                if let Ok(mut f) = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(path)
                {
                    let _ = f.write_all(line.as_bytes());
                }
            }
        }
        if rec.list.len() < self.opts.limits.max_records {
            // Live too, within the same bound (the channel is unbounded).
            if let Some(tx) = &self.opts.live {
                let _ = tx.send(r.clone());
            }
            rec.list.push(r);
        } else {
            rec.dropped += 1;
        }
    }

    fn decided(&self, entry: &'static str, host: &str, port: u16, d: &Decision) -> EgressRecord {
        EgressRecord {
            kind: "egress",
            timestamp_ms: now_ms(),
            entry,
            host: escape(host),
            port,
            verdict: d.verdict(),
            rule: d.rule.clone(),
            reason: d.reason.clone(),
            address: None,
            bytes_up: 0,
            bytes_down: 0,
            ms: 0,
            error: None,
            fix: d.fix.clone(),
            secrets: None,
        }
    }

    /// The synthetic address of an allowed name (a new one the first time), `None` past
    /// `max_names`.
    fn synthetic(&self, name: &str) -> Option<Ipv4Addr> {
        let mut names = self.names.lock().ok()?;
        if let Some(a) = names.by_name.get(name) {
            return Some(*a);
        }
        if names.by_name.len() >= self.opts.limits.max_names {
            return None;
        }
        let a = Ipv4Addr::from(u32::from(SYNTHETIC_BASE) + names.by_name.len() as u32);
        names.by_name.insert(name.to_string(), a);
        names.by_addr.insert(a, name.to_string());
        Some(a)
    }

    fn name_of(&self, a: Ipv4Addr) -> Option<String> {
        self.names.lock().ok()?.by_addr.get(&a).cloned()
    }

    /// [`resolve_checked`] with this engine's resolver, bound and policy.
    async fn resolve_checked(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, (Option<Decision>, String)> {
        let within = self.opts.limits.connect;
        let resolver = &self.opts.resolver;
        resolve_checked(&self.policy, resolver, within, &self.host_addrs, host, port).await
    }

    /// Dials the checked addresses in order: the address dialed is one that was decided.
    async fn dial(&self, addrs: &[SocketAddr]) -> Result<(TcpStream, SocketAddr), String> {
        let mut last = String::from("no address to dial");
        for addr in addrs {
            match tokio::time::timeout(self.opts.limits.connect, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    // A relay's writes are the client's: never held back for an ACK (Nagle
                    // would delay a TLS handshake's later flights by a delayed ACK, ~40 ms).
                    let _ = s.set_nodelay(true);
                    return Ok((s, *addr));
                }
                Ok(Err(e)) => last = format!("connecting to {addr}: {e}"),
                Err(_) => {
                    last = format!(
                        "connecting to {addr} took over {:?}",
                        self.opts.limits.connect
                    )
                }
            }
        }
        Err(last)
    }

    /// [`Shared::resolve_checked`] then [`Shared::dial`].
    async fn connect_checked(
        &self,
        host: &str,
        port: u16,
    ) -> Result<(TcpStream, SocketAddr), (Option<Decision>, String)> {
        let addrs = self.resolve_checked(host, port).await?;
        self.dial(&addrs).await.map_err(|e| (None, e))
    }
}

/// Resolves `host` as the engine does before it dials: an IP literal is itself; a name is
/// asked of `resolver` within `within`. `Err` is why it did not resolve.
pub async fn resolve(
    resolver: &Resolver,
    within: Duration,
    host: &str,
    port: u16,
) -> Result<Vec<IpAddr>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    match resolver {
        Resolver::Fixed(map) => map
            .get(host)
            .cloned()
            .ok_or_else(|| format!("{host} does not resolve")),
        Resolver::System => {
            let found = tokio::time::timeout(within, tokio::net::lookup_host((host, port)))
                .await
                .map_err(|_| format!("resolving {host} took over {within:?}"))?
                .map_err(|e| format!("{host} does not resolve: {e}"))?;
            Ok(found.map(|a| a.ip()).collect())
        }
    }
}

/// Resolves an allowed destination and decides each IPv4 answer
/// ([`Policy::decide_resolved`]): the addresses that passed, in order, the only ones the
/// engine dials. `Err((decision, reason))`: the decision that refused an answer (a denial),
/// or none when the name did not resolve (the connection was allowed). The engine and
/// `egress check` both ask this, so a check says what a connection would meet.
pub async fn resolve_checked(
    policy: &Policy,
    resolver: &Resolver,
    within: Duration,
    host_addrs: &[IpAddr],
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, (Option<Decision>, String)> {
    let answers = resolve(resolver, within, host, port)
        .await
        .map_err(|e| (None, e))?;
    let mut refusal = None;
    let mut passed = Vec::new();
    for ip in answers.into_iter().filter(IpAddr::is_ipv4) {
        let d = policy.decide_resolved(ip, port, host_addrs);
        if d.allowed {
            passed.push(SocketAddr::new(ip, port));
        } else {
            refusal.get_or_insert(d);
        }
    }
    match (passed.is_empty(), refusal) {
        (false, _) => Ok(passed),
        (true, Some(d)) => {
            let reason = d.reason.clone();
            Err((Some(d), reason))
        }
        (true, None) => Err((None, format!("{host} has no IPv4 address"))),
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, entry: Entry) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // EMFILE and the like: back off rather than spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // The step's side too, for the same reason as the dial's.
        let _ = stream.set_nodelay(true);
        let permit = shared.slots.clone().try_acquire_owned();
        let s = shared.clone();
        match permit {
            Ok(permit) => spawn(&shared, async move {
                match entry {
                    Entry::DnsTcp => serve_dns_tcp(&s, stream).await,
                    Entry::Http => serve_http(&s, stream).await,
                    Entry::Socks => serve_socks(&s, stream).await,
                    Entry::Capture => serve_capture(&s, stream).await,
                }
                drop(permit);
            }),
            Err(_) => {
                shared.over_cap.fetch_add(1, Ordering::Relaxed);
                let max = shared.opts.limits.max_connections;
                let hash = shared.hash.clone();
                // Answered without a slot, briefly, so a flood costs no more than a write.
                spawn(&shared, async move {
                    let mut stream = stream;
                    if matches!(entry, Entry::Http) {
                        let reason = format!("the sandbox has {max} connections open, its limit");
                        let _ = tokio::time::timeout(
                            Duration::from_secs(1),
                            stream.write_all(&proxy::http_denied(429, "", 0, &reason, &hash)),
                        )
                        .await;
                    }
                    reset(stream);
                });
            }
        }
    }
}

/// Closes with a reset: a refused raw connection fails at once, not as a hang or a quiet
/// end of stream.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn serve_dns_udp(shared: Arc<Shared>, sock: UdpSocket) {
    let mut buf = [0u8; dns::MAX_QUERY_BYTES + 1];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        if let Some(reply) = answer_dns(&shared, &buf[..n]) {
            let _ = sock.send_to(&reply, from).await;
        }
    }
}

async fn serve_dns_tcp(shared: &Shared, mut stream: TcpStream) {
    loop {
        let mut len = [0u8; 2];
        let read =
            tokio::time::timeout(shared.opts.limits.handshake, stream.read_exact(&mut len)).await;
        if !matches!(read, Ok(Ok(_))) {
            return;
        }
        let n = u16::from_be_bytes(len) as usize;
        if n > dns::MAX_QUERY_BYTES {
            return;
        }
        let mut msg = vec![0u8; n];
        let read =
            tokio::time::timeout(shared.opts.limits.handshake, stream.read_exact(&mut msg)).await;
        if !matches!(read, Ok(Ok(_))) {
            return;
        }
        let Some(reply) = answer_dns(shared, &msg) else {
            return;
        };
        let mut out = (reply.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&reply);
        if stream.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// Our answer to one query; `None` to stay silent (not a query; past the query cap).
fn answer_dns(shared: &Shared, msg: &[u8]) -> Option<Vec<u8>> {
    let n = shared.dns_queries.fetch_add(1, Ordering::Relaxed);
    if n >= shared.opts.limits.max_dns_queries {
        return None;
    }
    let q = match dns::parse_query(msg) {
        Ok(q) => q,
        Err(m) => return m.id.map(dns::format_error),
    };
    let raw = String::from_utf8_lossy(&q.name).into_owned();
    let d = shared.policy.decide_name(&raw);
    let name = normalize_name(&raw).unwrap_or_else(|_| raw.clone());
    let answer = if d.allowed {
        match shared.synthetic(&name) {
            Some(a) => Answer::Address(a),
            None => {
                let over = Decision {
                    allowed: false,
                    would_deny: false,
                    rule: None,
                    fix: None,
                    reason: format!(
                        "the sandbox's resolver has given out {} names, its limit",
                        shared.opts.limits.max_names
                    ),
                };
                record_dns_once(shared, &raw, &over);
                return Some(dns::respond(&q, Answer::NoSuchName));
            }
        }
    } else {
        Answer::NoSuchName
    };
    record_dns_once(shared, &raw, &d);
    Some(dns::respond(&q, answer))
}

fn record_dns_once(shared: &Shared, name: &str, d: &Decision) {
    let max = shared.opts.limits.max_records;
    let first = shared
        .records
        .lock()
        .map(|mut r| {
            // Bounded like the records: past them, a name's first query is only counted.
            if r.dns_seen.len() >= max {
                r.dropped += 1;
                return false;
            }
            r.dns_seen.insert((name.to_ascii_lowercase(), d.verdict()))
        })
        .unwrap_or(false);
    if first {
        shared.record(shared.decided("dns", name, 0, d));
    }
}

/// Why no request head was read.
enum HeadError {
    /// The client closed before it sent a byte: no request to answer or record.
    Silent,
    /// Bytes came but no head the proxy can take: why, and the bytes seen (bounded).
    Bad { reason: String, seen: Vec<u8> },
}

/// Reads an HTTP request head (through the blank line) within the handshake time and the
/// head bound; the head and any bytes after it.
async fn read_head(
    shared: &Shared,
    stream: &mut TcpStream,
) -> Result<(Vec<u8>, Vec<u8>), HeadError> {
    let max = shared.opts.limits.max_head_bytes;
    let mut buf = Vec::with_capacity(1024);
    let deadline = Instant::now() + shared.opts.limits.handshake;
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Ok((buf, rest));
        }
        let bad = |reason: String, seen: Vec<u8>| Err(HeadError::Bad { reason, seen });
        // A TLS handshake sent to the proxy itself (a proxy URL written https://) never
        // ends in a blank line: told at once, not after the handshake time.
        if buf.starts_with(&[0x16, 0x03]) {
            let why = "a TLS handshake: the proxy speaks plain HTTP (http://127.0.0.1:3128, not https://)";
            return bad(why.into(), Vec::new());
        }
        if buf.len() > max {
            return bad(format!("the request head is over {max} bytes"), buf);
        }
        let mut chunk = [0u8; 4096];
        let left = deadline.saturating_duration_since(Instant::now());
        let n = match tokio::time::timeout(left, stream.read(&mut chunk)).await {
            Err(_) => {
                let within = shared.opts.limits.handshake;
                return bad(
                    format!("the request head did not arrive within {within:?}"),
                    buf,
                );
            }
            Ok(Err(e)) => return bad(format!("reading the request head: {e}"), buf),
            Ok(Ok(0)) if buf.is_empty() => return Err(HeadError::Silent),
            Ok(Ok(0)) => return bad("closed before the request head ended".into(), buf),
            Ok(Ok(n)) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn serve_http(shared: &Shared, mut stream: TcpStream) {
    let (head, rest) = match read_head(shared, &mut stream).await {
        Ok(h) => h,
        Err(HeadError::Silent) => return,
        Err(HeadError::Bad { reason, seen }) => {
            bad_request(shared, &mut stream, &seen, reason).await;
            return;
        }
    };
    let target = match proxy::parse_http_head(&head) {
        Ok(t) => t,
        Err(reason) => {
            bad_request(shared, &mut stream, &head, reason).await;
            return;
        }
    };
    let (entry, host, port) = match &target {
        HttpTarget::Connect { host, port } => ("http-connect", host.clone(), *port),
        HttpTarget::Forward {
            host, port, tls, ..
        } => (if *tls { "https" } else { "http" }, host.clone(), *port),
    };
    let d = shared.policy.decide(&host, port);
    let mut rec = shared.decided(entry, &host, port, &d);
    if !d.allowed {
        shared.record(rec);
        let _ = stream
            .write_all(&proxy::http_denied(
                403,
                &host,
                port,
                &d.reason,
                &shared.hash,
            ))
            .await;
        return;
    }
    match target {
        HttpTarget::Connect { .. } => {
            // Answers are decided before the 200, so a refused one is still a 403.
            let addrs = match shared.resolve_checked(&host, port).await {
                Ok(a) => a,
                Err((refusal, reason)) => {
                    answer_refused(shared, &mut stream, &mut rec, &host, port, refusal, reason)
                        .await;
                    return;
                }
            };
            if stream
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            tunnel(shared, stream, rest, rec, &host, addrs).await;
        }
        HttpTarget::Forward { mut head, tls, .. } => {
            head.extend_from_slice(&rest);
            forward(shared, stream, rec, &host, port, head, tls).await;
        }
    }
}

/// A request the proxy could not read, or does not serve: a 400 whose JSON says why, and
/// a denial record naming what the request named as far as it could be read. No request
/// that reached the proxy goes unanswered or unrecorded.
async fn bad_request(shared: &Shared, stream: &mut TcpStream, seen: &[u8], reason: String) {
    let (host, port) = proxy::request_target_hint(seen).unwrap_or_default();
    let d = Decision {
        allowed: false,
        would_deny: false,
        rule: None,
        fix: None,
        reason: format!("the proxy could not take the request: {reason}"),
    };
    shared.record(shared.decided("http", &host, port, &d));
    let _ = stream
        .write_all(&proxy::http_denied(
            400,
            &host,
            port,
            &d.reason,
            &shared.hash,
        ))
        .await;
}

/// An allowed absolute-form request: its checked address dialed (TLS spoken to it for an
/// `https://` target, the origin verified against the host's trust store), the request's
/// first bytes (`first`: its head in origin form and what followed) sent, then both ways
/// spliced. A failure before the origin has the request is the client's 502, recorded.
async fn forward(
    shared: &Shared,
    mut stream: TcpStream,
    mut rec: EgressRecord,
    host: &str,
    port: u16,
    first: Vec<u8>,
    tls: bool,
) {
    let started = Instant::now();
    // Checked before the origin is even dialed: a denial, the step told why.
    if carries_placeholder(shared, &first) {
        // To one of its own hosts, but in plain text (an https:// URL sent to the proxy as
        // it is, as busybox's wget does): its value travels only inside TLS.
        let why = match bound_name(shared, host, HTTPS_PORT) {
            Some(_) => PLACEHOLDER_IN_PLAIN_TEXT,
            None => PLACEHOLDER_REFUSED,
        };
        deny_flight(&mut rec, why.into());
        shared.record(rec);
        let denied = proxy::http_denied(403, host, port, why, &shared.hash);
        let _ = stream.write_all(&denied).await;
        return;
    }
    let (origin, addr) = match shared.connect_checked(host, port).await {
        Ok(c) => c,
        Err((refusal, reason)) => {
            answer_refused(shared, &mut stream, &mut rec, host, port, refusal, reason).await;
            return;
        }
    };
    rec.address = Some(addr.to_string());
    let up = first.len() as u64;
    if !tls {
        let mut origin = origin;
        if let Err(e) = origin.write_all(&first).await {
            let reason = format!("sending the request to {addr}: {e}");
            answer_refused(shared, &mut stream, &mut rec, host, port, None, reason).await;
            return;
        }
        splice(shared, stream, origin, rec, started, up, None).await;
        return;
    }
    let mut origin = match crate::tls::connect(origin, host, shared.opts.limits.connect).await {
        Ok(o) => o,
        Err(reason) => {
            answer_refused(shared, &mut stream, &mut rec, host, port, None, reason).await;
            return;
        }
    };
    if let Err(e) = origin.write_all(&first).await {
        let reason = format!("sending the request to {addr} over TLS: {e}");
        answer_refused(shared, &mut stream, &mut rec, host, port, None, reason).await;
        return;
    }
    splice(shared, stream, origin, rec, started, up, None).await;
}

/// An HTTP client's answer when resolving or dialing its allowed destination failed: a 403
/// for an answer the policy refused, a 502 for one that could not be reached; recorded.
async fn answer_refused(
    shared: &Shared,
    stream: &mut TcpStream,
    rec: &mut EgressRecord,
    host: &str,
    port: u16,
    refusal: Option<Decision>,
    reason: String,
) {
    let status = if refusal.is_some() { 403 } else { 502 };
    finish_refused(shared, rec, refusal, reason.clone());
    let _ = stream
        .write_all(&proxy::http_denied(
            status,
            host,
            port,
            &reason,
            &shared.hash,
        ))
        .await;
}

/// A denial found after the first decision (a resolved address refused), or an error of
/// an allowed connection: either way, recorded.
fn finish_refused(
    shared: &Shared,
    rec: &mut EgressRecord,
    refusal: Option<Decision>,
    reason: String,
) {
    match refusal {
        Some(d) => {
            rec.verdict = d.verdict();
            rec.rule = d.rule;
            rec.reason = d.reason;
            rec.fix = d.fix;
        }
        None => rec.error = Some(reason),
    }
    shared.record(rec.clone());
}

/// The rest of a CONNECT tunnel or a captured connection, its addresses already checked:
/// waits briefly for the client's first bytes; a TLS ClientHello must name `host`; then
/// dials and splices.
async fn tunnel(
    shared: &Shared,
    mut client: TcpStream,
    mut early: Vec<u8>,
    mut rec: EgressRecord,
    host: &str,
    addrs: Vec<SocketAddr>,
) {
    let started = Instant::now();
    // ssh's server speaks first: its client would wait out `first_flight` in silence.
    let server_first = addrs.first().is_some_and(|a| a.port() == SSH_PORT);
    if !early.is_empty() || !server_first {
        let wait = shared.opts.limits.first_flight;
        match first_flight(shared, &mut client, wait, early, host).await {
            Flight::Forward(bytes) => early = bytes,
            Flight::Closed => return,
            Flight::Refused(why) => {
                deny_flight(&mut rec, why);
                shared.record(rec);
                reset(client);
                return;
            }
        }
    }
    // First bytes holding a placeholder bound elsewhere: the origin is never dialed.
    let port = addrs.first().map_or(0, |a| a.port());
    if bound_name(shared, host, port).is_none() && carries_placeholder(shared, &early) {
        deny_flight(&mut rec, PLACEHOLDER_REFUSED.into());
        shared.record(rec);
        reset(client);
        return;
    }
    let (origin, addr) = match shared.dial(&addrs).await {
        Ok(c) => c,
        Err(reason) => {
            finish_refused(shared, &mut rec, None, reason);
            reset(client);
            return;
        }
    };
    rec.address = Some(addr.to_string());
    let Some((client, early, origin, rec)) =
        secrets_or_on(shared, client, early, origin, rec, host, started).await
    else {
        return;
    };
    let mut origin = origin;
    if !early.is_empty() && origin.write_all(&early).await.is_err() {
        return;
    }
    let up = early.len() as u64;
    // Silent so far (a slow client, or one waiting for the server): checked on arrival.
    let check = early.is_empty().then_some(host);
    splice(shared, client, origin, rec, started, up, check).await;
}

/// Why bytes holding a secret's placeholder were not sent.
const PLACEHOLDER_REFUSED: &str =
    "the placeholder of a secret was sent to a host it is not bound to: not sent";
const PLACEHOLDER_IN_PLAIN_TEXT: &str =
    "the placeholder of a secret was sent to its host in plain text (its value is sent only inside TLS, to port 443): not sent";

/// Whether `bytes` hold the placeholder of any of the step's secrets.
fn carries_placeholder(shared: &Shared, bytes: &[u8]) -> bool {
    (shared.opts.secrets.as_ref()).is_some_and(|s| {
        let mut finder = s.placeholder_finder();
        finder.push(bytes, &mut Vec::new());
        finder.finish(false, &mut Vec::new());
        finder.swaps > 0
    })
}

/// `host` (normalized) when the step's secrets are bound to it and `port` is 443: its
/// connections are relayed with the swaps.
fn bound_name(shared: &Shared, host: &str, port: u16) -> Option<String> {
    let secrets = shared.opts.secrets.as_ref()?;
    normalize_name(host)
        .ok()
        .filter(|name| port == HTTPS_PORT && secrets.bound(name))
}

/// A connection whose destination is checked and dialed, and whose first bytes were checked
/// for placeholders bound elsewhere (by the caller, before its dial where it can): to a host
/// the step's secrets are bound to (port 443), relayed with their swaps, and `None`; else
/// handed back to be spliced.
async fn secrets_or_on(
    shared: &Shared,
    client: TcpStream,
    early: Vec<u8>,
    origin: TcpStream,
    mut rec: EgressRecord,
    host: &str,
    started: Instant,
) -> Option<(TcpStream, Vec<u8>, TcpStream, EgressRecord)> {
    let Some(secrets) = shared.opts.secrets.as_ref() else {
        return Some((client, early, origin, rec));
    };
    let port = origin.peer_addr().map_or(0, |a| a.port());
    // Unbound: its first bytes were checked for placeholders by the caller.
    let Some(name) = bound_name(shared, host, port) else {
        return Some((client, early, origin, rec));
    };
    let limit = shared.opts.limits.handshake;
    let r = crate::secrets::relay(secrets, client, early, origin, &name, limit).await;
    rec.bytes_up = r.bytes_up;
    rec.bytes_down = r.bytes_down;
    rec.ms = started.elapsed().as_millis() as u64;
    rec.secrets = Some(SecretsUse {
        names: r.names,
        swapped: r.swapped,
        scrubbed: r.scrubbed,
    });
    if let Some(why) = r.refused {
        deny_flight(&mut rec, why);
    }
    shared.record(rec);
    None
}

/// How a tunnel's first flight ended.
enum Flight {
    /// Bytes to forward, in order, before splicing: nothing (a silent client), another
    /// protocol's bytes, or every record of a whole ClientHello that passed the server-name
    /// check, with whatever arrived after it.
    Forward(Vec<u8>),
    /// The client closed before it sent a byte.
    Closed,
    /// Not forwarded, why (recorded as a denial).
    Refused(String),
}

/// The client's first bytes of a tunnel: whatever arrives within `wait` (nothing, for a
/// protocol whose server speaks first), then, when they begin a TLS record, the rest of
/// its ClientHello, checked ([`hello_flight`]).
async fn first_flight(
    shared: &Shared,
    client: &mut TcpStream,
    wait: Duration,
    already: Vec<u8>,
    host: &str,
) -> Flight {
    let mut early = already;
    if early.is_empty() {
        let mut chunk = vec![0u8; 16 << 10];
        match tokio::time::timeout(wait, client.read(&mut chunk)).await {
            Ok(Ok(0)) => return Flight::Closed,
            Ok(Ok(n)) => early.extend_from_slice(&chunk[..n]),
            _ => return Flight::Forward(early),
        }
    }
    hello_flight(client, early, shared.opts.limits.handshake, host).await
}

/// Reads the rest of a ClientHello that `flight` begins, across as many TLS records as it
/// spans, within `limit` and [`proxy::MAX_HELLO_FLIGHT`] bytes, and checks its server name
/// against `host`. A hello that is not whole when the client closes or a bound is hit is
/// refused: a partial hello is never read as one without a server name. A flight that
/// begins with a TLS record other than a handshake is refused too (a server may skip an
/// alert or a change_cipher_spec and read the hello behind it). Bytes that do not begin a
/// TLS record (ssh, plain text) are forwarded as they are.
async fn hello_flight<R: AsyncRead + Unpin>(
    client: &mut R,
    mut flight: Vec<u8>,
    limit: Duration,
    host: &str,
) -> Flight {
    const NOT_SENT: &str = "closed before any byte reached the origin";
    let deadline = Instant::now() + limit;
    let mut hello = proxy::HelloReader::default();
    let mut chunk = vec![0u8; 16 << 10];
    loop {
        match hello.feed(&flight) {
            Ok(FirstFlight::NotTls) => return Flight::Forward(flight),
            Ok(FirstFlight::Hello(name)) => {
                return match check_server_name(name.as_deref(), host) {
                    Ok(()) => Flight::Forward(flight),
                    Err(why) => Flight::Refused(format!("{why}: {NOT_SENT}")),
                }
            }
            Ok(FirstFlight::Incomplete) => {}
            Err(why) => return Flight::Refused(format!("{why}: {NOT_SENT}")),
        }
        // `feed` refuses a flight at the bound that is still incomplete, so there is room.
        let room = proxy::MAX_HELLO_FLIGHT
            .saturating_sub(flight.len())
            .clamp(1, chunk.len());
        let left = deadline.saturating_duration_since(Instant::now());
        let why = match tokio::time::timeout(left, client.read(&mut chunk[..room])).await {
            Ok(Ok(n)) if n > 0 => {
                flight.extend_from_slice(&chunk[..n]);
                continue;
            }
            Ok(Ok(_)) => "the client closed before its TLS ClientHello was whole".to_string(),
            Ok(Err(e)) => format!("the client's TLS ClientHello was cut short: {e}"),
            Err(_) => format!("the TLS ClientHello was not whole within {limit:?}"),
        };
        return Flight::Refused(format!("{why}: {NOT_SENT}"));
    }
}

/// A whole ClientHello's server name must be the tunnel's host: a tunnel opened to an
/// allowed name does not carry a handshake with another. A hello without one passes, as
/// a client connecting by address sends it (the destination itself was decided).
fn check_server_name(sni: Option<&str>, host: &str) -> Result<(), String> {
    let Some(sni) = sni else {
        return Ok(());
    };
    let want = normalize_name(host).unwrap_or_else(|_| host.to_ascii_lowercase());
    if sni == want {
        Ok(())
    } else {
        Err(format!(
            "the TLS server name {:?} is not the tunnel's host {want}",
            escape(sni)
        ))
    }
}

/// A first flight refused by the server-name check is a denial: the tunnel's destination
/// was allowed, what the client sent through it was not.
fn deny_flight(rec: &mut EgressRecord, why: String) {
    rec.verdict = "deny";
    rec.rule = None;
    rec.reason = why;
    rec.error = None;
    rec.fix = None;
}

async fn serve_socks(shared: &Shared, mut stream: TcpStream) {
    let limit = shared.opts.limits.handshake;
    let mut seen = false;
    let greeting = tokio::time::timeout(limit, socks_greeting(&mut stream, &mut seen)).await;
    let reason = match greeting {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(why)) => Err(why),
        Err(_) => Err(format!(
            "the SOCKS5 request did not arrive within {limit:?}"
        )),
    };
    let (host, port) = match reason {
        Ok(t) => t,
        // A connection that sent nothing made no request.
        Err(_) if !seen => return,
        Err(why) => {
            let d = Decision {
                allowed: false,
                would_deny: false,
                rule: None,
                fix: None,
                reason: format!("the proxy could not take the request: {why}"),
            };
            shared.record(shared.decided("socks5", "", 0, &d));
            return;
        }
    };
    let d = shared.policy.decide(&host, port);
    let mut rec = shared.decided("socks5", &host, port, &d);
    if !d.allowed {
        shared.record(rec);
        let _ = stream
            .write_all(&socks_reply(socks_reply::NOT_ALLOWED))
            .await;
        return;
    }
    // Dialed before the reply (a SOCKS5 client waits for it), then the first flight checked.
    let started = Instant::now();
    let (origin, addr) = match shared.connect_checked(&host, port).await {
        Ok(c) => c,
        Err((refusal, reason)) => {
            let code = if refusal.is_some() {
                socks_reply::NOT_ALLOWED
            } else {
                socks_reply::HOST_UNREACHABLE
            };
            finish_refused(shared, &mut rec, refusal, reason);
            let _ = stream.write_all(&socks_reply(code)).await;
            return;
        }
    };
    rec.address = Some(addr.to_string());
    if stream
        .write_all(&socks_reply(socks_reply::SUCCEEDED))
        .await
        .is_err()
    {
        return;
    }
    let wait = if port == SSH_PORT {
        Duration::ZERO
    } else {
        shared.opts.limits.first_flight
    };
    let early = match first_flight(shared, &mut stream, wait, Vec::new(), &host).await {
        Flight::Forward(bytes) => bytes,
        Flight::Closed => return,
        Flight::Refused(why) => {
            deny_flight(&mut rec, why);
            shared.record(rec);
            reset(stream);
            return;
        }
    };
    if bound_name(shared, &host, port).is_none() && carries_placeholder(shared, &early) {
        deny_flight(&mut rec, PLACEHOLDER_REFUSED.into());
        shared.record(rec);
        reset(stream);
        return;
    }
    let n = early.len();
    let Some((stream, early, mut origin, rec)) =
        secrets_or_on(shared, stream, early, origin, rec, &host, started).await
    else {
        return;
    };
    if !early.is_empty() && origin.write_all(&early).await.is_err() {
        return;
    }
    let check = (n == 0).then_some(host.as_str());
    splice(shared, stream, origin, rec, started, n as u64, check).await;
}

/// The SOCKS5 greeting and CONNECT request. `Err` is why it was refused (a SOCKS5 reply
/// sent where the protocol has one); `seen` is set once a byte has arrived.
/// Username/password authentication is accepted and ignored: some clients insist on it.
async fn socks_greeting(s: &mut TcpStream, seen: &mut bool) -> Result<(String, u16), String> {
    let cut = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "closed before the SOCKS5 request ended".to_string(),
        _ => format!("reading the SOCKS5 request: {e}"),
    };
    let mut hdr = [0u8; 2];
    let n = s.read(&mut hdr[..1]).await.map_err(cut)?;
    if n == 0 {
        return Err("closed before the SOCKS5 request ended".into());
    }
    *seen = true;
    s.read_exact(&mut hdr[1..]).await.map_err(cut)?;
    if hdr[0] != 5 {
        return Err(format!(
            "not a SOCKS5 greeting (version byte {}; SOCKS4 and other protocols are not served here)",
            hdr[0]
        ));
    }
    let mut methods = vec![0u8; hdr[1] as usize];
    s.read_exact(&mut methods).await.map_err(cut)?;
    socks_auth(s, &methods).await?;
    let mut req = [0u8; 4];
    s.read_exact(&mut req).await.map_err(cut)?;
    if req[0] != 5 {
        return Err(format!("a SOCKS5 request of version {}", req[0]));
    }
    if req[1] != 1 {
        let _ = s
            .write_all(&socks_reply(socks_reply::COMMAND_NOT_SUPPORTED))
            .await;
        return Err(format!(
            "SOCKS5 command {} (only CONNECT, 1, is served)",
            req[1]
        ));
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            s.read_exact(&mut a).await.map_err(cut)?;
            Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            s.read_exact(&mut len).await.map_err(cut)?;
            let mut name = vec![0u8; len[0] as usize];
            s.read_exact(&mut name).await.map_err(cut)?;
            String::from_utf8_lossy(&name).into_owned()
        }
        4 => {
            let mut a = [0u8; 16];
            s.read_exact(&mut a).await.map_err(cut)?;
            std::net::Ipv6Addr::from(a).to_string()
        }
        t => {
            let _ = s
                .write_all(&socks_reply(socks_reply::ADDRESS_NOT_SUPPORTED))
                .await;
            return Err(format!("SOCKS5 address type {t}"));
        }
    };
    let mut port = [0u8; 2];
    s.read_exact(&mut port).await.map_err(cut)?;
    Ok((host, u16::from_be_bytes(port)))
}

/// The SOCKS5 method negotiation: none, or username/password (read and ignored).
async fn socks_auth(s: &mut TcpStream, methods: &[u8]) -> Result<(), String> {
    let io = |e: std::io::Error| format!("the SOCKS5 negotiation was cut short: {e}");
    if methods.contains(&0) {
        return s.write_all(&[5, 0]).await.map_err(io);
    }
    if !methods.contains(&2) {
        let _ = s.write_all(&[5, 0xff]).await;
        return Err("no SOCKS5 method served (none or username/password)".into());
    }
    s.write_all(&[5, 2]).await.map_err(io)?;
    let mut v = [0u8; 2];
    s.read_exact(&mut v).await.map_err(io)?;
    let mut user = vec![0u8; v[1] as usize];
    s.read_exact(&mut user).await.map_err(io)?;
    let mut plen = [0u8; 1];
    s.read_exact(&mut plen).await.map_err(io)?;
    let mut pass = vec![0u8; plen[0] as usize];
    s.read_exact(&mut pass).await.map_err(io)?;
    s.write_all(&[1, 0]).await.map_err(io)
}

async fn serve_capture(shared: &Shared, stream: TcpStream) {
    let Ok(local) = stream.local_addr() else {
        return;
    };
    let port = local.port();
    let name = match local.ip() {
        IpAddr::V4(a) => shared.name_of(a),
        IpAddr::V6(_) => None,
    };
    let Some(name) = name else {
        let d = Decision {
            allowed: false,
            would_deny: false,
            rule: None,
            fix: None,
            reason: format!(
                "{} is not an address the sandbox's resolver gave out: connect by name",
                local.ip()
            ),
        };
        shared.record(shared.decided("capture", &local.ip().to_string(), port, &d));
        reset(stream);
        return;
    };
    let d = shared.policy.decide(&name, port);
    let mut rec = shared.decided("capture", &name, port, &d);
    if !d.allowed {
        shared.record(rec);
        reset(stream);
        return;
    }
    let addrs = match shared.resolve_checked(&name, port).await {
        Ok(a) => a,
        Err((refusal, reason)) => {
            finish_refused(shared, &mut rec, refusal, reason);
            reset(stream);
            return;
        }
    };
    tunnel(shared, stream, Vec::new(), rec, &name, addrs).await;
}

/// An origin connection [`splice`] copies to and from: a TCP stream, or TLS over one (an
/// `https://` request the proxy relays).
trait Origin {
    type Read: AsyncRead + Unpin + Send;
    type Write: tokio::io::AsyncWrite + Unpin + Send;
    fn halves(self) -> (Self::Read, Self::Write);
    /// The socket under a half, when the origin is a plain TCP connection (its bytes can then
    /// be moved in the kernel, [`crate::kernel_splice`]).
    fn tcp_read(r: &Self::Read) -> Option<&TcpStream>;
    fn tcp_write(w: &Self::Write) -> Option<&TcpStream>;
}

impl Origin for TcpStream {
    type Read = tokio::net::tcp::OwnedReadHalf;
    type Write = tokio::net::tcp::OwnedWriteHalf;
    fn halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
    fn tcp_read(r: &Self::Read) -> Option<&TcpStream> {
        Some(r.as_ref())
    }
    fn tcp_write(w: &Self::Write) -> Option<&TcpStream> {
        Some(w.as_ref())
    }
}

impl Origin for tokio_rustls::client::TlsStream<TcpStream> {
    type Read = tokio::io::ReadHalf<Self>;
    type Write = tokio::io::WriteHalf<Self>;
    fn halves(self) -> (Self::Read, Self::Write) {
        tokio::io::split(self)
    }
    fn tcp_read(_: &Self::Read) -> Option<&TcpStream> {
        None
    }
    fn tcp_write(_: &Self::Write) -> Option<&TcpStream> {
        None
    }
}

/// Copies both ways until both end, counting bytes; the record is written when the
/// connection ends, or when the engine stops it (the guard's drop).
///
/// `check`: the tunnel's host, when the client had sent nothing before the origin was
/// dialed (a slow client, or one that waited for the server): its first bytes must then
/// still pass the server-name check, a ClientHello read whole ([`hello_flight`]), before
/// any is forwarded; if they do not, both sides are closed.
async fn splice<O: Origin>(
    shared: &Shared,
    client: TcpStream,
    origin: O,
    rec: EgressRecord,
    started: Instant,
    up_already: u64,
    check: Option<&str>,
) {
    struct Open<'a> {
        shared: &'a Shared,
        rec: Option<EgressRecord>,
        up: Arc<AtomicU64>,
        down: Arc<AtomicU64>,
        started: Instant,
    }
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            if let Some(mut r) = self.rec.take() {
                r.bytes_up = self.up.load(Ordering::Relaxed);
                r.bytes_down = self.down.load(Ordering::Relaxed);
                r.ms = self.started.elapsed().as_millis() as u64;
                self.shared.record(r);
            }
        }
    }
    let open = Open {
        shared,
        rec: Some(rec),
        up: Arc::new(AtomicU64::new(up_already)),
        down: Arc::new(AtomicU64::new(0)),
        started,
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut or, mut ow) = origin.halves();
    let up = open.up.clone();
    let down = open.down.clone();
    let stop = tokio::sync::Notify::new();
    let mut refused: Option<String> = None;
    let limit = shared.opts.limits.handshake;
    let a = async {
        let mut buf = vec![0u8; 64 << 10];
        if let Some(host) = check {
            // The first bytes, whenever they come; then the hello they begin, bounded.
            let flight = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => Flight::Closed,
                Ok(n) => hello_flight(&mut cr, buf[..n].to_vec(), limit, host).await,
            };
            let first = match flight {
                Flight::Forward(first) => first,
                Flight::Closed => {
                    let _ = ow.shutdown().await;
                    return;
                }
                Flight::Refused(why) => {
                    refused = Some(why);
                    stop.notify_one();
                    let _ = ow.shutdown().await;
                    return;
                }
            };
            if ow.write_all(&first).await.is_err() {
                let _ = ow.shutdown().await;
                return;
            }
            up.fetch_add(first.len() as u64, Ordering::Relaxed);
        }
        // The step's placeholders go to no host they are not bound to, where the bytes can
        // be read (plain text; a TLS stream's are not, and carry no placeholder in the clear).
        let mut finder = (shared.opts.secrets.as_ref()).map(|s| s.placeholder_finder());
        // Nothing to look for in it: moved in the kernel.
        if let (None, Some(to)) = (&finder, O::tcp_write(&ow)) {
            let _ = crate::kernel_splice::copy(cr.as_ref(), to, &up).await;
            let _ = ow.shutdown().await;
            return;
        }
        while let Ok(n) = cr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if let Some(f) = &mut finder {
                f.push(&buf[..n], &mut Vec::new());
                if f.swaps > 0 {
                    refused = Some(PLACEHOLDER_REFUSED.into());
                    stop.notify_one();
                    break;
                }
            }
            if ow.write_all(&buf[..n]).await.is_err() {
                break;
            }
            up.fetch_add(n as u64, Ordering::Relaxed);
        }
        let _ = ow.shutdown().await;
    };
    let b = async {
        if let Some(from) = O::tcp_read(&or) {
            tokio::select! {
                _ = crate::kernel_splice::copy(from, cw.as_ref(), &down) => {}
                _ = stop.notified() => {}
            }
            let _ = cw.shutdown().await;
            return;
        }
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = tokio::select! {
                r = or.read(&mut buf) => match r {
                    Ok(n) if n > 0 => n,
                    _ => break,
                },
                _ = stop.notified() => break,
            };
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            down.fetch_add(n as u64, Ordering::Relaxed);
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(a, b);
    let mut open = open;
    if let (Some(why), Some(r)) = (refused, open.rec.as_mut()) {
        deny_flight(r, why);
    }
    drop(open);
}
