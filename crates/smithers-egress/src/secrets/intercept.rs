//! The relay of a connection to a bound host: the step's TLS ended here, ours to the real
//! host, HTTP/1.1 between them with the swaps of [`super`].

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::http::{Framer, Head, Pending, Piece, Side};
use super::replace::Replacer;
use super::{foreign_refusal, Secrets};

/// What a relayed connection did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Relayed {
    /// The secrets bound to the host.
    pub names: Vec<String>,
    /// Placeholders swapped for values on the way out.
    pub swapped: u64,
    /// Values (or their forms) swapped for placeholders on the way back.
    pub scrubbed: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Why the relay was refused or cut, if it was (nothing after the cause was sent).
    pub refused: Option<String>,
}

/// Relays `client` (whose first bytes, its ClientHello, are `early`) to `origin` as `host`,
/// within `handshake` for both handshakes.
pub async fn relay(
    secrets: &Secrets,
    client: TcpStream,
    early: Vec<u8>,
    origin: TcpStream,
    host: &str,
    handshake: Duration,
) -> Relayed {
    let mut done = Relayed {
        names: secrets.names_for(host),
        ..Relayed::default()
    };
    let server = match secrets.authority.server_for(host) {
        Ok(s) => s,
        Err(e) => {
            done.refused = Some(e);
            return done;
        }
    };
    let accepted = tokio::time::timeout(
        handshake,
        tokio_rustls::TlsAcceptor::from(server).accept(Rewind::new(early, client)),
    )
    .await;
    let client = match accepted {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            done.refused = Some(format!(
                "the step's TLS handshake as {host} failed (a client that does not trust the run's authority, or pins its own): {e}"
            ));
            return done;
        }
        Err(_) => {
            done.refused = Some(format!(
                "the step's TLS handshake was not done within {handshake:?}"
            ));
            return done;
        }
    };
    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_string()) else {
        done.refused = Some(format!("{host} is not a server name"));
        return done;
    };
    let connected = tokio::time::timeout(
        handshake,
        tokio_rustls::TlsConnector::from(secrets.upstream.clone()).connect(name, origin),
    )
    .await;
    let origin = match connected {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            done.refused = Some(format!(
                "{host} did not prove itself with this host's trust store: {e}; nothing was sent"
            ));
            return done;
        }
        Err(_) => {
            done.refused = Some(format!(
                "{host}'s TLS handshake was not done within {handshake:?}"
            ));
            return done;
        }
    };
    let (cr, cw) = tokio::io::split(client);
    let (or, ow) = tokio::io::split(origin);
    let pending = Pending::default();
    let stop = Notify::new();
    // The request's bodies pass as they are: only its header fields get the values (see
    // `rewrite_request`).
    let up = Pump {
        framer: Framer::new(Side::Request, pending.clone()),
        swaps: Replacer::new(Vec::new()),
        finder: Some(secrets.foreign(host)),
        mask_at_end: false,
        frames: Default::default(),
        fed: 0,
        sent: 0,
    };
    let down = Pump {
        framer: Framer::new(Side::Response, pending),
        swaps: secrets.swap_out(),
        finder: None,
        mask_at_end: true,
        frames: Default::default(),
        fed: 0,
        sent: 0,
    };
    let request_head = |bytes: &[u8]| rewrite_request(secrets, host, bytes);
    let (a, b) = tokio::join!(
        up.run(cr, ow, request_head, &stop),
        down.run(or, cw, check_response, &stop)
    );
    done.bytes_up = a.bytes;
    done.bytes_down = b.bytes;
    done.swapped = a.swaps;
    done.scrubbed = b.swaps;
    done.refused = a.refused.or(b.refused);
    done
}

/// One direction's work.
struct Pump {
    framer: Framer,
    swaps: Replacer,
    /// Placeholders that must not pass this way (request side).
    finder: Option<Replacer>,
    /// At the end, a held tail that began a pattern is masked (response side).
    mask_at_end: bool,
    /// Chunk framing, held until the payload before it has left the replacer: (the payload
    /// offset it follows, its bytes). Swaps keep lengths, so offsets stay true.
    frames: std::collections::VecDeque<(u64, Vec<u8>)>,
    /// Payload bytes given to the replacer, and those it has given back.
    fed: u64,
    sent: u64,
}

struct PumpEnd {
    bytes: u64,
    swaps: u64,
    refused: Option<String>,
}

impl Pump {
    async fn run<R, W>(
        mut self,
        mut from: R,
        mut to: W,
        on_head: impl Fn(&[u8]) -> Result<(Vec<u8>, u64), String>,
        stop: &Notify,
    ) -> PumpEnd
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut end = PumpEnd {
            bytes: 0,
            swaps: 0,
            refused: None,
        };
        let mut buf = vec![0u8; 64 << 10];
        let mut pieces = Vec::new();
        loop {
            let n = tokio::select! {
                r = from.read(&mut buf) => match r {
                    Ok(n) if n > 0 => n,
                    _ => break,
                },
                _ = stop.notified() => break,
            };
            match self.step(&buf[..n], &mut pieces, &on_head, &mut end) {
                Ok(out) => {
                    if to.write_all(&out).await.is_err() {
                        break;
                    }
                    end.bytes += out.len() as u64;
                }
                Err(why) => {
                    end.refused = Some(why);
                    // The other way ends too: the connection is over.
                    stop.notify_waiters();
                    stop.notify_one();
                    let _ = to.shutdown().await;
                    return end;
                }
            }
        }
        let mut tail = Vec::new();
        self.swaps.finish(self.mask_at_end, &mut tail);
        let mut out = Vec::new();
        self.interleave(tail, &mut out);
        out.extend(self.frames.drain(..).flat_map(|(_, f)| f));
        let _ = to.write_all(&out).await;
        end.swaps += self.swaps.swaps;
        let _ = to.shutdown().await;
        end
    }

    /// `input` read as messages, heads checked and rewritten, placeholders looked for, the
    /// swaps made over the payload (heads and bodies, never the chunk framing between them):
    /// what can be sent now.
    fn step(
        &mut self,
        input: &[u8],
        pieces: &mut Vec<Piece>,
        on_head: &impl Fn(&[u8]) -> Result<(Vec<u8>, u64), String>,
        end: &mut PumpEnd,
    ) -> Result<Vec<u8>, String> {
        self.framer.feed(input, pieces)?;
        let mut out = Vec::with_capacity(input.len());
        for piece in pieces.drain(..) {
            let payload = match piece {
                Piece::Frame(f) => {
                    self.frames.push_back((self.fed, f));
                    continue;
                }
                // A message's end: what is held is no secret's start any more (nothing
                // follows in it), so it goes now, never held back to be told apart.
                Piece::End => {
                    let mut held = Vec::new();
                    self.swaps.finish(self.mask_at_end, &mut held);
                    self.interleave(held, &mut out);
                    continue;
                }
                Piece::Head(h) => {
                    let (head, swapped) = on_head(&h)?;
                    end.swaps += swapped;
                    head
                }
                Piece::Data(d) => d,
            };
            if let Some(finder) = &mut self.finder {
                finder.push(&payload, &mut Vec::new());
                if finder.swaps > 0 {
                    return Err(foreign_refusal("this host"));
                }
            }
            let mut swapped = Vec::with_capacity(payload.len());
            self.swaps.push(&payload, &mut swapped);
            self.fed += payload.len() as u64;
            self.interleave(swapped, &mut out);
        }
        // Framing right after what has left can go too.
        self.interleave(Vec::new(), &mut out);
        Ok(out)
    }

    /// Appends `payload` (the replacer's next output) to `out` with each held frame at its
    /// place.
    fn interleave(&mut self, payload: Vec<u8>, out: &mut Vec<u8>) {
        let mut i = 0usize;
        loop {
            match self.frames.front() {
                Some((at, _)) if *at <= self.sent => {
                    let (_, f) = self.frames.pop_front().unwrap_or_default();
                    out.extend_from_slice(&f);
                }
                _ if i == payload.len() => return,
                Some((at, _)) => {
                    let n = ((*at - self.sent) as usize).min(payload.len() - i);
                    out.extend_from_slice(&payload[i..i + n]);
                    i += n;
                    self.sent += n as u64;
                }
                None => {
                    out.extend_from_slice(&payload[i..]);
                    self.sent += (payload.len() - i) as u64;
                    i = payload.len();
                }
            }
        }
    }
}

/// A request's head: its `Host` must be the connection's; `Accept-Encoding` becomes
/// `identity`; the placeholders of the host's secrets become their values in its header
/// fields (inside a `Basic` credential too), never in its request line or its body: an API
/// that stores or repeats what it is sent (a prompt, a document, a query kept in a log)
/// would otherwise give the value back by another way, or spell it out.
fn rewrite_request(secrets: &Secrets, host: &str, bytes: &[u8]) -> Result<(Vec<u8>, u64), String> {
    let mut head = Head::parse(bytes)?;
    // Exactly one Host (the parse refuses two), and it is the connection's: a front end
    // serving many sites routes by it.
    let named = head
        .get("host")
        .ok_or_else(|| format!("a request without a Host on a connection to {host}: not sent"))?;
    let name = named.rsplit_once(':').map_or(named, |(n, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            n
        } else {
            named
        }
    });
    if !name.eq_ignore_ascii_case(host) {
        return Err(format!(
            "a request for another host on a connection to {host}: not sent"
        ));
    }
    if (head.get("upgrade")).is_some_and(|u| !u.eq_ignore_ascii_case("websocket")) {
        return Err("an upgrade to anything but a WebSocket (h2c) cannot be read: not sent".into());
    }
    // Codings that would hide what comes back (`TE: gzip`, a WebSocket's deflate): dropped,
    // so the answer comes plain.
    head.fields.retain(|(n, _)| {
        !n.eq_ignore_ascii_case("te") && !n.eq_ignore_ascii_case("sec-websocket-extensions")
    });
    let mut swapped = 0;
    for (name, value) in &mut head.fields {
        if name.eq_ignore_ascii_case("accept-encoding") {
            *value = "identity".into();
            continue;
        }
        let credential = CREDENTIAL_FIELDS[..2]
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f));
        let basic = (value.strip_prefix("Basic ")).or_else(|| value.strip_prefix("basic "));
        if let (true, Some(encoded)) = (credential, basic) {
            let (swapped_in, n) = secrets.basic_auth(host, encoded)?;
            *value = format!("Basic {swapped_in}");
            swapped += n;
            continue;
        }
        if !CREDENTIAL_FIELDS
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f))
        {
            continue;
        }
        let mut r = secrets.swap_in(host);
        let mut out = Vec::with_capacity(value.len());
        r.push(value.as_bytes(), &mut out);
        r.finish(false, &mut out);
        if r.swaps > 0 {
            *value =
                String::from_utf8(out).map_err(|_| "a header that is not UTF-8".to_string())?;
            swapped += r.swaps;
        }
    }
    Ok((head.to_bytes(), swapped))
}

/// The header fields a value is swapped into: where credentials go. Any other field (one an
/// API might store or repeat) carries the placeholder as it is.
pub const CREDENTIAL_FIELDS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "x-auth-token",
    "private-token",
];

/// A response's head: a compressed body could not be read for the secrets' values, so it
/// ends the connection.
fn check_response(bytes: &[u8]) -> Result<(Vec<u8>, u64), String> {
    let head = Head::parse(bytes)?;
    if let Some(coding) = head.get("content-encoding") {
        if !coding.trim().eq_ignore_ascii_case("identity") {
            return Err(
                "a compressed response (identity was asked for) cannot be read for secrets: cut"
                    .into(),
            );
        }
    }
    Ok((bytes.to_vec(), 0))
}

/// A stream that first gives back bytes already read from it.
struct Rewind<S> {
    early: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Rewind<S> {
    fn new(early: Vec<u8>, inner: S) -> Rewind<S> {
        Rewind {
            early,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.early.len() {
            let n = (self.early.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.early[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
