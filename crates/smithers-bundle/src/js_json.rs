//! JSON with JavaScript semantics: `JSON.stringify` byte for byte, `String.prototype.trim`,
//! string length in UTF-16 code units, and the property order of JavaScript objects.
//!
//! Why this exists: the manifest we write must be the same bytes the JavaScript package
//! writes for the same input, and serde_json differs from `JSON.stringify` in two places:
//! - numbers: JavaScript has one number type (an f64) and prints it with the shortest
//!   round-trip form in its own notation (`1e+21`, `12345678901234567000`); serde_json keeps
//!   u64/i64 exactly and prints floats as `1e21`. We print every number as `JSON.stringify`
//!   prints the f64 nearest to it (via `ryu-js`). So numbers follow JS semantics: an integer
//!   beyond 2^53 is rounded the way JavaScript rounds it. We do NOT enable serde_json's
//!   `arbitrary_precision`: it would change `serde_json::Value` for every crate of the
//!   workspace (feature unification) and breaks `#[serde(flatten)]`/untagged enums, and JS
//!   precision is what the contract is anyway.
//! - object key order: a JavaScript object lists "array index" keys (`"0"`, `"17"`, up to
//!   2^32-2) first in ascending numeric order, then the other keys in insertion order.
//!   `JSON.parse` followed by `JSON.stringify` therefore moves `{"b":1,"1":2}` to
//!   `{"1":2,"b":1}`. With serde_json's `preserve_order` we have insertion order; [`entries`]
//!   applies the JavaScript rule on top of it.
//!
//! What serde_json cannot hold and JavaScript can: non-finite numbers (`JSON.parse("1e400")`
//! is `Infinity`), lone UTF-16 surrogates (`"\ud800"`), and nesting deeper than 128. Such a
//! README is rejected by us as invalid JSON (see the crate docs for the list of deliberate
//! differences); the JavaScript writer never produces the first and the last for outputs.

use std::fmt::Write as _;

use serde_json::{Map, Number, Value};

/// `s.length` in JavaScript: the number of UTF-16 code units (an astral character counts 2).
pub fn utf16_len(s: &str) -> usize {
    s.encode_utf16().count()
}

/// True when `s` has more than `max` UTF-16 code units, without counting when the byte
/// length already decides it (a UTF-16 length never exceeds the UTF-8 byte length).
pub fn utf16_len_exceeds(s: &str, max: usize) -> bool {
    s.len() > max && utf16_len(s) > max
}

/// JavaScript's WhiteSpace and LineTerminator code points, i.e. what
/// `String.prototype.trim` removes. Differs from Rust's `char::is_whitespace`: it includes
/// U+FEFF (a byte-order mark) and excludes U+0085.
pub fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\u{9}' | '\u{A}' | '\u{B}' | '\u{C}' | '\u{D}' | ' ' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202F}'
                | '\u{205F}'
                | '\u{3000}'
                | '\u{FEFF}'
    )
}

/// `s.trim()` in JavaScript.
pub fn js_trim(s: &str) -> &str {
    s.trim_matches(is_js_whitespace)
}

/// Parses `key` as a JavaScript array index (canonical decimal, 0 ..= 2^32 - 2).
pub fn array_index(key: &str) -> Option<u32> {
    let bytes = key.as_bytes();
    if bytes.is_empty() || bytes.len() > 10 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if bytes.len() > 1 && bytes[0] == b'0' {
        return None;
    }
    let n: u64 = key.parse().ok()?;
    if n <= u64::from(u32::MAX - 1) {
        Some(n as u32)
    } else {
        None
    }
}

/// The entries of `map` in the order a JavaScript object built from the same insertions
/// enumerates them (`Object.entries`, `JSON.stringify`): array-index keys ascending, then
/// the rest in insertion order.
pub fn entries(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut indexed: Vec<(u32, &String, &Value)> = Vec::new();
    let mut named: Vec<(&String, &Value)> = Vec::with_capacity(map.len());
    for (k, v) in map {
        match array_index(k) {
            Some(i) => indexed.push((i, k, v)),
            None => named.push((k, v)),
        }
    }
    if indexed.is_empty() {
        return named;
    }
    indexed.sort_by_key(|(i, _, _)| *i);
    let mut out: Vec<(&String, &Value)> = indexed.into_iter().map(|(_, k, v)| (k, v)).collect();
    out.extend(named);
    out
}

/// A JSON number as `JSON.stringify` prints it: the nearest f64 in JavaScript notation.
pub fn format_number(n: &Number) -> String {
    match n.as_f64() {
        // serde_json never holds a non-finite number; JSON.stringify would print `null`.
        Some(f) if f.is_finite() => ryu_js::Buffer::new().format(f).to_string(),
        _ => "null".to_string(),
    }
}

/// `JSON.stringify(value)` (compact).
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, None, 0);
    out
}

/// `JSON.stringify(value, null, 2)`: the README.md format.
pub fn to_string_pretty(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, Some(2), 0);
    out
}

fn newline_indent(out: &mut String, indent: Option<usize>, level: usize) {
    if let Some(width) = indent {
        out.push('\n');
        for _ in 0..width * level {
            out.push(' ');
        }
    }
}

fn write_value(out: &mut String, value: &Value, indent: Option<usize>, level: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&format_number(n)),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline_indent(out, indent, level + 1);
                write_value(out, item, indent, level + 1);
            }
            newline_indent(out, indent, level);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, v)) in entries(map).into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline_indent(out, indent, level + 1);
                write_string(out, k);
                out.push(':');
                if indent.is_some() {
                    out.push(' ');
                }
                write_value(out, v, indent, level + 1);
            }
            newline_indent(out, indent, level);
            out.push('}');
        }
    }
}

/// JSON.stringify's QuoteJSONString for a well-formed string: `"` `\` and the C0 controls
/// are escaped (short forms where they exist, else `\u00xx` lowercase); nothing else is.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let escape: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\u{8}' => Some("\\b"),
            '\u{C}' => Some("\\f"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            _ => None,
        };
        if escape.is_none() && c >= ' ' {
            continue;
        }
        out.push_str(&s[start..i]);
        match escape {
            Some(e) => out.push_str(e),
            None => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
        }
        start = i + c.len_utf8();
    }
    out.push_str(&s[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_print_like_javascript() {
        let v: Value = serde_json::from_str(
            "[1, -0, 1.5, 1e21, 1e-7, 123456789012345678901, 12345678901234567890, 0.1, 1E+2]",
        )
        .unwrap();
        assert_eq!(
            to_string(&v),
            "[1,0,1.5,1e+21,1e-7,123456789012345680000,12345678901234567000,0.1,100]"
        );
    }

    #[test]
    fn keys_follow_javascript_object_order() {
        let v: Value = serde_json::from_str(
            r#"{"b":1,"10":2,"a":3,"2":4,"01":5,"4294967295":6,"4294967294":7}"#,
        )
        .unwrap();
        assert_eq!(
            to_string(&v),
            r#"{"2":4,"10":2,"4294967294":7,"b":1,"a":3,"01":5,"4294967295":6}"#
        );
    }

    #[test]
    fn strings_escape_like_javascript() {
        let v = json!("a\"\\\u{8}\u{c}\n\r\t\u{1}\u{1f}\u{7f}\u{2028}é😀/");
        assert_eq!(
            to_string(&v),
            "\"a\\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\u{7f}\u{2028}é😀/\""
        );
    }

    #[test]
    fn pretty_matches_json_stringify_indent_2() {
        let v = json!({"outputs": {"a": [1, {}], "e": []}, "status": "finished", "patches": []});
        assert_eq!(
            to_string_pretty(&v),
            "{\n  \"outputs\": {\n    \"a\": [\n      1,\n      {}\n    ],\n    \"e\": []\n  },\n  \"status\": \"finished\",\n  \"patches\": []\n}"
        );
    }

    #[test]
    fn trim_and_lengths_follow_javascript() {
        assert_eq!(js_trim("\u{feff} \u{a0}{}\u{2029}\n"), "{}");
        assert_eq!(js_trim("\u{85}{}"), "\u{85}{}");
        assert_eq!(utf16_len("a😀é"), 4);
        assert!(!utf16_len_exceeds("😀", 2));
        assert!(utf16_len_exceeds("😀😀", 3));
    }
}
