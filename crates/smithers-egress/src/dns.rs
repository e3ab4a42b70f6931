//! The sandbox's resolver, on the wire: a query is parsed within its bounds (one question,
//! no compression in it, 512 bytes over UDP), and answered by us. Nothing is forwarded: an
//! allowed name gets a synthetic address that the capture listeners map back to the name,
//! a denied one NXDOMAIN, so no query a step writes (nor a name it encodes data in) leaves
//! the host.

use std::net::Ipv4Addr;

/// Largest query read (UDP, and each message over TCP).
pub const MAX_QUERY_BYTES: usize = 512;

const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
/// Answers are synthetic and stable for the sandbox's life; a short TTL still keeps a client
/// from caching one across sandboxes that share nothing else.
const TTL_SECS: u32 = 60;

/// One parsed question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// Recursion desired, echoed.
    pub rd: bool,
    /// The name as its labels' bytes joined by `.` (not yet checked as a host name: any byte
    /// may be in a label; [`crate::policy::normalize_name`] decides).
    pub name: Vec<u8>,
    pub qtype: u16,
    pub qclass: u16,
    /// The question's bytes (name, type, class), echoed in the answer.
    question: Vec<u8>,
}

/// Why a message was not a query we answer; `Some(id)` when a FORMERR can still be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    pub id: Option<u16>,
    pub reason: &'static str,
}

fn bad(id: Option<u16>, reason: &'static str) -> Malformed {
    Malformed { id, reason }
}

/// Parses a query: a standard query (opcode 0) with exactly one question.
pub fn parse_query(msg: &[u8]) -> Result<Query, Malformed> {
    if msg.len() < 12 {
        return Err(bad(None, "shorter than a DNS header"));
    }
    if msg.len() > MAX_QUERY_BYTES {
        return Err(bad(None, "longer than 512 bytes"));
    }
    let id = u16::from_be_bytes([msg[0], msg[1]]);
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    if flags & 0x8000 != 0 {
        return Err(bad(None, "a response, not a query"));
    }
    if (flags >> 11) & 0xf != 0 {
        return Err(bad(Some(id), "not a standard query"));
    }
    let qdcount = u16::from_be_bytes([msg[4], msg[5]]);
    if qdcount != 1 {
        return Err(bad(Some(id), "not exactly one question"));
    }
    let mut i = 12;
    let mut name = Vec::new();
    loop {
        let len = *msg.get(i).ok_or(bad(Some(id), "truncated name"))? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return Err(bad(
                Some(id),
                "a label over 63 bytes, or compression in a question",
            ));
        }
        let label = msg
            .get(i..i + len)
            .ok_or(bad(Some(id), "truncated label"))?;
        if !name.is_empty() {
            name.push(b'.');
        }
        name.extend_from_slice(label);
        if name.len() > 253 {
            return Err(bad(Some(id), "a name over 253 bytes"));
        }
        i += len;
    }
    let tail = msg
        .get(i..i + 4)
        .ok_or(bad(Some(id), "truncated question"))?;
    let qtype = u16::from_be_bytes([tail[0], tail[1]]);
    let qclass = u16::from_be_bytes([tail[2], tail[3]]);
    Ok(Query {
        id,
        rd: flags & 0x0100 != 0,
        name,
        qtype,
        qclass,
        question: msg[12..i + 4].to_vec(),
    })
}

/// How we answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// An A record for an `A` question (any other type: no data, NOERROR).
    Address(Ipv4Addr),
    /// NXDOMAIN: the name is not one the sandbox may reach.
    NoSuchName,
}

/// The response to `q`.
pub fn respond(q: &Query, answer: Answer) -> Vec<u8> {
    let (rcode, addr) = match answer {
        Answer::Address(a) if q.qtype == TYPE_A && q.qclass == CLASS_IN => (0u16, Some(a)),
        Answer::Address(_) => (0, None),
        Answer::NoSuchName => (3, None),
    };
    // QR, AA, RA; RD echoed.
    let flags: u16 = 0x8000 | 0x0400 | 0x0080 | if q.rd { 0x0100 } else { 0 } | rcode;
    let mut out = Vec::with_capacity(12 + q.question.len() + 16);
    out.extend_from_slice(&q.id.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::from(addr.is_some()).to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&q.question);
    if let Some(a) = addr {
        // The name by a pointer to the question's (offset 12).
        out.extend_from_slice(&[0xc0, 0x0c]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&TTL_SECS.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&a.octets());
    }
    out
}

/// FORMERR for a malformed query that still had an id.
pub fn format_error(id: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&(0x8000u16 | 0x0080 | 1).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out
}

/// A query for `name` and `qtype`, as a client sends it (for tests and the world's checks).
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&[0; 6]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

/// The rcode and the A addresses of a response (for tests and the world's checks).
pub fn parse_response(msg: &[u8]) -> Option<(u8, Vec<Ipv4Addr>)> {
    if msg.len() < 12 {
        return None;
    }
    let rcode = msg[3] & 0xf;
    let ancount = u16::from_be_bytes([msg[6], msg[7]]);
    let mut i = 12;
    // Skip the question.
    loop {
        let len = *msg.get(i)? as usize;
        if len & 0xc0 == 0xc0 {
            i += 2;
            break;
        }
        i += 1 + len;
        if len == 0 {
            break;
        }
    }
    i += 4;
    let mut addrs = Vec::new();
    for _ in 0..ancount {
        let len = *msg.get(i)? as usize;
        if len & 0xc0 == 0xc0 {
            i += 2;
        } else {
            loop {
                let len = *msg.get(i)? as usize;
                i += 1 + len;
                if len == 0 {
                    break;
                }
            }
        }
        let rtype = u16::from_be_bytes([*msg.get(i)?, *msg.get(i + 1)?]);
        let rdlen = u16::from_be_bytes([*msg.get(i + 8)?, *msg.get(i + 9)?]) as usize;
        let data = msg.get(i + 10..i + 10 + rdlen)?;
        if rtype == TYPE_A && rdlen == 4 {
            addrs.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        i += 10 + rdlen;
    }
    Some((rcode, addrs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip() {
        let q = parse_query(&query(7, "api.example.com", 1)).unwrap();
        assert_eq!(q.name, b"api.example.com");
        assert_eq!((q.id, q.qtype, q.rd), (7, 1, true));
        let a = respond(&q, Answer::Address(Ipv4Addr::new(127, 100, 0, 1)));
        assert_eq!(
            parse_response(&a),
            Some((0, vec![Ipv4Addr::new(127, 100, 0, 1)]))
        );
        assert_eq!(
            parse_response(&respond(&q, Answer::NoSuchName)),
            Some((3, vec![]))
        );
        let aaaa = parse_query(&query(8, "api.example.com", 28)).unwrap();
        let r = respond(&aaaa, Answer::Address(Ipv4Addr::new(127, 100, 0, 1)));
        assert_eq!(parse_response(&r), Some((0, vec![])));
    }

    #[test]
    fn hostile_queries_are_refused_within_bounds() {
        assert!(parse_query(&[0; 5]).is_err());
        assert!(parse_query(&vec![0; 600]).is_err());
        let mut compressed = query(1, "a.example.com", 1);
        compressed[12] = 0xc0;
        assert_eq!(parse_query(&compressed).unwrap_err().id, Some(1));
        let mut two = query(1, "a.example.com", 1);
        two[5] = 2;
        assert!(parse_query(&two).is_err());
        let mut truncated = query(1, "a.example.com", 1);
        truncated.truncate(20);
        assert!(parse_query(&truncated).is_err());
        let long = format!("{}.example.com", vec!["a".repeat(60); 5].join("."));
        assert!(parse_query(&query(1, &long, 1)).is_err());
        assert_eq!(format_error(9)[3] & 0xf, 1);
    }
}
