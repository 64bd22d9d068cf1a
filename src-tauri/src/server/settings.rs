//! `GET/POST /admin/settings`: what the dashboard shows and may change while serving. Changes
//! apply at once (max batch, memory budget, prefix cache size and KV quantization to models
//! loaded from now on, keep-alive to all)
//! and are saved to the config file for the next start.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::extract::{parse, ApiJson};
use super::{ApiError, AppState};

#[derive(Serialize)]
pub struct Settings {
    /// The OpenAI base URL clients point at.
    api_url: Option<String>,
    host: Option<String>,
    port: Option<u16>,
    api_key_set: bool,
    max_batch: usize,
    memory_budget_mb: u64,
    /// The prefix cache's cap per model (0: off).
    prefix_cache_mb: u64,
    /// `None`: loaded models stay until evicted.
    keep_alive_secs: Option<u64>,
    models_dir: String,
    /// KV-cache quantization: bits (0: off, 8 or 4), elements per scale, and the sequence
    /// length from which it applies.
    kv_bits: i32,
    kv_group_size: i32,
    kv_start: i32,
    /// Models with a KV format of their own, as `MODEL=BITS/GROUP/START` (or `MODEL=off`).
    model_kv: Vec<String>,
}

fn current(state: &AppState) -> Settings {
    let config = state.models.config();
    let listen = state.config.listen;
    let (kv_bits, kv_group_size, kv_start) = config.engine.kv_format.settings();
    Settings {
        api_url: listen.map(|a| format!("http://{a}/v1")),
        host: listen.map(|a| a.ip().to_string()),
        port: listen.map(|a| a.port()),
        api_key_set: state.config.api_key.is_some(),
        max_batch: config.engine.max_batch,
        memory_budget_mb: config.memory_budget >> 20,
        prefix_cache_mb: (config.engine.prefix_cache_bytes >> 20) as u64,
        keep_alive_secs: config.keep_alive.map(|k| k.as_secs()),
        models_dir: state.models.catalog().paths().models_dir.display().to_string(),
        kv_bits,
        kv_group_size,
        kv_start,
        model_kv: config.model_kv.iter().map(ToString::to_string).collect(),
    }
}

pub async fn get(State(state): State<AppState>) -> Json<Settings> {
    Json(current(&state))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    max_batch: Option<usize>,
    memory_budget_mb: Option<u64>,
    /// 0 turns the prefix cache off (for models loaded from now on).
    prefix_cache_mb: Option<u64>,
    /// `null` or 0: never unload for idleness.
    #[serde(default, deserialize_with = "some_or_null")]
    keep_alive_secs: Option<Option<u64>>,
    /// 0 turns KV quantization off (for models loaded from now on).
    kv_bits: Option<i32>,
    kv_group_size: Option<i32>,
    kv_start: Option<i32>,
    /// Replaces the models' own KV formats (`MODEL=BITS[/GROUP[/START]]` each).
    model_kv: Option<Vec<String>>,
}

/// Tells a field sent as `null` from one not sent.
fn some_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Ok(Some(Option::deserialize(d)?))
}

pub async fn post(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Json<Settings>, ApiError> {
    let change: Change = parse(&body)?;
    if change.max_batch.is_some_and(|b| !(1..=256).contains(&b)) {
        return Err(ApiError::invalid("max_batch", "max_batch must be between 1 and 256"));
    }
    let machine_mb = crate::mlx::total_memory_bytes().map(|b| b >> 20);
    if change.memory_budget_mb.is_some_and(|m| m < 256 || machine_mb.is_some_and(|total| m > total)) {
        return Err(ApiError::invalid(
            "memory_budget_mb",
            "memory_budget_mb must be at least 256 and at most the machine's memory",
        ));
    }
    let kv_change = change.kv_bits.is_some() || change.kv_group_size.is_some() || change.kv_start.is_some();
    let (bits, group_size, start) = state.models.config().engine.kv_format.settings();
    let kv_format = crate::model::KvFormat::from_settings(
        change.kv_bits.unwrap_or(bits),
        change.kv_group_size.unwrap_or(group_size),
        change.kv_start.unwrap_or(start),
    )
    .map_err(|message| ApiError::invalid("kv_bits", &message))?;
    let model_kv = match &change.model_kv {
        Some(list) => Some(
            list.iter()
                .map(|s| s.parse::<crate::store::ModelKv>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|message| ApiError::invalid("model_kv", message))?,
        ),
        None => None,
    };
    let config = state.models.update_config(|c| {
        c.engine.kv_format = kv_format;
        if let Some(list) = model_kv {
            c.model_kv = list;
        }
        if let Some(b) = change.max_batch {
            c.engine.max_batch = b;
        }
        if let Some(m) = change.memory_budget_mb {
            c.memory_budget = m << 20;
        }
        if let Some(m) = change.prefix_cache_mb {
            c.engine.prefix_cache_bytes = (m.min(1 << 30) as usize) << 20;
        }
        if let Some(k) = change.keep_alive_secs {
            c.keep_alive = k.filter(|&s| s > 0).map(Duration::from_secs);
        }
    });
    // Kept for the next start (flags and environment variables still win over the file).
    if let Some(path) = &state.config.settings_file {
        let int = |n: u64| Some(toml::Value::Integer(n.min(i64::MAX as u64) as i64));
        let mut changes = vec![
            ("max_batch", int(config.engine.max_batch as u64)),
            ("memory_budget_mb", int(config.memory_budget >> 20)),
            ("keep_alive", config.keep_alive.and_then(|k| int(k.as_secs()))),
        ];
        if change.prefix_cache_mb.is_some() {
            changes.push(("prefix_cache_mb", int((config.engine.prefix_cache_bytes >> 20) as u64)));
        }
        if change.model_kv.is_some() {
            let list: Vec<_> = config.model_kv.iter().map(|m| toml::Value::String(m.to_string())).collect();
            changes.push(("model_kv", (!list.is_empty()).then_some(toml::Value::Array(list))));
        }
        if kv_change {
            let (bits, group_size, start) = config.engine.kv_format.settings();
            changes.push(("kv_bits", int(bits as u64)));
            changes.push(("kv_group_size", int(group_size as u64)));
            changes.push(("kv_start", int(start as u64)));
        }
        crate::config_file::save(path, &changes)
            .map_err(|e| ApiError::internal(format!("the settings apply now but could not be saved: {e:#}")))?;
    }
    Ok(Json(current(&state)))
}
