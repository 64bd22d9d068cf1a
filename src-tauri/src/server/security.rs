//! Safe on localhost: an optional API key (Bearer or `x-api-key`, compared in constant time)
//! and a Host-header allow-list, so a web page cannot reach the server by DNS rebinding.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// Rejects requests whose Host is not an allowed name.
pub async fn check_host(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(host) = request.headers().get(header::HOST) {
        let host = host.to_str().unwrap_or_default();
        if !host_allowed(host, &state.config.allowed_hosts) {
            return ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "permission_error",
                format!("host {host:?} is not allowed (add it with --allowed-host)"),
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// Requires the API key, when one is configured.
pub async fn check_api_key(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(expected) = &state.config.api_key {
        let headers = request.headers();
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
        let given = bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
        if !given.is_some_and(|g| constant_time_eq(g.trim().as_bytes(), expected.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// `name[:port]` (or `[v6]:port`) against the allowed names, case-insensitively.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':')
            .map_or(host, |(name, port)| if port.chars().all(|c| c.is_ascii_digit()) { name } else { host })
    };
    allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Equal without an early exit, so the time taken says nothing about where keys differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let allowed = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
        for ok in ["localhost", "localhost:8080", "LOCALHOST:1", "127.0.0.1:9", "[::1]:8080"] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for bad in ["evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.2", "[::2]:1"] {
            assert!(!host_allowed(bad, &allowed), "{bad}");
        }
    }

    #[test]
    fn keys() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(!constant_time_eq(b"x", b""));
    }
}
