//! `GET /admin/metrics/stream`: every loaded model's engine metrics, MLX memory and the recent
//! requests, as a server-sent event twice a second (the dashboard's live graphs); and
//! `GET /admin/metrics/history`: the last 15 minutes of them, a sample a second, kept by the
//! server so that a Live page opened after the traffic starts from what happened.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use serde::Serialize;

use super::AppState;
use crate::engine::RecentRequest;

/// How long the history reaches back, and how often it takes a sample.
const HISTORY: Duration = Duration::from_secs(15 * 60);
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The recorded samples (snapshots without their recent requests), oldest first.
#[derive(Clone, Default)]
pub struct History(Arc<Mutex<VecDeque<serde_json::Value>>>);

impl History {
    fn push(&self, sample: serde_json::Value) {
        let mut samples = self.0.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back(sample);
        while samples.len() > (HISTORY.as_secs() / SAMPLE_EVERY.as_secs()) as usize {
            samples.pop_front();
        }
    }

    fn samples(&self) -> Vec<serde_json::Value> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }
}

/// Samples the live metrics into the history until `stopped` turns true.
pub async fn record(state: AppState, mut stopped: tokio::sync::watch::Receiver<bool>) -> std::io::Result<()> {
    loop {
        let mut sample = serde_json::to_value(snapshot(&state)).unwrap_or_default();
        if let Some(object) = sample.as_object_mut() {
            object.remove("recent");
        }
        state.history.push(sample);
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
            _ = stopped.wait_for(|s| *s) => return Ok(()),
        }
    }
}

pub async fn history(State(state): State<AppState>) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"samples": state.history.samples()}))
}

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
    /// Speculative decoding: tokens drafted and accepted so far.
    draft_tokens_total: u64,
    draft_accepted_total: u64,
    prefix_cache_hits: u64,
    prefix_cache_misses: u64,
    prefix_cache_tokens_reused: u64,
    prefix_cache_bytes: usize,
    prefix_cache_disk_bytes: u64,
    /// The governor's last measured step: its predicted and measured transient bytes.
    step_predicted_bytes: usize,
    step_measured_bytes: usize,
    parked_total: u64,
    refused_waited_total: u64,
    refused_memory_total: u64,
    /// Why it cannot serve: its cluster lost a machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    fault: Option<String>,
    /// Its cluster's machines, links and step costs, where it is split across one.
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<crate::engine::remote::ClusterStatus>,
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
    /// The process's memory ceiling (all models together).
    memory_budget_bytes: u64,
    /// What the process holds (resident; MLX's count where larger), MLX's buffer-cache limit
    /// and, on Metal, its wired limit (0: not set).
    resident_bytes: usize,
    cache_limit_bytes: u64,
    wired_limit_bytes: u64,
    models: Vec<ModelLive>,
    /// Newest first, all models together.
    recent: Vec<RecentWithModel>,
    /// A model split across machines while its cluster forms (again, after a lost machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<crate::store::Awaited>,
}

pub fn snapshot(state: &AppState) -> LiveSnapshot {
    let memory = crate::mlx::memory_stats();
    let mut models = Vec::new();
    let mut recent = Vec::new();
    for served in state.models.engines() {
        let (m, cluster) = (served.engine.snapshot(), served.cluster());
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
            draft_tokens_total: m.draft_tokens_total,
            draft_accepted_total: m.draft_accepted_total,
            prefix_cache_hits: m.prefix_cache_hits,
            prefix_cache_misses: m.prefix_cache_misses,
            prefix_cache_tokens_reused: m.prefix_cache_tokens_reused,
            prefix_cache_bytes: m.prefix_cache_bytes,
            prefix_cache_disk_bytes: m.prefix_cache_disk_bytes,
            step_predicted_bytes: m.memory.predicted_bytes,
            step_measured_bytes: m.memory.measured_bytes,
            parked_total: m.parked_total,
            refused_waited_total: m.refused_waited_total,
            refused_memory_total: m.refused_memory_total,
            fault: served.engine.fault(),
            cluster,
        });
    }
    recent.sort_by_key(|r| std::cmp::Reverse(r.request.finished_ms));
    recent.truncate(crate::engine::RECENT_REQUESTS);
    let time_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let limits = crate::mlx::applied_limits();
    LiveSnapshot {
        time_ms,
        resident_bytes: crate::engine::memory::Governor::held_now(),
        cache_limit_bytes: limits.cache_limit,
        wired_limit_bytes: limits.wired_limit,
        mlx_active_bytes: memory.active,
        mlx_cache_bytes: memory.cache,
        memory_budget_bytes: state.models.memory_budget(),
        models,
        recent,
        waiting: state.models.awaited(),
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
