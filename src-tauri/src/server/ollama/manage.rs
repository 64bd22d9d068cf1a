//! `POST /api/pull` and `DELETE /api/delete` on the model store. Pulls come from the Hugging
//! Face Hub: `owner/name`, or Ollama's own Hub syntax `hf.co/owner/name:Q4_K_M` (the tag picks a
//! GGUF file); Ollama library names pull what an alias names.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::params::{hub_repo, model_name, not_found, Fallback};
use crate::server::extract::ApiJson;
use crate::server::sse::ndjson;
use crate::server::{ApiError, AppState};
use crate::store::{CatalogError, PullRequest, PullState, PullStatus, PullWatch};

pub async fn pull(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response, ApiError> {
    let (name, resolved) = model_name(&state, &body, Fallback::None)?;
    let (repo, gguf) = hub_repo(&name)
        .or_else(|| hub_repo(&resolved))
        .ok_or_else(|| {
            ApiError::invalid(
                "model",
                format!("{name:?} is not a Hugging Face repo: pull owner/name (e.g. mlx-community/Qwen2.5-0.5B-Instruct-4bit) or hf.co/owner/name:Q4_K_M, or map the name to one with --alias"),
            )
        })?;
    let watch = state.pulls.start(PullRequest { repo, revision: "main".into(), gguf });
    if !body.get("stream").and_then(Value::as_bool).unwrap_or(true) {
        return match watch.finished().await {
            PullState::Done { .. } => Ok(Json(json!({"status": "success"})).into_response()),
            PullState::Cancelled => {
                Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "the download was cancelled"))
            }
            PullState::Failed { message } => Err(ApiError::new(StatusCode::BAD_GATEWAY, "hub_error", message)),
            PullState::Running => Err(ApiError::internal("the download stopped without an outcome")),
        };
    }
    let first = futures_util::stream::iter([json!({"status": "pulling manifest"})]);
    Ok(ndjson(futures_util::StreamExt::chain(first, progress_lines(watch))))
}

/// Ollama's progress lines, at most every 250 ms, then `success` or an error line.
fn progress_lines(watch: PullWatch) -> impl futures_util::Stream<Item = Value> {
    futures_util::stream::unfold(Some(watch), |watch| async move {
        let mut watch = watch?;
        let status: PullStatus = watch.status();
        let line = match &status.state {
            PullState::Running => {
                let p = &status.progress;
                let file = if p.file.is_empty() { status.repo.clone() } else { p.file.clone() };
                json!({"status": format!("pulling {file}"), "digest": file, "total": p.total, "completed": p.done})
            }
            PullState::Done { .. } => return Some((json!({"status": "success"}), None)),
            PullState::Cancelled => return Some((json!({"error": "the download was cancelled"}), None)),
            PullState::Failed { message } => return Some((json!({"error": message}), None)),
        };
        tokio::select! {
            _ = watch.state.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        Some((line, Some(watch)))
    })
}

/// Deletes a model FastMLX downloaded (unloading it first); others are refused.
pub async fn delete(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response, ApiError> {
    let (name, id) = model_name(&state, &body, Fallback::None)?;
    let model = state.models.find_local(&id).map_err(|_| not_found(&name))?;
    let _ = state.models.unload(&model.id).await;
    match state.models.catalog().delete(&model.id, false) {
        Ok(_) => Ok(StatusCode::OK.into_response()),
        Err(CatalogError::NotFound(_)) => Err(not_found(&name)),
        Err(e @ CatalogError::NotOwned { .. }) => {
            Err(ApiError::new(StatusCode::FORBIDDEN, "permission_error", e.to_string()))
        }
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}
