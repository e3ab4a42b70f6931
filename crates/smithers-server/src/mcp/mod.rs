//! The MCP endpoint, `POST /v1/mcp`: the tools of `smithers-sandbox mcp` (the same protocol,
//! schemas and byte encoding: `smithers-mcp`) over the MCP "streamable HTTP" transport, for
//! the sessions of this host. Behind the same bearer token as the rest of `/v1`: an agent
//! reaches only its token's sandboxes (another token's are "not found", as over HTTP), under
//! the operator's ceilings.
//!
//! The server is stateless at the protocol level (no `Mcp-Session-Id`: every call names the
//! sandbox it works on) and answers each request with one JSON body (the transport allows
//! that in place of an event stream); it offers no stream of its own and no protocol session
//! to end (`GET` and `DELETE` are 405, as the transport says for a server without them). A browser page cannot drive it: a request carrying an
//! `Origin` other than the host it was sent to is refused (DNS rebinding), and only
//! `application/json` bodies are taken (a cross-origin page cannot send one without a
//! preflight the server never grants).

mod tools;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use smithers_mcp::args::MAX_MESSAGE;
use smithers_mcp::protocol::{self, About, Message};

use crate::state::{AppState, Owner};

/// What the endpoint tells a client at the handshake.
const INSTRUCTIONS: &str = "Sandboxed sessions on a sandbox host: start a session (over a sandbox your client shipped, or an empty workspace), run commands and edit files in it, checkpoint and restore it, and stop it: its change is then collected into a bundle that waits for your client's review. Nothing here applies a change anywhere.";

/// The tools `tools/list` gives, made once.
static TOOLS: std::sync::LazyLock<Vec<Value>> =
    std::sync::LazyLock::new(smithers_mcp::schema::hosted);

/// `POST /v1/mcp`: one JSON-RPC message, one answer.
pub(crate) async fn post(
    State(state): State<Arc<AppState>>,
    Extension(owner): Extension<Owner>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(refused) = check_request(&headers) {
        return refused;
    }
    let bytes = match axum::body::to_bytes(body, MAX_MESSAGE).await {
        Ok(b) => b,
        Err(_) => {
            return answer(
                StatusCode::PAYLOAD_TOO_LARGE,
                &protocol::error(
                    Value::Null,
                    -32600,
                    &format!("a message is over {MAX_MESSAGE} bytes, or was cut off"),
                ),
            )
        }
    };
    let about = About {
        tools: &TOOLS,
        instructions: INSTRUCTIONS,
    };
    let reply = match protocol::read(&bytes, about) {
        Message::Reply(reply) => reply,
        // A notification or a response: accepted, nothing to say (the transport's 202).
        Message::Nothing => return StatusCode::ACCEPTED.into_response(),
        Message::Call { id, name, args } => {
            protocol::reply(id, tools::call(&state, &owner, &name, &args).await)
        }
    };
    answer(StatusCode::OK, &reply)
}

/// The transport's rules for a request, checked before its body is read.
#[allow(clippy::result_large_err)]
fn check_request(headers: &HeaderMap) -> Result<(), Response> {
    let refuse = |status: StatusCode, message: &str| {
        Err(answer(
            status,
            &protocol::error(Value::Null, -32600, message),
        ))
    };
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        if !same_host(origin.to_str().unwrap_or_default(), host) {
            return refuse(
                StatusCode::FORBIDDEN,
                "a request from a web page of another origin is refused",
            );
        }
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the body must be application/json",
        );
    }
    if let Some(version) = headers.get("mcp-protocol-version") {
        let known = version
            .to_str()
            .is_ok_and(|v| protocol::VERSIONS.contains(&v));
        if !known {
            return refuse(
                StatusCode::BAD_REQUEST,
                "an MCP-Protocol-Version this server does not speak",
            );
        }
    }
    Ok(())
}

/// Whether `origin` (`scheme://host[:port]`) names the host the request was sent to.
fn same_host(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    origin
        .split_once("://")
        .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
}

fn answer(status: StatusCode, message: &Value) -> Response {
    crate::json::json_response(status, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, axum::http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn a_web_page_of_another_origin_and_a_body_not_json_are_refused() {
        let ok = [
            ("host", "127.0.0.1:8080"),
            ("content-type", "application/json"),
        ];
        assert!(check_request(&headers(&ok)).is_ok());
        let same = headers(&[
            ("host", "127.0.0.1:8080"),
            ("content-type", "application/json; charset=utf-8"),
            ("origin", "http://127.0.0.1:8080"),
        ]);
        assert!(check_request(&same).is_ok());
        let other = headers(&[
            ("host", "127.0.0.1:8080"),
            ("content-type", "application/json"),
            ("origin", "http://evil.example"),
        ]);
        assert_eq!(
            check_request(&other).unwrap_err().status(),
            StatusCode::FORBIDDEN
        );
        let plain = headers(&[("host", "h"), ("content-type", "text/plain")]);
        assert_eq!(
            check_request(&plain).unwrap_err().status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        let version = headers(&[
            ("content-type", "application/json"),
            ("mcp-protocol-version", "1999-01-01"),
        ]);
        assert_eq!(
            check_request(&version).unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
    }
}
