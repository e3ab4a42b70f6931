//! JSON-RPC 2.0 and the MCP lifecycle: `initialize` (the handshake's versions), `ping`,
//! `tools/list`; `tools/call` is handed to the server ([`Message::Call`]); notifications are
//! taken silently; anything else is "method not found". The transport (lines on stdio, a POST
//! on HTTP) is the server's.

use serde_json::{json, Value};

use crate::args::CallResult;

/// The handshake versions spoken, oldest first; a client asking for another gets the newest.
pub const VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// What a message asks of the server.
#[derive(Debug)]
pub enum Message {
    /// Answered here (the lifecycle, a malformed message): send it.
    Reply(Value),
    /// A notification or a stray response: nothing is said.
    Nothing,
    /// A tool to call: call it, then send [`reply`]`(id, result)`.
    Call {
        id: Value,
        name: String,
        args: Value,
    },
}

/// What a server is: its tools (as `tools/list` gives them) and what it tells a client at
/// the handshake.
#[derive(Debug, Clone, Copy)]
pub struct About<'a> {
    pub tools: &'a [Value],
    pub instructions: &'a str,
}

/// Reads one message.
pub fn read(bytes: &[u8], about: About<'_>) -> Message {
    let mut message: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return Message::Reply(error(Value::Null, -32700, &format!("not JSON: {e}"))),
    };
    if !message.is_object() {
        // A batch (an array) or a bare value: not a request taken here (the protocol has no
        // batches since 2025-06-18).
        return Message::Reply(error(
            Value::Null,
            -32600,
            "a message must be one JSON-RPC object",
        ));
    }
    let method = message["method"].as_str().unwrap_or_default().to_string();
    let Some(id) = message.get_mut("id").map(Value::take) else {
        // A notification (initialized, cancelled, ...) or a stray response: nothing to say.
        return Message::Nothing;
    };
    if !matches!(id, Value::String(_) | Value::Number(_)) || message["jsonrpc"] != "2.0" {
        return Message::Reply(error(Value::Null, -32600, "not a JSON-RPC 2.0 request"));
    }
    if message.get("method").is_none() {
        // A response to a request of ours (none are made): nothing to say.
        return Message::Nothing;
    }
    // Taken, not copied: a message may be as large as the transport lets it be.
    let params = message
        .get_mut("params")
        .map(Value::take)
        .unwrap_or(json!({}));
    let result = match method.as_str() {
        "initialize" => Ok(initialize(&params, about.instructions)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": about.tools })),
        "tools/call" => match call_of(params) {
            Ok((name, args)) => return Message::Call { id, name, args },
            Err(e) => Err(e),
        },
        other => Err((
            -32601,
            format!("no method {}", smithers_terminal::line(other)),
        )),
    };
    Message::Reply(reply(id, result))
}

/// The answer to request `id`.
pub fn reply(id: Value, result: CallResult) -> Value {
    match result {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err((code, message)) => error(id, code, &message),
    }
}

fn initialize(params: &Value, instructions: &str) -> Value {
    let asked = params["protocolVersion"].as_str().unwrap_or_default();
    let version = VERSIONS
        .iter()
        .find(|v| **v == asked)
        .unwrap_or(&VERSIONS[VERSIONS.len() - 1]);
    json!({
        "protocolVersion": version,
        "capabilities": { "tools": { "listChanged": false } },
        "serverInfo": { "name": "smithers-sandbox", "version": env!("CARGO_PKG_VERSION") },
        "instructions": instructions,
    })
}

fn call_of(mut params: Value) -> Result<(String, Value), (i64, String)> {
    let name = params["name"]
        .as_str()
        .ok_or((-32602, "tools/call needs a tool name".to_string()))?
        .to_string();
    let args = match params.get_mut("arguments").map(Value::take) {
        None | Some(Value::Null) => json!({}),
        Some(args @ Value::Object(_)) => args,
        Some(_) => return Err((-32602, "arguments must be an object".into())),
    };
    Ok((name, args))
}

pub fn error(id: Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ABOUT: About<'static> = About {
        tools: &[],
        instructions: "",
    };

    fn answer(bytes: &[u8]) -> Option<Value> {
        match read(bytes, ABOUT) {
            Message::Reply(v) => Some(v),
            Message::Nothing => None,
            Message::Call { id, name, .. } => Some(json!({ "call": name, "id": id })),
        }
    }

    #[test]
    fn what_is_not_one_request_object_is_answered_invalid() {
        for bad in [&b"[1,2]"[..], b"3", b"\"x\"", b"{"] {
            let reply = answer(bad).expect("an answer");
            let code = reply["error"]["code"].as_i64().unwrap();
            assert!(code == -32600 || code == -32700, "{reply}");
        }
        // A notification gets no answer; a request with an odd id is refused.
        assert!(answer(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_none());
        let reply = answer(br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#).unwrap();
        assert_eq!(reply["error"]["code"], -32600);
        let reply = answer(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).unwrap();
        assert_eq!(reply["result"], json!({}));
    }

    #[test]
    fn a_tool_call_is_handed_over_with_its_arguments_checked() {
        let call =
            answer(br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"t"}}"#)
                .unwrap();
        assert_eq!(call, json!({ "call": "t", "id": "a" }));
        let refused = answer(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":[1]}}"#,
        )
        .unwrap();
        assert_eq!(refused["error"]["code"], -32602);
        let unknown = answer(br#"{"jsonrpc":"2.0","id":1,"method":"x\u001b[2J"}"#).unwrap();
        assert!(!unknown.to_string().contains("\\u001b"), "{unknown}");
    }
}
