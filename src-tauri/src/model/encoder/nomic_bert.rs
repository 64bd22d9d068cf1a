//! NomicBERT (nomic-embed-text v1 and v1.5, nomic-bert-2048): a post-norm BERT without a
//! position table: rotary positions over each whole head (base `rotary_emb_base`), a fused QKV
//! projection and no biases in the projections, a SwiGLU MLP (`fc11` up, `fc12` the gate, `fc2`
//! down), LayerNorms after the attention and after the MLP. Read in the layout the Hub ships
//! (the GPT-2 style names of its remote code: `n_embd`, `n_head`, `n_layer`, `n_inner`), the
//! layout transformers' own `nomic_bert` converts from.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{add, multiply};
use mlx_rs::Array;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

use super::decoder::pass_mask;
use crate::model::error::{ModelError, Result};
use crate::model::layers::{Embedding, LayerNorm, Linear};
use crate::model::weights::Weights;

#[derive(Debug, Clone)]
pub struct NomicBertConfig {
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_layers: usize,
    pub num_heads: i32,
    pub max_positions: usize,
    type_vocab_size: i32,
    norm_eps: f32,
    rope_theta: f32,
}

#[derive(Deserialize)]
struct Raw {
    vocab_size: i32,
    n_embd: i32,
    n_layer: usize,
    n_head: i32,
    #[serde(default)]
    n_inner: Option<i32>,
    #[serde(default = "positions")]
    n_positions: usize,
    #[serde(default = "two")]
    type_vocab_size: i32,
    #[serde(default = "eps")]
    layer_norm_epsilon: f32,
    #[serde(default = "base")]
    rotary_emb_base: f32,
    #[serde(default)]
    rotary_emb_fraction: f32,
    #[serde(default)]
    rotary_emb_interleaved: bool,
    #[serde(default)]
    rotary_scaling_factor: Option<f32>,
    #[serde(default = "gelu_new")]
    activation_function: String,
    #[serde(default)]
    prenorm: bool,
    #[serde(default)]
    causal: bool,
    #[serde(default = "yes")]
    qkv_proj_bias: bool,
    #[serde(default = "yes")]
    mlp_fc1_bias: bool,
    #[serde(default = "yes")]
    mlp_fc2_bias: bool,
    #[serde(default)]
    use_rms_norm: bool,
    #[serde(default)]
    parallel_block: bool,
}

// The defaults are those of nomic's configuration class (GPT-2's where it inherits them); the
// published checkpoints state every one.
fn positions() -> usize {
    1024
}
fn two() -> i32 {
    2
}
fn eps() -> f32 {
    1e-5
}
fn base() -> f32 {
    10_000.0
}
fn gelu_new() -> String {
    "gelu_new".into()
}
fn yes() -> bool {
    true
}

impl NomicBertConfig {
    pub fn from_json(json: &Value, path: &Path) -> Result<NomicBertConfig> {
        let bad = |message: String| ModelError::Config { path: path.to_path_buf(), message };
        let raw: Raw = serde_json::from_value(json.clone()).map_err(|e| bad(e.to_string()))?;
        // The variants nomic's code allows that no published embedder uses (nor transformers'
        // own `nomic_bert`, the reference): refused by name rather than run as something else.
        let unsupported = [
            (raw.activation_function != "swiglu", format!("activation_function {:?}", raw.activation_function)),
            (raw.prenorm, "prenorm".into()),
            (raw.causal, "causal attention".into()),
            (raw.use_rms_norm, "use_rms_norm".into()),
            (raw.parallel_block, "parallel_block".into()),
            (raw.rotary_scaling_factor.is_some(), "rotary_scaling_factor (dynamic NTK scaling)".into()),
            (raw.rotary_emb_fraction != 1.0, format!("rotary_emb_fraction {}", raw.rotary_emb_fraction)),
            (raw.rotary_emb_interleaved, "rotary_emb_interleaved".into()),
            (raw.qkv_proj_bias || raw.mlp_fc1_bias || raw.mlp_fc2_bias, "biases in its projections".into()),
        ];
        if let Some((_, what)) = unsupported.into_iter().find(|(on, _)| *on) {
            return Err(bad(format!("NomicBERT with {what} is not supported")));
        }
        if raw.n_head <= 0 || raw.n_embd % raw.n_head != 0 {
            return Err(bad(format!("n_embd {} is not a multiple of n_head {}", raw.n_embd, raw.n_head)));
        }
        Ok(NomicBertConfig {
            vocab_size: raw.vocab_size,
            hidden_size: raw.n_embd,
            intermediate_size: raw.n_inner.unwrap_or(4 * raw.n_embd),
            num_layers: raw.n_layer,
            num_heads: raw.n_head,
            max_positions: raw.n_positions,
            type_vocab_size: raw.type_vocab_size,
            norm_eps: raw.layer_norm_epsilon,
            rope_theta: raw.rotary_emb_base,
        })
    }

    pub fn parameter_count(&self) -> u64 {
        let (h, i) = (self.hidden_size as u64, self.intermediate_size as u64);
        (self.vocab_size as u64 + self.type_vocab_size as u64) * h + self.num_layers as u64 * (4 * h * h + 3 * h * i)
    }
}

struct Layer {
    qkv: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    up: Linear,
    gate: Linear,
    down: Linear,
    mlp_norm: LayerNorm,
}

pub struct NomicBert {
    pub config: NomicBertConfig,
    words: Embedding,
    /// None when the checkpoint has no segment embeddings (`type_vocab_size` 0).
    types: Option<Embedding>,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
}

impl NomicBert {
    /// Takes the model's tensors, named as the Hub's checkpoints name them (`bert.` removed).
    pub fn build(config: NomicBertConfig, weights: &mut Weights) -> Result<NomicBert> {
        let (h, i, eps) = (config.hidden_size, config.intermediate_size, config.norm_eps);
        let words = weights.embedding("embeddings.word_embeddings", config.vocab_size, h)?;
        let types = if config.type_vocab_size > 0 {
            Some(weights.embedding("embeddings.token_type_embeddings", config.type_vocab_size, h)?)
        } else {
            None
        };
        let embedding_norm = weights.layer_norm("emb_ln", h, eps, true)?;
        let layers = (0..config.num_layers)
            .map(|l| {
                let p = format!("encoder.layers.{l}");
                Ok(Layer {
                    qkv: weights.linear(&format!("{p}.attn.Wqkv"), 3 * h, h, false)?,
                    attention_out: weights.linear(&format!("{p}.attn.out_proj"), h, h, false)?,
                    attention_norm: weights.layer_norm(&format!("{p}.norm1"), h, eps, true)?,
                    up: weights.linear(&format!("{p}.mlp.fc11"), i, h, false)?,
                    gate: weights.linear(&format!("{p}.mlp.fc12"), i, h, false)?,
                    down: weights.linear(&format!("{p}.mlp.fc2"), h, i, false)?,
                    mlp_norm: weights.layer_norm(&format!("{p}.norm2"), h, eps, true)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(NomicBert { config, words, types, embedding_norm, layers })
    }

    /// `ids` and `type_ids`: `[rows, len]`, row `r` holding `lengths[r]` tokens padded on the
    /// right. Returns the last hidden states, `[rows, len, hidden]`.
    pub fn forward(&self, ids: &Array, type_ids: &Array, lengths: &[usize]) -> Result<Array> {
        let (rows, len) = (ids.shape()[0], ids.shape()[1]);
        let c = &self.config;
        let heads = c.num_heads;
        let head_dim = c.hidden_size / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mask = pass_mask(lengths, len as usize, true, None);
        let mut x = self.words.forward(ids)?;
        if let Some(types) = &self.types {
            x = add(&x, &types.forward(type_ids)?)?;
        }
        x = self.embedding_norm.forward(&x)?;
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x)?.reshape(&[rows, len, 3, heads, head_dim])?;
            let qkv = qkv.transpose_axes(&[2, 0, 3, 1, 4])?; // [3, rows, heads, len, head_dim]
            let (q, k, v) = (qkv.try_index(0)?, qkv.try_index(1)?, qkv.try_index(2)?);
            let rotate = |t: &Array| mlx_rs::fast::rope(t, head_dim, false, Some(c.rope_theta), 1.0, 0, None::<&Array>);
            let (q, k) = (rotate(&q)?, rotate(&k)?);
            let attended = mlx_rs::fast::scaled_dot_product_attention(&q, &k, &v, scale, &mask, None)?;
            let attended = attended.transpose_axes(&[0, 2, 1, 3])?.reshape(&[rows, len, c.hidden_size])?;
            x = layer.attention_norm.forward(&add(&x, &layer.attention_out.forward(&attended)?)?)?;
            let gated = multiply(&layer.up.forward(&x)?, &mlx_rs::nn::silu(&layer.gate.forward(&x)?)?)?;
            x = layer.mlp_norm.forward(&add(&x, &layer.down.forward(&gated)?)?)?;
        }
        Ok(x)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = self.words.arrays();
        all.extend(self.types.iter().flat_map(Embedding::arrays));
        all.extend(self.embedding_norm.arrays());
        for l in &self.layers {
            for linear in [&l.qkv, &l.attention_out, &l.up, &l.gate, &l.down] {
                all.extend(linear.arrays());
            }
            all.extend(l.attention_norm.arrays());
            all.extend(l.mlp_norm.arrays());
        }
        all
    }
}
