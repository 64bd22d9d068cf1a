//! Errors in each dialect's own envelope. Handlers, extractors and middleware all return
//! [`ApiError`] (OpenAI's `{"error": {...}}`); this layer rewrites an error response by the
//! path it answers: Anthropic's `{"type": "error", "error": {"type", "message"}}` under
//! `/v1/messages`, Ollama's `{"error": "message"}` under `/api/`. The SDKs raise their own
//! exception types only from their own shapes.

use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    Ollama,
}

pub fn dialect_of(path: &str) -> Dialect {
    if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        Dialect::Anthropic
    } else if path.starts_with("/api/") {
        Dialect::Ollama
    } else {
        Dialect::OpenAi
    }
}

pub async fn rewrite(request: Request, next: Next) -> Response {
    let dialect = dialect_of(request.uri().path());
    let response = next.run(request).await;
    let is_json =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if dialect == Dialect::OpenAi || response.status().as_u16() < 400 || !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = to_bytes(body, 1 << 20).await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "error body unreadable").into_response();
    };
    let rewritten = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| convert(dialect, parts.status, &v));
    let body = match rewritten {
        Some(v) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            Body::from(v.to_string())
        }
        None => Body::from(bytes),
    };
    Response::from_parts(parts, body)
}

/// An OpenAI error body in `dialect`'s envelope (`None`: not an OpenAI error body).
pub fn convert(dialect: Dialect, status: StatusCode, body: &Value) -> Option<Value> {
    let error = body.get("error")?;
    let message = error.get("message")?.as_str()?;
    Some(match dialect {
        Dialect::OpenAi => body.clone(),
        Dialect::Ollama => json!({ "error": message }),
        Dialect::Anthropic => {
            json!({ "type": "error", "error": { "type": anthropic_type(status), "message": message } })
        }
    })
}

/// `error` in `dialect`'s envelope, for errors sent inside a stream (no middleware sees those).
pub fn envelope(dialect: Dialect, error: &super::ApiError) -> Value {
    convert(dialect, error.status, &error.body()).expect("ApiError bodies are OpenAI error bodies")
}

/// Anthropic's error types, by status as its API documents them.
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::ApiError;

    #[test]
    fn envelopes() {
        let e = ApiError::invalid("max_tokens", "max_tokens must be at least 1");
        assert_eq!(
            convert(Dialect::Ollama, e.status, &e.body()),
            Some(json!({"error": "max_tokens must be at least 1"}))
        );
        assert_eq!(
            convert(Dialect::Anthropic, e.status, &e.body()),
            Some(
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens must be at least 1"}})
            )
        );
        let busy = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "busy");
        assert_eq!(
            convert(Dialect::Anthropic, busy.status, &busy.body()).unwrap()["error"]["type"],
            "overloaded_error"
        );
        assert_eq!(convert(Dialect::Ollama, StatusCode::OK, &json!({"ok": true})), None);
        assert_eq!(dialect_of("/v1/messages/count_tokens"), Dialect::Anthropic);
        assert_eq!(dialect_of("/api/chat"), Dialect::Ollama);
        assert_eq!(dialect_of("/v1/responses"), Dialect::OpenAi);
    }
}
