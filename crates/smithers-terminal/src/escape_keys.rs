//! The way out of a step's terminal that the step cannot take away: `~.` typed at the start of
//! a line (as ssh's escape) ends it. A step that turns off its own terminal's signals gets
//! Ctrl-C as a byte it may ignore, and with our terminal in raw mode every other key is its
//! too; without this, only its timeout would end it. `~~` types one `~`; a `~` followed by
//! anything else types both.

/// What the escape is, for a person (`run --help`, the line shown at a step's start).
pub const ESCAPE_HELP: &str = "~. at the start of a line ends it (~~ types a ~)";

/// The escape's state over the keys typed.
#[derive(Debug, Clone)]
pub struct EscapeKeys {
    at_line_start: bool,
    tilde: bool,
}

impl Default for EscapeKeys {
    fn default() -> Self {
        EscapeKeys {
            at_line_start: true,
            tilde: false,
        }
    }
}

impl EscapeKeys {
    /// Feeds keys typed: what the step gets is appended to `out`; `true` once `~.` was typed
    /// (nothing after it is passed on). A `~` at the start of a line is held until the next
    /// key says what it is.
    pub fn feed(&mut self, keys: &[u8], out: &mut Vec<u8>) -> bool {
        for &key in keys {
            if self.tilde {
                self.tilde = false;
                match key {
                    b'.' => return true,
                    b'~' => {
                        out.push(b'~');
                        self.at_line_start = false;
                        continue;
                    }
                    _ => out.push(b'~'),
                }
            } else if self.at_line_start && key == b'~' {
                self.tilde = true;
                continue;
            }
            out.push(key);
            self.at_line_start = matches!(key, b'\r' | b'\n');
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(chunks: &[&[u8]]) -> (Vec<u8>, bool) {
        let mut keys = EscapeKeys::default();
        let mut out = Vec::new();
        for chunk in chunks {
            if keys.feed(chunk, &mut out) {
                return (out, true);
            }
        }
        (out, false)
    }

    #[test]
    fn tilde_dot_at_a_line_start_ends_and_nowhere_else() {
        assert_eq!(typed(&[b"~."]), (vec![], true));
        assert_eq!(typed(&[b"ls\r~.rest"]), (b"ls\r".to_vec(), true));
        assert_eq!(typed(&[b"ls\n", b"~", b"."]), (b"ls\n".to_vec(), true));
        assert_eq!(typed(&[b"a~.b"]), (b"a~.b".to_vec(), false));
    }

    #[test]
    fn a_tilde_that_is_not_the_escape_is_typed_as_it_was() {
        assert_eq!(typed(&[b"~~."]), (b"~.".to_vec(), false));
        assert_eq!(typed(&[b"~a"]), (b"~a".to_vec(), false));
        assert_eq!(typed(&[b"~\r~."]), (b"~\r".to_vec(), true));
        assert_eq!(typed(&[b"\x03"]), (b"\x03".to_vec(), false));
    }
}
