//! Encoder models: text to vectors (embedding models) or query-document pairs to relevance
//! scores (cross-encoder rerankers), loaded from a Hugging Face or sentence-transformers folder.
//! A batch is a list of tokenized texts run as the rows of one forward, padded to the longest.

mod bert;
mod classifier;
pub mod config;
mod pooling;
mod sentence;
mod tokens;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlx_rs::ops::{divide, maximum, sqrt, sum_axis};
use mlx_rs::{Array, Dtype};

pub use bert::Encoder;
pub use config::{is_encoder_config, EncoderConfig, ENCODER_TYPES};
pub use pooling::{Pooling, PoolingMode};
pub use tokens::{EncodeError, EncodedText, EncoderTokenizer, TooLong};

use classifier::Classifier;
use sentence::SentenceLayout;

use crate::mlx::Backend;
use crate::model::checkpoint::{quant_config, read_json, read_safetensors, stored_dtype};
use crate::model::error::{ModelError, Result};
use crate::model::weights::Weights;

/// What an encoder model is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EncoderKind {
    Embedding,
    Reranker,
}

enum Head {
    Vectors(SentenceLayout),
    Scores(Classifier),
}

pub struct Embedder {
    /// The folder's name.
    pub name: String,
    pub path: PathBuf,
    pub tokenizer: Arc<EncoderTokenizer>,
    encoder: Encoder,
    head: Head,
    /// Bytes the weights take in memory.
    pub weights_bytes: usize,
}

impl Embedder {
    pub fn load(dir: &Path, backend: &Backend) -> Result<Embedder> {
        if !dir.is_dir() {
            return Err(ModelError::NotFound { path: dir.join("config.json") });
        }
        let config_path = dir.join("config.json");
        let raw = read_json(&config_path)?;
        let config = EncoderConfig::from_json(&raw, &config_path)?;
        let tensors = read_safetensors(dir)?;
        let compute = backend.compute_dtype(stored_dtype(&raw, &tensors));
        let mut weights = Weights::new(tensors, dir.to_path_buf(), quant_config(&raw, &config_path)?, compute);
        weights.rename_all(canonical_name);
        let head = match config.num_labels {
            Some(labels) => Head::Scores(Classifier::build(&config, labels, &mut weights)?),
            None => Head::Vectors(SentenceLayout::read(dir, compute)?),
        };
        let encoder = Encoder::build(config, &mut weights)?;
        let layout_max = match &head {
            Head::Vectors(layout) => layout.max_seq_length,
            Head::Scores(_) => None,
        };
        // sentence-transformers' limit where it sets one, within the position table.
        let max_tokens = layout_max.unwrap_or(usize::MAX).min(encoder.config.max_tokens());
        let lowercase = matches!(&head, Head::Vectors(l) if l.lowercase);
        let tokenizer = EncoderTokenizer::load(&dir.join("tokenizer.json"), max_tokens, lowercase)?;
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut embedder =
            Embedder { name, path: dir.to_path_buf(), tokenizer: Arc::new(tokenizer), encoder, head, weights_bytes: 0 };
        embedder.weights_bytes = embedder.materialize()?;
        Ok(embedder)
    }

    /// Attention heads per layer (the batch planner sizes the attention's scores with it).
    pub fn attention_heads(&self) -> usize {
        self.encoder.config.num_heads as usize
    }

    pub fn kind(&self) -> EncoderKind {
        match self.head {
            Head::Vectors(_) => EncoderKind::Embedding,
            Head::Scores(_) => EncoderKind::Reranker,
        }
    }

    /// The length of the vectors (0 for a reranker).
    pub fn dimensions(&self) -> usize {
        match &self.head {
            Head::Vectors(layout) => match layout.dense.last() {
                Some(dense) => dense.out_features as usize,
                None => self.encoder.config.hidden_size as usize * layout.pooling.modes.len(),
            },
            Head::Scores(_) => 0,
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.encoder.config.vocab_size as usize
    }

    /// Whether the model was trained for shorter vectors (a prefix of its vector is one too).
    /// None of the BERT and RoBERTa families' checkpoints says so in its files: `false`, and
    /// requests for fewer dimensions are refused rather than answered with vectors it was not
    /// trained to make.
    pub fn matryoshka(&self) -> bool {
        false
    }

    /// The prompt used when a request names none (`default_prompt_name`), as sentence-transformers.
    pub fn default_prompt(&self) -> Option<String> {
        match &self.head {
            Head::Vectors(layout) => layout.default_prompt.clone(),
            Head::Scores(_) => None,
        }
    }

    /// Whether the vectors come out unit-length.
    pub fn normalizes(&self) -> bool {
        matches!(&self.head, Head::Vectors(layout) if layout.normalize)
    }

    /// The instructions the model was trained with (`"query"` → `"query: "`).
    pub fn prompts(&self) -> BTreeMap<String, String> {
        match &self.head {
            Head::Vectors(layout) => layout.prompts.clone(),
            Head::Scores(_) => BTreeMap::new(),
        }
    }

    /// One vector per text, as sentence-transformers' `encode` makes it.
    pub fn embed(&self, texts: &[EncodedText]) -> Result<Vec<Vec<f32>>> {
        let Head::Vectors(layout) = &self.head else {
            return Err(ModelError::Invalid(format!(
                "{} is a reranker: it scores pairs, it makes no vectors",
                self.name
            )));
        };
        let (hidden, lengths) = self.hidden(texts)?;
        let prompts: Vec<usize> = texts.iter().map(|t| t.prompt_len).collect();
        let mut x = layout.pooling.forward(&hidden, &lengths, &prompts)?;
        for dense in &layout.dense {
            x = dense.forward(&x)?;
        }
        if layout.normalize {
            x = l2_normalize(&x)?;
        }
        let x = x.as_dtype(Dtype::Float32)?;
        x.eval()?;
        let dim = x.shape()[1] as usize;
        Ok(x.as_slice::<f32>().chunks(dim).map(<[f32]>::to_vec).collect())
    }

    /// One relevance score per query-document pair (a reranker's).
    pub fn score(&self, pairs: &[EncodedText]) -> Result<Vec<f32>> {
        let Head::Scores(classifier) = &self.head else {
            return Err(ModelError::Invalid(format!("{} is an embedding model: it has no scoring head", self.name)));
        };
        let (hidden, _) = self.hidden(pairs)?;
        classifier.scores(&hidden)
    }

    /// The rows' last hidden states, padded to the longest, and each row's length.
    fn hidden(&self, texts: &[EncodedText]) -> Result<(Array, Vec<usize>)> {
        let len = texts.iter().map(EncodedText::len).max().unwrap_or(0).max(1);
        if let Some(t) = texts.iter().find(|t| t.is_empty()) {
            return Err(ModelError::Invalid(format!("an input has no tokens ({:?})", t.ids)));
        }
        let vocab = self.encoder.config.vocab_size as u32;
        if let Some(bad) = texts.iter().flat_map(|t| &t.ids).find(|&&id| id >= vocab) {
            return Err(ModelError::Invalid(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        let pad = |values: &dyn Fn(&EncodedText) -> &[u32]| -> Vec<i32> {
            texts
                .iter()
                .flat_map(|t| {
                    let v = values(t);
                    v.iter().map(|&x| x as i32).chain(std::iter::repeat_n(0, len - v.len()))
                })
                .collect()
        };
        let shape = [texts.len() as i32, len as i32];
        let ids = Array::from_slice(&pad(&|t| &t.ids), &shape);
        let types = Array::from_slice(&pad(&|t| &t.type_ids), &shape);
        let lengths: Vec<usize> = texts.iter().map(EncodedText::len).collect();
        let mask = Encoder::key_mask(&lengths, len)?;
        Ok((self.encoder.forward(&ids, &types, &mask)?, lengths))
    }

    /// Evaluates every weight once and returns the bytes they take.
    fn materialize(&self) -> Result<usize> {
        let mut arrays = self.encoder.arrays();
        match &self.head {
            Head::Vectors(layout) => arrays.extend(layout.dense.iter().flat_map(|d| d.arrays())),
            Head::Scores(classifier) => arrays.extend(classifier.arrays()),
        }
        mlx_rs::transforms::eval(arrays.iter().copied())?;
        Ok(arrays.iter().map(|a| a.nbytes()).sum())
    }
}

/// `x / max(‖x‖, 1e-12)` per row, as `torch.nn.functional.normalize`.
pub fn l2_normalize(x: &Array) -> Result<Array> {
    let norm = sqrt(&sum_axis(&x.square()?, -1, true)?)?;
    Ok(divide(x, &maximum(&norm, Array::from_f32(1e-12))?)?)
}

/// The first `dims` numbers of a vector, made unit-length again when the model's are
/// (a Matryoshka-trained model's shorter vectors).
pub fn truncate_vector(mut vector: Vec<f32>, dims: usize, renormalize: bool) -> Vec<f32> {
    vector.truncate(dims);
    if renormalize {
        l2_normalize_vec(vector)
    } else {
        vector
    }
}

/// A vector made unit-length (a zero vector stays zero).
pub fn l2_normalize_vec(mut vector: Vec<f32>) -> Vec<f32> {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    vector.iter_mut().for_each(|v| *v /= norm);
    vector
}

/// Checkpoint names to the ones the encoder takes: task models keep the encoder under `bert.` or
/// `roberta.`; old checkpoints name LayerNorm's parameters `gamma` and `beta`.
fn canonical_name(name: &str) -> Option<String> {
    if name.ends_with("position_ids") {
        return None;
    }
    let name = ["bert.", "roberta.", "model."].iter().find_map(|p| name.strip_prefix(p)).unwrap_or(name);
    let name = match name.strip_suffix(".gamma") {
        Some(base) if base.ends_with("LayerNorm") => format!("{base}.weight"),
        _ => match name.strip_suffix(".beta") {
            Some(base) if base.ends_with("LayerNorm") => format!("{base}.bias"),
            _ => name.to_string(),
        },
    };
    Some(name)
}

/// Which kind of encoder a `config.json` describes (the catalog's view), if it is one.
pub fn encoder_kind(config: &serde_json::Value) -> Option<EncoderKind> {
    if !is_encoder_config(config) {
        return None;
    }
    let classifier = config
        .get("architectures")
        .and_then(|a| a.as_array())
        .is_some_and(|a| a.iter().any(|x| x.as_str().is_some_and(|s| s.ends_with("ForSequenceClassification"))));
    Some(if classifier { EncoderKind::Reranker } else { EncoderKind::Embedding })
}
