//! A minimal server-sent-events parser (the subset the sandbox host emits: `id`, `event`,
//! `data`, comments), fed with arbitrary chunks of the byte stream.

/// One dispatched SSE message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseFrame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// Longest line (and longest `data` of one frame) the parser holds: a longer one is dropped,
/// with the frame it belongs to, so a host that never ends a line cannot grow the buffer.
/// Far above any event the host sends (an output event is at most a few hundred KiB, a
/// completed one carries a result of at most 5 MiB, escaped).
pub const MAX_SSE_LINE_BYTES: usize = 64 << 20;

/// Incremental parser: [`SseParser::push`] bytes, get the complete frames back.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// How much of `buf` is known to hold no newline.
    scanned: usize,
    /// The line being read was too long: dropped up to its end, and its frame with it.
    skipping: bool,
    frame_dropped: bool,
    current: SseFrame,
    has_data: bool,
    dropped: u64,
}

impl SseParser {
    pub fn new() -> Self {
        SseParser::default()
    }

    /// Frames dropped for a line over [`MAX_SSE_LINE_BYTES`].
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Feeds a chunk; returns every frame completed by it. Linear in the bytes fed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseFrame> {
        self.buf.extend_from_slice(chunk);
        let mut frames = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start + self.scanned..]
            .iter()
            .position(|&b| b == b'\n')
        {
            let end = start + self.scanned + pos;
            self.scanned = 0;
            let mut line = &self.buf[start..end];
            start = end + 1;
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            if let Some(frame) = self.take_line(&line) {
                frames.push(frame);
            }
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        if self.buf.len() > MAX_SSE_LINE_BYTES {
            self.buf.clear();
            self.scanned = 0;
            self.skipping = true;
            self.frame_dropped = true;
        }
        frames
    }

    /// One line of the stream; the frame it completes, if any.
    fn take_line(&mut self, line: &str) -> Option<SseFrame> {
        if line.is_empty() {
            let done = (self.has_data || self.current.event.is_some()) && !self.frame_dropped;
            if self.frame_dropped {
                self.dropped += 1;
            }
            let frame = std::mem::take(&mut self.current);
            self.has_data = false;
            self.frame_dropped = false;
            return done.then_some(frame);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "id" => self.current.id = Some(value.to_string()),
            "event" => self.current.event = Some(value.to_string()),
            "data" => {
                if self.current.data.len() + value.len() > MAX_SSE_LINE_BYTES {
                    self.frame_dropped = true;
                    self.current.data.clear();
                    return None;
                }
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_chunks() {
        let mut p = SseParser::new();
        assert!(p.push(b": keepalive\n\nid: 0\nevent: st").is_empty());
        let frames = p.push(b"dout\ndata: {\"a\":1}\n\nid: 1\ndata: x\ndata: y\n\n");
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].id.as_deref(), Some("0"));
        assert_eq!(frames[0].event.as_deref(), Some("stdout"));
        assert_eq!(frames[0].data, "{\"a\":1}");
        assert_eq!(frames[1].data, "x\ny");
    }

    #[test]
    fn a_line_fed_byte_by_byte_and_many_lines_at_once() {
        let mut p = SseParser::new();
        let text = "id: 3\nevent: output\ndata: hello\n\n".repeat(1000);
        let mut frames = Vec::new();
        for b in text.as_bytes() {
            frames.extend(p.push(&[*b]));
        }
        assert_eq!(frames.len(), 1000);
        assert_eq!(p.push(text.as_bytes()).len(), 1000);
        assert!(frames.iter().all(|f| f.data == "hello"));
    }

    #[test]
    fn an_endless_line_is_dropped_with_its_frame() {
        let mut p = SseParser::new();
        assert!(p.push(b"id: 0\ndata: ").is_empty());
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..(MAX_SSE_LINE_BYTES >> 20) + 1 {
            assert!(p.push(&chunk).is_empty());
        }
        assert!(p.buf.len() <= MAX_SSE_LINE_BYTES);
        let frames = p.push(b"xx\n\nid: 1\ndata: ok\n\n");
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0].id.as_deref(), Some("1"));
        assert_eq!(p.dropped(), 1);
    }
}
