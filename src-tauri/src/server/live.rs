//! `GET /admin/metrics/stream`: every loaded model's engine metrics, MLX memory and the recent
//! requests, as a server-sent event twice a second (the dashboard's live graphs).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use serde::Serialize;

use super::AppState;
use crate::engine::RecentRequest;

#[derive(Serialize)]
struct ModelLive {
    id: String,
    running: usize,
    queued: usize,
    batch_size: usize,
    prefill_tokens_per_sec: f64,
    decode_tokens_per_sec: f64,
    kv_bytes: usize,
    kv_reserved_bytes: usize,
    kv_budget_bytes: usize,
    requests_total: u64,
    generated_tokens_total: u64,
    prefix_cache_hits: u64,
    prefix_cache_misses: u64,
    prefix_cache_tokens_reused: u64,
    prefix_cache_bytes: usize,
    prefix_cache_disk_bytes: u64,
}

#[derive(Serialize)]
struct RecentWithModel {
    model: String,
    #[serde(flatten)]
    request: RecentRequest,
}

#[derive(Serialize)]
pub struct LiveSnapshot {
    time_ms: u64,
    mlx_active_bytes: usize,
    mlx_cache_bytes: usize,
    memory_budget_bytes: u64,
    models: Vec<ModelLive>,
    /// Newest first, all models together.
    recent: Vec<RecentWithModel>,
}

pub fn snapshot(state: &AppState) -> LiveSnapshot {
    let memory = crate::mlx::memory_stats();
    let mut models = Vec::new();
    let mut recent = Vec::new();
    for served in state.models.engines() {
        let m = served.engine.snapshot();
        recent.extend(m.recent.iter().map(|r| RecentWithModel { model: served.id.clone(), request: r.clone() }));
        models.push(ModelLive {
            id: served.id,
            running: m.running,
            queued: m.queued,
            batch_size: m.batch_size,
            prefill_tokens_per_sec: m.prefill_tokens_per_sec,
            decode_tokens_per_sec: m.decode_tokens_per_sec,
            kv_bytes: m.kv_bytes,
            kv_reserved_bytes: m.kv_reserved_bytes,
            kv_budget_bytes: m.kv_budget_bytes,
            requests_total: m.requests_total,
            generated_tokens_total: m.generated_tokens_total,
            prefix_cache_hits: m.prefix_cache_hits,
            prefix_cache_misses: m.prefix_cache_misses,
            prefix_cache_tokens_reused: m.prefix_cache_tokens_reused,
            prefix_cache_bytes: m.prefix_cache_bytes,
            prefix_cache_disk_bytes: m.prefix_cache_disk_bytes,
        });
    }
    recent.sort_by_key(|r| std::cmp::Reverse(r.request.finished_ms));
    recent.truncate(crate::engine::RECENT_REQUESTS);
    let time_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    LiveSnapshot {
        time_ms,
        mlx_active_bytes: memory.active,
        mlx_cache_bytes: memory.cache,
        memory_budget_bytes: state.models.memory_budget(),
        models,
        recent,
    }
}

pub async fn stream(State(state): State<AppState>) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let events = futures_util::stream::unfold((state, true), |(state, first)| async move {
        if !first {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let data = serde_json::to_string(&snapshot(&state)).unwrap_or_default();
        Some((Ok(SseEvent::default().data(data)), (state, false)))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)).text("keepalive"))
}
