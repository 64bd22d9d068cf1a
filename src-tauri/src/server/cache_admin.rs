//! `GET /admin/cache` (the prefix cache of each loaded model: bytes, blocks, hit counts) and
//! `DELETE /admin/cache[?model=id]` (empty it, for one model or all).

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::extract::ApiQuery;
use super::{ApiError, AppState};

fn entry(id: &str, m: &crate::engine::Metrics) -> Value {
    json!({
        "model": id,
        "bytes": m.prefix_cache_bytes,
        "blocks": m.prefix_cache_blocks,
        "hits": m.prefix_cache_hits,
        "misses": m.prefix_cache_misses,
        "tokens_reused": m.prefix_cache_tokens_reused,
        "evictions": m.prefix_cache_evictions,
        "disk_bytes": m.prefix_cache_disk_bytes,
        "disk_blocks": m.prefix_cache_disk_blocks,
        "disk_hits": m.prefix_cache_disk_hits,
        "disk_write_skips": m.prefix_cache_disk_write_skips,
        "disk_enabled": m.prefix_cache_disk_enabled,
    })
}

pub async fn list(State(state): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = state.models.engines().iter().map(|s| entry(&s.id, &s.engine.snapshot())).collect();
    Json(json!({"models": models}))
}

#[derive(Deserialize)]
pub struct ClearQuery {
    model: Option<String>,
}

pub async fn clear(State(state): State<AppState>, ApiQuery(q): ApiQuery<ClearQuery>) -> Result<Json<Value>, ApiError> {
    let engines = state.models.engines();
    let chosen: Vec<_> = engines.iter().filter(|s| q.model.as_ref().is_none_or(|m| *m == s.id)).collect();
    if let (Some(model), true) = (&q.model, chosen.is_empty()) {
        return Err(ApiError {
            param: Some("model".into()),
            ..ApiError::not_found(&format!("loaded model {model:?}"))
        });
    }
    for served in &chosen {
        served.engine.clear_prefix_cache();
    }
    Ok(Json(json!({"cleared": chosen.iter().map(|s| s.id.clone()).collect::<Vec<_>>()})))
}
