//! Swapping byte strings for others of the same length in a stream, whatever the chunks.
//!
//! Each `push` returns everything it can say for certain: it holds back only a tail that
//! could still become a match (a proper prefix of a pattern), so a stream that pauses is never
//! held longer than that, and a pattern split across chunks is still found. Every swap keeps
//! the length, so the framing of what passes (lengths, chunk sizes) stays true.

/// A streaming replacer.
#[derive(Debug, Clone)]
pub struct Replacer {
    /// `(from, to)`, each pair of one length; longest first, so the longest match wins.
    patterns: Vec<(Vec<u8>, Vec<u8>)>,
    /// A value whose beginning is replaced too, once at least `.2` bytes of it match (an echo
    /// that truncates it): `(value, its replacement, the least)`.
    beginnings: Vec<(Vec<u8>, Vec<u8>, usize)>,
    /// Whether a byte can begin a match.
    starts: [bool; 256],
    tail: Vec<u8>,
    /// How many swaps were made.
    pub swaps: u64,
}

impl Replacer {
    pub fn new(mut patterns: Vec<(Vec<u8>, Vec<u8>)>) -> Replacer {
        patterns.retain(|(f, t)| !f.is_empty() && f.len() == t.len());
        patterns.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
        let mut starts = [false; 256];
        for (f, _) in &patterns {
            starts[f[0] as usize] = true;
        }
        Replacer {
            patterns,
            beginnings: Vec::new(),
            starts,
            tail: Vec::new(),
            swaps: 0,
        }
    }

    /// Also replaces any run of `value`'s first `least` or more bytes by as many of `to`'s.
    pub fn with_beginning(mut self, value: &[u8], to: &[u8], least: usize) -> Replacer {
        if value.len() == to.len() && least > 0 && least <= value.len() {
            self.starts[value[0] as usize] = true;
            self.beginnings.push((value.to_vec(), to.to_vec(), least));
        }
        self
    }

    /// Replaces in `input` (after what was held), appending what is certain to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut buf = std::mem::take(&mut self.tail);
        buf.extend_from_slice(input);
        let mut i = 0;
        while i < buf.len() {
            let b = buf[i];
            if !self.starts[b as usize] {
                out.push(b);
                i += 1;
                continue;
            }
            let rest = &buf[i..];
            if let Some((f, t)) = self.patterns.iter().find(|(f, _)| rest.starts_with(f)) {
                out.extend_from_slice(t);
                i += f.len();
                self.swaps += 1;
                continue;
            }
            let mut held = false;
            let mut matched = None;
            for (value, to, least) in &self.beginnings {
                let n = common_prefix(rest, value);
                if n == rest.len() && n < value.len() {
                    held = true;
                } else if n >= *least
                    && matched
                        .as_ref()
                        .is_none_or(|(m, _): &(usize, &Vec<u8>)| n > *m)
                {
                    matched = Some((n, to));
                }
            }
            if let Some((n, to)) = matched {
                out.extend_from_slice(&to[..n]);
                i += n;
                self.swaps += 1;
                continue;
            }
            if held {
                // It may go on: held.
                self.tail = rest.to_vec();
                return;
            }
            if (self.patterns.iter()).any(|(f, _)| f.len() > rest.len() && f.starts_with(rest)) {
                self.tail = rest.to_vec();
                return;
            }
            out.push(b);
            i += 1;
        }
    }

    /// The end of the stream: what was held goes out, replaced by the same length of the
    /// replacement it began when `mask` (it may be the cut-off start of a secret), else as is.
    pub fn finish(&mut self, mask: bool, out: &mut Vec<u8>) {
        let tail = std::mem::take(&mut self.tail);
        if tail.is_empty() {
            return;
        }
        let from_pattern = (self.patterns.iter())
            .find(|(f, _)| f.starts_with(&tail))
            .map(|(_, t)| t.as_slice());
        let from_beginning = (self.beginnings.iter())
            .find(|(v, _, _)| v.starts_with(&tail))
            .map(|(_, t, _)| t.as_slice());
        match from_pattern.or(from_beginning) {
            Some(t) if mask => {
                out.extend_from_slice(&t[..tail.len()]);
                self.swaps += 1;
            }
            _ => out.extend_from_slice(&tail),
        }
    }

    /// Whether nothing is held.
    pub fn is_clear(&self) -> bool {
        self.tail.is_empty()
    }
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(r: &mut Replacer, chunks: &[&[u8]], mask: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            r.push(c, &mut out);
        }
        r.finish(mask, &mut out);
        out
    }

    #[test]
    fn a_pattern_is_swapped_in_any_chunking_and_nothing_else_moves() {
        let text = b"head SECRETVALUE1234 mid SECRETVALUE1234 end SECRETVAL";
        for cut in 0..text.len() {
            let mut r = Replacer::new(vec![(
                b"SECRETVALUE1234".to_vec(),
                b"PLACEHOLDER9876".to_vec(),
            )]);
            let out = run(&mut r, &[&text[..cut], &text[cut..]], false);
            assert_eq!(
                out,
                b"head PLACEHOLDER9876 mid PLACEHOLDER9876 end SECRETVAL".to_vec(),
                "cut at {cut}"
            );
            assert_eq!(r.swaps, 2);
        }
    }

    #[test]
    fn only_a_possible_start_is_held() {
        let mut r = Replacer::new(vec![(
            b"SECRETVALUE1234".to_vec(),
            b"PLACEHOLDER9876".to_vec(),
        )]);
        let mut out = Vec::new();
        r.push(b"data: {\"x\": 1}\n\nSEC", &mut out);
        assert_eq!(out, b"data: {\"x\": 1}\n\n");
        r.push(b"OND", &mut out);
        assert_eq!(out, b"data: {\"x\": 1}\n\nSECOND");
        assert!(r.is_clear());
    }

    #[test]
    fn a_cut_off_or_truncated_value_is_masked() {
        let value = b"sk-test-AbCdEfGhIjKlMnOp";
        let to = b"sk-test-ZyXwVuTsRqPoNmLk";
        let mut r =
            Replacer::new(vec![(value.to_vec(), to.to_vec())]).with_beginning(value, to, 8 + 8);
        let out = run(
            &mut r,
            &[b"key was sk-test-AbCdEfGhIj... (truncated)"],
            true,
        );
        assert_eq!(out, b"key was sk-test-ZyXwVuTsRq... (truncated)".to_vec());
        let mut r =
            Replacer::new(vec![(value.to_vec(), to.to_vec())]).with_beginning(value, to, 16);
        let out = run(&mut r, &[b"ends with sk-test-AbCd"], true);
        assert_eq!(out, b"ends with sk-test-ZyXw".to_vec());
        // Too short a run of it is left (it is the public prefix).
        let mut r =
            Replacer::new(vec![(value.to_vec(), to.to_vec())]).with_beginning(value, to, 16);
        let out = run(&mut r, &[b"sk-test-A and more"], true);
        assert_eq!(out, b"sk-test-A and more".to_vec());
    }
}
