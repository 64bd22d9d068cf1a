//! A model's page (from Models or Discover): its card (the README), what its config says, its
//! files, and what it takes and serves on this machine, for a model on disk or on the Hub.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::fit::{kv_element_bytes, plan_from};
use super::hub::{HubClient, HubError};
use super::LocalModel;
use crate::engine::memory::ServingPlan;
use crate::model::{KvFormat, ModelConfig};

/// A card longer than this is cut (model cards are a few KiB; some paste whole papers).
const README_LIMIT: u64 = 256 << 10;
/// The most read from the Hub for a card or a config (larger than any text config; a card past
/// it is not shown).
const FETCH_LIMIT: u64 = 4 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    /// The catalog id (on disk) or the Hub repo.
    pub id: String,
    /// "disk" or "hub".
    pub source: &'static str,
    pub readme: Option<String>,
    pub config: Option<ConfigSummary>,
    /// Why FastMLX cannot load it, when it cannot.
    pub unsupported: Option<String>,
    pub files: Vec<FileEntry>,
    /// What four requests get here (chat models whose shape is known).
    pub plan: Option<ServingPlan>,
    pub kv_per_1k_tokens: Option<KvPer1k>,
}

/// What a model's config says, in the terms people choose by.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigSummary {
    pub model_type: String,
    pub parameters: u64,
    pub layers: usize,
    /// Layers with a recurrent state instead of keys and values (linear-attention hybrids).
    pub recurrent_layers: usize,
    /// Layers attending within a window, and its width.
    pub windowed_layers: usize,
    pub window: Option<usize>,
    pub hidden_size: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub context: usize,
    pub experts: Option<usize>,
    pub experts_per_token: Option<usize>,
    /// The checkpoint carries a vision tower (FastMLX serves its text model).
    pub vision: bool,
}

/// Bytes of keys and values 1,000 tokens of context add (windowed layers counted until their
/// window is full), at full precision and with the KV cache at 8 and 4 bits.
#[derive(Debug, Clone, Serialize)]
pub struct KvPer1k {
    pub full: u64,
    pub kv8: Option<u64>,
    pub kv4: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileEntry {
    pub name: String,
    pub bytes: Option<u64>,
}

pub fn summarize(config: &ModelConfig, raw: Option<&Value>) -> ConfigSummary {
    let layers = config.num_layers;
    let recurrent_layers = (0..layers).filter(|&i| config.is_recurrent(i)).count();
    let windowed_layers = (0..layers).filter(|&i| !config.is_recurrent(i) && config.layer_window(i).is_some()).count();
    ConfigSummary {
        model_type: config.arch.model_type().to_string(),
        parameters: config.parameter_count(),
        layers,
        recurrent_layers,
        windowed_layers,
        window: config.sliding_window.filter(|_| windowed_layers > 0),
        hidden_size: config.hidden_size,
        heads: config.num_heads,
        kv_heads: config.num_kv_heads,
        head_dim: config.head_dim,
        context: config.max_position_embeddings,
        experts: config.moe.as_ref().map(|m| m.num_experts),
        experts_per_token: config.moe.as_ref().map(|m| m.top_k),
        vision: raw.is_some_and(|r| r.get("vision_config").is_some()),
    }
}

pub fn kv_per_1k(config: &ModelConfig) -> KvPer1k {
    let act = kv_element_bytes();
    let full = config.kv_footprint(act);
    let quantized = |bits: i32| {
        let quant = config.kv_quant_for(bits)?;
        let q = config.kv_footprint_in(act, KvFormat { quant: Some(quant), start: 0 }).quantized?;
        Some((q.full_per_token + q.windowed_per_token) as u64 * 1000)
    };
    KvPer1k {
        full: (full.full_per_token + full.windowed_per_token) as u64 * 1000,
        kv8: quantized(8),
        kv4: quantized(4),
    }
}

/// A model on disk, with `plan` what the store's planner says for it.
pub fn local(model: &LocalModel, plan: Option<ServingPlan>) -> ModelInfo {
    let dir = model.path.is_dir().then_some(model.path.as_path());
    let raw: Option<Value> = dir
        .and_then(|d| std::fs::read_to_string(d.join("config.json")).ok())
        .and_then(|t| crate::model::json::parse_json(&t).ok());
    let config = crate::model::read_config(&model.path).ok();
    let files = match dir {
        Some(d) => folder_files(d),
        None => vec![FileEntry {
            name: file_name(&model.path),
            bytes: std::fs::metadata(&model.path).ok().map(|m| m.len()),
        }],
    };
    ModelInfo {
        id: model.id.clone(),
        source: "disk",
        readme: dir.and_then(|d| read_readme(&d.join("README.md"))),
        kv_per_1k_tokens: config.as_ref().map(kv_per_1k),
        config: config.as_ref().map(|c| summarize(c, raw.as_ref())),
        unsupported: model.summary.unloadable_reason.clone(),
        files,
        plan,
    }
}

/// A repo on the Hub: its files, card and config at the commit `main` names, and what its
/// weights (the safetensors files) would take here under `ceiling`.
pub async fn hub(hub: &HubClient, repo: &str, ceiling: u64, max_batch: usize) -> Result<ModelInfo, HubError> {
    let info = hub.repo_info(repo, "main").await?;
    let has = |name: &str| info.files.iter().any(|f| f.name == name);
    let readme = if has("README.md") {
        let bytes = hub.fetch_small_file(repo, &info.sha, "README.md", FETCH_LIMIT).await.ok();
        bytes.map(|b| cut(String::from_utf8_lossy(&b).into_owned()))
    } else {
        None
    };
    let raw: Option<Value> = if has("config.json") {
        let bytes = hub.fetch_small_file(repo, &info.sha, "config.json", FETCH_LIMIT).await.ok();
        bytes.and_then(|b| serde_json::from_slice(&b).ok())
    } else {
        None
    };
    let parsed = raw.as_ref().map(|r| crate::model::config_from_json(r, &Path::new(repo).join("config.json")));
    let weights: u64 = info.files.iter().filter(|f| f.name.ends_with(".safetensors")).filter_map(|f| f.size).sum();
    let config = parsed.as_ref().and_then(|p| p.as_ref().ok());
    Ok(ModelInfo {
        id: repo.to_string(),
        source: "hub",
        readme,
        config: config.map(|c| summarize(c, raw.as_ref())),
        unsupported: parsed.as_ref().and_then(|p| p.as_ref().err()).map(|e| e.to_string()),
        plan: config.filter(|_| weights > 0).map(|c| plan_from(c, weights, ceiling, max_batch)),
        kv_per_1k_tokens: config.map(kv_per_1k),
        files: info.files.iter().map(|f| FileEntry { name: f.name.clone(), bytes: f.size }).collect(),
    })
}

fn folder_files(dir: &Path) -> Vec<FileEntry> {
    let mut files: Vec<FileEntry> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()) && !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| FileEntry {
            name: e.file_name().to_string_lossy().into_owned(),
            bytes: e.metadata().ok().map(|m| m.len()),
        })
        .collect();
    files.sort_by(|a, b| a.name.cmp(&b.name));
    files
}

fn read_readme(path: &Path) -> Option<String> {
    std::fs::read(path).ok().map(|b| cut(String::from_utf8_lossy(&b).into_owned()))
}

/// The card within [`README_LIMIT`], cut at a character boundary, saying so.
fn cut(mut text: String) -> String {
    if text.len() as u64 > README_LIMIT {
        let mut at = README_LIMIT as usize;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
        text.push_str("\n\n*(cut: the card is longer)*\n");
    }
    text
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_folder_shows_its_card_config_files_and_kv_cost() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny");
        crate::fixtures::synthetic::write_tiny_model(&path, crate::model::Arch::Qwen3Moe, 1, None).unwrap();
        std::fs::write(path.join("README.md"), "# Tiny\n\nA test model.").unwrap();
        let model = LocalModel {
            id: "tiny".into(),
            summary: crate::model::inspect(&path),
            path,
            source: super::super::Source::Fastmlx,
            owned: true,
        };
        let info = local(&model, None);
        assert_eq!(info.readme.as_deref(), Some("# Tiny\n\nA test model."));
        let config = info.config.expect("a config summary");
        assert_eq!((config.model_type.as_str(), config.experts.is_some(), config.vision), ("qwen3_moe", true, false));
        assert!(info.files.iter().any(|f| f.name == "model.safetensors" && f.bytes.unwrap_or(0) > 0));
        let kv = info.kv_per_1k_tokens.unwrap();
        assert!(kv.kv8.unwrap() < kv.full && kv.kv4.unwrap() < kv.kv8.unwrap(), "{kv:?}");
        assert!(info.unsupported.is_none());
    }

    #[test]
    fn a_long_card_is_cut_at_a_character_boundary() {
        let long = "é".repeat(README_LIMIT as usize);
        let cut = cut(long);
        assert!(cut.len() < README_LIMIT as usize + 64 && cut.ends_with("*(cut: the card is longer)*\n"));
    }
}
