//! JSON bodies in and out, shared by the sandbox handlers (`routes`) and the review handlers
//! (`review`).

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Reads a JSON body of at most `limit` bytes: 413 beyond it, 400 when it is not the
/// expected JSON (the message says where serde stopped).
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        // The limit error of http-body-util is not re-exported; its message is stable.
        if error_chain(&e).contains("length limit exceeded") {
            ApiError::too_large("jsonBytes", limit as u64)
        } else {
            ApiError::malformed(format!("could not read the request body: {e}"))
        }
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::malformed(format!("malformed JSON body: {e}")))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

pub(crate) fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
