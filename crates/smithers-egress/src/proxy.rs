//! The entry points' protocols, parsed from hostile bytes within fixed bounds: an HTTP proxy
//! request head (CONNECT and absolute-form), a SOCKS5 greeting and request, and the server
//! name of a TLS ClientHello (a tunnel to an allowed name must not carry a handshake for
//! another).

/// What an HTTP proxy request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpTarget {
    /// `CONNECT host:port`: a tunnel.
    Connect { host: String, port: u16 },
    /// `GET http://host[:port]/path`: one request, forwarded in origin form with the rest of
    /// the head (`Proxy-*` headers dropped, `Host` set to the target). `tls`: the target was
    /// `https://` (busybox `wget` sends every https URL so to its `http_proxy`), so the
    /// proxy speaks TLS to the origin ([`crate::tls`]).
    Forward {
        host: String,
        port: u16,
        head: Vec<u8>,
        tls: bool,
    },
}

/// Parses a complete request head (through its blank line). `Err` is the reason for a 400.
pub fn parse_http_head(head: &[u8]) -> Result<HttpTarget, String> {
    let text =
        std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8".to_string())?;
    let mut lines = text.split("\r\n");
    let request = lines.next().unwrap_or("");
    let mut parts = request.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed request line".into());
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!(
            "unsupported HTTP version {:?}",
            crate::policy::escape(version)
        ));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err("malformed method".into());
    }
    if method == "CONNECT" {
        let (host, port) = split_authority(target, None)?;
        return Ok(HttpTarget::Connect { host, port });
    }
    let scheme = target
        .get(..8)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    let (rest, tls, default_port) = if scheme.starts_with("http://") {
        (&target[7..], false, 80)
    } else if scheme == "https://" {
        (&target[8..], true, 443)
    } else {
        return Err(if target.starts_with('/') {
            "this is the sandbox's egress proxy: send an absolute-form request (http://host/path) or CONNECT".into()
        } else {
            format!(
                "only http:// and https:// targets are forwarded, not {:?}",
                crate::policy::escape(target)
            )
        });
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err("credentials in the URL are not forwarded".into());
    }
    let (host, port) = split_authority(authority, Some(default_port))?;
    let mut out = format!("{method} {path} {version}\r\n");
    let host_header = if port == default_port {
        host.clone()
    } else {
        format!("{host}:{port}")
    };
    out.push_str(&format!("Host: {host_header}\r\n"));
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let Some((name, _)) = line.split_once(':') else {
            return Err("malformed header line".into());
        };
        let lower = name.trim().to_ascii_lowercase();
        if lower == "host" || lower.starts_with("proxy-") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    Ok(HttpTarget::Forward {
        host,
        port,
        head: out.into_bytes(),
        tls,
    })
}

/// The destination a request head names, as far as its request line can be read: for the
/// record of a request refused before it was understood (malformed, cut short, over a
/// bound). Never a decision: only what the record names.
pub fn request_target_hint(head: &[u8]) -> Option<(String, u16)> {
    let line = head.split(|b| *b == b'\r' || *b == b'\n').next()?;
    let line = std::str::from_utf8(line.get(..line.len().min(8 << 10))?).ok()?;
    let mut parts = line.split(' ');
    let (method, target) = (parts.next()?, parts.next()?);
    if method == "CONNECT" {
        return split_authority(target, None).ok();
    }
    let lower = target.get(..8).map(str::to_ascii_lowercase)?;
    let (rest, port) = if lower.starts_with("http://") {
        (&target[7..], 80)
    } else if lower == "https://" {
        (&target[8..], 443)
    } else {
        return None;
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    split_authority(authority, Some(port)).ok()
}

/// `host:port` (or `[v6]:port`); the port is required unless `default` is given.
pub fn split_authority(a: &str, default: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("{:?} is not host:port", crate::policy::escape(a));
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or_else(bad)?;
        (h, tail.strip_prefix(':'))
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    let port = match (port, default) {
        (Some(p), _) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad)?,
        (None, Some(d)) => d,
        (None, None) => return Err(bad()),
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

/// The body and headers of our answer to a denied HTTP request: a 403 whose JSON says why,
/// with a header naming the policy, so an agent reads "blocked by policy", not a fault.
pub fn http_denied(status: u16, host: &str, port: u16, reason: &str, policy_hash: &str) -> Vec<u8> {
    let error = match status {
        403 => "blocked by the sandbox's egress policy",
        429 => "the sandbox's egress connection limit is reached",
        502 => "allowed by the sandbox's egress policy, but the destination could not be reached",
        _ => "not a request the sandbox's egress proxy serves",
    };
    let body = serde_json::json!({
        "error": error,
        "host": crate::policy::escape(host),
        "port": port,
        "reason": reason,
        "policy": policy_hash,
    })
    .to_string();
    let text = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        429 => "Too Many Requests",
        502 => "Bad Gateway",
        _ => "Error",
    };
    format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: application/json\r\nX-Smithers-Egress-Policy: {policy_hash}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// SOCKS5 reply codes we send.
pub mod socks_reply {
    pub const SUCCEEDED: u8 = 0x00;
    pub const GENERAL_FAILURE: u8 = 0x01;
    pub const NOT_ALLOWED: u8 = 0x02;
    pub const HOST_UNREACHABLE: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x07;
    pub const ADDRESS_NOT_SUPPORTED: u8 = 0x08;
}

/// A SOCKS5 reply with an all-zero bound address.
pub fn socks_reply(code: u8) -> [u8; 10] {
    [5, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// TLS record content types (RFC 8446 5.1, RFC 6520): a handshake, and the others a
/// first flight may not begin with.
const TLS_CHANGE_CIPHER_SPEC: u8 = 20;
const TLS_ALERT: u8 = 21;
const TLS_HANDSHAKE: u8 = 22;
const TLS_APPLICATION_DATA: u8 = 23;
const TLS_HEARTBEAT: u8 = 24;
/// The major version byte of every TLS record (SSL 3.0 to TLS 1.3 alike).
const TLS_MAJOR: u8 = 3;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// Largest TLS plaintext record payload (RFC 8446 5.1): a larger record is not TLS.
const MAX_TLS_RECORD: usize = 1 << 14;
/// The `server_name` extension, and its one name type (RFC 6066 3).
const SERVER_NAME: usize = 0;
const HOST_NAME: usize = 0;
const MALFORMED: &str = "a malformed TLS ClientHello";

/// Most bytes of a tunnel's first flight, record headers included, read to find a whole
/// ClientHello; one not whole within them is refused. Real hellos are a few KiB, large
/// post-quantum key shares included.
pub const MAX_HELLO_FLIGHT: usize = 64 << 10;

/// What a tunnel's first bytes are, as far as the server-name check goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstFlight {
    /// They do not begin a TLS record: another protocol (ssh, plain text), not checked.
    NotTls,
    /// A TLS handshake whose ClientHello is not whole yet, or a first byte that may begin
    /// a TLS record whose version byte has not come yet: more must be read. Never to be
    /// taken as a hello without a server name, nor as another protocol.
    Incomplete,
    /// A whole ClientHello, and its server name (lowercased) if it has one.
    Hello(Option<String>),
}

/// Reassembles the ClientHello of a first flight from its TLS records: a hello may span
/// several records, and a record may hold more than the hello; the handshake header's
/// 24-bit length says where the hello ends. Each record is copied once, so a hello sent a
/// byte at a time costs linear time, not a re-parse per read.
#[derive(Debug, Default)]
pub struct HelloReader {
    /// Bytes of the flight consumed as whole records.
    parsed: usize,
    /// The payloads of those records, concatenated: the handshake messages.
    handshake: Vec<u8>,
}

impl HelloReader {
    /// Reads what `flight` adds since the last call: every byte of the first flight read
    /// so far, each call's a continuation of the last's. `Err`: not a ClientHello this
    /// reader will vouch for (malformed, over a bound, interleaved with other records, or
    /// after a TLS record of another type), which a tunnel refuses rather than let through
    /// unread.
    pub fn feed(&mut self, flight: &[u8]) -> Result<FirstFlight, &'static str> {
        match flight.first() {
            None => return Ok(FirstFlight::Incomplete),
            Some(&TLS_HANDSHAKE) => {}
            Some(&ty) => {
                let Some(why) = not_a_handshake(ty) else {
                    // Another protocol through the tunnel (ssh, plain text): not checked.
                    return Ok(FirstFlight::NotTls);
                };
                // A TLS record, but not a handshake: a server may skip a warning alert or a
                // change_cipher_spec before the hello, which would then go unchecked. The
                // version byte tells such a record from another protocol's first byte.
                return match flight.get(1) {
                    None => Ok(FirstFlight::Incomplete),
                    Some(&TLS_MAJOR) => Err(why),
                    Some(_) => Ok(FirstFlight::NotTls),
                };
            }
        }
        loop {
            if let Some(hello) = self.whole_hello()? {
                // Records after the hello (a 0-RTT client's early data) are not ours to read.
                return Ok(hello);
            }
            let at = self.parsed;
            let Some(header) = flight.get(at..at + 5) else {
                break;
            };
            if header[0] != TLS_HANDSHAKE {
                return Err(
                    "a TLS record other than a handshake came before the ClientHello was whole",
                );
            }
            if header[1] != TLS_MAJOR {
                return Err("not a TLS record (its version is not 3.x)");
            }
            let len = u16::from_be_bytes([header[3], header[4]]) as usize;
            if len == 0 || len > MAX_TLS_RECORD {
                return Err("a TLS handshake record that is empty or over 16 KiB");
            }
            let Some(payload) = flight.get(at + 5..at + 5 + len) else {
                break;
            };
            self.handshake.extend_from_slice(payload);
            self.parsed = at + 5 + len;
        }
        if flight.len() >= MAX_HELLO_FLIGHT {
            return Err("the TLS ClientHello is not whole within 64 KiB");
        }
        Ok(FirstFlight::Incomplete)
    }

    /// The hello, once the handshake bytes hold all of it; `None` before.
    fn whole_hello(&self) -> Result<Option<FirstFlight>, &'static str> {
        let Some(h) = self.handshake.get(..4) else {
            return Ok(None);
        };
        if h[0] != CLIENT_HELLO {
            return Err("the first TLS handshake message is not a ClientHello");
        }
        let len = 4 + u32::from_be_bytes([0, h[1], h[2], h[3]]) as usize;
        // Refused at once when even full records could not carry it within the bound,
        // rather than after waiting for bytes that would be refused anyway.
        if len + 5 * len.div_ceil(MAX_TLS_RECORD) > MAX_HELLO_FLIGHT {
            return Err("the TLS ClientHello declares a length over 64 KiB");
        }
        match self.handshake.get(4..len) {
            Some(body) => hello_server_name(body).map(|n| Some(FirstFlight::Hello(n))),
            None => Ok(None),
        }
    }
}

/// Why a first flight that begins with a TLS record of content type `ty` is refused, if
/// `ty` is a TLS record type other than a handshake.
fn not_a_handshake(ty: u8) -> Option<&'static str> {
    Some(match ty {
        TLS_CHANGE_CIPHER_SPEC => "a TLS change_cipher_spec record came before the ClientHello",
        TLS_ALERT => "a TLS alert record came before the ClientHello",
        TLS_APPLICATION_DATA => "a TLS application_data record came before the ClientHello",
        TLS_HEARTBEAT => "a TLS heartbeat record came before the ClientHello",
        _ => return None,
    })
}

/// A cursor over hostile bytes: every length is checked against what is left.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if n > self.0.len() {
            return Err(MALFORMED);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<usize, &'static str> {
        Ok(self.take(1)?[0] as usize)
    }
    fn u16(&mut self) -> Result<usize, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    /// A vector with a 16-bit length.
    fn vec16(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u16()?;
        self.take(n)
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The server name of a whole ClientHello's body (after its handshake header), read
/// strictly: every length must land inside its parent and nothing may trail, because a
/// server reading the bytes another way than we did could see another name. `Ok(None)`: a
/// hello with no `server_name` extension, as a client connecting by address sends.
fn hello_server_name(body: &[u8]) -> Result<Option<String>, &'static str> {
    let mut c = Cursor(body);
    c.take(2 + 32)?; // legacy_version, random
    let session_id = c.u8()?;
    if session_id > 32 {
        return Err(MALFORMED);
    }
    c.take(session_id)?;
    let suites = c.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(MALFORMED);
    }
    let compression = c.u8()?;
    if compression == 0 {
        return Err(MALFORMED);
    }
    c.take(compression)?;
    if c.is_empty() {
        // A hello may end before its extensions (TLS 1.2 allows it): no server name.
        return Ok(None);
    }
    let mut exts = Cursor(c.vec16()?);
    if !c.is_empty() {
        return Err(MALFORMED);
    }
    let mut name = None;
    let mut seen = false;
    while !exts.is_empty() {
        let ty = exts.u16()?;
        let data = exts.vec16()?;
        if ty == SERVER_NAME {
            // A server might read the second; we would have checked the first.
            if seen {
                return Err("a TLS ClientHello with two server_name extensions");
            }
            seen = true;
            name = host_name(data)?;
        }
    }
    Ok(name)
}

/// The host name of a `server_name` extension's data: exactly one entry, a host name of
/// printable ASCII (what servers accept; anything else could be read differently).
fn host_name(data: &[u8]) -> Result<Option<String>, &'static str> {
    let mut c = Cursor(data);
    let mut list = Cursor(c.vec16()?);
    if !c.is_empty() || list.is_empty() {
        return Err(MALFORMED);
    }
    let kind = list.u8()?;
    let name = list.vec16()?;
    if kind != HOST_NAME || !list.is_empty() {
        return Err("a TLS server_name that is not exactly one host name");
    }
    if name.is_empty() || !name.iter().all(u8::is_ascii_graphic) {
        return Err("a TLS server name that is not a printable ASCII host name");
    }
    Ok(Some(String::from_utf8_lossy(name).to_ascii_lowercase()))
}

/// The server name of a first flight given whole (one [`HelloReader::feed`]). `Ok(None)`:
/// not TLS, or a whole hello without a server name; `Err`: a hello that is incomplete in
/// `flight` or cannot be read, or a first TLS record that is not a handshake, which a
/// tunnel refuses rather than let through unread.
pub fn tls_server_name(flight: &[u8]) -> Result<Option<String>, &'static str> {
    match HelloReader::default().feed(flight)? {
        FirstFlight::NotTls => Ok(None),
        FirstFlight::Incomplete => Err("an incomplete TLS ClientHello"),
        FirstFlight::Hello(name) => Ok(name),
    }
}

/// A minimal TLS ClientHello (one cipher suite, one extension) naming `name`: what a
/// client's first flight looks like to [`HelloReader`], for tests and probes of the
/// server-name check.
pub fn minimal_client_hello(name: &str) -> Vec<u8> {
    let n = name.len() as u16;
    let mut sni = (n + 3).to_be_bytes().to_vec();
    sni.push(0);
    sni.extend_from_slice(&n.to_be_bytes());
    sni.extend_from_slice(name.as_bytes());
    let mut ext = vec![0, 0];
    ext.extend_from_slice(&(sni.len() as u16).to_be_bytes());
    ext.extend_from_slice(&sni);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[0; 32]);
    body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![1, 0];
    hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What one read of a whole `flight` makes of it.
    fn tls_first_flight(flight: &[u8]) -> Result<FirstFlight, &'static str> {
        HelloReader::default().feed(flight)
    }

    #[test]
    fn connect_and_absolute_form() {
        assert_eq!(
            parse_http_head(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap(),
            HttpTarget::Connect {
                host: "api.example.com".into(),
                port: 443
            }
        );
        let HttpTarget::Forward {
            host,
            port,
            head,
            tls: false,
        } = parse_http_head(
            b"GET http://www.example.com:8080/a?b HTTP/1.1\r\nHost: evil.example\r\nProxy-Authorization: x\r\nAccept: */*\r\n\r\n",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!((host.as_str(), port), ("www.example.com", 8080));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /a?b HTTP/1.1\r\nHost: www.example.com:8080\r\nAccept: */*\r\n\r\n"
        );
        // busybox wget's https through http_proxy: the proxy is to speak TLS to the origin.
        let HttpTarget::Forward {
            host,
            port,
            head,
            tls: true,
        } = parse_http_head(
            b"GET https://x.example/p?q HTTP/1.1\r\nHost: x.example\r\nUser-Agent: Wget\r\nConnection: close\r\n\r\n",
        )
        .unwrap()
        else {
            panic!()
        };
        assert_eq!((host.as_str(), port), ("x.example", 443));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /p?q HTTP/1.1\r\nHost: x.example\r\nUser-Agent: Wget\r\nConnection: close\r\n\r\n"
        );
        let Ok(HttpTarget::Forward {
            port: 8443,
            tls: true,
            ..
        }) = parse_http_head(b"GET HTTPS://x.example:8443/ HTTP/1.1\r\n\r\n")
        else {
            panic!()
        };
        for bad in [
            &b"GET /x HTTP/1.1\r\n\r\n"[..],
            b"CONNECT example.com HTTP/1.1\r\n\r\n",
            b"GET ftp://x.example/ HTTP/1.1\r\n\r\n",
            b"GET https:// HTTP/1.1\r\n\r\n",
            b"GET http://u:p@x.example/ HTTP/1.1\r\n\r\n",
            b"get http://x.example/ HTTP/1.1\r\n\r\n",
            b"GET http://x.example/ SPDY/3\r\n\r\n",
            b"\xff\xfe\r\n\r\n",
        ] {
            assert!(
                parse_http_head(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_refused_request_still_names_what_it_could() {
        for (head, want) in [
            (
                &b"CONNECT a.example:443 HTTP/1.1\r\n"[..],
                Some(("a.example", 443)),
            ),
            (
                b"GET https://u@b.example/x HTTP/1.1",
                Some(("b.example", 443)),
            ),
            (
                b"GET http://c.example:8080?x HTTP/1.1\r\n\r\n",
                Some(("c.example", 8080)),
            ),
            (b"GET /x HTTP/1.1\r\n", None),
            (b"\xff\xfe", None),
            (b"", None),
        ] {
            let got = request_target_hint(head);
            assert_eq!(
                got.as_ref().map(|(h, p)| (h.as_str(), *p)),
                want,
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }

    /// A ClientHello handshake message (header included) with extensions around the
    /// server name, so that splits can fall inside the extensions on either side of it.
    fn hello_message(name: Option<&str>) -> Vec<u8> {
        let mut exts = Vec::new();
        // supported_groups, then the server name, then a padding-sized key_share stand-in.
        exts.extend_from_slice(&[0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x1d]);
        if let Some(name) = name {
            let n = name.len() as u16;
            exts.extend_from_slice(&[0, 0]);
            exts.extend_from_slice(&(n + 5).to_be_bytes());
            exts.extend_from_slice(&(n + 3).to_be_bytes());
            exts.push(0);
            exts.extend_from_slice(&n.to_be_bytes());
            exts.extend_from_slice(name.as_bytes());
        }
        exts.extend_from_slice(&[0x00, 0x33, 0x00, 0x24]);
        exts.extend_from_slice(&[0x5a; 0x24]);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(32);
        body.extend_from_slice(&[9; 32]);
        body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02, 1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let len = (body.len() as u32).to_be_bytes();
        let mut msg = vec![CLIENT_HELLO, len[1], len[2], len[3]];
        msg.extend_from_slice(&body);
        msg
    }

    /// Handshake bytes cut into TLS handshake records at `cuts` (offsets into `hs`).
    fn records(hs: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain([hs.len()].iter()) {
            let part = &hs[from..to];
            out.extend_from_slice(&[TLS_HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
            from = to;
        }
        out
    }

    /// Feeds `flight` in pieces of `step` bytes, as reads would bring it: every proper
    /// prefix is incomplete (never a hello without a name), the whole is `want`.
    fn fed_in_steps(flight: &[u8], step: usize) -> Result<FirstFlight, &'static str> {
        let mut r = HelloReader::default();
        let mut at = 0;
        loop {
            at = (at + step).min(flight.len());
            let got = r.feed(&flight[..at])?;
            if at == flight.len() {
                return Ok(got);
            }
            assert_eq!(got, FirstFlight::Incomplete, "at {at} of {}", flight.len());
        }
    }

    fn named(name: &str) -> Result<FirstFlight, &'static str> {
        Ok(FirstFlight::Hello(Some(name.into())))
    }

    #[test]
    fn a_hello_in_one_record() {
        let hello = minimal_client_hello("API.example.com");
        assert_eq!(tls_first_flight(&hello), named("api.example.com"));
        assert_eq!(tls_server_name(&hello), Ok(Some("api.example.com".into())));
        assert!(tls_server_name(&hello[..hello.len() - 1]).is_err());
        let flight = records(&hello_message(Some("a.test")), &[]);
        assert_eq!(tls_first_flight(&flight), named("a.test"));
        assert_eq!(fed_in_steps(&flight, 1), named("a.test"));
        // Whatever follows the hello (early data, a second message) is not read.
        let mut more = flight.clone();
        more.extend_from_slice(&[0x14, 3, 3, 0, 1, 1, 0x17, 3, 3, 0, 2, 0xde, 0xad]);
        assert_eq!(tls_first_flight(&more), named("a.test"));
    }

    #[test]
    fn a_hello_split_across_two_records() {
        let hs = hello_message(Some("a.test"));
        let ext_start = 4 + 2 + 32 + 33 + 6 + 2 + 2;
        let sni_at = ext_start + 8;
        // Inside the handshake header (a 1-byte first record too), right after it, inside
        // the random, just before the extensions (the first record then has none), inside
        // the extensions before, in and after the server name, one byte before the end.
        let named_points = [1, 2, 3, 4, 20, ext_start - 2, ext_start, sni_at + 3];
        let points = named_points.into_iter().chain([sni_at + 12, hs.len() - 1]);
        for cut in points.chain(1..hs.len()) {
            let flight = records(&hs, &[cut]);
            assert_eq!(tls_first_flight(&flight), named("a.test"), "cut at {cut}");
            for step in [1, 5, 7] {
                assert_eq!(fed_in_steps(&flight, step), named("a.test"), "cut at {cut}");
            }
            // The first record alone is never a hello, with or without a name.
            let first = records(&hs[..cut], &[]);
            assert_eq!(
                tls_first_flight(&first),
                Ok(FirstFlight::Incomplete),
                "{cut}"
            );
        }
    }

    #[test]
    fn a_hello_split_across_many_records() {
        let hs = hello_message(Some("many.test"));
        let every_byte: Vec<usize> = (1..hs.len()).collect();
        let flight = records(&hs, &every_byte);
        assert_eq!(tls_first_flight(&flight), named("many.test"));
        assert_eq!(fed_in_steps(&flight, 1), named("many.test"));
        let uneven: Vec<usize> = (1..hs.len())
            .filter(|i| i % 13 == 0 || i % 7 == 1)
            .collect();
        assert_eq!(fed_in_steps(&records(&hs, &uneven), 3), named("many.test"));
        // Several handshake messages in one record: the hello is the first, by its length.
        let mut two = hs.clone();
        two.extend_from_slice(&[11, 0, 0, 2, 0, 0]);
        assert_eq!(tls_first_flight(&records(&two, &[])), named("many.test"));
        assert_eq!(tls_first_flight(&records(&two, &[30])), named("many.test"));
    }

    #[test]
    fn a_truncated_hello_is_never_whole() {
        let hs = hello_message(Some("a.test"));
        for cuts in [&[][..], &[1], &[90], &[1, 2, 3, 50, 100]] {
            let flight = records(&hs, cuts);
            for end in 0..flight.len() {
                assert_eq!(
                    tls_first_flight(&flight[..end]),
                    Ok(FirstFlight::Incomplete),
                    "{cuts:?} cut at {end}"
                );
            }
        }
        // A record that ends the handshake bytes before the hello's declared length.
        let short = records(&hs[..hs.len() - 1], &[]);
        assert_eq!(tls_first_flight(&short), Ok(FirstFlight::Incomplete));
    }

    #[test]
    fn a_whole_hello_without_a_server_name_has_none() {
        assert_eq!(
            tls_first_flight(&records(&hello_message(None), &[])),
            Ok(FirstFlight::Hello(None))
        );
        assert_eq!(
            tls_first_flight(&records(&hello_message(None), &[3, 77])),
            Ok(FirstFlight::Hello(None))
        );
        // A hello that ends before its extensions.
        let hs = hello_message(None);
        let bare = &hs[..4 + 2 + 32 + 33 + 6 + 2];
        let mut bare = bare.to_vec();
        let len = (bare.len() as u32 - 4).to_be_bytes();
        bare[1..4].copy_from_slice(&len[1..]);
        assert_eq!(
            tls_first_flight(&records(&bare, &[10])),
            Ok(FirstFlight::Hello(None))
        );
    }

    #[test]
    fn an_oversize_hello_is_refused_at_once() {
        for declared in [0xff_ffff_u32, 70_000, (MAX_HELLO_FLIGHT - 4 - 15) as u32] {
            let d = declared.to_be_bytes();
            let flight = records(&[CLIENT_HELLO, d[1], d[2], d[3], 3, 3], &[]);
            assert!(tls_first_flight(&flight).is_err(), "{declared}");
        }
        // Declared within the bound, sent a byte a record: the bound is on what is read.
        let d = 30_000u32.to_be_bytes();
        let mut hs = vec![CLIENT_HELLO, d[1], d[2], d[3]];
        hs.resize(4 + 30_000, 0);
        let every_byte: Vec<usize> = (1..hs.len()).collect();
        let flight = records(&hs, &every_byte);
        let mut r = HelloReader::default();
        let at_bound = &flight[..MAX_HELLO_FLIGHT];
        assert_eq!(r.feed(&at_bound[..1000]), Ok(FirstFlight::Incomplete));
        assert!(r.feed(at_bound).is_err());
    }

    #[test]
    fn garbage_is_refused() {
        let hs = hello_message(Some("a.test"));
        let good = records(&hs, &[]);
        let mut cases: Vec<Vec<u8>> = vec![
            // Not a handshake message of type ClientHello.
            records(&[2, 0, 0, 2, 3, 3], &[]),
            // An empty record, a record over 16 KiB, a record version that is not 3.x.
            vec![TLS_HANDSHAKE, 3, 1, 0, 0],
            vec![TLS_HANDSHAKE, 3, 1, 0x40, 0x01],
            vec![TLS_HANDSHAKE, 0x47, 0x45, 0x54, 0x20],
        ];
        // A non-handshake record before the hello is whole.
        let mut interleaved = records(&hs[..10], &[]);
        interleaved.extend_from_slice(&[0x17, 3, 3, 0, 1, 0]);
        interleaved.extend_from_slice(&records(&hs[10..], &[]));
        cases.push(interleaved);
        // Lengths inside the hello that do not add up: each length field off by one.
        let ext_start = 4 + 2 + 32 + 33 + 6 + 2 + 2;
        for at in [
            4 + 34,
            4 + 2 + 32 + 33 + 1,
            ext_start - 1,
            ext_start + 3,
            ext_start + 11,
        ] {
            let mut bad = hs.clone();
            bad[at] = bad[at].wrapping_add(1);
            cases.push(records(&bad, &[]));
        }
        // Two server_name extensions; a server name that is not printable ASCII.
        let sni = [0u8, 0, 0, 8, 0, 6, 0, 0, 3, b'b', b'.', b't'];
        let mut twice = hs.clone();
        twice.extend_from_slice(&sni);
        let n = twice.len() - 4;
        twice[1..4].copy_from_slice(&(n as u32).to_be_bytes()[1..]);
        let ext_len = twice.len() - ext_start;
        twice[ext_start - 2..ext_start].copy_from_slice(&(ext_len as u16).to_be_bytes());
        assert!(hello_server_name(&twice[4..]).is_err());
        cases.push(records(&twice, &[]));
        let mut control = hs.clone();
        let name_at = ext_start + 8 + 9;
        control[name_at] = b'\n';
        cases.push(records(&control, &[]));
        for (i, flight) in cases.iter().enumerate() {
            assert!(tls_first_flight(flight).is_err(), "case {i}: {flight:?}");
        }
        assert_eq!(tls_first_flight(&good), named("a.test"));
        // Random bytes behind a handshake record header never panic, and never pass for a
        // hello without a name unless they are one.
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..2000 {
            let mut flight = vec![TLS_HANDSHAKE, 3, 1, 0, 0];
            let len = (x % 300) as usize + 1;
            flight[3..5].copy_from_slice(&(len as u16).to_be_bytes());
            flight.push(CLIENT_HELLO);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                flight.push(x as u8);
            }
            let _ = tls_first_flight(&flight);
        }
    }

    #[test]
    fn a_first_flight_that_is_not_tls_is_not_checked() {
        // ssh, plain text, and bytes that begin like a TLS record type but are followed by
        // no TLS version: another protocol's, forwarded as they are.
        for flight in [
            &b"SSH-2.0-OpenSSH\r\n"[..],
            b"GET / HTTP/1.1\r\n",
            &[0x15, 0x00, 0x03],
            &[0x17, b'x'],
            &[0x14, 0x02, 3, 3],
            &[0x18, 0xff],
            &[0x19, 3, 3, 0, 1, 0],
            &[0x13, 3, 3, 0, 1, 0],
        ] {
            assert_eq!(
                tls_first_flight(flight),
                Ok(FirstFlight::NotTls),
                "{flight:?}"
            );
            assert_eq!(tls_server_name(flight), Ok(None), "{flight:?}");
        }
        assert_eq!(tls_first_flight(b""), Ok(FirstFlight::Incomplete));
    }

    #[test]
    fn a_tls_record_other_than_a_handshake_first_is_refused() {
        // A server that skips a warning alert or a change_cipher_spec before the hello
        // would read this hello; it must not pass unchecked behind the record.
        let hello = records(&hello_message(Some("denied.test")), &[]);
        let before: [&[u8]; 6] = [
            &[0x15, 3, 1, 0, 2, 1, 112],  // alert: warning, unrecognized_name
            &[0x15, 3, 3, 0, 2, 1, 0],    // alert: warning, close_notify
            &[0x14, 3, 1, 0, 1, 1],       // change_cipher_spec
            &[0x17, 3, 3, 0, 1, 0],       // application_data
            &[0x18, 3, 3, 0, 3, 1, 0, 0], // heartbeat
            &[0x15, 3, 0, 0, 0],          // an empty alert, SSL 3.0's version
        ];
        for record in before {
            let flight = [record, &hello[..]].concat();
            assert!(tls_first_flight(&flight).is_err(), "{record:?}");
            assert!(tls_server_name(&flight).is_err(), "{record:?}");
            assert!(tls_first_flight(record).is_err(), "{record:?}");
            // Read as it arrives: its first byte alone is not yet known to be TLS, the
            // version byte after it refuses it.
            assert_eq!(
                tls_first_flight(&record[..1]),
                Ok(FirstFlight::Incomplete),
                "{record:?}"
            );
            for step in [1, 2, 5] {
                assert!(fed_in_steps(&flight, step).is_err(), "{record:?} by {step}");
            }
        }
        // The reason names the record.
        let alert = [&[0x15, 3, 3, 0, 2, 1, 0][..], &hello[..]].concat();
        assert_eq!(
            tls_first_flight(&alert),
            Err("a TLS alert record came before the ClientHello")
        );
        let ccs = [&[0x14, 3, 3, 0, 1, 1][..], &hello[..]].concat();
        assert_eq!(
            tls_first_flight(&ccs),
            Err("a TLS change_cipher_spec record came before the ClientHello")
        );
        // The same hello alone is read, and names its server.
        assert_eq!(tls_first_flight(&hello), named("denied.test"));
    }
}
