//! Swapping byte strings for others of the same length in a stream, whatever the chunks.
//!
//! Each `push` returns everything it can say for certain: it holds back only a tail that
//! could still become a match (a proper prefix of a pattern), so a stream that pauses is never
//! held longer than that, and a pattern split across chunks is still found. Every swap keeps
//! the length, so the framing of what passes (lengths, chunk sizes) stays true.
//!
//! A [`Replacer::steady`] one holds a tail of one length whatever it holds (the longest
//! pattern's, less one): what it gives back, and when, then depends on the bytes' count, not
//! on whether they begin a secret. Holding only a possible beginning would let a sender that
//! controls what is echoed (a prompt a model streams back) learn, from which guesses stall,
//! a secret one character at a time.

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
    /// Whether two bytes can begin a match (a bit per pair): most bytes that could begin
    /// one are ruled out by the next without comparing any pattern.
    pairs: Box<[u64; 1024]>,
    tail: Vec<u8>,
    /// Hold a tail of one length (see the module's docs).
    steady: bool,
    /// How many swaps were made.
    pub swaps: u64,
}

impl Replacer {
    pub fn new(mut patterns: Vec<(Vec<u8>, Vec<u8>)>) -> Replacer {
        patterns.retain(|(f, t)| !f.is_empty() && f.len() == t.len());
        patterns.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
        let mut r = Replacer {
            patterns: Vec::new(),
            beginnings: Vec::new(),
            starts: [false; 256],
            pairs: Box::new([0; 1024]),
            tail: Vec::new(),
            steady: false,
            swaps: 0,
        };
        for (f, _) in &patterns {
            r.may_begin_with(&f[..f.len().min(2)]);
        }
        r.patterns = patterns;
        r
    }

    /// Notes that a match may begin with `begin` (one byte: with it and any other).
    fn may_begin_with(&mut self, begin: &[u8]) {
        let Some(&first) = begin.first() else {
            return;
        };
        self.starts[first as usize] = true;
        let seconds = match begin.get(1) {
            Some(&b) => b..=b,
            None => 0..=255,
        };
        for second in seconds {
            let k = pair(first, second);
            self.pairs[k >> 6] |= 1 << (k & 63);
        }
    }

    /// Whether a match may begin at `buf[i]`: by its byte and the next (when there is one).
    fn may_begin(&self, buf: &[u8], i: usize) -> bool {
        let first = buf[i];
        if !self.starts[first as usize] {
            return false;
        }
        buf.get(i + 1).is_none_or(|&second| {
            let k = pair(first, second);
            self.pairs[k >> 6] & (1 << (k & 63)) != 0
        })
    }

    /// Holds a tail of one length whatever it holds (see the module's docs).
    pub fn steady(mut self) -> Replacer {
        self.steady = true;
        self
    }

    /// The longest byte string a match may take.
    fn longest(&self) -> usize {
        let p = self.patterns.first().map_or(0, |(f, _)| f.len());
        let b = self
            .beginnings
            .iter()
            .map(|(v, _, _)| v.len())
            .max()
            .unwrap_or(0);
        p.max(b)
    }

    /// Also replaces any run of `value`'s first `least` or more bytes by as many of `to`'s.
    pub fn with_beginning(mut self, value: &[u8], to: &[u8], least: usize) -> Replacer {
        if value.len() == to.len() && least > 0 && least <= value.len() {
            self.may_begin_with(&value[..least.min(2)]);
            self.beginnings.push((value.to_vec(), to.to_vec(), least));
        }
        self
    }

    /// Replaces in `input` (after what was held), appending what is certain to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        self.scan(input, self.steady, out);
    }

    /// [`Replacer::push`]'s work; `steady` holds a tail of one length, else only a possible
    /// beginning.
    fn scan(&mut self, input: &[u8], steady: bool, out: &mut Vec<u8>) {
        let mut buf = std::mem::take(&mut self.tail);
        buf.extend_from_slice(input);
        // Steady: only where every match is decided (at least the longest ahead).
        let limit = if steady {
            buf.len().saturating_sub(self.longest().saturating_sub(1))
        } else {
            buf.len()
        };
        let mut i = 0;
        while i < limit {
            // A run of bytes none of which can begin a match goes out whole.
            let run = (i..limit)
                .position(|j| self.may_begin(&buf, j))
                .unwrap_or(limit - i);
            if run > 0 {
                out.extend_from_slice(&buf[i..i + run]);
                i += run;
                continue;
            }
            let b = buf[i];
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
        self.tail = buf[i..].to_vec();
    }

    /// The end of a stream or a message: what was held goes out as it is, unless `mask` and
    /// it is a run of a value's beginning at least its bound long (a cut-off echo of it):
    /// then as that much of the replacement. A shorter held tail is never told apart from a
    /// miss, or a guessed beginning would be confirmed one character at a time.
    pub fn finish(&mut self, mask: bool, out: &mut Vec<u8>) {
        // What was held for its length is read now, holding only real beginnings.
        self.scan(&[], false, out);
        let tail = std::mem::take(&mut self.tail);
        if tail.is_empty() {
            return;
        }
        let cut_off = (self.beginnings.iter())
            .find(|(v, _, least)| tail.len() >= *least && v.starts_with(&tail))
            .map(|(_, t, _)| t.as_slice());
        match cut_off {
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

/// The bit of two bytes in [`Replacer::pairs`].
fn pair(first: u8, second: u8) -> usize {
    (usize::from(first) << 8) | usize::from(second)
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
    fn the_pair_filter_misses_no_match_of_one_byte_or_two() {
        // Patterns of one and two bytes, a beginning bound of one, next to look-alikes.
        let text = b"xaxbcxbdxqwerty-qwXq";
        for cut in 0..text.len() {
            let mut r = Replacer::new(vec![
                (b"a".to_vec(), b"A".to_vec()),
                (b"bc".to_vec(), b"BC".to_vec()),
            ])
            .with_beginning(b"qwerty", b"QWERTY", 1);
            let out = run(&mut r, &[&text[..cut], &text[cut..]], true);
            assert_eq!(out, b"xAxBCxbdxQWERTY-QWXQ".to_vec(), "cut at {cut}");
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
        // Held, but shorter than the bound: out as it is (never told apart from a miss).
        let out = run(&mut r, &[b"ends with sk-test-AbCd"], true);
        assert_eq!(out, b"ends with sk-test-AbCd".to_vec());
        // Too short a run of it is left (it is the public prefix).
        let mut r =
            Replacer::new(vec![(value.to_vec(), to.to_vec())]).with_beginning(value, to, 16);
        let out = run(&mut r, &[b"sk-test-A and more"], true);
        assert_eq!(out, b"sk-test-A and more".to_vec());
    }

    /// Steady: how much comes back, and when, does not depend on whether the bytes begin the
    /// secret (a right guess and a wrong one come back alike).
    #[test]
    fn a_steady_replacer_gives_back_by_count_not_by_content() {
        let value = b"sk-test-AbCdEfGhIjKlMnOp";
        let to = b"sk-test-ZyXwVuTsRqPoNmLk";
        let make = || {
            Replacer::new(vec![(value.to_vec(), to.to_vec())])
                .with_beginning(value, to, 16)
                .steady()
        };
        for guess in [
            &b"data: sk-test-A"[..],
            b"data: sk-test-Q",
            b"data: zzzzzzzzz",
        ] {
            let mut r = make();
            let mut out = Vec::new();
            r.push(guess, &mut out);
            r.push(b" and then some more bytes to come", &mut out);
            assert_eq!(out.len(), guess.len() + 33 - (value.len() - 1), "{guess:?}");
        }
        // Whole, it still swaps.
        let mut r = make();
        let out = run(&mut r, &[b"x sk-test-AbCdEfG", b"hIjKlMnOp y"], true);
        assert_eq!(out, b"x sk-test-ZyXwVuTsRqPoNmLk y".to_vec());
    }
}
