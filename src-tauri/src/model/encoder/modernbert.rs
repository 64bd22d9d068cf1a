//! ModernBERT (gte-modernbert, modernbert-embed, Granite Embedding R2, gte-reranker-modernbert):
//! a pre-norm encoder without position tables: rotary positions (a long base in the global
//! layers, a short one in the local ones), every `global_attn_every_n_layers`-th layer attending
//! to the whole text and the others to `local_attention / 2` tokens each way, fused QKV, a GeGLU
//! MLP, LayerNorms without bias. Its sequence-classification head pools (CLS or mean), then
//! dense, GELU, norm, and the labels.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{add, divide, multiply, split_equal, sum_axis};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

use super::config::ClassifierFields;
use super::decoder::pass_mask;
use crate::model::error::{ModelError, Result};
use crate::model::layers::{Embedding, LayerNorm, Linear};
use crate::model::weights::Weights;

#[derive(Debug, Clone)]
pub struct ModernBertConfig {
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_layers: usize,
    pub num_heads: i32,
    pub max_positions: usize,
    norm_eps: f32,
    norm_bias: bool,
    global_rope_theta: f32,
    local_rope_theta: f32,
    global_every: usize,
    local_window: usize,
    attention_bias: bool,
    mlp_bias: bool,
    /// The classification head pools the CLS token (else the mean).
    classifier_cls: bool,
    classifier_bias: bool,
    /// Outputs of a sequence-classification head, when the checkpoint is one.
    pub num_labels: Option<usize>,
}

#[derive(Deserialize)]
struct Raw {
    vocab_size: i32,
    hidden_size: i32,
    intermediate_size: i32,
    num_hidden_layers: usize,
    num_attention_heads: i32,
    #[serde(default = "positions")]
    max_position_embeddings: usize,
    #[serde(default = "eps")]
    norm_eps: f32,
    #[serde(default)]
    norm_bias: bool,
    #[serde(default = "global_theta")]
    global_rope_theta: f32,
    #[serde(default = "local_theta")]
    local_rope_theta: f32,
    #[serde(default = "three")]
    global_attn_every_n_layers: usize,
    #[serde(default = "window")]
    local_attention: usize,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default = "gelu")]
    hidden_activation: String,
    #[serde(default = "gelu")]
    classifier_activation: String,
    #[serde(default = "mean")]
    classifier_pooling: String,
    #[serde(default)]
    classifier_bias: bool,
    #[serde(flatten)]
    classifier: ClassifierFields,
}

fn positions() -> usize {
    8192
}
fn eps() -> f32 {
    1e-5
}
fn global_theta() -> f32 {
    160_000.0
}
fn local_theta() -> f32 {
    10_000.0
}
fn three() -> usize {
    3
}
fn window() -> usize {
    128
}
fn gelu() -> String {
    "gelu".into()
}
fn mean() -> String {
    "mean".into()
}

impl ModernBertConfig {
    pub fn from_json(json: &Value, path: &Path) -> Result<ModernBertConfig> {
        let bad = |message: String| ModelError::Config { path: path.to_path_buf(), message };
        let raw: Raw = serde_json::from_value(json.clone()).map_err(|e| bad(e.to_string()))?;
        for (what, act) in
            [("hidden_activation", &raw.hidden_activation), ("classifier_activation", &raw.classifier_activation)]
        {
            if act != "gelu" {
                return Err(bad(format!("{what} {act:?} (supported: \"gelu\")")));
            }
        }
        if raw.num_attention_heads <= 0 || raw.hidden_size % raw.num_attention_heads != 0 {
            return Err(bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                raw.hidden_size, raw.num_attention_heads
            )));
        }
        let num_labels = raw.classifier.labels();
        Ok(ModernBertConfig {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            max_positions: raw.max_position_embeddings,
            norm_eps: raw.norm_eps,
            norm_bias: raw.norm_bias,
            global_rope_theta: raw.global_rope_theta,
            local_rope_theta: raw.local_rope_theta,
            global_every: raw.global_attn_every_n_layers.max(1),
            local_window: raw.local_attention,
            attention_bias: raw.attention_bias,
            mlp_bias: raw.mlp_bias,
            classifier_cls: raw.classifier_pooling == "cls",
            classifier_bias: raw.classifier_bias,
            num_labels,
        })
    }

    pub fn parameter_count(&self) -> u64 {
        let (h, i) = (self.hidden_size as u64, self.intermediate_size as u64);
        self.vocab_size as u64 * h + self.num_layers as u64 * (4 * h * h + 3 * h * i)
    }

    fn is_global(&self, layer: usize) -> bool {
        layer.is_multiple_of(self.global_every)
    }
}

struct Layer {
    /// None in layer 0 (the embeddings' norm comes just before).
    attention_norm: Option<LayerNorm>,
    qkv: Linear,
    attention_out: Linear,
    mlp_norm: LayerNorm,
    mlp_in: Linear,
    mlp_out: Linear,
}

pub struct ModernBert {
    pub config: ModernBertConfig,
    words: Embedding,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    final_norm: LayerNorm,
}

impl ModernBert {
    /// Takes the model's tensors (Hugging Face's `ModernBertModel` names, `model.` removed).
    pub fn build(config: ModernBertConfig, weights: &mut Weights) -> Result<ModernBert> {
        let (h, i, eps, bias) = (config.hidden_size, config.intermediate_size, config.norm_eps, config.norm_bias);
        let norm = |weights: &mut Weights, name: &str| weights.layer_norm(name, h, eps, bias);
        let words = weights.embedding("embeddings.tok_embeddings", config.vocab_size, h)?;
        let embedding_norm = norm(weights, "embeddings.norm")?;
        let layers = (0..config.num_layers)
            .map(|l| {
                let p = format!("layers.{l}");
                Ok(Layer {
                    attention_norm: if l == 0 { None } else { Some(norm(weights, &format!("{p}.attn_norm"))?) },
                    qkv: weights.linear(&format!("{p}.attn.Wqkv"), 3 * h, h, config.attention_bias)?,
                    attention_out: weights.linear(&format!("{p}.attn.Wo"), h, h, config.attention_bias)?,
                    mlp_norm: norm(weights, &format!("{p}.mlp_norm"))?,
                    mlp_in: weights.linear(&format!("{p}.mlp.Wi"), 2 * i, h, config.mlp_bias)?,
                    mlp_out: weights.linear(&format!("{p}.mlp.Wo"), h, i, config.mlp_bias)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let final_norm = norm(weights, "final_norm")?;
        Ok(ModernBert { config, words, embedding_norm, layers, final_norm })
    }

    /// `ids`: `[rows, len]`, row `r` holding `lengths[r]` tokens padded on the right. Returns the
    /// last hidden states, `[rows, len, hidden]`.
    pub fn forward(&self, ids: &Array, lengths: &[usize]) -> Result<Array> {
        let (rows, len) = (ids.shape()[0], ids.shape()[1]);
        let c = &self.config;
        let heads = c.num_heads;
        let head_dim = c.hidden_size / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let global_mask = pass_mask(lengths, len as usize, true, None);
        let local_mask = pass_mask(lengths, len as usize, true, Some(c.local_window));
        let mut x = self.embedding_norm.forward(&self.words.forward(ids)?)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let normed = match &layer.attention_norm {
                Some(norm) => norm.forward(&x)?,
                None => x.clone(),
            };
            let qkv = layer.qkv.forward(&normed)?.reshape(&[rows, len, 3, heads, head_dim])?;
            let qkv = qkv.transpose_axes(&[2, 0, 3, 1, 4])?; // [3, rows, heads, len, head_dim]
            let (q, k, v) = (qkv.try_index(0)?, qkv.try_index(1)?, qkv.try_index(2)?);
            let (theta, mask) =
                if c.is_global(l) { (c.global_rope_theta, &global_mask) } else { (c.local_rope_theta, &local_mask) };
            let rotate = |t: &Array| mlx_rs::fast::rope(t, head_dim, false, Some(theta), 1.0, 0, None::<&Array>);
            let (q, k) = (rotate(&q)?, rotate(&k)?);
            let attended = mlx_rs::fast::scaled_dot_product_attention(&q, &k, &v, scale, mask, None)?;
            let attended = attended.transpose_axes(&[0, 2, 1, 3])?.reshape(&[rows, len, c.hidden_size])?;
            x = add(&x, &layer.attention_out.forward(&attended)?)?;
            let both = layer.mlp_in.forward(&layer.mlp_norm.forward(&x)?)?;
            let halves = split_equal(&both, 2, -1)?;
            let gated = multiply(&mlx_rs::nn::gelu(&halves[0])?, &halves[1])?;
            x = add(&x, &layer.mlp_out.forward(&gated)?)?;
        }
        self.final_norm.forward(&x)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = self.words.arrays();
        all.extend(self.embedding_norm.arrays());
        for l in &self.layers {
            for linear in [&l.qkv, &l.attention_out, &l.mlp_in, &l.mlp_out] {
                all.extend(linear.arrays());
            }
            all.extend(l.attention_norm.iter().flat_map(LayerNorm::arrays));
            all.extend(l.mlp_norm.arrays());
        }
        all.extend(self.final_norm.arrays());
        all
    }
}

/// ModernBERT's sequence-classification head: the CLS token or the mean of the tokens, then
/// dense, GELU, LayerNorm and the labels (one: a sigmoid, as sentence-transformers' CrossEncoder).
pub struct ModernBertClassifier {
    dense: Linear,
    norm: LayerNorm,
    out: Linear,
    cls: bool,
}

impl ModernBertClassifier {
    pub fn build(config: &ModernBertConfig, labels: usize, weights: &mut Weights) -> Result<ModernBertClassifier> {
        let h = config.hidden_size;
        Ok(ModernBertClassifier {
            dense: weights.linear("head.dense", h, h, config.classifier_bias)?,
            norm: weights.layer_norm("head.norm", h, config.norm_eps, config.norm_bias)?,
            out: weights.linear("classifier", labels as i32, h, true)?,
            cls: config.classifier_cls,
        })
    }

    pub fn scores(&self, hidden: &Array, lengths: &[usize]) -> Result<Vec<f32>> {
        let pooled = if self.cls {
            hidden.try_index((.., 0, ..))?
        } else {
            let len = hidden.shape()[1] as usize;
            let weights: Vec<f32> =
                lengths.iter().flat_map(|&n| (0..len).map(move |j| if j < n { 1.0 } else { 0.0 })).collect();
            let w = Array::from_slice(&weights, &[lengths.len() as i32, len as i32, 1]).as_dtype(hidden.dtype())?;
            divide(&sum_axis(&multiply(hidden, &w)?, 1, false)?, &sum_axis(&w, 1, false)?)?
        };
        let x = self.norm.forward(&mlx_rs::nn::gelu(&self.dense.forward(&pooled)?)?)?;
        let logits = self.out.forward(&x)?.as_dtype(Dtype::Float32)?;
        let labels = logits.shape()[1];
        let probs = if labels == 1 {
            mlx_rs::ops::sigmoid(&logits)?
        } else {
            mlx_rs::ops::softmax_axis(&logits, -1, None)?.try_index((.., (labels - 1)..))?
        };
        probs.eval()?;
        Ok(probs.as_slice::<f32>().to_vec())
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = self.dense.arrays();
        all.extend(self.norm.arrays());
        all.extend(self.out.arrays());
        all
    }
}
