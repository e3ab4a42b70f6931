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
    /// the head (`Proxy-*` headers dropped, `Host` set to the target).
    Forward {
        host: String,
        port: u16,
        head: Vec<u8>,
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
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(if target.starts_with('/') {
            "this is the sandbox's egress proxy: send an absolute-form request (http://host/path) or CONNECT".into()
        } else {
            format!(
                "only http:// targets are forwarded (use CONNECT for TLS), not {:?}",
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
    let (host, port) = split_authority(authority, Some(80))?;
    let mut out = format!("{method} {path} {version}\r\n");
    let host_header = if port == 80 {
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
    })
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

/// The server name of a TLS ClientHello at the start of `buf`. `Ok(None)`: not a TLS
/// handshake, or one without a server name; `Err`: a handshake we cannot read (incomplete in
/// `buf` or malformed), which a tunnel refuses rather than let through unread.
pub fn tls_server_name(buf: &[u8]) -> Result<Option<String>, &'static str> {
    if buf.first() != Some(&0x16) {
        return Ok(None);
    }
    let rd = |i: usize, n: usize| {
        buf.get(i..i + n)
            .ok_or("incomplete or malformed ClientHello")
    };
    let u16at = |i: usize| rd(i, 2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize);
    let record_len = u16at(3)?;
    // The hello must be in this first record (it is, in every client we know).
    let end = 5 + record_len;
    if rd(5, 1)?[0] != 1 {
        return Err("the first TLS record is not a ClientHello");
    }
    let mut i = 5 + 4 + 2 + 32; // handshake header, version, random
    i += 1 + rd(i, 1)?[0] as usize; // session id
    i += 2 + u16at(i)?; // cipher suites
    i += 1 + rd(i, 1)?[0] as usize; // compression methods
    if i >= end {
        return Ok(None);
    }
    let ext_end = (i + 2 + u16at(i)?).min(end);
    i += 2;
    while i + 4 <= ext_end {
        let ty = u16at(i)?;
        let len = u16at(i + 2)?;
        let body = i + 4;
        if ty == 0 {
            // server_name_list: length, then (type, length, name)*
            let mut j = body + 2;
            let list_end = body + 2 + u16at(body)?;
            while j + 3 <= list_end {
                let kind = rd(j, 1)?[0];
                let n = u16at(j + 1)?;
                let name = rd(j + 3, n)?;
                if kind == 0 {
                    let name = std::str::from_utf8(name).map_err(|_| "server name is not ASCII")?;
                    return Ok(Some(name.to_ascii_lowercase()));
                }
                j += 3 + n;
            }
            return Ok(None);
        }
        i = body + len;
    }
    Ok(None)
}

/// A minimal TLS ClientHello (one cipher suite, one extension) naming `name`: what a
/// client's first flight looks like to [`tls_server_name`], for tests and probes of the
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

    #[test]
    fn connect_and_absolute_form() {
        assert_eq!(
            parse_http_head(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap(),
            HttpTarget::Connect {
                host: "api.example.com".into(),
                port: 443
            }
        );
        let HttpTarget::Forward { host, port, head } = parse_http_head(
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
        for bad in [
            &b"GET /x HTTP/1.1\r\n\r\n"[..],
            b"CONNECT example.com HTTP/1.1\r\n\r\n",
            b"GET https://x.example/ HTTP/1.1\r\n\r\n",
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
    fn server_name_of_a_client_hello() {
        let hello = minimal_client_hello("API.example.com");
        assert_eq!(tls_server_name(&hello), Ok(Some("api.example.com".into())));
        assert_eq!(tls_server_name(b"SSH-2.0-OpenSSH\r\n"), Ok(None));
        assert!(tls_server_name(&hello[..20]).is_err());
        for cut in 0..hello.len() {
            let _ = tls_server_name(&hello[..cut]);
        }
    }
}
