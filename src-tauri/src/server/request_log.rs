//! One log line per HTTP request: method, path, status and the time to the response's head
//! (a stream's body is still running then). Target `fastmlx::http`: `FASTMLX_LOG=fastmlx::http=info`
//! shows every request; a refused or failed one (4xx, 5xx) is a warning, shown by default, so a
//! client that gives up says why in the server's log too. The query string is left out (it may
//! carry what a user would not want written down).

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

pub async fn log(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    if status.is_client_error() || status.is_server_error() {
        tracing::warn!(target: "fastmlx::http", "{method} {path} {} ({ms:.1} ms)", status.as_u16());
    } else {
        tracing::info!(target: "fastmlx::http", "{method} {path} {} ({ms:.1} ms)", status.as_u16());
    }
    response
}
