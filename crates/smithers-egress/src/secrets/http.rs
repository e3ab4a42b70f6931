//! HTTP/1.1 read as messages, one direction at a time: where each head begins and ends and
//! how long each body is, so that heads can be checked and rewritten while bodies pass as
//! bytes. Bounded: a head over [`MAX_HEAD`] bytes or [`MAX_HEADERS`] fields, a chunk-size
//! line over 1 KiB, or a message whose framing is ambiguous (both a length and chunked) ends
//! the connection.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// The longest head read.
pub const MAX_HEAD: usize = 64 << 10;
/// The most header fields in one head.
pub const MAX_HEADERS: usize = 200;

/// Which side's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Request,
    Response,
}

/// A piece of the stream, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// A whole head, its final CRLF CRLF included.
    Head(Vec<u8>),
    /// Bytes of a body (or, after an upgrade, of whatever the connection carries).
    Data(Vec<u8>),
    /// A body's framing: chunk-size lines, the CRLF after a chunk, trailers.
    Frame(Vec<u8>),
    /// A message ended here (its head had no body, or its body is whole).
    End,
}

/// A head, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The request or status line, without its CRLF.
    pub start: String,
    pub fields: Vec<(String, String)>,
}

impl Head {
    /// A head, read strictly: lines end in CRLF and hold no other control byte (a bare LF,
    /// a NUL, an obsolete folded line: each read differently by some origins, which would then
    /// see other messages than we do); field names are tokens; no name is given twice where
    /// twice would be ambiguous (`Host`, `Content-Length`, `Transfer-Encoding`,
    /// `Content-Encoding`).
    pub fn parse(bytes: &[u8]) -> Result<Head, String> {
        let text =
            std::str::from_utf8(bytes).map_err(|_| "a head that is not UTF-8".to_string())?;
        let text = text
            .strip_suffix("\r\n\r\n")
            .ok_or_else(|| "a head without its end".to_string())?;
        let mut lines = text.split("\r\n");
        let start = lines.next().unwrap_or_default().to_string();
        if start.is_empty() || start.bytes().any(|b| b.is_ascii_control()) {
            return Err("a start line that is empty or holds a control byte".into());
        }
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in lines {
            if fields.len() >= MAX_HEADERS {
                return Err(format!("over {MAX_HEADERS} header fields"));
            }
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| "a header line without a colon".to_string())?;
            if name.is_empty() || !name.bytes().all(is_tchar) {
                return Err("a header name that is not a token".into());
            }
            if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                return Err("a header value that holds a control byte".into());
            }
            let once = [
                "host",
                "content-length",
                "transfer-encoding",
                "content-encoding",
            ];
            if once.iter().any(|o| name.eq_ignore_ascii_case(o))
                && fields.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                return Err(format!("{name} given twice"));
            }
            fields.push((name.to_string(), value.trim().to_string()));
        }
        Ok(Head { start, fields })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        (self.fields.iter())
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.start);
        for (n, v) in &self.fields {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.into_bytes()
    }

    /// How the body after this head is framed (`None`: it has none): exactly `chunked`, or
    /// a length of digits only; anything else is refused.
    fn body(&self) -> Result<Option<Body>, String> {
        let chunked = match self.get("transfer-encoding") {
            None => false,
            Some(te) if te.eq_ignore_ascii_case("chunked") => true,
            Some(_) => return Err("a transfer coding other than chunked".into()),
        };
        match (chunked, self.get("content-length")) {
            (true, None) => Ok(Some(Body::Chunked(Chunk::Size(Vec::new())))),
            (true, Some(_)) => Err("both a length and chunked framing".into()),
            (false, None) => Ok(None),
            (false, Some(len)) => {
                if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) || len.len() > 18 {
                    return Err("a length that is not a number".into());
                }
                let n: u64 = len
                    .parse()
                    .map_err(|_| "a length that is not a number".to_string())?;
                Ok((n > 0).then_some(Body::Length(n)))
            }
        }
    }
}

/// A token's character (RFC 9110 `tchar`).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The most requests waiting for their answers on one connection.
pub const MAX_PENDING: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Length(u64),
    Chunked(Chunk),
    UntilClose,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Chunk {
    /// Reading a chunk-size line.
    Size(Vec<u8>),
    /// Inside a chunk's data, this much left.
    Data(u64),
    /// The CRLF after a chunk's data, this much left.
    DataEnd(u8),
    /// After the last chunk: trailer lines until an empty one (the current line so far).
    Trailer(Vec<u8>),
}

#[derive(Debug)]
enum State {
    Head(Vec<u8>),
    Body(Body),
    /// After an upgrade (or a response read until the close): bytes only.
    Raw,
}

/// The requests' methods, in order, for their responses (a HEAD's has no body), and whether
/// an upgrade was asked for.
pub type Pending = Arc<Mutex<VecDeque<String>>>;

/// One direction's reader.
#[derive(Debug)]
pub struct Framer {
    side: Side,
    state: State,
    pending: Pending,
}

impl Framer {
    pub fn new(side: Side, pending: Pending) -> Framer {
        Framer {
            side,
            state: State::Head(Vec::new()),
            pending,
        }
    }

    /// Reads `input` into pieces; `Err` ends the connection.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<Piece>) -> Result<(), String> {
        while !input.is_empty() {
            match &mut self.state {
                State::Raw => {
                    out.push(Piece::Data(input.to_vec()));
                    return Ok(());
                }
                State::Head(buf) => {
                    let before = buf.len();
                    buf.extend_from_slice(input);
                    let from = before.saturating_sub(3);
                    match find(&buf[from..], b"\r\n\r\n") {
                        Some(at) => {
                            let end = from + at + 4;
                            let used = end - before;
                            let head = buf[..end].to_vec();
                            input = &input[used..];
                            self.state = self.after_head(&head)?;
                            out.push(Piece::Head(head));
                            if matches!(self.state, State::Head(_)) {
                                out.push(Piece::End);
                            }
                        }
                        None if buf.len() > MAX_HEAD => {
                            return Err(format!("a head over {MAX_HEAD} bytes"))
                        }
                        None => return Ok(()),
                    }
                }
                State::Body(body) => {
                    let (used, done) = body.take(input, out)?;
                    input = &input[used..];
                    if done {
                        self.state = State::Head(Vec::new());
                        out.push(Piece::End);
                    }
                }
            }
        }
        Ok(())
    }

    /// The state after `head`: its body's, or the next head's.
    fn after_head(&mut self, bytes: &[u8]) -> Result<State, String> {
        let head = Head::parse(bytes)?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        match self.side {
            Side::Request => {
                // `METHOD SP origin-form SP HTTP/1.1`: a target naming a host (absolute
                // form) could route to another site behind the same front end.
                let mut parts = head.start.split(' ');
                let (method, target, version) = (parts.next(), parts.next(), parts.next());
                let (Some(method), Some(target), Some("HTTP/1.1"), None) =
                    (method, target, version, parts.next())
                else {
                    return Err("a request line other than METHOD /path HTTP/1.1".into());
                };
                let origin_form = target.starts_with('/') || (method == "OPTIONS" && target == "*");
                if !method.bytes().all(is_tchar) || !origin_form {
                    return Err("a request line other than METHOD /path HTTP/1.1".into());
                }
                if pending.len() >= MAX_PENDING {
                    return Err(format!("over {MAX_PENDING} requests waiting for answers"));
                }
                if head.get("upgrade").is_some() {
                    // Raw from here if the answer is 101; any other answer ends it.
                    pending.push_back(format!("{UPGRADE}{method}"));
                    return Ok(State::Raw);
                }
                pending.push_back(method.to_string());
                Ok(head.body()?.map_or(State::Head(Vec::new()), State::Body))
            }
            Side::Response => {
                let mut parts = head.start.splitn(3, ' ');
                let version = parts.next().unwrap_or_default();
                let code: u16 = (parts.next())
                    .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|c| c.parse().ok())
                    .ok_or_else(|| "a status line without a status".to_string())?;
                if version != "HTTP/1.1" && version != "HTTP/1.0" {
                    return Err("a status line of another protocol".into());
                }
                if code == 101 {
                    return match pending.front() {
                        Some(m) if m.starts_with(UPGRADE) => Ok(State::Raw),
                        _ => Err("a switch of protocols nobody asked for".into()),
                    };
                }
                if (100..200).contains(&code) {
                    return Ok(State::Head(Vec::new()));
                }
                let method = pending.pop_front().unwrap_or_default();
                if method.starts_with(UPGRADE) {
                    return Err("an upgrade asked for and refused: the connection ends".into());
                }
                if method == "HEAD" || code == 204 || code == 304 {
                    return Ok(State::Head(Vec::new()));
                }
                Ok(State::Body(head.body()?.unwrap_or(Body::UntilClose)))
            }
        }
    }
}

/// Marks a request that asked for an upgrade, in the queue of requests waiting.
const UPGRADE: &str = "\u{0}upgrade ";

impl Body {
    /// How much of `input` is this body's, and whether it ended there; its pieces go to
    /// `out` (payload as data, chunk framing as frame).
    fn take(&mut self, input: &[u8], out: &mut Vec<Piece>) -> Result<(usize, bool), String> {
        match self {
            Body::UntilClose => {
                out.push(Piece::Data(input.to_vec()));
                Ok((input.len(), false))
            }
            Body::Length(left) => {
                let n = (*left).min(input.len() as u64);
                *left -= n;
                out.push(Piece::Data(input[..n as usize].to_vec()));
                Ok((n as usize, *left == 0))
            }
            Body::Chunked(chunk) => {
                let mut i = 0;
                while i < input.len() {
                    let (used, piece, ended) = chunk.step(&input[i..])?;
                    match piece {
                        Some(ChunkPiece::Payload) => {
                            out.push(Piece::Data(input[i..i + used].to_vec()))
                        }
                        Some(ChunkPiece::Frame(f)) => out.push(Piece::Frame(f)),
                        None => {}
                    }
                    i += used;
                    if ended {
                        return Ok((i, true));
                    }
                }
                Ok((i, false))
            }
        }
    }
}

/// What a step through a chunked body gives: payload (the bytes read), or framing, rebuilt
/// (a chunk-size line without its extensions, the CRLF after a chunk, the end without its
/// trailers: nothing of the sender's choosing passes in it).
enum ChunkPiece {
    Payload,
    Frame(Vec<u8>),
}

impl Chunk {
    /// Reads from the start of `input`: how many bytes, what they give, whether the body
    /// ended with them.
    fn step(&mut self, input: &[u8]) -> Result<(usize, Option<ChunkPiece>, bool), String> {
        match self {
            Chunk::Size(line) => {
                let mut used = 0;
                for &b in input {
                    line.push(b);
                    used += 1;
                    if line.ends_with(b"\r\n") {
                        let text = String::from_utf8_lossy(&line[..line.len() - 2]).to_string();
                        let hex = text.split(';').next().unwrap_or_default();
                        if hex.is_empty()
                            || hex.len() > 15
                            || !hex.bytes().all(|b| b.is_ascii_hexdigit())
                        {
                            return Err("a chunk size that is not hex".into());
                        }
                        let size = u64::from_str_radix(hex, 16)
                            .map_err(|_| "a chunk size that is not hex".to_string())?;
                        *self = if size == 0 {
                            Chunk::Trailer(Vec::new())
                        } else {
                            Chunk::Data(size)
                        };
                        let frame = format!("{size:x}\r\n").into_bytes();
                        return Ok((used, Some(ChunkPiece::Frame(frame)), false));
                    }
                    if line.len() > 1024 {
                        return Err("a chunk-size line over 1 KiB".into());
                    }
                }
                Ok((used, None, false))
            }
            Chunk::Data(left) => {
                let n = (*left).min(input.len() as u64);
                *left -= n;
                if *left == 0 {
                    *self = Chunk::DataEnd(2);
                }
                Ok((n as usize, Some(ChunkPiece::Payload), false))
            }
            Chunk::DataEnd(left) => {
                let want: &[u8] = if *left == 2 { b"\r\n" } else { b"\n" };
                let n = (*left as usize).min(input.len());
                if input[..n] != want[..n] {
                    return Err("a chunk that does not end in CRLF".into());
                }
                *left -= n as u8;
                if *left > 0 {
                    return Ok((n, None, false));
                }
                *self = Chunk::Size(Vec::new());
                Ok((n, Some(ChunkPiece::Frame(b"\r\n".to_vec())), false))
            }
            Chunk::Trailer(line) => {
                let mut used = 0;
                for &b in input {
                    line.push(b);
                    used += 1;
                    if line.ends_with(b"\r\n") {
                        if line.len() == 2 {
                            return Ok((used, Some(ChunkPiece::Frame(b"\r\n".to_vec())), true));
                        }
                        line.clear();
                    } else if line.len() > MAX_HEAD {
                        return Err("a trailer over 64 KiB".into());
                    }
                }
                Ok((used, None, false))
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(side: Side, pending: &Pending, chunks: &[&[u8]]) -> Vec<Piece> {
        let mut f = Framer::new(side, pending.clone());
        let mut out = Vec::new();
        for c in chunks {
            f.feed(c, &mut out).unwrap();
        }
        out
    }

    fn heads(p: &[Piece]) -> usize {
        p.iter().filter(|p| matches!(p, Piece::Head(_))).count()
    }

    #[test]
    fn pipelined_requests_with_lengths_and_chunks_are_read_message_by_message() {
        let pending = Pending::default();
        let stream: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: x\r\n\r\nPOST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nHEAD /d HTTP/1.1\r\nHost: x\r\n\r\n";
        for cut in 0..stream.len() {
            pending.lock().unwrap().clear();
            let p = pieces(Side::Request, &pending, &[&stream[..cut], &stream[cut..]]);
            assert_eq!(heads(&p), 4, "cut {cut}");
            let joined: Vec<u8> = p
                .iter()
                .flat_map(|p| match p {
                    Piece::Head(b) | Piece::Data(b) | Piece::Frame(b) => b.clone(),
                    Piece::End => Vec::new(),
                })
                .collect();
            assert_eq!(joined, stream);
        }
        assert_eq!(
            pending.lock().unwrap().iter().collect::<Vec<_>>(),
            ["POST", "GET", "POST", "HEAD"]
        );
    }

    #[test]
    fn a_responses_body_follows_its_requests_method_and_status() {
        let pending: Pending = Arc::new(Mutex::new(
            [
                "HEAD".to_string(),
                "GET".to_string(),
                format!("{UPGRADE}GET"),
            ]
            .into(),
        ));
        let stream: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 101 Switching\r\nUpgrade: websocket\r\n\r\nframes";
        let p = pieces(Side::Response, &pending, &[stream]);
        assert_eq!(heads(&p), 4);
        assert_eq!(p.last(), Some(&Piece::Data(b"frames".to_vec())));
        // A switch nobody asked for, or an upgrade answered otherwise, ends the connection.
        for (asked, answer) in [
            ("GET", &b"HTTP/1.1 101 Switching\r\n\r\n"[..]),
            (
                &*format!("{UPGRADE}GET"),
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            ),
        ] {
            let pending: Pending = Arc::new(Mutex::new([asked.to_string()].into()));
            let mut f = Framer::new(Side::Response, pending);
            assert!(f.feed(answer, &mut Vec::new()).is_err(), "{asked:?}");
        }
    }

    #[test]
    fn heads_an_origin_could_read_otherwise_are_refused() {
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\nY: 2\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET https://evil.test/ HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
            b"\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\n{\"model\": 1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
        ] {
            let mut f = Framer::new(Side::Request, Pending::default());
            assert!(
                f.feed(bad, &mut Vec::new()).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // Chunk extensions and trailers never pass: the framing is rebuilt.
        let mut f = Framer::new(
            Side::Response,
            Arc::new(Mutex::new(["GET".to_string()].into())),
        );
        let mut p = Vec::new();
        f.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;ext=SECRET\r\nok\r\n0\r\nX-Trailer: SECRET\r\n\r\n", &mut p).unwrap();
        let frames: Vec<u8> = p
            .iter()
            .flat_map(|p| match p {
                Piece::Frame(b) => b.clone(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(frames, b"2\r\n\r\n0\r\n\r\n");
    }

    #[test]
    fn ambiguous_or_oversized_framing_ends_the_connection() {
        for bad in [
            &b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ] {
            let mut f = Framer::new(Side::Request, Pending::default());
            assert!(
                f.feed(bad, &mut Vec::new()).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut f = Framer::new(Side::Request, Pending::default());
        assert!(f.feed(&vec![b'a'; MAX_HEAD + 10], &mut Vec::new()).is_err());
    }
}
