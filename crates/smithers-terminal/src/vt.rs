//! The filter between a step's terminal and a person's (`run -t`): a full-screen program's
//! output passes, whatever could act on the person's terminal or machine does not.
//!
//! A program on a terminal needs escape sequences: [`escape`](crate::escape) would make
//! `vim` unusable. But a terminal also obeys sequences that reach past the screen: OSC 52
//! writes the clipboard (the next paste runs the step's command in the person's shell), title
//! and font reports, DECRQSS and `ENQ` make the terminal *answer* with text the step chose,
//! typed into whatever reads the terminal next, and device control strings drive the
//! terminal's own features. So the filter parses the stream (ECMA-48's grammar, as a VT500
//! parser does), and re-emits only what it fully read and allows; everything else is dropped
//! and counted by [`Blocked`] kind, never shown as text.
//!
//! | passes | dropped |
//! |---|---|
//! | printable UTF-8; BEL, BS, HT, LF, VT, FF, CR | other C0 (ENQ, SO/SI, ...); C1 controls (U+0080–U+009F); invalid UTF-8 (shown as U+FFFD) |
//! | CSI cursor movement and position, erase and insert/delete, scroll regions and scrolling, SGR colours and attributes, tab stops, save/restore cursor, cursor style | CSI window operations and reports (`t`), DECRQM and every `$` sequence, XTVERSION, media copy, any CSI not listed, any over 64 bytes |
//! | DEC private modes: cursor keys, origin, autowrap, blink, cursor shown, the alternate screen (47, 1047–1049), mouse reporting (1000, 1002–1007, 1015, 1016; not 1001, highlight tracking, which waits for the program's answer), focus events, bracketed paste (2004), synchronized output (2026); erase in display and line, selective (`CSI ? J`, `CSI ? K`); insert and newline modes (4, 20); REP, ECH; the soft reset (`CSI ! p`) | any other private mode; any colon in a parameter but SGR's |
//! | the cursor position and status reports (`CSI 6n`, `CSI ? 6n`, `CSI 5n`) and the device attributes (`CSI c`, `CSI > c`), whose answers are fixed by the terminal, not by the step; the kitty keyboard protocol (`CSI > u`, `CSI < u`, `CSI = u`, `CSI ? u`) and modifyOtherKeys (`CSI > 4 ; n m`) — without `-i` (the step gets no keys) every request for an answer and the mouse and focus modes are dropped too, or the answers would be typed into the person's shell | `ESC Z` (DECID), `CSI = c` (its unit id) |
//! | ESC 7/8, ESC =/>, ESC D/E/H/M, character set designations (`ESC ( B`, ...) | every other ESC sequence, RIS (`ESC c`) included |
//! | — | every OSC (title, clipboard, font, colours, hyperlinks, notifications), DCS (DECRQSS, sixel, tmux passthrough), SOS, PM, APC: read to their end, never shown |
//!
//! When the step ends, [`VtFilter::restore`] gives the bytes that set back whatever the
//! sequences it let through left set (see `left.rs`): modes, the alternate screen, keyboard
//! protocols, character sets, attributes, the scroll region.

use std::collections::BTreeMap;

use crate::left::{parse_csi, Csi, Left};

/// Why a sequence was kept from the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Blocked {
    /// OSC 52: the clipboard, written or read.
    Clipboard,
    /// OSC 0, 1, 2: the window or icon title.
    Title,
    /// OSC 50: the font, set or reported.
    Font,
    /// OSC 8: a hyperlink (its text can say another address than it opens).
    Hyperlink,
    /// Any other OSC (colours, notifications, working directory, ...).
    OtherOsc,
    /// DCS: DECRQSS, sixel, a multiplexer's passthrough.
    DeviceControl,
    /// SOS, PM, APC.
    ApplicationString,
    /// A request that makes the terminal answer with what it holds or was told: ENQ, DECID,
    /// window and title reports, DECRQM, XTVERSION.
    Report,
    /// Any other control or sequence not on the list.
    Other,
}

impl Blocked {
    /// Its name, for the line that says what was kept out.
    pub fn describe(self) -> &'static str {
        match self {
            Blocked::Clipboard => "clipboard access (OSC 52)",
            Blocked::Title => "title change (OSC 0/1/2)",
            Blocked::Font => "font change or report (OSC 50)",
            Blocked::Hyperlink => "hyperlink (OSC 8)",
            Blocked::OtherOsc => "other OSC",
            Blocked::DeviceControl => "device control string (DCS)",
            Blocked::ApplicationString => "SOS/PM/APC string",
            Blocked::Report => "request for the terminal to answer",
            Blocked::Other => "other control sequence",
        }
    }
}

/// The longest CSI or ESC sequence passed on; a longer one is dropped.
const MAX_SEQUENCE: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ground,
    /// After ESC.
    Escape,
    /// Inside a CSI, collecting its bytes.
    Csi,
    /// Inside an OSC, DCS, SOS, PM or APC string: read, never kept (its kind is decided by
    /// its first bytes).
    String(StringKind),
    /// Inside a string, after ESC: `\` ends it.
    StringEscape(StringKind),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StringKind {
    Osc,
    Dcs,
    Other,
}

/// The filter, streaming: feed it the terminal's bytes in any chunks.
#[derive(Debug)]
pub struct VtFilter {
    state: State,
    /// The sequence being read (ESC included), up to [`MAX_SEQUENCE`] bytes.
    seq: Vec<u8>,
    /// An OSC's number, as its first bytes arrive.
    osc_number: Vec<u8>,
    /// A UTF-8 character being read.
    utf8: Vec<u8>,
    utf8_len: usize,
    blocked: BTreeMap<Blocked, u64>,
    /// Whether the terminal's answers reach the step (its keys are relayed to it): else a
    /// request for one, or a mode that makes the terminal report, is kept out, or its answer
    /// would be typed into whatever reads the person's terminal next (their shell).
    answers: bool,
    /// What the sequences let through left set, to be undone at the end.
    left: Left,
}

impl Default for VtFilter {
    fn default() -> Self {
        VtFilter::new()
    }
}

impl VtFilter {
    pub fn new() -> VtFilter {
        VtFilter {
            state: State::Ground,
            seq: Vec::new(),
            osc_number: Vec::new(),
            utf8: Vec::new(),
            utf8_len: 0,
            blocked: BTreeMap::new(),
            answers: true,
            left: Left::default(),
        }
    }

    /// A filter for a terminal whose keys do not reach the step (`run -t` without `-i`):
    /// requests for the terminal to answer, and the modes that make it report (mouse, focus),
    /// are kept out too.
    pub fn without_answers() -> VtFilter {
        VtFilter {
            answers: false,
            ..VtFilter::new()
        }
    }

    /// The bytes that set back what the sequences let through left set on the terminal
    /// (modes, the alternate screen, keyboard protocols, character sets, attributes, the
    /// scroll region): written when the step ends; empty when it changed nothing.
    pub fn restore(&self) -> Vec<u8> {
        self.left.restore()
    }

    /// What was kept out so far, by kind.
    pub fn blocked(&self) -> &BTreeMap<Blocked, u64> {
        &self.blocked
    }

    /// Filters `input`, appending what may reach the terminal to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &b in input {
            self.byte(b, out);
        }
    }

    fn block(&mut self, kind: Blocked) {
        *self.blocked.entry(kind).or_insert(0) += 1;
    }

    fn byte(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.state {
            State::Ground => self.ground(b, out),
            State::Escape => self.escape(b, out),
            State::Csi => self.csi(b, out),
            State::String(kind) => self.string(kind, b),
            State::StringEscape(kind) => {
                // ESC `\` is the string terminator; any other ESC ends the string and starts
                // a sequence, as a terminal reads it.
                self.end_string(kind);
                if b != b'\\' {
                    self.start_escape();
                    self.escape(b, out);
                }
            }
        }
    }

    fn start_escape(&mut self) {
        self.state = State::Escape;
        self.seq.clear();
        self.seq.push(0x1b);
    }

    fn ground(&mut self, b: u8, out: &mut Vec<u8>) {
        if self.utf8_len > 0 {
            if (0x80..0xc0).contains(&b) {
                self.utf8.push(b);
                if self.utf8.len() == self.utf8_len {
                    self.utf8_len = 0;
                    let ch = std::str::from_utf8(&self.utf8)
                        .ok()
                        .and_then(|s| s.chars().next());
                    match ch {
                        // C1 controls, as UTF-8: 8-bit CSI, OSC, DCS to a terminal that takes
                        // them.
                        Some(c) if ('\u{80}'..='\u{9f}').contains(&c) => self.block(Blocked::Other),
                        Some(_) => out.extend_from_slice(&self.utf8),
                        None => out.extend_from_slice("\u{fffd}".as_bytes()),
                    }
                }
                return;
            }
            // A character cut short: shown as such, and this byte read afresh.
            self.utf8_len = 0;
            out.extend_from_slice("\u{fffd}".as_bytes());
        }
        match b {
            0x07..=0x0d => out.push(b),
            0x1b => self.start_escape(),
            0x05 => self.block(Blocked::Report),
            0x00..=0x1f | 0x7f => self.block(Blocked::Other),
            0x20..=0x7e => out.push(b),
            0xc2..=0xdf => self.start_utf8(b, 2),
            0xe0..=0xef => self.start_utf8(b, 3),
            0xf0..=0xf4 => self.start_utf8(b, 4),
            _ => out.extend_from_slice("\u{fffd}".as_bytes()),
        }
    }

    fn start_utf8(&mut self, b: u8, len: usize) {
        self.utf8.clear();
        self.utf8.push(b);
        self.utf8_len = len;
    }

    fn escape(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            b'[' if self.seq.len() == 1 => {
                self.seq.push(b);
                self.state = State::Csi;
            }
            b']' if self.seq.len() == 1 => self.start_string(StringKind::Osc),
            b'P' if self.seq.len() == 1 => self.start_string(StringKind::Dcs),
            b'X' | b'^' | b'_' if self.seq.len() == 1 => self.start_string(StringKind::Other),
            // Intermediates (character set designations: `ESC ( B`).
            0x20..=0x2f if self.seq.len() < 3 => self.seq.push(b),
            0x30..=0x7e => {
                self.seq.push(b);
                let allowed = match &self.seq[1..] {
                    [b'7' | b'8' | b'=' | b'>' | b'D' | b'E' | b'H' | b'M'] => true,
                    [b'(' | b')' | b'*' | b'+', f] => f.is_ascii_alphanumeric() || *f == b'<',
                    _ => false,
                };
                if allowed {
                    self.left.esc(&self.seq[1..]);
                    out.extend_from_slice(&self.seq);
                } else if self.seq[1..] == *b"Z" {
                    self.block(Blocked::Report);
                } else {
                    self.block(Blocked::Other);
                }
                self.state = State::Ground;
            }
            // CAN and SUB cancel; ESC starts over; other controls inside end the sequence.
            0x1b => {
                self.block(Blocked::Other);
                self.start_escape();
            }
            _ => {
                self.block(Blocked::Other);
                self.state = State::Ground;
                if b != 0x18 && b != 0x1a {
                    self.ground(b, out);
                }
            }
        }
    }

    fn csi(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            0x20..=0x3f if self.seq.len() < MAX_SEQUENCE => self.seq.push(b),
            0x40..=0x7e if self.seq.len() < MAX_SEQUENCE => {
                self.seq.push(b);
                let body = &self.seq[2..];
                let verdict = csi_verdict(body).or_else(|| {
                    (!self.answers && asks_for_answer(body)).then_some(Blocked::Report)
                });
                match verdict {
                    None => {
                        self.left.csi(&self.seq[2..]);
                        out.extend_from_slice(&self.seq);
                    }
                    Some(kind) => self.block(kind),
                }
                self.state = State::Ground;
            }
            0x1b => {
                self.block(Blocked::Other);
                self.start_escape();
            }
            0x20..=0x7e => {
                // Over the bound: the rest is read as the sequence's, then dropped whole.
                if (0x40..=0x7e).contains(&b) {
                    self.block(Blocked::Other);
                    self.state = State::Ground;
                }
            }
            _ => {
                self.block(Blocked::Other);
                self.state = State::Ground;
                if b != 0x18 && b != 0x1a {
                    self.ground(b, out);
                }
            }
        }
    }

    fn start_string(&mut self, kind: StringKind) {
        self.osc_number.clear();
        self.state = State::String(kind);
    }

    fn string(&mut self, kind: StringKind, b: u8) {
        match b {
            // BEL ends an OSC (xterm's form); CAN and SUB cancel any string.
            0x07 if kind == StringKind::Osc => self.end_string(kind),
            0x18 | 0x1a => self.end_string(kind),
            0x1b => self.state = State::StringEscape(kind),
            b'0'..=b'9' if kind == StringKind::Osc && self.osc_number.len() < 8 => {
                if !self.osc_number.contains(&b';') {
                    self.osc_number.push(b);
                }
            }
            _ => {
                if kind == StringKind::Osc && self.osc_number.len() < 8 {
                    self.osc_number.push(b';');
                }
            }
        }
    }

    fn end_string(&mut self, kind: StringKind) {
        let what = match kind {
            StringKind::Dcs => Blocked::DeviceControl,
            StringKind::Other => Blocked::ApplicationString,
            StringKind::Osc => {
                let digits: Vec<u8> = (self.osc_number.iter())
                    .take_while(|b| b.is_ascii_digit())
                    .copied()
                    .collect();
                match &digits[..] {
                    b"52" => Blocked::Clipboard,
                    b"0" | b"1" | b"2" => Blocked::Title,
                    b"50" => Blocked::Font,
                    b"8" => Blocked::Hyperlink,
                    _ => Blocked::OtherOsc,
                }
            }
        };
        self.block(what);
        self.state = State::Ground;
    }
}

/// The DEC private modes a full-screen program may set and reset.
const DEC_MODES: &[u32] = &[
    1, 6, 7, 12, 25, 47, 1000, 1002, 1003, 1004, 1005, 1006, 1007, 1015, 1016, 1047, 1048, 1049,
    2004, 2026,
];

/// Whether the CSI whose bytes after `ESC [` are `body` (one that passes) makes the terminal
/// answer: a report asked for, or a mode that reports mouse or focus events.
fn asks_for_answer(body: &[u8]) -> bool {
    let Some(Csi {
        private,
        numbers,
        intermediates,
        last,
    }) = parse_csi(body)
    else {
        return false;
    };
    if !intermediates.is_empty() {
        return false;
    }
    match (private, last) {
        (None | Some(b'?'), b'n') | (None | Some(b'>'), b'c') | (Some(b'?'), b'u') => true,
        (Some(b'?'), b'h') => numbers.iter().any(|n| (1000..=1016).contains(n)),
        _ => false,
    }
}

/// Whether the CSI whose bytes after `ESC [` are `body` passes (`None`) or why not.
fn csi_verdict(body: &[u8]) -> Option<Blocked> {
    let (last, rest) = body.split_last()?;
    let private = rest.first().copied().filter(|b| b"?<=>".contains(b));
    let params_end = rest
        .iter()
        .position(|b| (0x20..=0x2f).contains(b))
        .unwrap_or(rest.len());
    let intermediates = &rest[params_end..];
    let params = &rest[usize::from(private.is_some())..params_end];
    // Parameters are digits and separators only (a private marker is only ever first); a
    // colon only in SGR (colours), where every terminal reads it alike (elsewhere some read
    // `4:2` as `4;2`, so what was checked would not be what acts).
    if !params
        .iter()
        .all(|b| b.is_ascii_digit() || *b == b';' || *b == b':')
        || (params.contains(&b':') && (*last != b'm' || private.is_some()))
    {
        return Some(Blocked::Other);
    }
    // Read as `left` reads it; no parameter at all is one of 0, as a terminal takes it.
    let mut numbers = parse_csi(body).map(|c| c.numbers).unwrap_or_default();
    if numbers.is_empty() {
        numbers.push(0);
    }
    let allowed = match (private, intermediates, *last) {
        (None, [], b'@' | b'A'..=b'H' | b'I' | b'J' | b'K' | b'L' | b'M' | b'P') => true,
        (None, [], b'S' | b'T' | b'X' | b'Z' | b'`' | b'a' | b'b' | b'd' | b'e' | b'f') => true,
        (None, [], b'g' | b'm' | b'r' | b's' | b'u') => true,
        // Insert mode and automatic newline are the only ANSI modes.
        (None, [], b'h' | b'l') => numbers.iter().all(|n| *n == 4 || *n == 20),
        // The status and the cursor position: the terminal's fixed answers.
        (None, [], b'n') => numbers == [5] || numbers == [6],
        (Some(b'?'), [], b'n') => numbers == [6],
        // Primary and secondary device attributes: fixed answers, which programs wait for.
        (None | Some(b'>'), [], b'c') => numbers.iter().all(|n| *n == 0),
        (Some(b'?'), [], b'h' | b'l' | b's' | b'r') => {
            numbers.iter().all(|n| DEC_MODES.contains(n))
        }
        (Some(b'?'), [], b'J' | b'K') => true,
        // The kitty keyboard protocol: push, pop, query its flags.
        (Some(b'>' | b'<' | b'?' | b'='), [], b'u') => true,
        // xterm's modifyOtherKeys, as vim sets it.
        (Some(b'>'), [], b'm') => true,
        // Cursor style; a soft reset.
        (None, [b' '], b'q') | (None, [b'!'], b'p') => true,
        _ => false,
    };
    if allowed {
        return None;
    }
    Some(match (private, intermediates, *last) {
        (_, _, b't') | (_, [b'$'], _) | (Some(b'>'), [], b'q') | (Some(b'='), [], b'c') => {
            Blocked::Report
        }
        _ => Blocked::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(input: &[u8]) -> (Vec<u8>, BTreeMap<Blocked, u64>) {
        let mut f = VtFilter::new();
        let mut out = Vec::new();
        f.feed(input, &mut out);
        (out, f.blocked().clone())
    }

    fn passes(input: &[u8]) {
        let (out, blocked) = filter(input);
        assert_eq!(
            out,
            input,
            "{:?} {blocked:?}",
            String::from_utf8_lossy(input)
        );
        assert!(blocked.is_empty(), "{blocked:?}");
    }

    fn blocked_as(input: &[u8], kind: Blocked, shown: &[u8]) {
        let (out, blocked) = filter(input);
        assert_eq!(out, shown, "{:?}", String::from_utf8_lossy(input));
        assert_eq!(
            blocked.get(&kind),
            Some(&1),
            "{:?}: {blocked:?}",
            String::from_utf8_lossy(input)
        );
    }

    #[test]
    fn what_a_full_screen_program_needs_passes() {
        for s in [
            &b"plain text, tabs\tand lines\r\n"[..],
            "é 漢字 🦀".as_bytes(),
            b"\x1b[H\x1b[2J\x1b[10;20H\x1b[K\x1b[1;31;42mred\x1b[0m\x1b[38;2;1;2;3mtrue\x1b[m",
            b"\x1b[?1049h\x1b[?25l\x1b[?1000;1006h\x1b[?2004h\x1b[?1049l\x1b[?25h",
            b"\x1b[5;20r\x1b[3S\x1b[2T\x1b[4@\x1b[2P\x1b[3L\x1b[M\x1b[2 q\x1b[!p",
            b"\x1b7\x1b8\x1b=\x1b>\x1bM\x1b(B\x1b(0qqq\x1b(B",
            b"\x1b[6n\x1b[c\x1b[>c\x1b[>1u\x1b[<u\x1b[?u\x1b[>4;1m\x07",
        ] {
            passes(s);
        }
    }

    #[test]
    fn what_acts_beyond_the_screen_is_kept_out_and_named() {
        let cases: &[(&[u8], Blocked)] = &[
            (b"a\x1b]52;c;ZWNobyBwd25lZA==\x07b", Blocked::Clipboard),
            (b"a\x1b]52;c;?\x1b\\b", Blocked::Clipboard),
            (b"a\x1b]2;evil title\x07b", Blocked::Title),
            (b"a\x1b]0;t\x1b\\b", Blocked::Title),
            (b"a\x1b]50;?\x07b", Blocked::Font),
            (b"a\x1b]8;;http://evil/\x07b", Blocked::Hyperlink),
            (b"a\x1b]11;?\x07b", Blocked::OtherOsc),
            (b"a\x1bP$qm\x1b\\b", Blocked::DeviceControl),
            (
                b"a\x1bPtmux;\x1b\x1b]52;c;x\x07\x1b\\b",
                Blocked::DeviceControl,
            ),
            (b"a\x1b_Gf=100;AAAA\x1b\\b", Blocked::ApplicationString),
            (b"a\x1b[21tb", Blocked::Report),
            (b"a\x1b[8;100;100tb", Blocked::Report),
            (b"a\x05b", Blocked::Report),
            (b"a\x1bZb", Blocked::Report),
            (b"a\x1b[?1$pb", Blocked::Report),
            (b"a\x1b[>0qb", Blocked::Report),
            (b"a\x1bcb", Blocked::Other),
            (b"a\x1b[?1234hb", Blocked::Other),
            (b"a\x1b[6;\"nb", Blocked::Other),
            (b"a\xc2\x9b31mb", Blocked::Other),
            (b"a\x0eb", Blocked::Other),
        ];
        for (input, kind) in cases {
            let (out, blocked) = filter(input);
            let text = String::from_utf8_lossy(&out);
            assert!(
                text.starts_with('a') && text.ends_with('b') && !out.contains(&0x1b),
                "{:?} -> {text:?}",
                String::from_utf8_lossy(input)
            );
            assert_eq!(
                blocked.get(kind),
                Some(&1),
                "{:?}: {blocked:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn a_sequence_split_across_chunks_is_read_whole() {
        let mut f = VtFilter::new();
        let mut out = Vec::new();
        for chunk in [
            &b"x\x1b"[..],
            b"]5",
            b"2;c;QUJD",
            b"\x1b",
            b"\\y\x1b[3",
            b"1mz\xe6",
            b"\xbc",
            b"\xa2",
        ] {
            f.feed(chunk, &mut out);
        }
        assert_eq!(out, "xy\x1b[31mz漢".as_bytes());
        assert_eq!(f.blocked().get(&Blocked::Clipboard), Some(&1));
    }

    #[test]
    fn invalid_utf8_and_overlong_sequences_never_pass_raw() {
        blocked_as(b"\x1b[?2004\x18h", Blocked::Other, b"h");
        let (out, _) = filter(b"a\xffb\xe6\xbcc");
        assert_eq!(out, "a\u{fffd}b\u{fffd}c".as_bytes());
        let long = [b"\x1b[".to_vec(), vec![b'1'; 100], b"m!".to_vec()].concat();
        blocked_as(&long, Blocked::Other, b"!");
        // An unterminated string swallows what follows until it ends, never shows it.
        let (out, _) = filter(b"\x1b]52;c;AAAA and more text");
        assert_eq!(out, b"");
    }

    fn restore_after(input: &[u8]) -> String {
        let mut f = VtFilter::new();
        f.feed(input, &mut Vec::new());
        String::from_utf8(f.restore()).unwrap()
    }

    #[test]
    fn what_the_step_left_set_is_set_back_and_nothing_else() {
        assert_eq!(restore_after(b"plain \x1b[1;1H\x1b[2J\x1b[0m text"), "");
        // Set then reset: nothing to undo.
        assert_eq!(
            restore_after(b"\x1b[?1049h\x1b[?25l\x1b[?1049l\x1b[?25h"),
            ""
        );
        let left = restore_after(
            b"\x1b[?1003h\x1b[?1004h\x1b[>1u\x1b[>3u\x1b[>4;2m\x1b(0\x1b[8m\x1b[?25l\x1b[?1049h\x1b[4h\x1b=\x1b[2;5r",
        );
        assert_eq!(
            left,
            "\x1b[r\x1b[?1049l\x1b[?1004l\x1b[?1003l\x1b[?25h\x1b[4l\x1b>\x1b(B\x1b)B\x1b[0m\x1b[<2u\x1b[>4m"
        );
        // A pop undoes a push; the cursor-saving mode is an action, not a state.
        assert_eq!(restore_after(b"\x1b[>1u\x1b[<u\x1b[?1048h"), "");
        // A sequence kept out leaves nothing to undo.
        assert_eq!(restore_after(b"\x1b[?9h\x1b[4:2h"), "");
    }

    #[test]
    fn without_keys_relayed_no_answer_is_asked_for() {
        let mut f = VtFilter::without_answers();
        let mut out = Vec::new();
        f.feed(
            b"\x1b[6n\x1b[5n\x1b[?6n\x1b[c\x1b[>c\x1b[?u\x1b[?1000h\x1b[?1004hok\x1b[?1000l\x1b[?1049h",
            &mut out,
        );
        assert_eq!(out, b"ok\x1b[?1000l\x1b[?1049h".to_vec());
        assert_eq!(f.blocked().get(&Blocked::Report), Some(&8));
    }

    #[test]
    fn a_colon_passes_only_in_sgr() {
        passes(b"\x1b[38:2::1:2:3m\x1b[4:3m");
        for s in [&b"\x1b[4:2h"[..], b"\x1b[?25:2l", b"\x1b[2:1J"] {
            let (out, _) = filter(s);
            assert_eq!(out, b"", "{:?}", String::from_utf8_lossy(s));
        }
    }
}
