//! An encoder's shape from its `config.json`: the BERT family (BERT, MiniLM, BGE, E5) and the
//! RoBERTa family (XLM-RoBERTa: BGE-M3, multilingual E5, bge-reranker), which differ only in
//! where positions start.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::model::error::{ModelError, Result};

/// The encoder families this build runs (ModernBERT's and NomicBERT's shapes are read by their
/// own files).
pub const ENCODER_TYPES: &[&str] = &["bert", "roberta", "xlm-roberta", "modernbert", "nomic_bert"];

#[derive(Debug, Clone)]
pub struct EncoderConfig {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_layers: usize,
    pub num_heads: i32,
    pub intermediate_size: i32,
    pub max_positions: i32,
    pub type_vocab_size: i32,
    pub layer_norm_eps: f32,
    /// Where the first token's position is: 0 for BERT; RoBERTa counts from its padding id + 1.
    pub position_offset: i32,
    /// Outputs of a sequence-classification head (rerankers: 1), when the checkpoint is one.
    pub num_labels: Option<usize>,
}

#[derive(Deserialize)]
struct Raw {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    num_hidden_layers: usize,
    num_attention_heads: i32,
    intermediate_size: i32,
    max_position_embeddings: i32,
    #[serde(default = "two")]
    type_vocab_size: i32,
    #[serde(default = "bert_eps")]
    layer_norm_eps: f32,
    #[serde(default = "gelu")]
    hidden_act: String,
    #[serde(default)]
    pad_token_id: Option<i32>,
    #[serde(default)]
    position_embedding_type: Option<String>,
    #[serde(flatten)]
    classifier: ClassifierFields,
}

/// What says whether a checkpoint is a sequence classifier (a reranker), and with how many labels.
#[derive(Deserialize)]
pub(super) struct ClassifierFields {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    id2label: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    num_labels: Option<usize>,
}

impl ClassifierFields {
    /// The outputs of its classification head, when the checkpoint has one.
    pub(super) fn labels(&self) -> Option<usize> {
        let classifier = self.architectures.iter().any(|a| a.ends_with("ForSequenceClassification"));
        classifier.then(|| self.num_labels.or(self.id2label.as_ref().map(|m| m.len())).unwrap_or(2))
    }
}

fn two() -> i32 {
    2
}
fn bert_eps() -> f32 {
    1e-12
}
fn gelu() -> String {
    "gelu".into()
}

impl EncoderConfig {
    pub fn from_json(json: &Value, path: &Path) -> Result<EncoderConfig> {
        let bad = |message: String| ModelError::Config { path: path.to_path_buf(), message };
        let raw: Raw = serde_json::from_value(json.clone()).map_err(|e| bad(e.to_string()))?;
        const READ_HERE: [&str; 3] = ["bert", "roberta", "xlm-roberta"];
        if !READ_HERE.contains(&raw.model_type.as_str()) {
            return Err(ModelError::UnsupportedArch {
                path: path.to_path_buf(),
                model_type: raw.model_type,
                supported: READ_HERE.join(", "),
            });
        }
        // HF's "gelu" is the exact (erf) form; the others are other functions.
        if raw.hidden_act != "gelu" {
            return Err(bad(format!("hidden_act {:?} (supported: \"gelu\")", raw.hidden_act)));
        }
        if let Some(kind) = raw.position_embedding_type.as_deref().filter(|k| *k != "absolute") {
            return Err(bad(format!("position_embedding_type {kind:?} (supported: \"absolute\")")));
        }
        if raw.num_attention_heads <= 0 || raw.hidden_size % raw.num_attention_heads != 0 {
            return Err(bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                raw.hidden_size, raw.num_attention_heads
            )));
        }
        let roberta = raw.model_type != "bert";
        let position_offset = if roberta { raw.pad_token_id.unwrap_or(1) + 1 } else { 0 };
        let num_labels = raw.classifier.labels();
        Ok(EncoderConfig {
            model_type: raw.model_type,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            intermediate_size: raw.intermediate_size,
            max_positions: raw.max_position_embeddings,
            type_vocab_size: raw.type_vocab_size,
            layer_norm_eps: raw.layer_norm_eps,
            position_offset,
            num_labels,
        })
    }

    /// The most tokens a sequence can have: positions past the table do not exist.
    pub fn max_tokens(&self) -> usize {
        (self.max_positions - self.position_offset).max(0) as usize
    }

    /// RoBERTa's checkpoints keep their modules under `roberta.`, classifiers their encoder under
    /// `bert.`: the names below drop those prefixes.
    pub fn is_roberta(&self) -> bool {
        self.model_type != "bert"
    }

    pub fn parameter_count(&self) -> u64 {
        let (h, i) = (self.hidden_size as u64, self.intermediate_size as u64);
        let embed = (self.vocab_size as u64 + self.max_positions as u64 + self.type_vocab_size as u64) * h;
        let layer = 4 * h * h + 2 * h * i;
        embed + self.num_layers as u64 * layer
    }
}

/// Whether the folder's `config.json` names an encoder family (the catalog's kind).
pub fn is_encoder_config(json: &Value) -> bool {
    json.get("model_type").and_then(Value::as_str).is_some_and(|t| ENCODER_TYPES.contains(&t))
}
