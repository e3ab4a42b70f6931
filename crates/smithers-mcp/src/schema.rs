//! The tools' descriptions and input schemas, as `tools/list` gives them.

use serde_json::{json, Value};

fn id() -> Value {
    json!({ "type": "string", "description": "The session's id (from session_start)." })
}

/// The tools of a `serve` host's endpoint: those of [`all`] that a host's sessions offer, its
/// `session_start` over a sandbox the client shipped (or an empty one). A host has no project
/// of its own to diff against: that tool is not offered there, and accept is the client's (it
/// fetches the bundle).
pub fn hosted() -> Vec<Value> {
    const OFFERED: [&str; 10] = [
        "session_list",
        "session_exec",
        "session_read",
        "session_write",
        "session_list_dir",
        "session_checkpoint",
        "session_restore",
        "session_fork",
        "session_stop",
        "session_start",
    ];
    let mut tools = vec![tool(
        "session_start",
        "Start a session: a sandbox of this host held for many commands, over the workspace of a sandbox your client created and shipped (sandboxId), or an empty /workspace. Its change is collected into a bundle when it stops, for your client's review.",
        json!({
            "sandboxId": { "type": "string", "description": "A shipped sandbox of this token (sbx-...); none: a new sandbox with an empty workspace and the host's limits." }
        }),
        &[],
    )];
    tools.extend(
        all()
            .into_iter()
            .filter(|t| t["name"] != "session_start" && OFFERED.iter().any(|n| t["name"] == *n)),
    );
    tools
}

/// Every tool (`session_accept` among them; the server leaves it out unless allowed).
pub fn all() -> Vec<Value> {
    vec![
        tool(
            "session_start",
            "Start a session: a sandbox over the project, held for many commands. The project is never changed by it; its change waits for review when it stops.",
            json!({
                "idleTimeout": { "type": "string", "description": "End it after this long without a command (30s, 10m, 1h; default 30m)." },
                "timeout": { "type": "string", "description": "End it after this long in all." },
                "memory": { "type": "string", "description": "Memory limit (512m, 2g)." },
                "cpus": { "type": "string", "description": "CPU limit in cores (1.5)." },
                "allowHosts": { "type": "array", "items": { "type": "string" }, "description": "Hosts it may reach (NAME[:PORTS]), among those the operator allows this server; none by default." }
            }),
            &[],
        ),
        tool("session_list", "The sessions this server started, and their state.", json!({}), &[]),
        tool(
            "session_exec",
            "Run a command in the session (argv, no shell unless you run one). Its stdout and stderr come back (text, or base64 when not UTF-8), bounded.",
            json!({
                "sessionId": id(),
                "command": { "type": "array", "items": { "type": "string" }, "minItems": 1 },
                "cwd": { "type": "string", "description": "Absolute in the sandbox, or relative to /workspace." },
                "env": { "type": "object", "additionalProperties": { "type": "string" } },
                "stdin": { "type": "string" },
                "stdinBase64": { "type": "string" },
                "timeoutMs": { "type": "integer", "minimum": 0 },
                "maxOutputBytes": { "type": "integer", "minimum": 0, "description": "Per stream (default 1 MiB, at most 16 MiB)." }
            }),
            &["sessionId", "command"],
        ),
        tool(
            "session_read",
            "Read a file of the session (relative to /workspace, or absolute in the sandbox): text, or base64 when not UTF-8.",
            json!({ "sessionId": id(), "path": { "type": "string" }, "maxBytes": { "type": "integer", "minimum": 0 } }),
            &["sessionId", "path"],
        ),
        tool(
            "session_write",
            "Write a file of the session (its parent directories made): content as text, or contentBase64.",
            json!({ "sessionId": id(), "path": { "type": "string" }, "content": { "type": "string" }, "contentBase64": { "type": "string" } }),
            &["sessionId", "path"],
        ),
        tool(
            "session_list_dir",
            "List a directory of the session: each entry's name, type and size.",
            json!({ "sessionId": id(), "path": { "type": "string", "description": "Default: /workspace." } }),
            &["sessionId"],
        ),
        tool(
            "session_diff",
            "The session's change to the project so far, as the review will show it.",
            json!({ "sessionId": id() }),
            &["sessionId"],
        ),
        tool(
            "session_checkpoint",
            "Freeze the session's workspace as it is now (no file copied); returns its name (cp-1, cp-2, ...) for session_restore and session_fork. Refused (BUSY) while a command runs.",
            json!({ "sessionId": id() }),
            &["sessionId"],
        ),
        tool(
            "session_restore",
            "Put the session's workspace back to a checkpoint; what was written since is dropped.",
            json!({ "sessionId": id(), "checkpoint": { "type": "string" } }),
            &["sessionId", "checkpoint"],
        ),
        tool(
            "session_fork",
            "Start a new session whose workspace starts from this one's (now, or a checkpoint); the two then change apart. No process is carried over.",
            json!({ "sessionId": id(), "checkpoint": { "type": "string", "description": "Default: the workspace as it is now." } }),
            &["sessionId"],
        ),
        tool(
            "session_stop",
            "Stop the session: its processes end and its change waits for a person's review.",
            json!({ "sessionId": id() }),
            &["sessionId"],
        ),
        tool(
            "session_accept",
            "Apply a stopped session's reviewed change to the project (offered only when the operator allows it).",
            json!({ "sessionId": id() }),
            &["sessionId"],
        ),
    ]
}

fn tool(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_offers_its_own_start_and_no_diff_or_accept() {
        let names: Vec<String> = hosted()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names.len(), 10, "{names:?}");
        assert_eq!(names.iter().filter(|n| *n == "session_start").count(), 1);
        for absent in ["session_diff", "session_accept"] {
            assert!(!names.iter().any(|n| n == absent), "{absent}");
        }
        assert!(hosted()[0]["inputSchema"]["properties"]["sandboxId"].is_object());
    }
}
