//! Flag values several commands share: sizes (`512m`, `2g`) and durations (`30s`, `10m`).

use serde_json::Value;
use smithers_errors::ErrorCode;
use smithers_runtime::parse_memory_limit;

use crate::output::coded_error;

fn invalid(message: String) -> anyhow::Error {
    coded_error(ErrorCode::InvalidInput, message, Value::Null)
}

/// A size flag's value in bytes: a number with a unit (`512m`, `2g`, `1.5g`, `100k`, `4096b`),
/// at least one byte. A bare number is refused rather than read as bytes (`--memory 512`
/// would be a 512-byte limit, which nobody means), and every error names the flag.
pub fn parse_size_flag(flag: &str, text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let has_unit = t.chars().last().is_some_and(|c| c.is_ascii_alphabetic());
    if !has_unit {
        let hint = if t.chars().all(|c| c.is_ascii_digit()) && !t.is_empty() && t != "0" {
            format!(" (did you mean {t}m? or {t}b for bytes)")
        } else {
            String::new()
        };
        return Err(invalid(format!(
            "{flag} {text:?} needs a unit: b, k, m, g or t, e.g. 512m, 2g{hint}"
        )));
    }
    parse_memory_limit(t).map_err(|_| {
        invalid(format!(
            "{flag} {text:?} is not a size of at least one byte (e.g. 512m, 2g, 100k)"
        ))
    })
}

/// Parses `30s`, `10m`, `1h`, `500ms` or a bare number of seconds into milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let factor = match unit.trim() {
        "ms" => 1.0,
        "" | "s" => 1000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return None,
    };
    let ms = value * factor;
    (ms.is_finite() && ms >= 1.0 && ms < u64::MAX as f64).then_some(ms as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn size_flags_need_a_unit_and_name_the_flag() {
        use super::parse_size_flag;
        assert_eq!(parse_size_flag("--memory", "512m").unwrap(), 512 << 20);
        assert_eq!(parse_size_flag("--disk", "1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size_flag("--max-output", "4096b").unwrap(), 4096);
        let bare = parse_size_flag("--memory", "512").unwrap_err().to_string();
        assert!(bare.contains("--memory") && bare.contains("512m"), "{bare}");
        for (flag, text) in [
            ("--disk", "0"),
            ("--max-output", "0"),
            ("--disk", "0m"),
            ("--memory", "lots"),
        ] {
            let e = parse_size_flag(flag, text).unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
            assert!(!e.contains("memoryLimit"), "{e}");
        }
    }

    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("10m"), Some(600_000));
        assert_eq!(parse_duration_ms("30s"), Some(30_000));
        assert_eq!(parse_duration_ms("45"), Some(45_000));
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("1.5h"), Some(5_400_000));
        assert_eq!(parse_duration_ms("soon"), None);
        assert_eq!(parse_duration_ms("0"), None);
    }
}
