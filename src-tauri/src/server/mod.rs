//! The OpenAI-compatible HTTP API (axum), fed by the batching engine. It knows nothing of the
//! desktop shell: [`app`] is the router the `serve` command and the app both mount.

mod admin;
pub mod aliases;
mod anthropic;
mod blocks;
mod cache_admin;
pub mod chat;
mod dialect_errors;
mod embeddings;
mod error;
mod extract;
pub mod listen;
mod live;
mod metrics;
mod ollama;
mod openai;
pub mod openapi;
mod origin;
mod priority;
mod request_log;
mod rerank;
mod responses;
mod run;
mod security;
mod settings;
mod sse;
mod ui;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue, Method};
use axum::routing::{get, post};
use axum::{middleware, Router};
use tower_http::cors::{AllowOrigin, CorsLayer};

pub use error::ApiError;
pub use run::{local_access, RunningServer};

use crate::store::hub::HubClient;
use crate::store::{Pulls, Residency};

/// Settings of the HTTP layer.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Required on every API call when set.
    pub api_key: Option<String>,
    /// Host names the server answers to (DNS-rebinding protection).
    pub allowed_hosts: Vec<String>,
    /// Web page origins trusted besides the server's own, local ones, the app's and editor
    /// webviews (`*`: every origin); others are refused (`origin`) and get no CORS headers.
    pub allowed_origins: Vec<String>,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Most tokens a request may ask for.
    pub max_tokens_limit: usize,
    /// Most stop strings, and their longest length.
    pub max_stop_strings: usize,
    pub max_stop_length: usize,
    /// Most messages in one chat request.
    pub max_messages: usize,
    /// Where the server listens, once bound (for the dashboard's snippets).
    pub listen: Option<std::net::SocketAddr>,
    /// The config file settings changed from the dashboard are saved to (`None`: not saved).
    pub settings_file: Option<std::path::PathBuf>,
    /// Names other tools ask for mapped to local models (later entries win over earlier ones).
    pub aliases: Vec<aliases::Alias>,
    /// Also listen on this port (Ollama clients look at 11434).
    pub ollama_port: Option<u16>,
    /// `tool_choice: "auto"`: a call the model opens is held to its format's grammar.
    pub strict_tools: bool,
    /// `http(s)` image URLs in requests are fetched (off: refused, since a local server that
    /// fetches URLs lets any web page reach your network).
    pub fetch_image_urls: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_key: None,
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: Vec::new(),
            // Images arrive inline as base64: a 20 MB one is 27 MB of JSON (OpenAI takes 50 MB a request).
            max_body_bytes: 64 << 20,
            max_tokens_limit: 32768,
            max_stop_strings: 16,
            max_stop_length: 256,
            max_messages: 2048,
            listen: None,
            settings_file: None,
            aliases: aliases::defaults(),
            ollama_port: None,
            strict_tools: false,
            fetch_image_urls: false,
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The loaded models and the catalog of local ones.
    pub models: Residency,
    /// Downloads from the Hub into the models folder.
    pub pulls: Pulls,
    pub config: Arc<ServerConfig>,
    /// Unix time the server started (`created` in model listings).
    pub created: u64,
    /// The last minutes of live metrics, for a Live page opened after the traffic.
    pub history: live::History,
    /// Each loaded model's chat format, resolved on its first chat request.
    pub formats: Arc<chat::FormatCache>,
    /// Hub models' configs, read for search results.
    pub hub_shapes: crate::store::HubShapes,
}

impl AppState {
    /// Pulls go to the Hub the environment names (`HF_ENDPOINT`, `HF_TOKEN`).
    pub fn new(models: Residency, config: ServerConfig) -> AppState {
        AppState::with_hub(models, config, HubClient::from_env())
    }

    pub fn with_hub(models: Residency, config: ServerConfig, hub: HubClient) -> AppState {
        let pulls = Pulls::new(models.catalog().paths().clone(), hub);
        AppState::from_parts(models, pulls, config)
    }

    /// With pulls that outlive this server (the desktop app restarts its server).
    pub fn from_parts(models: Residency, pulls: Pulls, config: ServerConfig) -> AppState {
        AppState {
            models,
            pulls,
            config: Arc::new(config),
            created: unix_time(),
            history: live::History::default(),
            formats: Arc::default(),
            hub_shapes: Default::default(),
        }
    }
}

impl AppState {
    /// The local model a request names: aliases applied, Ollama's `:latest` tag dropped.
    /// `None`: the model served now (no name, or an alias with an empty target).
    pub fn resolve_model(&self, requested: Option<&str>) -> Option<String> {
        let name = requested.map(str::trim).filter(|n| !n.is_empty())?;
        if let Some(target) = aliases::resolve(&self.config.aliases, name) {
            return (!target.is_empty()).then(|| target.to_string());
        }
        Some(name.strip_suffix(":latest").unwrap_or(name).to_string())
    }
}

/// Seconds since the Unix epoch (`created` fields).
pub fn unix_time() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The whole API as one router.
pub fn app(state: AppState) -> Router {
    let api = Router::new()
        .route("/v1/models", get(openai::models::list))
        .route("/v1/models/{*id}", get(openai::models::get_one))
        .route("/v1/chat/completions", post(openai::chat::completions))
        .route("/v1/completions", post(openai::completions::completions))
        .route("/v1/embeddings", post(openai::embeddings::embeddings))
        .route("/v1/rerank", post(rerank::rerank))
        .route("/rerank", post(rerank::rerank))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .merge(ollama::routes())
        .route("/metrics", get(metrics::prometheus))
        .route("/admin/models", get(admin::list))
        .route("/admin/models/{*id}", axum::routing::delete(admin::delete))
        .route("/admin/status", get(admin::status))
        .route("/admin/load", post(admin::load))
        .route("/admin/unload", post(admin::unload))
        .route("/admin/cluster/take-back", post(admin::take_back))
        .route("/admin/search", get(admin::search))
        .route("/admin/recommended", get(admin::recommended))
        .route("/admin/hub", get(admin::hub_status))
        .route("/admin/model-info", get(admin::model_info))
        .route("/admin/pull", post(admin::pull))
        .route("/admin/pull/cancel", post(admin::cancel_pull))
        .route("/admin/pulls", get(admin::pulls))
        .route("/admin/metrics/stream", get(live::stream))
        .route("/admin/metrics/history", get(live::history))
        .route("/admin/settings", get(settings::get).post(settings::post))
        .route("/admin/cache", get(cache_admin::list).delete(cache_admin::clear))
        .layer(middleware::from_fn_with_state(state.clone(), security::check_api_key));
    Router::new()
        .route("/", get(root).head(ollama::root))
        .route("/health", get(health))
        // Claude Code's reachability check (`HEAD /api/hello`) before its first request, sent
        // unless CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is set.
        .route("/api/hello", get(|| async {}))
        // The UI itself needs no key (it asks for one); every API call it makes does.
        .route("/ui", get(ui::redirect))
        .route("/ui/", get(ui::index))
        .route("/ui/{*path}", get(ui::file))
        .merge(api)
        .fallback(|| async { ApiError::not_found("route") })
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(cors(&state.config))
        // Before CORS: a preflight from an untrusted page is refused like the request it announces.
        .layer(middleware::from_fn_with_state(state.clone(), origin::check_origin))
        .layer(middleware::from_fn_with_state(state.clone(), security::check_host))
        .layer(middleware::from_fn(dialect_errors::rewrite))
        // Outermost: it logs what the client finally gets.
        .layer(middleware::from_fn(request_log::log))
        .with_state(state)
}

async fn health(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> (axum::http::StatusCode, axum::Json<openai::types::Health>) {
    let loaded = state.models.loaded();
    let waiting = state.models.awaited().map(|w| format!("{}: {}", w.id, w.reason));
    let error = waiting.or_else(|| loaded.iter().find_map(|m| m.fault.as_ref().map(|why| format!("{}: {why}", m.id))));
    let status = if error.is_some() { axum::http::StatusCode::SERVICE_UNAVAILABLE } else { axum::http::StatusCode::OK };
    let health = openai::types::Health {
        status: if error.is_some() { "error" } else { "ok" },
        loaded: loaded.into_iter().map(|m| m.id).collect(),
        error,
    };
    (status, axum::Json(health))
}

/// `/`: a browser (it asks for `text/html`) is sent to the web UI; everyone else gets Ollama's
/// "Ollama is running", which Ollama clients check for.
async fn root(headers: axum::http::HeaderMap) -> axum::response::Response {
    use axum::response::IntoResponse;
    let wants_html =
        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|accept| accept.contains("text/html"));
    if wants_html {
        axum::response::Redirect::to("/ui/").into_response()
    } else {
        ollama::root().await.into_response()
    }
}

fn cors(config: &ServerConfig) -> CorsLayer {
    // The same rule as the origin guard, so CORS never allows what the guard refuses.
    let allowed = config.allowed_origins.clone();
    let origins = AllowOrigin::predicate(move |origin: &HeaderValue, request: &axum::http::request::Parts| {
        let host = request.headers.get(header::HOST).and_then(|h| h.to_str().ok());
        origin.to_str().is_ok_and(|o| origin::trusted(o, host, &allowed))
    });
    CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
        .allow_headers([
            header::CONTENT_TYPE,
            header::AUTHORIZATION,
            "x-api-key".parse().expect("valid header name"),
            "x-priority".parse().expect("valid header name"),
        ])
}
