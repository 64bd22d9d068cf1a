//! `POST /v1/rerank` and `/rerank`, in the shape Jina, Cohere and llama.cpp's server share:
//! `query`, `documents` (strings, or `{"text": ...}`), `top_n`, `return_documents` (on by
//! default, as Jina's); the answer lists documents by relevance, each with its index in the
//! request and a score in [0, 1] (the reranker's sigmoid). Inputs longer than the model takes
//! are cut unless `truncate` is false (Cohere's and Jina's servers cut them).

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::server::embeddings::rerank as rank;
use crate::server::extract::ApiJson;
use crate::server::{ApiError, AppState};

#[derive(Deserialize)]
pub struct RerankRequest {
    #[serde(default)]
    model: Option<String>,
    query: String,
    documents: Vec<Value>,
    #[serde(default)]
    top_n: Option<i64>,
    #[serde(default = "yes")]
    return_documents: bool,
    #[serde(default = "yes")]
    truncate: bool,
}

fn yes() -> bool {
    true
}

pub async fn rerank(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<RerankRequest>,
) -> Result<Json<Value>, ApiError> {
    let documents: Vec<String> = request
        .documents
        .iter()
        .map(|d| match d {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("text").and_then(Value::as_str).map(str::to_string),
            _ => None,
        })
        .collect::<Option<_>>()
        .ok_or_else(|| ApiError::invalid("documents", "documents must be strings or objects with a \"text\" string"))?;
    let top_n = match request.top_n {
        None => documents.len(),
        Some(n) if n < 1 => return Err(ApiError::invalid("top_n", "top_n must be at least 1")),
        Some(n) => (n as usize).min(documents.len()),
    };
    let ranked = rank(&state, request.model.as_deref(), request.query, documents.clone(), request.truncate).await?;
    let mut order: Vec<usize> = (0..ranked.scores.len()).collect();
    order.sort_by(|&a, &b| ranked.scores[b].total_cmp(&ranked.scores[a]).then(a.cmp(&b)));
    let results: Vec<Value> = order
        .into_iter()
        .take(top_n)
        .map(|i| {
            let mut result = json!({"index": i, "relevance_score": ranked.scores[i]});
            if request.return_documents {
                result["document"] = json!({"text": documents[i]});
            }
            result
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "model": ranked.model,
        "results": results,
        "usage": {"prompt_tokens": ranked.tokens, "total_tokens": ranked.tokens},
    })))
}
