//! The concurrency limits from the environment, parsed like the JavaScript package parses
//! them.

/// Default of `SMITHERS_MAX_CONCURRENT_SANDBOXES`.
pub const DEFAULT_MAX_CONCURRENT_SANDBOXES: u32 = 10;

/// Parses `SMITHERS_MAX_CONCURRENT_SANDBOXES` exactly like the JavaScript package
/// (`Number(raw)`, then non-finite or `<= 0` → 10, else `Math.floor`): unset, empty,
/// non-numeric, `0`, negative or infinite → 10; `2.9` → 2; `0x10` → 16; ` 5 ` → 5;
/// `0.5` → 0 (JavaScript floors after the `<= 0` check, so a fraction below 1 admits nothing).
pub fn parse_max_concurrent(raw: Option<&str>) -> u32 {
    parse_limit(raw, DEFAULT_MAX_CONCURRENT_SANDBOXES)
}

/// [`parse_max_concurrent`]'s rules with another default (for other limits read from the
/// environment, such as the host-wide one).
pub fn parse_limit(raw: Option<&str>, default: u32) -> u32 {
    let Some(raw) = raw else {
        return default;
    };
    let parsed = js_number(raw);
    if !parsed.is_finite() || parsed <= 0.0 {
        return default;
    }
    // `as` saturates at u32::MAX for huge values, which is what "no practical limit" means.
    parsed.floor() as u32
}

/// JavaScript's `Number(string)`: trimmed; empty → 0; `0x`/`0o`/`0b` integer prefixes;
/// otherwise a decimal literal (`Infinity` allowed); anything else NaN.
fn js_number(raw: &str) -> f64 {
    let s = raw.trim();
    if s.is_empty() {
        return 0.0;
    }
    for (prefix, radix) in [
        ("0x", 16),
        ("0X", 16),
        ("0o", 8),
        ("0O", 8),
        ("0b", 2),
        ("0B", 2),
    ] {
        if let Some(digits) = s.strip_prefix(prefix) {
            return u128::from_str_radix(digits, radix)
                .map(|v| v as f64)
                .unwrap_or(f64::NAN);
        }
    }
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    if unsigned == "Infinity" {
        return if s.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
    }
    // Rust also accepts "inf"/"nan"/"infinity" in any case, which JavaScript does not; only
    // digits, one dot and an exponent are JavaScript decimal literals.
    if !unsigned
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        || !unsigned.chars().any(|c| c.is_ascii_digit())
    {
        return f64::NAN;
    }
    s.parse().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_concurrent_parsing_matches_javascript_number() {
        let cases: [(Option<&str>, u32); 16] = [
            (None, 10),
            (Some(""), 10),
            (Some("   "), 10),
            (Some("abc"), 10),
            (Some("5abc"), 10),
            (Some("0"), 10),
            (Some("-3"), 10),
            (Some("Infinity"), 10),
            (Some("inf"), 10),
            (Some("NaN"), 10),
            (Some("3"), 3),
            (Some(" 7 "), 7),
            (Some("2.9"), 2),
            (Some("1e1"), 10),
            (Some("0x10"), 16),
            (Some("0.5"), 0),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_max_concurrent(raw), want, "{raw:?}");
        }
    }
}
