//! What a model on the Hub is before it is downloaded: its `config.json`, read from the Hub
//! and kept (by repo and the date the Hub says it last changed), so search results can say
//! whether FastMLX loads it and what context it would serve on this machine (the memory
//! governor's planner, as for the models on disk).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::Value;

use super::hub::{HubClient, SearchHit};
use crate::model::{ModelConfig, ModelError};

/// Configs read at once, and how long one may take before the results go without it (it is
/// asked again by the next search).
const AT_ONCE: usize = 8;
const WAIT: Duration = Duration::from_secs(4);
/// Larger than any text config (multimodal ones carry their processors': tens of KiB).
const MOST_BYTES: u64 = 4 << 20;
/// Repos remembered; past this the memory starts again.
const REMEMBERED: usize = 1024;

/// A Hub model's shape, as its `config.json` says.
#[derive(Debug, Clone)]
pub struct HubShape {
    /// `model_type` (of the text model, for multimodal checkpoints).
    pub model_type: Option<String>,
    /// Its shape, or why FastMLX cannot load it.
    pub config: Result<ModelConfig, String>,
}

/// The shapes read so far, shared by the server's requests.
#[derive(Clone, Default)]
pub struct HubShapes {
    known: Arc<Mutex<HashMap<String, Option<Arc<HubShape>>>>>,
}

impl HubShapes {
    /// Each hit's shape, in order: `None` for a repo without a `config.json` (GGUF files carry
    /// theirs in the weights), or when the Hub did not answer in time.
    pub async fn of(&self, hub: &HubClient, hits: &[SearchHit]) -> Vec<Option<Arc<HubShape>>> {
        let gate = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
        join_all(hits.iter().map(|hit| {
            let gate = gate.clone();
            async move {
                if is_gguf(hit) {
                    return None;
                }
                let key = format!("{}@{}", hit.id, hit.last_modified.as_deref().unwrap_or(""));
                if let Some(known) = self.known.lock().expect("not poisoned").get(&key) {
                    return known.clone();
                }
                let _turn = gate.acquire().await.ok()?;
                let read = tokio::time::timeout(WAIT, hub.fetch_small_file(&hit.id, "main", "config.json", MOST_BYTES));
                let shape = match read.await {
                    Ok(Ok(bytes)) => Some(Arc::new(shape_of(&hit.id, &bytes))),
                    // Not there (or not readable, or gated): nothing to say, until the repo changes.
                    Ok(Err(e)) if !e.is_transient() => None,
                    // Slow or briefly failing: asked again next time.
                    _ => return None,
                };
                let mut known = self.known.lock().expect("not poisoned");
                if known.len() >= REMEMBERED {
                    known.clear();
                }
                known.insert(key, shape.clone());
                shape
            }
        }))
        .await
    }
}

fn is_gguf(hit: &SearchHit) -> bool {
    hit.library.as_deref() == Some("gguf") || hit.tags.iter().any(|t| t == "gguf")
}

/// `bytes` as a `config.json`: its model type and shape, or why it cannot be loaded.
fn shape_of(repo: &str, bytes: &[u8]) -> HubShape {
    let parsed = std::str::from_utf8(bytes).map_err(|e| e.to_string());
    let json: Value = match parsed.and_then(|t| crate::model::json::parse_json(t).map_err(|e| e.to_string())) {
        Ok(json) => json,
        Err(e) => return HubShape { model_type: None, config: Err(format!("its config.json is not JSON: {e}")) },
    };
    let text = crate::model::arch::text_config(&json);
    let model_type = text.get("model_type").and_then(Value::as_str).map(str::to_string);
    let origin = Path::new(repo).join("config.json");
    let config = crate::model::config_from_json(&json, &origin).map_err(|e| match e {
        ModelError::UnsupportedArch { model_type, .. } if model_type.is_empty() => {
            "its config.json names no model_type".to_string()
        }
        ModelError::UnsupportedArch { model_type, .. } => {
            format!("FastMLX does not load the model type \"{model_type}\"")
        }
        other => other.to_string(),
    });
    HubShape { model_type, config }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_says_what_it_is_or_why_it_cannot_be_loaded() {
        let dir = tempfile::tempdir().unwrap();
        crate::fixtures::synthetic::write_tiny_model(dir.path(), crate::model::Arch::Qwen3, 1, None).unwrap();
        let bytes = std::fs::read(dir.path().join("config.json")).unwrap();
        let shape = shape_of("org/tiny", &bytes);
        assert_eq!(shape.model_type.as_deref(), Some("qwen3"));
        assert!(shape.config.is_ok(), "{:?}", shape.config);

        let shape = shape_of("org/x", br#"{"model_type": "whisper", "d_model": 384}"#);
        assert_eq!(shape.model_type.as_deref(), Some("whisper"));
        assert_eq!(shape.config.unwrap_err(), "FastMLX does not load the model type \"whisper\"");

        assert!(shape_of("org/x", b"{oops").config.unwrap_err().contains("not JSON"));
        assert_eq!(shape_of("org/x", b"{}").config.unwrap_err(), "its config.json names no model_type");
        // A known type whose fields are missing: the loader's own message.
        let err = shape_of("org/x", br#"{"model_type": "llama"}"#).config.unwrap_err();
        assert!(err.contains("org/x/config.json"), "{err}");
    }
}
