//! A secret's placeholder, and the forms both are looked for in.
//!
//! The placeholder has the value's shape: its prefix (the part before the value's last
//! separator in its first half: `sk-ant-api03-`), every character that is not a letter or a
//! digit where the value has it, and random letters and digits of the same case elsewhere.
//! So an SDK that checks a key's shape takes it, and every encoding of the two (base64 at any
//! alignment, percent-encoding, JSON escaping) has the same length: swapping one for the other
//! never changes a message's length, its `Content-Length` or its chunk sizes.

use base64::Engine as _;

/// The shortest value taken: a shorter one would be matched by chance in ordinary traffic.
pub const MIN_VALUE: usize = 16;
/// The longest value taken (a key, a token: not a file).
pub const MAX_VALUE: usize = 4096;
/// How many characters of a value beyond its prefix an echo of its beginning must carry to
/// be taken for the value (a truncated echo: `sk-ant-api03-AbCdEfGh...`).
pub const PARTIAL_MIN: usize = 8;

/// Why a value cannot be a secret here, if it cannot.
pub fn check_value(value: &[u8]) -> Result<(), String> {
    if value.len() < MIN_VALUE || value.len() > MAX_VALUE {
        return Err(format!(
            "a secret's value must be {MIN_VALUE} to {MAX_VALUE} bytes (it is {})",
            value.len()
        ));
    }
    if !value.iter().all(|b| b.is_ascii_graphic()) {
        return Err(
            "a secret's value must be printable ASCII without spaces (a key or a token)".into(),
        );
    }
    if secret_part(value) < MIN_VALUE / 2 {
        return Err(
            "a secret's value must have at least 8 letters or digits after its prefix".into(),
        );
    }
    Ok(())
}

/// How long the value's prefix is: up to its last separator in its first half.
pub fn prefix_len(value: &[u8]) -> usize {
    let half = &value[..value.len() / 2];
    half.iter()
        .rposition(|b| !b.is_ascii_alphanumeric())
        .map_or(0, |i| i + 1)
}

/// The letters and digits of the value past its prefix (what is random in the placeholder).
fn secret_part(value: &[u8]) -> usize {
    value[prefix_len(value)..]
        .iter()
        .filter(|b| b.is_ascii_alphanumeric())
        .count()
}

/// A placeholder for `value` drawn from `random` (one byte per character), differing from it
/// in every letter and digit past its prefix.
pub fn make(value: &[u8], random: &[u8]) -> Vec<u8> {
    let prefix = prefix_len(value);
    (value.iter().enumerate())
        .map(|(i, &b)| {
            let r = random.get(i).copied().unwrap_or(0);
            let pick = |set: &[u8]| {
                let c = set[r as usize % set.len()];
                if c == b {
                    set[(r as usize + 1) % set.len()]
                } else {
                    c
                }
            };
            match b {
                _ if i < prefix => b,
                b'a'..=b'z' => pick(b"abcdefghijklmnopqrstuvwxyz"),
                b'A'..=b'Z' => pick(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
                b'0'..=b'9' => pick(b"0123456789"),
                _ => b,
            }
        })
        .collect()
}

/// The forms `from` is looked for in, each with the same form of `to` (same length): as is,
/// percent-encoded (both cases of hex), JSON-escaped, and base64 (standard and URL-safe) at
/// each of the three alignments a value can have in a longer encoded string (only the
/// characters that depend on the value alone: the edges mix in its neighbours' bytes).
pub fn forms(from: &[u8], to: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = vec![(from.to_vec(), to.to_vec())];
    let mut add = |f: Vec<u8>, t: Vec<u8>| {
        if f.len() == t.len()
            && f.len() >= MIN_VALUE / 2
            && f != t
            && !out.iter().any(|(g, _)| *g == f)
        {
            out.push((f, t));
        }
    };
    add(percent(from, false), percent(to, false));
    add(percent(from, true), percent(to, true));
    add(json_escaped(from), json_escaped(to));
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for lead in 0..3usize {
            let (f, t) = (
                aligned_core(engine, from, lead),
                aligned_core(engine, to, lead),
            );
            add(f, t);
        }
    }
    out
}

/// The base64 characters of `bytes` placed `lead` bytes into a string, that depend on
/// `bytes` alone (whole 3-byte groups of it).
fn aligned_core(engine: &base64::engine::GeneralPurpose, bytes: &[u8], lead: usize) -> Vec<u8> {
    let skip = (3 - lead) % 3;
    let Some(rest) = bytes.get(skip..) else {
        return Vec::new();
    };
    let whole = rest.len() / 3 * 3;
    engine.encode(&rest[..whole]).into_bytes()
}

fn percent(bytes: &[u8], lower: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b);
        } else if lower {
            out.extend_from_slice(format!("%{b:02x}").as_bytes());
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

fn json_escaped(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in bytes {
        match b {
            b'"' | b'\\' | b'/' => {
                out.push(b'\\');
                out.push(b);
            }
            _ => out.push(b),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placeholder_has_the_values_shape_and_none_of_its_secret() {
        let value = b"sk-ant-api03-AbCdEf0123456789_xyz-QQ";
        let p = make(value, &[7u8; 64]);
        assert_eq!(p.len(), value.len());
        assert!(p.starts_with(b"sk-ant-api03-"));
        for (a, b) in value.iter().zip(&p).skip(prefix_len(value)) {
            assert_eq!(a.is_ascii_alphanumeric(), b.is_ascii_alphanumeric());
            assert_eq!(a.is_ascii_uppercase(), b.is_ascii_uppercase());
            if a.is_ascii_alphanumeric() {
                assert_ne!(a, b);
            } else {
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn every_form_has_its_counterparts_length() {
        let value = b"ghp_ABCdef/123+456=789xyzXYZ";
        let p = make(value, &[3u8; 64]);
        let forms = forms(value, &p);
        assert!(forms.len() >= 7, "{}", forms.len());
        for (f, t) in &forms {
            assert_eq!(f.len(), t.len());
        }
        // Basic auth of `user:value` holds the value's aligned core.
        let basic = base64::engine::general_purpose::STANDARD
            .encode([b"x-access-token:".as_slice(), value].concat());
        assert!(forms
            .iter()
            .any(|(f, _)| basic.as_bytes().windows(f.len()).any(|w| w == f)));
    }

    #[test]
    fn values_too_short_or_not_printable_are_refused() {
        assert!(check_value(b"short").is_err());
        assert!(check_value(b"has a space in it, sadly").is_err());
        assert!(check_value(b"sk-ant-api03-----------------x").is_err());
        assert!(check_value(b"sk-ant-api03-AbCdEf0123456789").is_ok());
    }
}
