//! Loading a model from disk: a Hugging Face / MLX-community folder or a single GGUF file.
//! Either way the result is the same [`LoadedModel`]: transformer, tokenizer, chat template.

mod gguf;
mod gguf_header;
mod gguf_kquants;
mod gguf_tensors;
mod hf_dir;
mod inspect;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::mlx::Backend;
use crate::model::error::{ModelError, Result};
use crate::model::Transformer;
use crate::tokenizer::{ChatTemplate, Tokenizer};

pub use inspect::{chat_template_source, folder_size, inspect, ModelKind, ModelSummary};

/// How quantized checkpoints are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// Packed on a GPU; on a CPU expanded to the compute dtype when that fits comfortably in
    /// memory (a quarter of it), because MLX's CPU quantized matmul is a slow single-threaded
    /// kernel while dense matmuls go through a multi-threaded BLAS.
    #[default]
    Auto,
    /// Keep quantized weights packed (MLX's quantized kernels).
    Packed,
    /// Expand quantized weights to the compute dtype at load.
    Dense,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    pub weights: WeightFormat,
}

/// Everything needed to generate text with a model.
pub struct LoadedModel {
    /// A display name: the folder or file name.
    pub name: String,
    pub path: PathBuf,
    pub transformer: Transformer,
    /// Shared with the HTTP tier, which tokenizes requests before they reach the engine.
    pub tokenizer: Arc<Tokenizer>,
    /// `None` when the model ships no chat template (a base model).
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// Bytes the weights take in memory (the vision tower's included).
    pub weights_bytes: usize,
    /// The vision tower and image processor, for a checkpoint whose images FastMLX reads.
    pub vision: Option<crate::model::vision::VisionModel>,
}

/// What a loader reads: the transformer, tokenizer, chat template and vision side.
type Loaded = (Transformer, Tokenizer, Option<ChatTemplate>, Option<crate::model::vision::VisionModel>);

/// Loads the model at `path` (a folder with `config.json`, or a `.gguf` file).
pub fn load_model(path: &Path, backend: &Backend) -> Result<LoadedModel> {
    load_model_with(path, backend, &LoadOptions::default())
}

pub fn load_model_with(path: &Path, backend: &Backend, options: &LoadOptions) -> Result<LoadedModel> {
    load_model_split(path, backend, options, |_| Ok(()))
}

/// Loads the model at `path` cut down by `split` (a cluster rank's pipeline stage or tensor
/// share) as built, before a weight is read (MLX reads lazily), so a rank reads only what it
/// holds. A split model has no vision tower: images are not served across a cluster yet.
pub fn load_model_split(
    path: &Path,
    backend: &Backend,
    options: &LoadOptions,
    split: impl FnOnce(&mut Transformer) -> Result<()>,
) -> Result<LoadedModel> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| path.display().to_string());
    let (transformer, tokenizer, chat_template, vision) = build(path, backend, options)?;
    let (mut transformer, mut vision) = (transformer, vision);
    split(&mut transformer)?;
    if transformer.is_split() {
        vision = None;
    }
    let weights_error = |e: ModelError| ModelError::Weights { path: path.to_path_buf(), message: e.to_string() };
    let mut weights_bytes = transformer.materialize().map_err(weights_error)?;
    if let Some(vision) = &vision {
        let arrays = vision.arrays();
        mlx_rs::transforms::eval(arrays.iter().copied()).map_err(|e| weights_error(e.into()))?;
        weights_bytes += arrays.iter().map(|a| a.nbytes()).sum::<usize>();
    }
    Ok(LoadedModel {
        name,
        path: path.to_path_buf(),
        transformer,
        tokenizer: Arc::new(tokenizer),
        chat_template: chat_template.map(Arc::new),
        weights_bytes,
        vision,
    })
}

/// The model at `path` built, before a weight is read (MLX reads lazily): its shape, what
/// splitting it across machines plans from.
pub fn build_unread(path: &Path, backend: &Backend, options: &LoadOptions) -> Result<Transformer> {
    build(path, backend, options).map(|(transformer, ..)| transformer)
}

fn build(path: &Path, backend: &Backend, options: &LoadOptions) -> Result<Loaded> {
    if !path.exists() {
        return Err(ModelError::NotFound { path: path.to_path_buf() });
    }
    if path.is_dir() {
        hf_dir::load(path, backend, options)
    } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        let (transformer, tokenizer, template) = gguf::load(path, backend, options)?;
        Ok((transformer, tokenizer, template, None))
    } else {
        Err(ModelError::Config {
            path: path.to_path_buf(),
            message: "not a model: expected a folder with config.json or a .gguf file".into(),
        })
    }
}

pub use hf_dir::config_from_json;

/// An embedding model or reranker from its folder: an encoder family's, or a chat family's
/// decoder used as one (Qwen3-Embedding, EmbeddingGemma, Qwen3-Reranker), whose transformer is
/// read as a chat model's is.
pub fn load_embedder(dir: &Path, backend: &Backend) -> Result<crate::model::encoder::Embedder> {
    use crate::model::encoder::{decoder_role, DecoderEncoder, Embedder};
    if !dir.is_dir() {
        return Err(ModelError::NotFound { path: dir.join("config.json") });
    }
    let raw = crate::model::checkpoint::read_json(&dir.join("config.json"))?;
    let text = crate::model::arch::text_config(&raw);
    match decoder_role(dir, &text) {
        Some(role) => {
            let (_, transformer) = hf_dir::load_transformer(dir, backend, &LoadOptions::default())?;
            Embedder::from_decoder(dir, DecoderEncoder::new(dir, transformer, &text)?, role)
        }
        None => Embedder::load_encoder(dir, &raw, backend),
    }
}

/// The model's configuration (its shape) without reading its weights: a folder's
/// `config.json` or a GGUF file's header.
pub fn read_config(path: &Path) -> Result<crate::model::ModelConfig> {
    if path.is_dir() {
        hf_dir::read_config(path)
    } else {
        gguf::read_config(path)
    }
}

/// Whether quantized weights of a model with `parameters` parameters will be expanded when
/// loaded on this machine's device.
pub fn expands_quantized(options: &LoadOptions, parameters: u64) -> bool {
    expand_quantized(options, &Backend { gpu: crate::mlx::gpu_available() }, parameters)
}

/// Whether to expand quantized weights of a model with `parameters` parameters.
pub(crate) fn expand_quantized(options: &LoadOptions, backend: &Backend, parameters: u64) -> bool {
    match options.weights {
        WeightFormat::Packed => false,
        WeightFormat::Dense => true,
        WeightFormat::Auto => {
            let dense_bytes = parameters * 4;
            let memory = crate::mlx::machine_memory_bytes();
            !backend.gpu && dense_bytes <= memory / 4
        }
    }
}
