//! Ollama's API on the same port (and on Ollama's own, 11434, with `--ollama-port`): what VS Code
//! Copilot, Zed, JetBrains and the Ollama providers of Continue, Cline and Roo speak. Requests
//! are translated into the server's common chat and completion requests; answers are rendered
//! as Ollama's NDJSON. Errors are `{"error": "..."}` (see `dialect_errors`).

mod chat;
mod embed;
mod manage;
mod models;
mod params;

use axum::routing::{delete, get, post};
use axum::Router;

use super::AppState;

/// The version reported: VS Code Copilot requires 0.6.4 or later.
pub const VERSION: &str = "0.9.0";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/version", get(models::version))
        .route("/api/tags", get(models::tags))
        .route("/api/show", post(models::show))
        .route("/api/ps", get(models::ps))
        .route("/api/chat", post(chat::chat))
        .route("/api/generate", post(chat::generate))
        .route("/api/embed", post(embed::embed_many))
        .route("/api/embeddings", post(embed::embed_one))
        .route("/api/pull", post(manage::pull))
        .route("/api/delete", delete(manage::delete))
}

/// `GET /`: Ollama clients probe it.
pub async fn root() -> &'static str {
    "Ollama is running"
}
