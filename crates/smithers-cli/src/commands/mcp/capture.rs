//! Bytes to and from a client: a command's stream read through a pipe up to a bound (the rest
//! counted and dropped, so the command is never blocked on it), and bytes put in a message as
//! they are: text when they are UTF-8, base64 when not.

use std::io::Read;

use base64::Engine as _;
use serde_json::{json, Map, Value};

/// A stream read up to a bound.
pub struct Captured {
    pub bytes: Vec<u8>,
    /// Every byte the stream carried, kept or not.
    pub total: u64,
}

impl Captured {
    pub fn truncated(&self) -> bool {
        self.total > self.bytes.len() as u64
    }
}

/// Reads `pipe` (a socket pair's end: a pipe of the oldest Rust this builds with) to its end on a thread of its own, keeping the first `limit` bytes.
pub fn spawn_reader(
    mut pipe: std::os::unix::net::UnixStream,
    limit: usize,
) -> std::thread::JoinHandle<Captured> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut total = 0u64;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    let room = limit.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        Captured { bytes: kept, total }
    })
}

/// Reads `pipe` up to `limit` bytes and one more (to know there were more), then closes it:
/// the writer learns its reader is gone. `total` is what was read.
pub fn spawn_bounded_reader(
    pipe: std::os::unix::net::UnixStream,
    limit: usize,
) -> std::thread::JoinHandle<Captured> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let _ = (&pipe).take(limit as u64 + 1).read_to_end(&mut kept);
        let total = kept.len() as u64;
        kept.truncate(limit);
        drop(pipe);
        Captured { bytes: kept, total }
    })
}

/// `name` (text) or `name + "Base64"` in `into`, for `bytes`.
pub fn put_bytes(into: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            into.insert(name.into(), json!(text));
        }
        Err(_) => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
            into.insert(format!("{name}Base64"), json!(encoded));
        }
    }
}

/// Bytes from `text` or `base64` (exactly one of them).
pub fn take_bytes(text: Option<&Value>, base64: Option<&Value>) -> Result<Vec<u8>, String> {
    match (text, base64) {
        (Some(Value::String(t)), None) => Ok(t.as_bytes().to_vec()),
        (None, Some(Value::String(b))) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| format!("contentBase64 is not base64: {e}")),
        _ => Err("give exactly one of content (text) and contentBase64".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_text_when_they_are_utf8_and_base64_when_not() {
        let mut m = Map::new();
        put_bytes(&mut m, "stdout", "héllo\n".as_bytes());
        put_bytes(&mut m, "stderr", b"\xff\x00a");
        assert_eq!(m["stdout"], "héllo\n");
        assert_eq!(m["stderrBase64"], "/wBh");
        assert_eq!(
            take_bytes(None, Some(&json!("/wBh"))).unwrap(),
            b"\xff\x00a"
        );
        assert_eq!(take_bytes(Some(&json!("x")), None).unwrap(), b"x");
        assert!(take_bytes(Some(&json!("x")), Some(&json!("eA=="))).is_err());
        assert!(take_bytes(None, None).is_err());
        assert!(take_bytes(None, Some(&json!("!!"))).is_err());
    }

    #[test]
    fn a_stream_past_its_bound_is_kept_to_it_and_counted_whole() {
        let (r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
        let reader = spawn_reader(r, 10);
        std::io::Write::write_all(&mut w, &[7u8; 100_000]).unwrap();
        drop(w);
        let c = reader.join().unwrap();
        assert_eq!((c.bytes.len(), c.total, c.truncated()), (10, 100_000, true));
    }
}
