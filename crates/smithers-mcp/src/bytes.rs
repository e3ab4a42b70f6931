//! Bytes to and from a client, exactly: text when they are UTF-8, base64 when not, never
//! re-encoded lossily; and a stream kept up to a bound.

use base64::Engine as _;
use serde_json::{json, Map, Value};

/// A stream read up to a bound: the bytes kept and how many it carried in all.
#[derive(Debug, Default)]
pub struct Captured {
    pub bytes: Vec<u8>,
    /// Every byte the stream carried, kept or not.
    pub total: u64,
}

impl Captured {
    pub fn truncated(&self) -> bool {
        self.total > self.bytes.len() as u64
    }

    /// Counts `bytes` and keeps what fits under `limit`.
    pub fn take(&mut self, bytes: &[u8], limit: usize) {
        self.total += bytes.len() as u64;
        let room = limit.saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
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
            .map_err(|e| format!("the base64 content is not base64: {e}")),
        _ => Err("give exactly one of the text and the base64 form".into()),
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
        let mut c = Captured::default();
        for _ in 0..10 {
            c.take(&[7u8; 10_000], 10);
        }
        assert_eq!((c.bytes.len(), c.total, c.truncated()), (10, 100_000, true));
    }
}
