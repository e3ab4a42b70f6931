//! The step's result: its result file, else a JSON object on its stdout, read without
//! trusting what the sandbox wrote.

use std::path::Path;

use serde_json::Value;
use smithers_runtime::output::Capture;

/// Largest result JSON file read back (the README limit of the bundle).
const MAX_RESULT_BYTES: u64 = 5 << 20;

/// What reading the step's result file found.
enum Untrusted {
    Missing,
    TooBig(u64),
    Bytes(Vec<u8>),
}

/// Reads a host file the sandbox wrote, without following a symlink it may have planted.
fn read_untrusted(path: &Path, max: u64) -> Untrusted {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return Untrusted::Missing;
    };
    let Ok(meta) = file.metadata() else {
        return Untrusted::Missing;
    };
    if !meta.is_file() {
        return Untrusted::Missing;
    }
    if meta.len() > max {
        return Untrusted::TooBig(meta.len());
    }
    let mut out = Vec::new();
    if file.take(max + 1).read_to_end(&mut out).is_err() {
        return Untrusted::Missing;
    }
    if out.len() as u64 > max {
        return Untrusted::TooBig(out.len() as u64);
    }
    Untrusted::Bytes(out)
}

/// Parses a result document: a JSON object. Errors say why (serde names a recursion limit
/// for a too-deep document).
fn result_json(bytes: &[u8]) -> Result<Option<Value>, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| "is not UTF-8".to_string())?
        .trim();
    if text.is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(Some(v)),
        Ok(_) => Err("is not a JSON object".to_string()),
        Err(e) if e.to_string().contains("recursion limit") => Err(format!(
            "exceeds the maximum nesting depth the runtime accepts ({e})"
        )),
        Err(e) => Err(format!("is not valid JSON ({e})")),
    }
}

/// The step's result: the result file, else stdout when it holds a JSON object. A result the
/// step clearly meant to give but that breaks a limit is reported (never dropped silently).
pub(super) fn step_result(result_file: &Path, out: &Capture) -> (Option<Value>, Option<String>) {
    match read_untrusted(result_file, MAX_RESULT_BYTES) {
        Untrusted::TooBig(n) => {
            return (
                None,
                Some(format!(
                    "the result JSON ({n} bytes) exceeds the limit of {MAX_RESULT_BYTES} bytes (SANDBOX_MAX_README_BYTES)"
                )),
            )
        }
        Untrusted::Bytes(b) => {
            return match result_json(&b) {
                Ok(v) => (v, None),
                Err(why) => (None, Some(format!("the result JSON {why}"))),
            }
        }
        Untrusted::Missing => {}
    }
    let looks_like_json = out
        .copy()
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    if !looks_like_json {
        return (None, None);
    }
    if let Some(cap) = out.cap() {
        let cap = cap.control();
        return (
            None,
            Some(format!(
                "the result JSON on stdout exceeds {cap} and was truncated"
            )),
        );
    }
    match result_json(out.copy()) {
        Ok(v) => (v, None),
        // Plain output that happens to start with `{` is not a result; a too-deep object is.
        Err(why) if why.contains("depth") => {
            (None, Some(format!("the result JSON on stdout {why}")))
        }
        Err(_) => (None, None),
    }
}
