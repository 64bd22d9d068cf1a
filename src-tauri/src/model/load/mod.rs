//! Loading a model from disk: a Hugging Face / MLX-community folder or a single GGUF file.
//! Either way the result is the same [`LoadedModel`]: transformer, tokenizer, chat template.

mod gguf;
mod hf_dir;

use std::path::{Path, PathBuf};

use crate::mlx::Backend;
use crate::model::error::{ModelError, Result};
use crate::model::Transformer;
use crate::tokenizer::{ChatTemplate, Tokenizer};

/// Everything needed to generate text with a model.
pub struct LoadedModel {
    /// A display name: the folder or file name.
    pub name: String,
    pub path: PathBuf,
    pub transformer: Transformer,
    pub tokenizer: Tokenizer,
    /// `None` when the model ships no chat template (a base model).
    pub chat_template: Option<ChatTemplate>,
    /// Bytes the weights take in memory.
    pub weights_bytes: usize,
}

/// Loads the model at `path` (a folder with `config.json`, or a `.gguf` file).
pub fn load_model(path: &Path, backend: &Backend) -> Result<LoadedModel> {
    if !path.exists() {
        return Err(ModelError::NotFound { path: path.to_path_buf() });
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| path.display().to_string());
    let (transformer, tokenizer, chat_template) = if path.is_dir() {
        hf_dir::load(path, backend)?
    } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        gguf::load(path, backend)?
    } else {
        return Err(ModelError::Config {
            path: path.to_path_buf(),
            message: "not a model: expected a folder with config.json or a .gguf file".into(),
        });
    };
    let weights_bytes = transformer.materialize().map_err(|e| ModelError::Weights { path: path.to_path_buf(), message: e.to_string() })?;
    Ok(LoadedModel { name, path: path.to_path_buf(), transformer, tokenizer, chat_template, weights_bytes })
}
