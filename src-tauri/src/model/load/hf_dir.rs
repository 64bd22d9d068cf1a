//! A Hugging Face / MLX-community model folder: `config.json`, `*.safetensors` (sharded with
//! `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`, optionally `chat_template.jinja`.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};
use serde_json::Value;

use crate::mlx::Backend;
use crate::model::arch::{self, HfConfig};
use crate::model::config::{Arch, QuantMode, QuantSpec};
use crate::model::error::{ModelError, Result};
use crate::model::weights::{QuantConfig, Weights};
use crate::model::Transformer;
use crate::tokenizer::{ChatTemplate, Tokenizer};

pub fn load(
    dir: &Path,
    backend: &Backend,
    options: &super::LoadOptions,
) -> Result<(Transformer, Tokenizer, Option<ChatTemplate>)> {
    let config_path = dir.join("config.json");
    let (raw, hf, mut config) = read_configs(dir)?;

    let tensors = read_safetensors(dir)?;
    let stored = stored_dtype(&raw, &tensors);
    let quant = quant_config(&raw, &config_path)?;
    let mut weights = Weights::new(tensors, dir.to_path_buf(), quant, backend.compute_dtype(stored));
    weights.expand_quantized = super::expand_quantized(options, backend, config.parameter_count());
    weights.rename_all(arch::canonical_tensor_name);
    arch::sanitize(&config, &mut weights)?;
    if hf.tie_word_embeddings.is_none() {
        config.tie_word_embeddings = !weights.contains("lm_head.weight");
    }
    let transformer = Transformer::build(config, &mut weights)?;

    let (tokenizer, template) = load_tokenizer(dir, &raw)?;
    Ok((transformer, tokenizer, template))
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
    let arch = Arch::from_model_type(model_type)
        .ok_or_else(|| ModelError::UnsupportedArch { path: config_path.clone(), model_type: model_type.to_string() })?;
    let hf: HfConfig = serde_json::from_value(raw.clone())
        .map_err(|e| ModelError::Config { path: config_path.clone(), message: e.to_string() })?;
    let config = arch::model_config(arch, &hf).map_err(|message| ModelError::Config { path: config_path, message })?;
    Ok((raw, hf, config))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ModelError::NotFound { path: path.to_path_buf() },
        _ => ModelError::Io { path: path.to_path_buf(), source },
    })?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::Config { path: path.to_path_buf(), message: format!("invalid JSON: {e}") })
}

/// The safetensors files of the checkpoint: those the index names, else every `*.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let map = read_json(&index)?;
        let files: BTreeSet<String> = map
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| ModelError::Config { path: index.clone(), message: "no \"weight_map\"".into() })?
            .values()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|source| ModelError::Io { path: dir.to_path_buf(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::NotFound { path: dir.join("*.safetensors") });
    }
    Ok(files)
}

fn read_safetensors(dir: &Path) -> Result<HashMap<String, Array>> {
    let mut tensors = HashMap::new();
    for file in weight_files(dir)? {
        if !file.exists() {
            return Err(ModelError::NotFound { path: file });
        }
        check_safetensors_size(&file)?;
        let part = Array::load_safetensors(&file)
            .map_err(|e| ModelError::Weights { path: file.clone(), message: e.to_string() })?;
        tensors.extend(part);
    }
    Ok(tensors)
}

/// Checks that the file is as long as its header says, so a truncated download is reported as
/// such (MLX reads tensors lazily and would fail later, far from the cause).
fn check_safetensors_size(file: &Path) -> Result<()> {
    use std::io::Read;
    let bad = |message: String| ModelError::Weights { path: file.to_path_buf(), message };
    let mut f = fs::File::open(file).map_err(|source| ModelError::Io { path: file.to_path_buf(), source })?;
    let actual = f.metadata().map_err(|source| ModelError::Io { path: file.to_path_buf(), source })?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| bad("truncated: no safetensors header".into()))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > 100_000_000 || 8 + header_len > actual {
        return Err(bad(format!(
            "corrupt or truncated safetensors header ({header_len} bytes declared, file has {actual})"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header).map_err(|_| bad("truncated safetensors header".into()))?;
    let header: Value = serde_json::from_slice(&header).map_err(|e| bad(format!("corrupt safetensors header: {e}")))?;
    let end = header
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| *k != "__metadata__")
                .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
                .max()
                .unwrap_or(0)
        })
        .ok_or_else(|| bad("corrupt safetensors header: not an object".into()))?;
    if 8 + header_len + end > actual {
        return Err(bad(format!("truncated: tensors need {} bytes, file has {actual}", 8 + header_len + end)));
    }
    Ok(())
}

/// The dtype the checkpoint was saved in (`torch_dtype`/`dtype`, else its first float tensor).
fn stored_dtype(config: &Value, tensors: &HashMap<String, Array>) -> Dtype {
    let named = config.get("torch_dtype").or_else(|| config.get("dtype")).and_then(Value::as_str);
    match named {
        Some("bfloat16") => Dtype::Bfloat16,
        Some("float16") => Dtype::Float16,
        Some("float32") => Dtype::Float32,
        _ => tensors
            .values()
            .map(Array::dtype)
            .find(|d| matches!(d, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32))
            .unwrap_or(Dtype::Float32),
    }
}

/// `"quantization"` (or `"quantization_config"`) as MLX writes it: a default spec plus
/// per-layer entries (`{"group_size", "bits"}`, or `false` for a layer left unquantized).
fn quant_config(config: &Value, path: &Path) -> Result<QuantConfig> {
    let Some(q) = config.get("quantization").or_else(|| config.get("quantization_config")) else {
        return Ok(QuantConfig::default());
    };
    let bad =
        |message: String| ModelError::Quantization { path: path.to_path_buf(), name: "quantization".into(), message };
    if let Some(mode) = q.get("mode") {
        if serde_json::from_value::<QuantMode>(mode.clone()).is_err() {
            return Err(bad(format!("mode {mode} (supported: \"affine\", \"mxfp4\", \"nvfp4\", \"mxfp8\")")));
        }
    }
    match q.get("quant_method").and_then(Value::as_str) {
        // OpenAI's gpt-oss ships its experts in mxfp4, which MLX computes with as is.
        Some("mxfp4") => {
            let spec = QuantSpec { group_size: 32, bits: 4, mode: QuantMode::Mxfp4 };
            return Ok(QuantConfig { default: Some(spec), ..QuantConfig::default() });
        }
        Some(method) => {
            return Err(bad(format!("{method:?} checkpoints are not MLX-quantized; use an MLX conversion")))
        }
        None => {}
    }
    let spec = |v: &Value| -> Option<QuantSpec> { serde_json::from_value(v.clone()).ok() };
    let default = spec(q).ok_or_else(|| bad("needs integer \"group_size\" and \"bits\"".into()))?;
    let overrides = q
        .as_object()
        .map(|m| {
            m.iter().filter(|(_, v)| v.is_object()).filter_map(|(k, v)| Some((module_name(k)?, spec(v)?))).collect()
        })
        .unwrap_or_default();
    Ok(QuantConfig { default: Some(default), overrides, infer_bits_with_group: None })
}

/// A per-module quantization key in the names the loader uses (see
/// [`arch::canonical_tensor_name`]).
fn module_name(key: &str) -> Option<String> {
    let name = arch::canonical_tensor_name(&format!("{key}.weight"))?;
    Some(name.trim_end_matches(".weight").to_string())
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
