//! Encoder models: text to vectors (embedding models) or query-document pairs to relevance
//! scores (rerankers), loaded from a Hugging Face or sentence-transformers folder. The network
//! is a BERT-family encoder or a chat family's decoder (Qwen3-Embedding, EmbeddingGemma,
//! Qwen3-Reranker). A batch is a list of tokenized texts run as the rows of one forward,
//! padded to the longest.

mod bert;
mod classifier;
pub mod config;
mod decoder;
mod modernbert;
mod nomic_bert;
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
pub use decoder::{decoder_role, DecoderEncoder, DecoderRole};
pub use pooling::{Pooling, PoolingMode};
pub use tokens::{EncodeError, EncodedText, EncoderTokenizer, TooLong};

use classifier::Classifier;
use modernbert::{ModernBert, ModernBertClassifier, ModernBertConfig};
use nomic_bert::{NomicBert, NomicBertConfig};
use sentence::SentenceLayout;

use crate::mlx::Backend;
use crate::model::checkpoint::{quant_config, read_safetensors, stored_dtype};
use crate::model::error::{ModelError, Result};
use crate::model::weights::Weights;

/// What an encoder model is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EncoderKind {
    Embedding,
    Reranker,
}

/// The network that turns tokens into token vectors.
enum Backbone {
    Bert(Encoder),
    ModernBert(ModernBert),
    NomicBert(NomicBert),
    /// Boxed: a whole transformer beside the encoders' few fields.
    Decoder(Box<DecoderEncoder>),
}

enum Head {
    Vectors(SentenceLayout),
    /// A cross-encoder's classification head.
    Scores(Classifier),
    /// ModernBERT's (pooled, then dense, GELU and norm).
    ModernBertScores(ModernBertClassifier),
    /// A decoder judge's "yes" and "no" tokens.
    Judge {
        yes: u32,
        no: u32,
    },
}

pub struct Embedder {
    /// The folder's name.
    pub name: String,
    pub path: PathBuf,
    pub tokenizer: Arc<EncoderTokenizer>,
    backbone: Backbone,
    head: Head,
    /// Bytes the weights take in memory.
    pub weights_bytes: usize,
}

/// One text's attention scores in one layer (f32, every head) stay within this (the batch
/// planner's bound, `engine::embed::BatchLimits`): a decoder embedder takes at most the tokens
/// that allows (Qwen3-Embedding-0.6B: 2,048), rather than a forward larger than the memory
/// governor counted.
const MAX_ROW_SCORE_BYTES: usize = 256 << 20;

/// The most tokens a decoder encoder with `heads` attention heads takes in one text: its
/// positions, within `MAX_ROW_SCORE_BYTES` of scores (in steps of 256, at least 256).
pub fn decoder_token_limit(heads: usize, positions: usize) -> usize {
    let score_limit = ((MAX_ROW_SCORE_BYTES / (heads.max(1) * 4)) as f64).sqrt() as usize / 256 * 256;
    positions.min(score_limit.max(256))
}

impl Embedder {
    /// An encoder family's folder (BERT, RoBERTa, ModernBERT, NomicBERT) with its `config.json`
    /// `raw`. `model::load::load_embedder` reads any embedder's folder, a decoder's included.
    pub fn load_encoder(dir: &Path, raw: &serde_json::Value, backend: &Backend) -> Result<Embedder> {
        let config_path = dir.join("config.json");
        match raw.get("model_type").and_then(serde_json::Value::as_str) {
            Some("modernbert") => return Embedder::load_modernbert(dir, backend, raw),
            Some("nomic_bert") => return Embedder::load_nomic_bert(dir, backend, raw),
            _ => {}
        }
        let config = EncoderConfig::from_json(raw, &config_path)?;
        let mut weights = read_weights(dir, raw, backend)?;
        let head = match config.num_labels {
            Some(labels) => Head::Scores(Classifier::build(&config, labels, &mut weights)?),
            None => Head::Vectors(SentenceLayout::read(dir, weights.dtype)?),
        };
        let encoder = Encoder::build(config, &mut weights)?;
        let tokenizer = head.tokenizer(dir, encoder.config.max_tokens())?;
        Embedder::finish(dir, tokenizer, Backbone::Bert(encoder), head)
    }

    fn load_modernbert(dir: &Path, backend: &Backend, raw: &serde_json::Value) -> Result<Embedder> {
        let config = ModernBertConfig::from_json(raw, &dir.join("config.json"))?;
        let mut weights = read_weights(dir, raw, backend)?;
        let head = match config.num_labels {
            Some(labels) => Head::ModernBertScores(ModernBertClassifier::build(&config, labels, &mut weights)?),
            None => Head::Vectors(SentenceLayout::read(dir, weights.dtype)?),
        };
        let model = ModernBert::build(config, &mut weights)?;
        let tokenizer = head.tokenizer(dir, model.config.max_positions)?;
        Embedder::finish(dir, tokenizer, Backbone::ModernBert(model), head)
    }

    /// NomicBERT, as an embedding model only (no published reranker is one).
    fn load_nomic_bert(dir: &Path, backend: &Backend, raw: &serde_json::Value) -> Result<Embedder> {
        let config_path = dir.join("config.json");
        if encoder_kind(raw) == Some(EncoderKind::Reranker) {
            return Err(ModelError::Config {
                path: config_path,
                message: "NomicBERT sequence classifiers are not supported (its embedders are)".into(),
            });
        }
        let config = NomicBertConfig::from_json(raw, &config_path)?;
        let mut weights = read_weights(dir, raw, backend)?;
        let head = Head::Vectors(SentenceLayout::read(dir, weights.dtype)?);
        let model = NomicBert::build(config, &mut weights)?;
        let tokenizer = head.tokenizer(dir, model.config.max_positions)?;
        Embedder::finish(dir, tokenizer, Backbone::NomicBert(model), head)
    }

    /// A chat family's decoder as an embedding model (the sentence-transformers layout around
    /// it) or as a judge reranker.
    pub fn from_decoder(dir: &Path, decoder: DecoderEncoder, role: DecoderRole) -> Result<Embedder> {
        let limit = decoder_token_limit(decoder.heads(), decoder.transformer.config.max_position_embeddings);
        let tokenizer_path = dir.join("tokenizer.json");
        let (head, tokenizer) = match role {
            DecoderRole::Embedding => {
                let head = Head::Vectors(SentenceLayout::read(dir, decoder.transformer.dtype)?);
                let tokenizer = head.tokenizer(dir, limit)?;
                (head, tokenizer)
            }
            DecoderRole::YesNo => {
                let tokenizer = EncoderTokenizer::load_judge(&tokenizer_path, limit)?;
                let id = |token: &str| {
                    tokenizer.token_id(token).ok_or_else(|| ModelError::Tokenizer {
                        path: tokenizer_path.clone(),
                        message: format!("a judge reranker needs {token:?} in its vocabulary"),
                    })
                };
                (Head::Judge { yes: id("yes")?, no: id("no")? }, tokenizer)
            }
        };
        Embedder::finish(dir, tokenizer, Backbone::Decoder(Box::new(decoder)), head)
    }

    fn finish(dir: &Path, tokenizer: EncoderTokenizer, backbone: Backbone, head: Head) -> Result<Embedder> {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tokenizer = Arc::new(tokenizer);
        let mut embedder = Embedder { name, path: dir.to_path_buf(), tokenizer, backbone, head, weights_bytes: 0 };
        embedder.weights_bytes = embedder.materialize()?;
        Ok(embedder)
    }

    /// Attention heads per layer (the batch planner sizes the attention's scores with it).
    pub fn attention_heads(&self) -> usize {
        match &self.backbone {
            Backbone::Bert(encoder) => encoder.config.num_heads as usize,
            Backbone::ModernBert(model) => model.config.num_heads as usize,
            Backbone::NomicBert(model) => model.config.num_heads as usize,
            Backbone::Decoder(decoder) => decoder.heads(),
        }
    }

    fn hidden_size(&self) -> usize {
        match &self.backbone {
            Backbone::Bert(encoder) => encoder.config.hidden_size as usize,
            Backbone::ModernBert(model) => model.config.hidden_size as usize,
            Backbone::NomicBert(model) => model.config.hidden_size as usize,
            Backbone::Decoder(decoder) => decoder.transformer.config.hidden_size,
        }
    }

    pub fn kind(&self) -> EncoderKind {
        match self.head {
            Head::Vectors(_) => EncoderKind::Embedding,
            _ => EncoderKind::Reranker,
        }
    }

    /// The length of the vectors (0 for a reranker).
    pub fn dimensions(&self) -> usize {
        match &self.head {
            Head::Vectors(layout) => match layout.dense.last() {
                Some(dense) => dense.out_features as usize,
                None => self.hidden_size() * layout.pooling.modes.len(),
            },
            _ => 0,
        }
    }

    pub fn vocab_size(&self) -> usize {
        match &self.backbone {
            Backbone::Bert(encoder) => encoder.config.vocab_size as usize,
            Backbone::ModernBert(model) => model.config.vocab_size as usize,
            Backbone::NomicBert(model) => model.config.vocab_size as usize,
            Backbone::Decoder(decoder) => decoder.transformer.config.vocab_size,
        }
    }

    /// Whether the model was trained for shorter vectors (a prefix of its vector is one too).
    /// No checkpoint says so in its files; the decoder embedders of the Qwen3 and Gemma 3
    /// families (Qwen3-Embedding, EmbeddingGemma) were all trained so (Matryoshka
    /// representation learning, per their model cards). The BERT and RoBERTa families' were
    /// not as a rule: requests for fewer dimensions are refused rather than answered with
    /// vectors the model was not trained to make.
    pub fn matryoshka(&self) -> bool {
        use crate::model::config::Arch;
        match (&self.backbone, &self.head) {
            (Backbone::Decoder(decoder), Head::Vectors(_)) => {
                matches!(decoder.transformer.config.arch, Arch::Qwen3 | Arch::Gemma3)
            }
            _ => false,
        }
    }

    /// The prompt used when a request names none (`default_prompt_name`), as sentence-transformers.
    pub fn default_prompt(&self) -> Option<String> {
        match &self.head {
            Head::Vectors(layout) => layout.default_prompt.clone(),
            _ => None,
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
            _ => BTreeMap::new(),
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
        let (hidden, lengths) = match &self.head {
            Head::Vectors(_) => {
                return Err(ModelError::Invalid(format!("{} is an embedding model: it has no scoring head", self.name)))
            }
            _ => self.hidden(pairs)?,
        };
        match (&self.head, &self.backbone) {
            (Head::Scores(classifier), _) => classifier.scores(&hidden),
            (Head::ModernBertScores(classifier), _) => classifier.scores(&hidden, &lengths),
            (Head::Judge { yes, no }, Backbone::Decoder(decoder)) => decoder.judge(&hidden, &lengths, *yes, *no),
            _ => Err(ModelError::Invalid(format!("{}: a judge head needs a decoder", self.name))),
        }
    }

    /// The rows' last hidden states, padded to the longest, and each row's length.
    fn hidden(&self, texts: &[EncodedText]) -> Result<(Array, Vec<usize>)> {
        let len = texts.iter().map(EncodedText::len).max().unwrap_or(0).max(1);
        if let Some(t) = texts.iter().find(|t| t.is_empty()) {
            return Err(ModelError::Invalid(format!("an input has no tokens ({:?})", t.ids)));
        }
        let vocab = self.vocab_size() as u32;
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
        let lengths: Vec<usize> = texts.iter().map(EncodedText::len).collect();
        let hidden = match &self.backbone {
            Backbone::Bert(encoder) => {
                let types = Array::from_slice(&pad(&|t| &t.type_ids), &shape);
                encoder.forward(&ids, &types, &Encoder::key_mask(&lengths, len)?)?
            }
            Backbone::ModernBert(model) => model.forward(&ids, &lengths)?,
            Backbone::NomicBert(model) => {
                let types = Array::from_slice(&pad(&|t| &t.type_ids), &shape);
                model.forward(&ids, &types, &lengths)?
            }
            Backbone::Decoder(decoder) => decoder.forward(&ids, &lengths)?,
        };
        Ok((hidden, lengths))
    }

    /// Evaluates every weight once and returns the bytes they take.
    fn materialize(&self) -> Result<usize> {
        let mut arrays = match &self.backbone {
            Backbone::Bert(encoder) => encoder.arrays(),
            Backbone::ModernBert(model) => model.arrays(),
            Backbone::NomicBert(model) => model.arrays(),
            Backbone::Decoder(decoder) => decoder.arrays(),
        };
        match &self.head {
            Head::Vectors(layout) => arrays.extend(layout.dense.iter().flat_map(|d| d.arrays())),
            Head::Scores(classifier) => arrays.extend(classifier.arrays()),
            Head::ModernBertScores(classifier) => arrays.extend(classifier.arrays()),
            Head::Judge { .. } => {}
        }
        mlx_rs::transforms::eval(arrays.iter().copied())?;
        Ok(arrays.iter().map(|a| a.nbytes()).sum())
    }
}

impl Head {
    /// The model's tokenizer, cutting at sentence-transformers' `max_seq_length` where the
    /// layout sets one, within the `positions` the network has.
    fn tokenizer(&self, dir: &Path, positions: usize) -> Result<EncoderTokenizer> {
        let (layout_max, lowercase) = match self {
            Head::Vectors(layout) => (layout.max_seq_length, layout.lowercase),
            _ => (None, false),
        };
        let max_tokens = layout_max.unwrap_or(usize::MAX).min(positions);
        EncoderTokenizer::load(&dir.join("tokenizer.json"), max_tokens, lowercase)
    }
}

/// An encoder's checkpoint in its compute dtype, its tensors under the names the builders take.
fn read_weights(dir: &Path, raw: &serde_json::Value, backend: &Backend) -> Result<Weights> {
    let config_path = dir.join("config.json");
    let tensors = read_safetensors(dir)?;
    let compute = backend.compute_dtype(stored_dtype(raw, &tensors));
    let mut weights = Weights::new(tensors, dir.to_path_buf(), quant_config(raw, &config_path)?, compute);
    weights.rename_all(canonical_name);
    Ok(weights)
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

/// An encoder's parameters and the most tokens its positions allow, from its `config.json`.
pub fn encoder_shape(config: &serde_json::Value, path: &Path) -> Result<(u64, usize)> {
    match config.get("model_type").and_then(serde_json::Value::as_str) {
        Some("modernbert") => ModernBertConfig::from_json(config, path).map(|c| (c.parameter_count(), c.max_positions)),
        Some("nomic_bert") => NomicBertConfig::from_json(config, path).map(|c| (c.parameter_count(), c.max_positions)),
        _ => EncoderConfig::from_json(config, path).map(|c| (c.parameter_count(), c.max_tokens())),
    }
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
