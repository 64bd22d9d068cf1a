//! `POST /api/embed` (`input`: a string or a list; `truncate`, on by default; `dimensions`;
//! vectors unit-length, as Ollama returns them) and the older `POST /api/embeddings` (`prompt`,
//! one vector as the model makes it). Without input, `/api/embed` loads the model (or, with
//! `keep_alive: 0`, unloads it), as Ollama does.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::params::{apply_keep_alive, keep_alive, model_name, named, nanos, Fallback};
use crate::model::ModelKind;
use crate::server::embeddings::{embed, EmbedParams, Inputs};
use crate::server::extract::ApiJson;
use crate::server::{ApiError, AppState};
use crate::store::ResidencyError;

pub async fn embed_many(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Json<Value>, ApiError> {
    let (name, id) = model_name(&state, &body, Fallback::Served)?;
    let keep = keep_alive(&body)?;
    let texts: Vec<String> = match body.get("input") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::invalid("input", "input must be a string or a list of strings"))?,
        Some(_) => return Err(ApiError::invalid("input", "input must be a string or a list of strings")),
    };
    if texts.is_empty() {
        load_or_unload(&state, &name, &id, keep).await?;
        return Ok(Json(json!({"model": name, "embeddings": []})));
    }
    let truncate = match body.get("truncate") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("truncate", "truncate must be true or false")),
    };
    let params = EmbedParams { truncate, dimensions: dimensions(&body)?, normalize: true, prompt_name: None };
    let embedded = embed(&state, Some(&id), Inputs::Texts(texts), params).await.map_err(|e| named(e, &name, &id))?;
    apply_keep_alive(&state, &embedded.model, keep);
    Ok(Json(json!({
        "model": name,
        "embeddings": embedded.vectors,
        "total_duration": nanos(embedded.total),
        "load_duration": nanos(embedded.load),
        "prompt_eval_count": embedded.prompt_tokens,
    })))
}

pub async fn embed_one(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Json<Value>, ApiError> {
    let (name, id) = model_name(&state, &body, Fallback::Served)?;
    let keep = keep_alive(&body)?;
    let prompt = match body.get("prompt") {
        None | Some(Value::Null) => return Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::invalid("prompt", "prompt must be a string")),
    };
    let params = EmbedParams { truncate: true, ..EmbedParams::default() };
    let embedded =
        embed(&state, Some(&id), Inputs::Texts(vec![prompt]), params).await.map_err(|e| named(e, &name, &id))?;
    apply_keep_alive(&state, &embedded.model, keep);
    Ok(Json(json!({"embedding": embedded.vectors.into_iter().next().unwrap_or_default()})))
}

fn dimensions(body: &Value) -> Result<Option<usize>, ApiError> {
    match body.get("dimensions") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(d) if d >= 1 => Ok(Some(d as usize)),
            _ => Err(ApiError::invalid("dimensions", "dimensions must be a positive integer")),
        },
    }
}

async fn load_or_unload(
    state: &AppState,
    name: &str,
    id: &str,
    keep: Option<Option<Duration>>,
) -> Result<(), ApiError> {
    if keep == Some(Some(Duration::ZERO)) {
        return match state.models.unload(id).await {
            Ok(()) | Err(ResidencyError::NotLoaded(_)) => Ok(()),
            Err(e) => Err(named(e.into(), name, id)),
        };
    }
    match state.models.load_any(id, None).await.map_err(|e| named(e.into(), name, id))? {
        ModelKind::Embedding => {}
        kind => {
            let e = ResidencyError::WrongKind { id: id.to_string(), kind, wanted: ModelKind::Embedding };
            return Err(e.into());
        }
    }
    apply_keep_alive(state, id, keep);
    Ok(())
}
