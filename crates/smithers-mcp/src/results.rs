//! The results both servers give from a command's bytes: a command's streams, a file, a
//! directory's listing.

use serde_json::{json, Map, Value};

use crate::args::result;
use crate::bytes::{put_bytes, Captured};

/// `session_exec`'s result: the command's end (`exit`, as the session reports it) and its
/// two streams, each cut at `limit` (said, with the whole count).
pub fn exec_result(exit: Value, out: &Captured, err: &Captured, limit: usize) -> Value {
    let mut structured = Map::new();
    structured.insert("exit".into(), exit.clone());
    put_bytes(&mut structured, "stdout", &out.bytes);
    put_bytes(&mut structured, "stderr", &err.bytes);
    structured.insert("stdoutBytes".into(), json!(out.total));
    structured.insert("stderrBytes".into(), json!(err.total));
    structured.insert("stdoutTruncated".into(), json!(out.truncated()));
    structured.insert("stderrTruncated".into(), json!(err.truncated()));
    let text = format!(
        "{} (exit code {}){}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        exit["termination"].as_str().unwrap_or("?"),
        exit["exitCode"],
        if out.truncated() || err.truncated() {
            format!(" [output cut at {limit} bytes per stream]")
        } else {
            String::new()
        },
        String::from_utf8_lossy(&out.bytes),
        String::from_utf8_lossy(&err.bytes)
    );
    result(text, Value::Object(structured), false)
}

/// `session_read`'s result: the file's bytes up to the bound (its size known only when it
/// came whole).
pub fn read_result(got: &Captured) -> Value {
    let truncated = got.truncated();
    let mut structured = Map::new();
    put_bytes(&mut structured, "content", &got.bytes);
    structured.insert("sizeBytes".into(), json!((!truncated).then_some(got.total)));
    structured.insert("truncated".into(), json!(truncated));
    let text = match std::str::from_utf8(&got.bytes) {
        Ok(t) => t.to_string(),
        Err(_) => format!("({} bytes, not UTF-8: in contentBase64)", got.bytes.len()),
    };
    result(text, Value::Object(structured), false)
}

/// `session_list_dir`'s result from [`crate::scripts::LIST_DIR`]'s output (NUL-ended
/// records of type, size and name).
pub fn listing_result(path: &str, out: &Captured) -> Value {
    let mut entries = Vec::new();
    let mut text = String::new();
    for record in out.bytes.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let mut fields = record.splitn(3, |b| *b == b'\t');
        let (Some(kind), Some(size), Some(name)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let kind = match kind {
            b"d" => "directory",
            b"f" => "file",
            b"l" => "symlink",
            _ => "other",
        };
        let mut entry = Map::new();
        put_bytes(&mut entry, "name", name);
        entry.insert("type".into(), json!(kind));
        entry.insert(
            "sizeBytes".into(),
            json!(String::from_utf8_lossy(size).parse::<u64>().ok()),
        );
        text.push_str(&format!(
            "{kind}\t{}\n",
            smithers_terminal::line(&String::from_utf8_lossy(name))
        ));
        entries.push(Value::Object(entry));
    }
    result(
        text,
        json!({ "path": path, "entries": entries, "truncated": out.truncated() }),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_names_each_entry_exactly_and_shows_it_inert() {
        let out = Captured {
            bytes: b"d\t4096\tsub\0f\t3\t\xffx\0l\t1\tesc\x1b[2J\0".to_vec(),
            total: 0,
        };
        let r = listing_result(".", &out);
        let entries = r["structuredContent"]["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0]["type"], "directory");
        assert_eq!(entries[1]["nameBase64"], "/3g=");
        assert_eq!(entries[2]["name"], "esc\u{1b}[2J");
        assert!(!r["content"][0]["text"].as_str().unwrap().contains('\u{1b}'));
    }
}
