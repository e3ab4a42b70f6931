//! The results both servers give from a command's bytes: a command's streams, a file, a
//! directory's listing.

use serde_json::{json, Map, Value};

use crate::args::result;
use crate::bytes::{put_bytes, Captured};

/// The most of each stream or file the text form of a result (what a model reads) shows;
/// the structured form has all that was kept.
pub const TEXT_LIMIT: usize = 1 << 20;

/// `bytes` as text for a model (lossy), at most [`TEXT_LIMIT`] of them, the rest named.
fn text_of(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(TEXT_LIMIT)];
    let mut text = String::from_utf8_lossy(shown).into_owned();
    if bytes.len() > shown.len() {
        text.push_str(&format!(
            "\n[{} more bytes in structuredContent]",
            bytes.len() - shown.len()
        ));
    }
    text
}

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
        text_of(&out.bytes),
        text_of(&err.bytes)
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
        Ok(_) => text_of(&got.bytes),
        Err(_) => format!("({} bytes, not UTF-8: in contentBase64)", got.bytes.len()),
    };
    result(text, Value::Object(structured), false)
}

/// `session_list_dir`'s result from [`crate::scripts::LIST_DIR`]'s output (NUL-ended
/// records of type, size and name).
pub fn listing_result(path: &str, out: &Captured) -> Value {
    let mut entries = Vec::new();
    let mut text = String::new();
    let mut records: Vec<&[u8]> = out.bytes.split(|b| *b == 0).collect();
    if out.truncated() {
        // Cut at the bound: the last record may stop inside its name.
        records.pop();
    }
    for record in records.into_iter().filter(|r| !r.is_empty()) {
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
        if text.len() < TEXT_LIMIT {
            text.push_str(&format!(
                "{kind}\t{}\n",
                smithers_terminal::line(&String::from_utf8_lossy(name))
            ));
        }
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
    fn the_text_form_is_bounded_and_a_cut_listing_drops_its_cut_record() {
        let big = Captured {
            bytes: vec![b'x'; TEXT_LIMIT + 10],
            total: (TEXT_LIMIT + 10) as u64,
        };
        let r = exec_result(json!({"exitCode": 0}), &big, &Captured::default(), 1 << 24);
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(text.len() < TEXT_LIMIT + 200, "{}", text.len());
        assert!(text.contains("[10 more bytes in structuredContent]"));
        assert_eq!(
            r["structuredContent"]["stdout"].as_str().unwrap().len(),
            TEXT_LIMIT + 10
        );
        let cut = Captured {
            bytes: b"f\t1\ta\0f\t1\tbc".to_vec(),
            total: 100,
        };
        let r = listing_result(".", &cut);
        assert_eq!(
            r["structuredContent"]["entries"].as_array().unwrap().len(),
            1
        );
    }

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
