//! A hosted session's commands (`POST /v1/sandboxes/{id}/exec`): the request, and the framed
//! stream that answers it. The answer streams the command's output as it is written, byte for
//! byte, then its end; the host keeps no copy (a client that reads slowly slows the command
//! down, as a full pipe would).
//!
//! A frame is one kind byte, a big-endian `u32` length and that many bytes: [`STDOUT`] and
//! [`STDERR`] carry output, [`EXIT`] the command's [`smithers_runtime::ExecExit`] (JSON, the
//! last frame), [`FAILED`] an error report (JSON, the last frame) when the command could not
//! run. A stream that ends without one of those two was cut.

use serde::{Deserialize, Serialize};

/// Frame kinds.
pub const STDOUT: u8 = b'o';
pub const STDERR: u8 = b'e';
pub const EXIT: u8 = b'x';
pub const FAILED: u8 = b'f';

/// The largest frame a host sends (output is cut into frames of at most this).
pub const MAX_FRAME: usize = 1 << 20;

/// The most stdin one command may carry (as upstream Smithers bounds a session's stdin).
pub const MAX_STDIN_BYTES: usize = 16 << 20;

/// `POST …/exec`'s body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecBody {
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The command's stdin (base64), at most [`MAX_STDIN_BYTES`] decoded; none: `/dev/null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
}

/// `POST …/restore`'s body, and `POST …/checkpoint`'s answer: a checkpoint of the session,
/// named by the host (`cp-1`, `cp-2`, … in the order made; the layers behind a name never
/// leave the host).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointBody {
    pub checkpoint: String,
    /// In an answer: how long the session's processes were held still, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_us: Option<u64>,
}

/// `POST …/fork`'s body: the checkpoint the fork starts from (none: one made now).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

/// `POST …/fork`'s answer: the new live session, and the parent's checkpoint it started from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Forked {
    pub sandbox: crate::wire::SandboxInfo,
    pub checkpoint: String,
}

/// One frame's bytes.
pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads frames out of a byte stream as it arrives.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// Adds bytes received.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived; `Err` for a frame no host sends (an unknown
    /// kind, or longer than [`MAX_FRAME`]).
    pub fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, String> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let kind = self.buf[0];
        if ![STDOUT, STDERR, EXIT, FAILED].contains(&kind) {
            return Err(format!("unknown frame kind {kind:#x}"));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_FRAME {
            return Err(format!("a frame of {len} bytes, over {MAX_FRAME}"));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let payload = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        Ok(Some((kind, payload)))
    }

    /// Bytes received that are not a whole frame yet.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_anywhere_come_out_whole_and_in_order() {
        let mut wire = frame(STDOUT, b"a\0\xff");
        wire.extend(frame(STDERR, b""));
        wire.extend(frame(EXIT, b"{}"));
        for cut in 0..wire.len() {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for part in [&wire[..cut], &wire[cut..]] {
                d.push(part);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(
                got,
                vec![
                    (STDOUT, b"a\0\xff".to_vec()),
                    (STDERR, Vec::new()),
                    (EXIT, b"{}".to_vec())
                ]
            );
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn a_frame_no_host_sends_is_refused() {
        let mut d = Decoder::default();
        d.push(&[b'z', 0, 0, 0, 0]);
        assert!(d.next_frame().is_err());
        let mut d = Decoder::default();
        d.push(&[STDOUT, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.next_frame().is_err());
    }
}
