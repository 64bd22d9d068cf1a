//! Load and run errors of models: each names the file and the problem, never a panic.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not found")]
    NotFound { path: PathBuf },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{path}: unsupported model_type {model_type:?} (supported: {supported})")]
    UnsupportedArch { path: PathBuf, model_type: String, supported: String },
    #[error("{path}: tensor {name:?} is missing")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor {name:?} has shape {got:?}, expected {expected:?}")]
    Shape { path: PathBuf, name: String, expected: Vec<i32>, got: Vec<i32> },
    #[error("{path}: unsupported quantization for {name:?}: {message}")]
    Quantization { path: PathBuf, name: String, message: String },
    #[error("{path}: cannot read weights: {message}")]
    Weights { path: PathBuf, message: String },
    #[error("{path}: tokenizer: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("MLX: {0}")]
    Mlx(String),
    /// A setting this model cannot run with.
    #[error("{0}")]
    Invalid(String),
}

impl From<mlx_rs::error::Exception> for ModelError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        ModelError::Mlx(e.what().to_string())
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
