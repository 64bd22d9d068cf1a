//! What a model on disk is, without loading it: architecture, size, quantization, context
//! length, and whether this build can load it (and why not). For model listings.

use std::path::Path;

use serde_json::Value;

use super::gguf_header;
use crate::model::arch::{self, HfConfig};
use crate::model::config::Arch;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelSummary {
    /// `hf` (a folder with config.json) or `gguf`.
    pub format: &'static str,
    /// What it serves: chat (text generation), embedding or reranker.
    pub kind: ModelKind,
    /// `model_type` / `general.architecture`.
    pub architecture: Option<String>,
    pub parameters: Option<u64>,
    /// e.g. "4-bit (group 64)", "bf16", "Q4_1".
    pub quantization: Option<String>,
    pub context_length: Option<usize>,
    pub size_bytes: u64,
    /// Bytes the weights take once loaded (kept packed), where that is not about `size_bytes`:
    /// GGUF files, whose blocks are repacked into MLX's layout.
    pub loaded_bytes: Option<u64>,
    /// `None` when this build can load it; otherwise why not.
    pub unloadable_reason: Option<String>,
    /// It reads images (a family whose vision tower FastMLX runs, with the tower's weights).
    #[serde(default)]
    pub vision: bool,
}

/// What a model serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Text generation: the chat and completion APIs.
    #[default]
    Chat,
    /// Text to vectors: `/v1/embeddings`, `/api/embed`.
    Embedding,
    /// Query-document relevance: `/v1/rerank`.
    Reranker,
}

impl From<crate::model::encoder::EncoderKind> for ModelKind {
    fn from(kind: crate::model::encoder::EncoderKind) -> Self {
        match kind {
            crate::model::encoder::EncoderKind::Embedding => ModelKind::Embedding,
            crate::model::encoder::EncoderKind::Reranker => ModelKind::Reranker,
        }
    }
}

impl ModelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Chat => "chat",
            ModelKind::Embedding => "embedding",
            ModelKind::Reranker => "reranker",
        }
    }
}

/// Describes the model at `path` (a folder with `config.json`, or a `.gguf` file).
pub fn inspect(path: &Path) -> ModelSummary {
    if path.is_dir() {
        inspect_folder(path)
    } else {
        inspect_gguf(path)
    }
}

fn inspect_folder(dir: &Path) -> ModelSummary {
    let mut summary = ModelSummary {
        format: "hf",
        kind: ModelKind::Chat,
        architecture: None,
        parameters: None,
        quantization: None,
        context_length: None,
        size_bytes: folder_size(dir),
        loaded_bytes: None,
        unloadable_reason: None,
        vision: false,
    };
    let raw: Value = match std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| e.to_string())
        .and_then(|t| crate::model::json::parse_json(&t).map_err(|e| e.to_string()))
    {
        Ok(raw) => raw,
        Err(e) => {
            summary.unloadable_reason = Some(format!("config.json: {e}"));
            return summary;
        }
    };
    summary.vision = reads_images(dir, &raw);
    let raw = arch::text_config(&raw);
    let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or_default().to_string();
    summary.architecture = (!model_type.is_empty()).then(|| model_type.clone());
    summary.context_length = raw.get("max_position_embeddings").and_then(Value::as_u64).map(|n| n as usize);
    summary.quantization = match raw.get("quantization").or_else(|| raw.get("quantization_config")) {
        Some(q) => match (
            q.get("bits").and_then(Value::as_u64),
            q.get("group_size").and_then(Value::as_u64),
            q.get("quant_method").and_then(Value::as_str),
        ) {
            (Some(bits), Some(group), _) => match q.get("mode").and_then(Value::as_str).filter(|m| *m != "affine") {
                Some(mode) => Some(format!("{bits}-bit {mode} (group {group})")),
                None => Some(format!("{bits}-bit (group {group})")),
            },
            (_, _, Some(method)) => Some(method.to_string()),
            _ => Some("quantized".into()),
        },
        None => raw.get("torch_dtype").or_else(|| raw.get("dtype")).and_then(Value::as_str).map(str::to_string),
    };
    let mut reasons = Vec::new();
    if crate::model::encoder::is_encoder_config(&raw) {
        inspect_encoder(dir, &raw, &mut summary, &mut reasons);
    } else {
        inspect_decoder(&model_type, &raw, &mut summary, &mut reasons);
        if let Some(role) = crate::model::encoder::decoder_role(dir, &raw) {
            summary.kind = match role {
                crate::model::encoder::DecoderRole::Embedding => ModelKind::Embedding,
                crate::model::encoder::DecoderRole::YesNo => ModelKind::Reranker,
            };
            let heads = raw.get("num_attention_heads").and_then(Value::as_u64).unwrap_or(1) as usize;
            let max = sentence_max_seq_length(dir).unwrap_or(usize::MAX);
            let positions = summary.context_length.unwrap_or(usize::MAX).min(max);
            summary.context_length = Some(crate::model::encoder::decoder_token_limit(heads, positions));
        }
    }
    let method = raw.get("quantization_config").and_then(|q| q.get("quant_method")).and_then(Value::as_str);
    if let Some(method) = method.filter(|m| *m != "mxfp4") {
        reasons.push(format!("{method} quantization is not supported (use an MLX conversion)"));
    }
    if !dir.join("tokenizer.json").exists() {
        reasons.push("tokenizer.json is missing".into());
    }
    let has_weights = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"));
    if !has_weights {
        reasons.push("no .safetensors weights".into());
    }
    summary.unloadable_reason = (!reasons.is_empty()).then(|| reasons.join("; "));
    summary
}

/// Whether the folder's model reads images: a family whose tower FastMLX runs, and the tower's
/// tensors among its weights (read from the index or the files' headers, no tensor data).
fn reads_images(dir: &Path, outer: &Value) -> bool {
    use crate::model::vision::processor::{FAMILIES_THAT_SEE, TOWER_PREFIXES};
    let model_type = outer.get("model_type").and_then(Value::as_str).unwrap_or_default();
    if !FAMILIES_THAT_SEE.contains(&model_type) {
        return false;
    }
    let is_tower = |name: &str| TOWER_PREFIXES.iter().any(|(p, key)| name == format!("{p}{key}"));
    if let Ok(text) = std::fs::read_to_string(dir.join("model.safetensors.index.json")) {
        let index: Value = serde_json::from_str(&text).unwrap_or_default();
        return index.get("weight_map").and_then(Value::as_object).is_some_and(|m| m.keys().any(|k| is_tower(k)));
    }
    let files = std::fs::read_dir(dir).into_iter().flatten().flatten();
    files
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .any(|e| safetensors_names(&e.path()).iter().any(|n| is_tower(n)))
}

/// The tensor names in a safetensors file's header (its first 8 bytes say how long the header is).
fn safetensors_names(path: &Path) -> Vec<String> {
    use std::io::Read;
    let read = || -> std::io::Result<Vec<String>> {
        let mut file = std::fs::File::open(path)?;
        let mut len = [0u8; 8];
        file.read_exact(&mut len)?;
        let len = u64::from_le_bytes(len);
        // A header past 100 MB is not a checkpoint's.
        if len > 100 << 20 {
            return Ok(Vec::new());
        }
        let mut header = vec![0u8; len as usize];
        file.read_exact(&mut header)?;
        let header: Value = serde_json::from_slice(&header).unwrap_or_default();
        Ok(header.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default())
    };
    read().unwrap_or_default()
}

/// A generating model's size, or why this build cannot load it.
fn inspect_decoder(model_type: &str, raw: &Value, summary: &mut ModelSummary, reasons: &mut Vec<String>) {
    match Arch::from_model_type(model_type) {
        None => reasons.push(format!("architecture {model_type:?} is not supported")),
        Some(arch) => match serde_json::from_value::<HfConfig>(raw.clone())
            .map_err(|e| e.to_string())
            .and_then(|hf| arch::model_config(arch, &hf))
        {
            Ok(config) => summary.parameters = Some(config.parameter_count()),
            Err(e) => reasons.push(format!("config.json: {e}")),
        },
    }
}

/// An embedding model's or reranker's kind, size and the most tokens it takes.
fn inspect_encoder(dir: &Path, raw: &Value, summary: &mut ModelSummary, reasons: &mut Vec<String>) {
    let config_path = dir.join("config.json");
    summary.kind = crate::model::encoder::encoder_kind(raw).map_or(ModelKind::Embedding, ModelKind::from);
    match crate::model::encoder::encoder_shape(raw, &config_path) {
        Ok((parameters, max_tokens)) => {
            summary.parameters = Some(parameters);
            let st_max = sentence_max_seq_length(dir);
            summary.context_length = Some(st_max.unwrap_or(usize::MAX).min(max_tokens));
        }
        Err(e) => reasons.push(e.to_string()),
    }
}

/// sentence-transformers' `max_seq_length`, where the folder sets one.
fn sentence_max_seq_length(dir: &Path) -> Option<usize> {
    std::fs::read_to_string(dir.join("sentence_bert_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v.get("max_seq_length").and_then(Value::as_u64))
        .map(|n| n as usize)
}

fn inspect_gguf(path: &Path) -> ModelSummary {
    let size_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut summary = ModelSummary {
        format: "gguf",
        kind: ModelKind::Chat,
        architecture: None,
        parameters: None,
        quantization: None,
        context_length: None,
        size_bytes,
        loaded_bytes: None,
        unloadable_reason: None,
        vision: false,
    };
    let header = match gguf_header::read(path) {
        Ok(h) => h,
        Err(e) => {
            summary.unloadable_reason = Some(format!("cannot read the GGUF header: {e}"));
            return summary;
        }
    };
    let arch = header.string("general.architecture").unwrap_or_default().to_string();
    summary.context_length = header.int(&format!("{arch}.context_length")).map(|n| n as usize);
    summary.parameters = Some(header.tensor_elements.iter().sum());
    // Floats are computed in f16 on a GPU, f32 on a CPU; scales and biases follow.
    let compute_bytes = if crate::mlx::gpu_available() { 2.0 } else { 4.0 };
    summary.loaded_bytes = header
        .tensor_types
        .iter()
        .zip(&header.tensor_elements)
        .map(|(&t, &n)| super::gguf_tensors::loaded_bytes_per_weight(t, compute_bytes).map(|b| (b * n as f64) as u64))
        .sum::<Option<u64>>();
    summary.quantization = header.int("general.file_type").map(|t| file_type_name(t as u32).to_string());
    let mut reasons = Vec::new();
    let experts = header.int(&format!("{arch}.expert_count")).is_some_and(|n| n > 0);
    if super::gguf::gguf_arch(&arch, experts).is_none() {
        reasons.push(format!("architecture {arch:?} is not supported"));
    }
    if header.string("tokenizer.ggml.model").is_some_and(|m| m != "gpt2") {
        reasons.push("SentencePiece GGUF tokenizers are not supported (load the Hugging Face folder)".into());
    }
    if let Some(t) = header.tensor_types.iter().find(|t| !super::gguf::is_readable_type(**t)) {
        reasons.push(format!(
            "{} tensors are not read yet ({} are); use an MLX conversion",
            super::gguf::ggml_type_name(*t),
            super::gguf_tensors::readable_names().join(", ")
        ));
    }
    summary.architecture = (!arch.is_empty()).then_some(arch);
    summary.unloadable_reason = (!reasons.is_empty()).then(|| reasons.join("; "));
    summary
}

/// llama.cpp's `general.file_type` names.
fn file_type_name(t: u32) -> &'static str {
    match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => "other",
    }
}

/// Bytes of the files in `dir` (following the HF cache's symlinks to their blobs).
pub fn folder_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                folder_size(&path)
            } else {
                std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)
            }
        })
        .sum()
}

/// The chat template's source, read without loading the model (`chat_template.jinja`, the
/// tokenizer config's `chat_template`, or the GGUF's `tokenizer.chat_template`).
pub fn chat_template_source(path: &Path) -> Option<String> {
    if !path.is_dir() {
        return super::gguf_header::read(path).ok()?.string("tokenizer.chat_template").map(str::to_string);
    }
    if let Ok(text) = std::fs::read_to_string(path.join("chat_template.jinja")) {
        return Some(text);
    }
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(path.join("tokenizer_config.json")).ok()?).ok()?;
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .map(str::to_string),
        _ => None,
    }
}
