//! What the sequences a filter let through left set on a person's terminal, and the bytes
//! that set it back when the step ends: a step that turns on mouse or focus reporting, a
//! keyboard protocol, the alternate screen, a line-drawing character set or hidden text and
//! then ends (or is killed) would otherwise leave the person's shell taking those reports as
//! typed input, its keys arriving as escape codes, its text unreadable. Only what was set is
//! undone, so a step that changed nothing leaves the terminal exactly as it was.

/// Private modes whose default is on (autowrap, the cursor shown): reset is what is undone.
const DEFAULT_ON: &[u32] = &[7, 25];
/// Private modes that are actions, not states (save or restore the cursor).
const ACTIONS: &[u32] = &[1048];

#[derive(Debug, Default, Clone)]
pub(crate) struct Left {
    /// Default-off private modes set (`CSI ? n h`), in the order they were set.
    on: Vec<u32>,
    /// Default-on private modes reset.
    off: Vec<u32>,
    insert: bool,
    scroll_region: bool,
    charset: bool,
    keypad: bool,
    /// Keyboard protocol levels pushed (`CSI > flags u`), and flags set on the base level.
    kitty_pushes: u32,
    kitty_flags: bool,
    modify_other_keys: bool,
    attributes: bool,
}

/// A CSI, read: its private marker, numbers (each parameter's first part), intermediates
/// and final byte.
pub(crate) struct Csi<'a> {
    pub(crate) private: Option<u8>,
    pub(crate) numbers: Vec<u32>,
    pub(crate) intermediates: &'a [u8],
    pub(crate) last: u8,
}

/// `body` (a CSI's bytes after `ESC [`) read as a [`Csi`].
pub(crate) fn parse_csi(body: &[u8]) -> Option<Csi<'_>> {
    let (last, rest) = body.split_last()?;
    let private = rest.first().copied().filter(|b| b"?<=>".contains(b));
    let params_end = rest
        .iter()
        .position(|b| (0x20..=0x2f).contains(b))
        .unwrap_or(rest.len());
    let params = &rest[usize::from(private.is_some())..params_end];
    let numbers = (params.split(|b| *b == b';'))
        .filter(|p| !p.is_empty() || !params.is_empty())
        .map(|p| {
            let digits = p.split(|b| *b == b':').next().unwrap_or(&[]);
            std::str::from_utf8(digits)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        })
        .collect();
    Some(Csi {
        private,
        numbers,
        intermediates: &rest[params_end..],
        last: *last,
    })
}

impl Left {
    /// Notes a CSI that passed (`body`: its bytes after `ESC [`).
    pub(crate) fn csi(&mut self, body: &[u8]) {
        let Some(Csi {
            private,
            numbers,
            intermediates,
            last,
        }) = parse_csi(body)
        else {
            return;
        };
        if !intermediates.is_empty() {
            return;
        }
        match (private, last) {
            (Some(b'?'), b'h' | b'l') => {
                for n in numbers.into_iter().filter(|n| !ACTIONS.contains(n)) {
                    let (set, default_on) = (last == b'h', DEFAULT_ON.contains(&n));
                    let list = if default_on {
                        &mut self.off
                    } else {
                        &mut self.on
                    };
                    list.retain(|m| *m != n);
                    if set != default_on {
                        list.push(n);
                    }
                }
            }
            (None, b'h' | b'l') if numbers.contains(&4) => self.insert = last == b'h',
            (None, b'r') => self.scroll_region = numbers.iter().any(|n| *n != 0),
            (None, b'm') => self.attributes = numbers.iter().any(|n| *n != 0),
            (Some(b'>'), b'u') => self.kitty_pushes = self.kitty_pushes.saturating_add(1),
            (Some(b'<'), b'u') => {
                let n = numbers.first().copied().filter(|n| *n > 0).unwrap_or(1);
                self.kitty_pushes = self.kitty_pushes.saturating_sub(n);
            }
            (Some(b'='), b'u') if self.kitty_pushes == 0 => {
                self.kitty_flags = numbers.first().is_some_and(|f| *f != 0);
            }
            (Some(b'>'), b'm') if numbers.first() == Some(&4) => {
                self.modify_other_keys = numbers.get(1).is_some_and(|v| *v != 0);
            }
            _ => {}
        }
    }

    /// Notes an ESC sequence that passed (`seq`: its bytes after `ESC`).
    pub(crate) fn esc(&mut self, seq: &[u8]) {
        match seq {
            [b'='] => self.keypad = true,
            [b'>'] => self.keypad = false,
            [b'(', b'B'] => self.charset = false,
            [b'(' | b')' | b'*' | b'+', _] => self.charset = true,
            _ => {}
        }
    }

    /// The bytes that undo what was left set; empty when nothing was.
    pub(crate) fn restore(&self) -> Vec<u8> {
        let mut out = String::new();
        if self.scroll_region {
            out.push_str("\x1b[r");
        }
        // Most recent first: the alternate screen is left before the main one's state.
        for n in self.on.iter().rev() {
            out.push_str(&format!("\x1b[?{n}l"));
        }
        for n in &self.off {
            out.push_str(&format!("\x1b[?{n}h"));
        }
        if self.insert {
            out.push_str("\x1b[4l");
        }
        if self.keypad {
            out.push_str("\x1b>");
        }
        if self.charset {
            out.push_str("\x1b(B\x1b)B");
        }
        if self.attributes {
            out.push_str("\x1b[0m");
        }
        if self.kitty_pushes > 0 {
            out.push_str(&format!("\x1b[<{}u", self.kitty_pushes));
        }
        if self.kitty_flags {
            out.push_str("\x1b[=0;1u");
        }
        if self.modify_other_keys {
            out.push_str("\x1b[>4m");
        }
        out.into_bytes()
    }
}
