//! JSON-RPC 2.0 and the MCP lifecycle: `initialize` (the handshake's versions), `ping`,
//! `tools/list`, `tools/call`; notifications are taken silently; anything else is
//! "method not found".

use serde_json::{json, Value};

use super::tools::Server;

/// The handshake versions this server speaks, oldest first; a client asking for another gets
/// the newest.
const VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The reply to one message (`None` for a notification).
pub fn handle(server: &mut Server, line: &[u8]) -> Option<Value> {
    let message: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return Some(error(Value::Null, -32700, &format!("not JSON: {e}"))),
    };
    if !message.is_object() {
        // A batch (an array) or a bare value: not a request this server takes (the protocol
        // has no batches since 2025-06-18).
        return Some(error(
            Value::Null,
            -32600,
            "a message must be one JSON-RPC object",
        ));
    }
    let id = message.get("id").cloned();
    let method = message["method"].as_str().unwrap_or_default();
    let Some(id) = id else {
        // A notification (initialized, cancelled, ...) or a stray response: nothing to say.
        return None;
    };
    if !matches!(id, Value::String(_) | Value::Number(_)) || message["jsonrpc"] != "2.0" {
        return Some(error(Value::Null, -32600, "not a JSON-RPC 2.0 request"));
    }
    let params = message.get("params").cloned().unwrap_or(json!({}));
    let result = match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": server.list() })),
        "tools/call" => call(server, &params),
        other => Err((-32601, format!("no method {}", crate::output::inert(other)))),
    };
    Some(match result {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err((code, message)) => error(id, code, &message),
    })
}

fn initialize(params: &Value) -> Value {
    let asked = params["protocolVersion"].as_str().unwrap_or_default();
    let version = VERSIONS
        .iter()
        .find(|v| **v == asked)
        .unwrap_or(&VERSIONS[VERSIONS.len() - 1]);
    json!({
        "protocolVersion": version,
        "capabilities": { "tools": { "listChanged": false } },
        "serverInfo": { "name": "smithers-sandbox", "version": env!("CARGO_PKG_VERSION") },
        "instructions": "Sandboxed sessions over one project: start a session, run commands and edit files in it (the project is untouched), look at its change with session_diff, and stop it: its change then waits for a person's review.",
    })
}

fn call(server: &mut Server, params: &Value) -> Result<Value, (i64, String)> {
    let name = params["name"]
        .as_str()
        .ok_or((-32602, "tools/call needs a tool name".to_string()))?;
    let args = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(m)) => Value::Object(m.clone()),
        Some(_) => return Err((-32602, "arguments must be an object".into())),
    };
    server.call(name, &args)
}

pub fn error(id: Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_one_request_object_is_answered_invalid() {
        let mut server = Server::new(std::path::PathBuf::from("/x"), false);
        for bad in [&b"[1,2]"[..], b"3", b"\"x\"", b"{"] {
            let reply = handle(&mut server, bad).expect("an answer");
            let code = reply["error"]["code"].as_i64().unwrap();
            assert!(code == -32600 || code == -32700, "{reply}");
        }
        // A notification gets no answer; a request with an odd id is refused.
        assert!(handle(
            &mut server,
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#
        )
        .is_none());
        let reply = handle(
            &mut server,
            br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
        )
        .unwrap();
        assert_eq!(reply["error"]["code"], -32600);
        let reply = handle(&mut server, br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).unwrap();
        assert_eq!(reply["result"], json!({}));
    }
}
