//! `GET /api/version`, `GET /api/tags`, `POST /api/show`, `GET /api/ps`: the local models as
//! Ollama describes them. Every field is present and a string where clients parse strings (Zed's
//! and Roo's parsers reject nulls).

use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::params::{model_name, not_found, timestamp, Fallback};
use crate::model::load::chat_template_source;
use crate::model::ModelKind;
use crate::server::extract::ApiJson;
use crate::server::{ApiError, AppState};
use crate::store::{LocalModel, MANIFEST};

pub async fn version() -> Json<Value> {
    Json(json!({ "version": super::VERSION }))
}

pub async fn tags(State(state): State<AppState>) -> Json<Value> {
    // Discovery reads the disk.
    let models = tokio::task::spawn_blocking(move || state.models.local_models()).await.unwrap_or_default();
    let models: Vec<Value> = models.iter().filter(|m| m.summary.unloadable_reason.is_none()).map(entry).collect();
    Json(json!({ "models": models }))
}

pub async fn ps(State(state): State<AppState>) -> Json<Value> {
    let now = SystemTime::now();
    // Ollama's "forever" is a date far ahead.
    let forever = now + Duration::from_secs(100 * 365 * 86_400);
    let engines = state.models.engines();
    let residency = state.models.clone();
    let local = tokio::task::spawn_blocking(move || residency.local_models()).await.unwrap_or_default();
    let models: Vec<Value> = state
        .models
        .loaded()
        .into_iter()
        .filter_map(|loaded| {
            let model = local.iter().find(|m| m.id == loaded.id)?;
            let mut e = entry(model);
            let expires = loaded
                .expires_in_secs
                .and_then(|s| now.checked_add(Duration::from_secs(s)))
                .map_or(forever, |t| t.min(forever));
            e["expires_at"] = json!(timestamp(expires));
            e["size"] = json!(loaded.memory_bytes);
            // Unified memory: all of it is the GPU's.
            e["size_vram"] = json!(loaded.memory_bytes);
            // The window it was loaded with (`--ctx` may cap the model's own).
            let context = engines.iter().find(|s| s.id == loaded.id).map(|s| s.engine.model_info().context_length);
            e["context_length"] = json!(context.or(model.summary.context_length).unwrap_or(0));
            Some(e)
        })
        .collect();
    Json(json!({ "models": models }))
}

pub async fn show(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Json<Value>, ApiError> {
    let (name, id) = model_name(&state, &body, Fallback::Served)?;
    let model = state.models.find_local(&id).map_err(|_| not_found(&name))?;
    let loaded = state.models.engines().into_iter().find(|s| s.id == model.id).map(|s| s.engine.model_info().clone());
    let template = match &loaded {
        Some(info) => info.chat_template.as_ref().map(|t| t.source().to_string()),
        None => chat_template_source(&model.path),
    };
    let fim = match &loaded {
        Some(info) => crate::server::chat::fim::markers(&info.tokenizer).is_some(),
        None => std::fs::read_to_string(model.path.join("tokenizer_config.json"))
            .is_ok_and(|t| t.contains("fim_prefix") || t.contains("<PRE>")),
    };
    let summary = &model.summary;
    let arch = summary.architecture.clone().unwrap_or_else(|| "unknown".into());
    let mut info = Map::new();
    info.insert("general.architecture".into(), json!(arch));
    if let Some(n) = summary.parameters {
        info.insert("general.parameter_count".into(), json!(n));
    }
    let context = loaded.as_ref().map(|i| i.context_length).or(summary.context_length);
    if let Some(ctx) = context {
        info.insert(format!("{arch}.context_length"), json!(ctx));
    }
    let template = template.unwrap_or_default();
    let mut capabilities = match summary.kind {
        ModelKind::Chat => vec!["completion"],
        // Ollama's name for what /api/embed serves; a reranker is FastMLX's own.
        ModelKind::Embedding => vec!["embedding"],
        ModelKind::Reranker => vec!["rerank"],
    };
    if template.contains("tools") {
        capabilities.push("tools");
    }
    if template.contains("<think>") || template.contains("enable_thinking") {
        capabilities.push("thinking");
    }
    if fim {
        capabilities.push("insert");
    }
    // What Open WebUI and Ollama's clients check before they offer to send images.
    if loaded.as_ref().map_or(summary.vision, |info| info.vision.is_some()) {
        capabilities.push("vision");
    }
    let parameters = context.map(|c| format!("num_ctx                        {c}")).unwrap_or_default();
    Ok(Json(json!({
        "license": "",
        "modelfile": format!("# Served by FastMLX from {}\nFROM {}\n", model.path.display(), model.path.display()),
        "parameters": parameters,
        "template": template,
        "details": details(&model),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": timestamp(modified(&model)),
    })))
}

/// One model in `/api/tags` (and `/api/ps`).
fn entry(model: &LocalModel) -> Value {
    json!({
        "name": model.id,
        "model": model.id,
        "modified_at": timestamp(modified(model)),
        "size": model.summary.size_bytes,
        "digest": digest(model),
        "details": details(model),
        // FastMLX's: chat, embedding or reranker (Ollama's clients ignore it).
        "kind": model.summary.kind,
    })
}

fn details(model: &LocalModel) -> Value {
    let s = &model.summary;
    let family = s.architecture.clone().unwrap_or_else(|| "unknown".into());
    json!({
        "parent_model": "",
        "format": if s.format == "gguf" { "gguf" } else { "safetensors" },
        "family": family,
        "families": [family],
        "parameter_size": s.parameters.map(parameter_size).unwrap_or_default(),
        "quantization_level": s.quantization.clone().unwrap_or_else(|| "unquantized".into()),
    })
}

/// `135M`, `7.6B`, as Ollama writes sizes.
fn parameter_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", (n as f64 / 1e6).round() as u64)
    }
}

fn modified(model: &LocalModel) -> SystemTime {
    std::fs::metadata(&model.path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// SHA-256 of the download manifest (which holds every file's SHA-256) for downloaded models;
/// for others, of the id, size and modification time, so it changes when the files do (hashing
/// gigabytes of weights on every listing is not an option).
fn digest(model: &LocalModel) -> String {
    let mut hasher = Sha256::new();
    match std::fs::read(model.path.join(MANIFEST)) {
        Ok(manifest) => hasher.update(&manifest),
        Err(_) => {
            let mtime = modified(model).duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            hasher.update(format!("{}\0{}\0{}", model.id, model.summary.size_bytes, mtime).as_bytes());
        }
    }
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parameter_size(134_515_008), "135M");
        assert_eq!(parameter_size(7_615_616_512), "7.6B");
    }
}
