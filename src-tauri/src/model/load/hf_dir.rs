//! A Hugging Face / MLX-community model folder: `config.json`, `*.safetensors` (sharded with
//! `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`, optionally `chat_template.jinja`.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::mlx::Backend;
use crate::model::arch::{self, HfConfig};
use crate::model::checkpoint::{quant_config, read_json, read_safetensors, stored_dtype};
use crate::model::config::Arch;
use crate::model::error::{ModelError, Result};
use crate::model::vision::processor::{FAMILIES_THAT_SEE, TOWER_PREFIXES};
use crate::model::vision::{Family, ImageProcessor, Tower, VisionModel};
use crate::model::weights::Weights;
use crate::model::Transformer;
use crate::tokenizer::{ChatTemplate, Tokenizer};

pub fn load(dir: &Path, backend: &Backend, options: &super::LoadOptions) -> Result<super::Loaded> {
    let (raw, transformer, vision) = load_parts(dir, backend, options)?;
    let (tokenizer, template) = load_tokenizer(dir, &raw)?;
    Ok((transformer, tokenizer, template, vision))
}

/// The transformer of the folder (no tokenizer) and its `config.json`'s text part: a chat
/// model's, or an embedding model's, whose checkpoint may be the bare model (`embed_tokens`,
/// `layers.N` at the top, as Qwen3-Embedding's and EmbeddingGemma's are).
pub(super) fn load_transformer(
    dir: &Path,
    backend: &Backend,
    options: &super::LoadOptions,
) -> Result<(Value, Transformer)> {
    let (raw, transformer, _) = load_parts(dir, backend, options)?;
    Ok((raw, transformer))
}

/// The transformer, its config's text part, and the vision side where the checkpoint has one
/// FastMLX runs (Qwen3-VL's, Qwen3.5's).
fn load_parts(
    dir: &Path,
    backend: &Backend,
    options: &super::LoadOptions,
) -> Result<(Value, Transformer, Option<VisionModel>)> {
    let config_path = dir.join("config.json");
    let outer = read_json(&config_path)?;
    let (raw, hf, mut config) = understand_config(&outer, config_path.clone())?;

    let tensors = read_safetensors(dir)?;
    let stored = stored_dtype(&raw, &tensors);
    let quant = quant_config(&raw, &config_path)?;
    let mut weights = Weights::new(tensors, dir.to_path_buf(), quant, backend.compute_dtype(stored));
    weights.expand_quantized = super::expand_quantized(options, backend, config.parameter_count());
    if !weights.contains("model.embed_tokens.weight") && weights.contains("embed_tokens.weight") {
        weights.rename_all(|name| match name.starts_with("lm_head.") || name.starts_with("score.") {
            true => Some(name.to_string()),
            false => Some(format!("model.{name}")),
        });
    }
    let vision = load_vision(dir, &outer, &mut weights)?;
    weights.rename_all(arch::canonical_tensor_name);
    arch::sanitize(&config, &mut weights)?;
    if hf.tie_word_embeddings.is_none() {
        config.tie_word_embeddings = !weights.contains("lm_head.weight");
    }
    let transformer = Transformer::build(config, &mut weights)?;
    Ok((raw, transformer, vision))
}

/// The vision tower and processor of a checkpoint that sees (Qwen3-VL, Qwen3.5/3.6, Gemma 3 and
/// 4), in mlx-community's layout or Hugging Face's; `None` for other families and for
/// checkpoints shipped without the tower.
fn load_vision(dir: &Path, outer: &Value, weights: &mut Weights) -> Result<Option<VisionModel>> {
    let config_path = dir.join("config.json");
    // A conversion for text alone may drop the tower.
    let model_type = outer.get("model_type").and_then(Value::as_str).unwrap_or_default();
    if !FAMILIES_THAT_SEE.contains(&model_type) {
        return Ok(None);
    }
    let Some((prefix, _)) = TOWER_PREFIXES.into_iter().find(|(p, key)| weights.contains(&format!("{p}{key}"))) else {
        return Ok(None);
    };
    // Hugging Face's layout puts `model.` before the projector too.
    let outer_prefix = if prefix.starts_with("model.") { "model." } else { "" };
    let invalid = |message: String| ModelError::Config { path: config_path.clone(), message };
    let vision_config = outer.get("vision_config").cloned().unwrap_or_default();
    fn tower_config<T: serde::de::DeserializeOwned>(v: Value, path: &Path) -> Result<T> {
        serde_json::from_value(v)
            .map_err(|e| ModelError::Config { path: path.to_path_buf(), message: format!("vision_config: {e}") })
    }
    let optional = |name: &str| -> Result<Value> {
        let path = dir.join(name);
        if path.exists() {
            read_json(&path)
        } else {
            Ok(Value::Null)
        }
    };
    let processor =
        ImageProcessor::from_json(outer, &optional("preprocessor_config.json")?, &optional("processor_config.json")?)
            .map_err(invalid)?;
    let text_hidden = arch::text_config(outer).get("hidden_size").and_then(Value::as_u64).unwrap_or_default() as usize;
    let tower = match &processor.family {
        Family::Qwen { .. } => Tower::Qwen(crate::model::vision::qwen_tower::QwenVisionTower::build(
            tower_config(vision_config, &config_path)?,
            weights,
            prefix,
        )?),
        Family::Gemma3 { image } => Tower::Siglip(crate::model::vision::siglip::SiglipTower::build(
            tower_config(vision_config, &config_path)?,
            image.tokens,
            text_hidden,
            weights,
            prefix,
            &format!("{outer_prefix}multi_modal_projector."),
        )?),
        Family::Gemma4 { .. } => Tower::Gemma4(crate::model::vision::gemma4_tower::Gemma4Tower::build(
            tower_config(vision_config, &config_path)?,
            text_hidden,
            weights,
            prefix,
            &format!("{outer_prefix}embed_vision."),
        )?),
    };
    Ok(Some(VisionModel { processor: std::sync::Arc::new(processor), tower }))
}

/// The model's shape from `config.json` alone (no weights read): what the memory planner needs.
pub fn read_config(dir: &Path) -> Result<crate::model::ModelConfig> {
    Ok(read_configs(dir)?.2)
}

/// `config.json` (its text part, for multimodal checkpoints), as read and as understood.
fn read_configs(dir: &Path) -> Result<(Value, HfConfig, crate::model::ModelConfig)> {
    let config_path = dir.join("config.json");
    understand_config(&read_json(&config_path)?, config_path)
}

/// A `config.json` read elsewhere (a Hub repo's, before it is downloaded), as understood;
/// `origin` names it in errors.
pub fn config_from_json(json: &Value, origin: &Path) -> Result<crate::model::ModelConfig> {
    Ok(understand_config(json, origin.to_path_buf())?.2)
}

fn understand_config(json: &Value, config_path: PathBuf) -> Result<(Value, HfConfig, crate::model::ModelConfig)> {
    let raw = arch::text_config(json);
    let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or_default();
    let arch = Arch::from_model_type(model_type).ok_or_else(|| ModelError::UnsupportedArch {
        path: config_path.clone(),
        model_type: model_type.to_string(),
        supported: Arch::supported(),
    })?;
    let hf: HfConfig = serde_json::from_value(raw.clone())
        .map_err(|e| ModelError::Config { path: config_path.clone(), message: e.to_string() })?;
    let config = arch::model_config(arch, &hf).map_err(|message| ModelError::Config { path: config_path, message })?;
    Ok((raw, hf, config))
}

fn load_tokenizer(dir: &Path, config: &Value) -> Result<(Tokenizer, Option<ChatTemplate>)> {
    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.exists() {
        return Err(ModelError::NotFound { path: tokenizer_path });
    }
    let inner = Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| ModelError::Tokenizer { path: tokenizer_path.clone(), message: e.to_string() })?;
    let tc_path = dir.join("tokenizer_config.json");
    let tc = if tc_path.exists() { read_json(&tc_path)? } else { Value::Null };
    let token = |key: &str| -> Option<String> {
        let v = tc.get(key)?;
        v.as_str().or_else(|| v.get("content")?.as_str()).map(str::to_string)
    };
    let (bos, eos) = (token("bos_token"), token("eos_token"));

    let gen_path = dir.join("generation_config.json");
    let generation = if gen_path.exists() { read_json(&gen_path)? } else { Value::Null };
    let mut eos_ids = token_ids(generation.get("eos_token_id"));
    eos_ids.extend(token_ids(config.get("eos_token_id")));
    let tokenizer = Tokenizer::new(inner, bos.clone(), eos.clone(), &eos_ids, None);

    let jinja_path = dir.join("chat_template.jinja");
    let source = if jinja_path.exists() {
        Some(fs::read_to_string(&jinja_path).map_err(|source| ModelError::Io { path: jinja_path.clone(), source })?)
    } else {
        chat_template_source(tc.get("chat_template"))
    };
    let template = source
        .map(|s| ChatTemplate::new(&s, bos, eos))
        .transpose()
        .map_err(|e| ModelError::Tokenizer { path: tc_path, message: e.to_string() })?;
    Ok((tokenizer, template))
}

/// `chat_template` is a string, or a list of `{name, template}` of which "default" is used.
fn chat_template_source(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

/// `eos_token_id` as a number or a list of numbers.
fn token_ids(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_u64).map(|n| n as u32).collect(),
        _ => Vec::new(),
    }
}
