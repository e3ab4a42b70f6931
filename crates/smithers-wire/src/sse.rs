//! A minimal server-sent-events parser (the subset the sandbox host emits: `id`, `event`,
//! `data`, comments), fed with arbitrary chunks of the byte stream.

/// One dispatched SSE message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseFrame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// Incremental parser: [`SseParser::push`] bytes, get the complete frames back.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    current: SseFrame,
    has_data: bool,
}

impl SseParser {
    pub fn new() -> Self {
        SseParser::default()
    }

    /// Feeds a chunk; returns every frame completed by it.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseFrame> {
        self.buf.extend_from_slice(chunk);
        let mut frames = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            if line.is_empty() {
                if self.has_data || self.current.event.is_some() {
                    frames.push(std::mem::take(&mut self.current));
                }
                self.current = SseFrame::default();
                self.has_data = false;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_str(), ""),
            };
            match field {
                "id" => self.current.id = Some(value.to_string()),
                "event" => self.current.event = Some(value.to_string()),
                "data" => {
                    if self.has_data {
                        self.current.data.push('\n');
                    }
                    self.current.data.push_str(value);
                    self.has_data = true;
                }
                _ => {}
            }
        }
        frames
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
}
