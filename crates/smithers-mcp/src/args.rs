//! A tool's arguments, checked before use (types, sizes, NUL bytes), and its result's shape.
//! Everything a client sends is hostile: a check failing is a JSON-RPC error (`-32602`), never
//! a guess at what was meant.

use serde_json::{json, Value};

/// Default and largest bound of a stream or file a tool returns.
pub const DEFAULT_OUTPUT: usize = 1 << 20;
pub const MAX_OUTPUT: usize = 16 << 20;
/// Bounds of what a call may carry.
pub const MAX_ARGV: usize = 4096;
pub const MAX_ARG_BYTES: usize = 128 << 10;
pub const MAX_ENV: usize = 256;
/// The largest message a client may send (a file written through `session_write` is in it).
pub const MAX_MESSAGE: usize = 24 << 20;

/// A tool's result, or a JSON-RPC error (code, message) for a malformed call.
pub type CallResult = Result<Value, (i64, String)>;

/// A malformed call.
pub fn bad(message: impl Into<String>) -> (i64, String) {
    (-32602, message.into())
}

/// A tool's result: `text` for a model to read, `structured` for a program.
pub fn result(text: String, structured: Value, is_error: bool) -> Value {
    json!({
        "content": [{ "type": "text", "text": text }],
        "structuredContent": structured,
        "isError": is_error,
    })
}

/// A tool that failed: the error (code, message) as its result.
pub fn failed(code: &str, message: &str) -> Value {
    result(
        format!("{code}: {message}"),
        json!({ "code": code, "message": message }),
        true,
    )
}

pub fn str_arg<'a>(args: &'a Value, key: &str) -> Result<Option<&'a str>, (i64, String)> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() <= MAX_ARG_BYTES && !s.contains('\0') => Ok(Some(s)),
        Some(_) => Err(bad(format!(
            "{key} must be a string (no NUL, at most {MAX_ARG_BYTES} bytes)"
        ))),
    }
}

/// A string argument that must be there.
pub fn required<'a>(args: &'a Value, key: &str) -> Result<&'a str, (i64, String)> {
    str_arg(args, key)?.ok_or_else(|| bad(format!("{key} is required")))
}

pub fn str_list(args: &Value, key: &str, max: usize) -> Result<Vec<String>, (i64, String)> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) if items.len() <= max => items
            .iter()
            .map(|v| match v {
                Value::String(s) if s.len() <= MAX_ARG_BYTES && !s.contains('\0') => Ok(s.clone()),
                _ => Err(bad(format!(
                    "{key} must hold strings (no NUL, at most {MAX_ARG_BYTES} bytes)"
                ))),
            })
            .collect(),
        Some(_) => Err(bad(format!(
            "{key} must be an array of at most {max} strings"
        ))),
    }
}

/// `command`: a non-empty argv.
pub fn argv_arg(args: &Value) -> Result<Vec<String>, (i64, String)> {
    let argv = str_list(args, "command", MAX_ARGV)?;
    if argv.first().is_none_or(String::is_empty) {
        return Err(bad(
            "command must be a non-empty array of strings naming a program",
        ));
    }
    Ok(argv)
}

pub fn env_arg(args: &Value) -> Result<Vec<(String, String)>, (i64, String)> {
    match args.get("env") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) if m.len() <= MAX_ENV => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s)
                    if !k.is_empty() && !k.contains(['=', '\0']) && !s.contains('\0') =>
                {
                    Ok((k.clone(), s.clone()))
                }
                _ => Err(bad(format!(
                    "env {}: names without '=' or NUL, string values",
                    smithers_terminal::line(k)
                ))),
            })
            .collect(),
        Some(_) => Err(bad(format!(
            "env must be an object of at most {MAX_ENV} strings"
        ))),
    }
}

pub fn u64_arg(args: &Value, key: &str) -> Result<Option<u64>, (i64, String)> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(format!("{key} must be a non-negative integer"))),
    }
}

/// A bound the client asks for, within [`MAX_OUTPUT`] ([`DEFAULT_OUTPUT`] unasked).
pub fn limit_arg(args: &Value, key: &str) -> Result<usize, (i64, String)> {
    Ok(u64_arg(args, key)?.map_or(DEFAULT_OUTPUT, |n| (n as usize).min(MAX_OUTPUT)))
}

/// `stdin` (text) or `stdinBase64`, if either is given.
pub fn stdin_arg(args: &Value) -> Result<Option<Vec<u8>>, (i64, String)> {
    match (args.get("stdin"), args.get("stdinBase64")) {
        (None, None) => Ok(None),
        (t, b) => crate::bytes::take_bytes(t, b).map(Some).map_err(bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_of_the_wrong_shape_are_refused_before_use() {
        let args = json!({"command": ["a", 1], "env": {"A=B": "x"}, "timeoutMs": -1});
        assert!(str_list(&args, "command", 10).is_err());
        assert!(argv_arg(&args).is_err());
        assert!(argv_arg(&json!({"command": [""]})).is_err());
        assert!(argv_arg(&json!({"command": []})).is_err());
        assert!(env_arg(&args).is_err());
        assert!(u64_arg(&args, "timeoutMs").is_err());
        assert!(str_arg(&json!({"p": "a\u{0}b"}), "p").is_err());
        assert!(required(&json!({}), "p").is_err());
        assert_eq!(limit_arg(&json!({"m": u64::MAX}), "m").unwrap(), MAX_OUTPUT);
        assert_eq!(limit_arg(&json!({}), "m").unwrap(), DEFAULT_OUTPUT);
    }
}
