//! The HTTP API's router over a tiny model, driven by oneshot requests (no socket).

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use fastmlx::engine::{EngineConfig, EngineHandle};
use fastmlx::fixtures::synthetic;
use fastmlx::model::Arch;
use fastmlx::server::{app, AppState, ServerConfig};
use fastmlx::store::{Catalog, Residency, ResidencyConfig, StorePaths};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

pub struct Harness {
    pub _dir: tempfile::TempDir,
    pub engine: EngineHandle,
    pub state: AppState,
    /// The id the API knows the model by.
    pub id: String,
}

/// The API over one tiny model loaded from `dir` (FastMLX's models folder in these tests).
pub async fn harness_in(dir: tempfile::TempDir, engine_config: EngineConfig, config: ServerConfig) -> Harness {
    let models_dir = dir.path().join("models");
    let model = models_dir.join("tiny-qwen2");
    if !model.exists() {
        synthetic::write_tiny_model(&model, Arch::Qwen2, 5, None).unwrap();
    }
    let residency = Residency::new(
        Catalog::new(StorePaths::only(&models_dir)),
        ResidencyConfig { engine: engine_config, ..Default::default() },
    );
    let served = residency.load("tiny-qwen2", None).await.unwrap();
    let state = AppState::new(residency, config);
    Harness { _dir: dir, engine: served.engine, state, id: served.id }
}

pub async fn harness(engine_config: EngineConfig, config: ServerConfig) -> Harness {
    harness_in(tempfile::tempdir().unwrap(), engine_config, config).await
}

pub async fn default_harness() -> Harness {
    harness(EngineConfig::default(), ServerConfig::default()).await
}

pub fn post(uri: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(uri)
        .header(header::HOST, "localhost:8080")
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .unwrap()
}

/// A `DELETE`, with a JSON body when given (Ollama's `/api/delete` takes one).
pub fn delete(uri: &str, body: Option<Value>) -> Request<Body> {
    let request = Request::delete(uri).header(header::HOST, "localhost");
    match body {
        Some(body) => request.header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string())),
        None => request.body(Body::empty()),
    }
    .unwrap()
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).header(header::HOST, "127.0.0.1:8080").body(Body::empty()).unwrap()
}

/// Longest a test request may take, answer and body, before the test fails (not hangs).
pub const REQUEST_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

pub async fn send(h: &Harness, request: Request<Body>) -> (StatusCode, String) {
    let what = format!("{} {}", request.method(), request.uri());
    let exchange = async {
        let response = app(h.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).to_string())
    };
    tokio::time::timeout(REQUEST_LIMIT, exchange)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {REQUEST_LIMIT:?}"))
}

pub async fn send_json(h: &Harness, request: Request<Body>) -> (StatusCode, Value) {
    let (status, body) = send(h, request).await;
    (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}")))
}

pub fn chat(extra: Value) -> String {
    let mut body = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body.to_string()
}

/// `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

/// The harness's models served on a real socket (127.0.0.1, a free port), for what only the HTTP
/// layer sees: raw bytes, and tasks `RunningServer` starts.
pub async fn serve_on_a_socket(h: &Harness) -> fastmlx::server::RunningServer {
    fastmlx::server::RunningServer::start(
        h.state.models.clone(),
        h.state.pulls.clone(),
        ServerConfig::default(),
        [127, 0, 0, 1].into(),
        0,
    )
    .await
    .unwrap()
}

/// Sends `request` as raw bytes and reads the answer to the end (for at most `limit`).
pub async fn raw_exchange(address: std::net::SocketAddr, request: &[u8], limit: std::time::Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(limit, socket.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).to_string()
}
