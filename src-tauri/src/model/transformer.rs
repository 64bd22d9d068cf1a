//! The decoder-only transformer every supported architecture is an instance of:
//! embeddings -> N x (norm, attention, residual, norm, MLP, residual) -> norm -> output head.

use mlx_rs::ops::{add, ge, logical_and, lt, subtract};
use mlx_rs::{Array, Dtype};

use crate::model::config::ModelConfig;
use crate::model::error::Result;
use crate::model::kv_cache::KvCache;
use crate::model::layers::{Attention, AttentionMask, Embedding, Linear, Mlp, QkvProjection, RmsNorm, Rope};
use crate::model::weights::Weights;

pub struct DecoderLayer {
    input_norm: RmsNorm,
    attention: Attention,
    post_attention_norm: RmsNorm,
    mlp: Mlp,
}

pub struct Transformer {
    pub config: ModelConfig,
    /// The dtype activations are computed in.
    pub dtype: Dtype,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None` when the output head is the transposed embedding (tied weights).
    lm_head: Option<Linear>,
}

impl Transformer {
    /// Builds the model from tensors named in the Hugging Face layout
    /// (`model.layers.N.self_attn.q_proj`, ...).
    pub fn build(config: ModelConfig, weights: &mut Weights) -> Result<Transformer> {
        let c = &config;
        let hidden = c.hidden_size as i32;
        let q_dim = (c.num_heads * c.head_dim) as i32;
        let kv_dim = (c.num_kv_heads * c.head_dim) as i32;
        let inter = c.intermediate_size as i32;
        let eps = c.rms_norm_eps;

        let embed = weights.embedding("model.embed_tokens", c.vocab_size as i32, hidden)?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}");
            let qkv = if c.fused_projections {
                QkvProjection::Fused(weights.linear(&format!("{p}.self_attn.qkv_proj"), q_dim + 2 * kv_dim, hidden, c.qkv_bias)?)
            } else {
                QkvProjection::Separate {
                    q: weights.linear(&format!("{p}.self_attn.q_proj"), q_dim, hidden, c.qkv_bias)?,
                    k: weights.linear(&format!("{p}.self_attn.k_proj"), kv_dim, hidden, c.qkv_bias)?,
                    v: weights.linear(&format!("{p}.self_attn.v_proj"), kv_dim, hidden, c.qkv_bias)?,
                }
            };
            let (q_norm, k_norm) = if c.qk_norm {
                let d = c.head_dim as i32;
                (
                    Some(weights.norm(&format!("{p}.self_attn.q_norm"), d, eps)?),
                    Some(weights.norm(&format!("{p}.self_attn.k_norm"), d, eps)?),
                )
            } else {
                (None, None)
            };
            let attention = Attention {
                qkv,
                o: weights.linear(&format!("{p}.self_attn.o_proj"), hidden, q_dim, false)?,
                q_norm,
                k_norm,
                rope: Rope::new(&c.rope, c.max_position_embeddings)?,
                num_heads: c.num_heads as i32,
                num_kv_heads: c.num_kv_heads as i32,
                head_dim: c.head_dim as i32,
            };
            let mlp = if c.fused_projections {
                Mlp::Fused {
                    gate_up: weights.linear(&format!("{p}.mlp.gate_up_proj"), 2 * inter, hidden, false)?,
                    down: weights.linear(&format!("{p}.mlp.down_proj"), hidden, inter, false)?,
                }
            } else {
                Mlp::Separate {
                    gate: weights.linear(&format!("{p}.mlp.gate_proj"), inter, hidden, false)?,
                    up: weights.linear(&format!("{p}.mlp.up_proj"), inter, hidden, false)?,
                    down: weights.linear(&format!("{p}.mlp.down_proj"), hidden, inter, false)?,
                }
            };
            layers.push(DecoderLayer {
                input_norm: weights.norm(&format!("{p}.input_layernorm"), hidden, eps)?,
                attention,
                post_attention_norm: weights.norm(&format!("{p}.post_attention_layernorm"), hidden, eps)?,
                mlp,
            });
        }
        let norm = weights.norm("model.norm", hidden, eps)?;
        let lm_head = if c.tie_word_embeddings || !weights.contains("lm_head.weight") {
            None
        } else {
            Some(weights.linear("lm_head", c.vocab_size as i32, hidden, false)?)
        };
        let dtype = weights.dtype;
        Ok(Transformer { config, dtype, embed, layers, norm, lm_head })
    }

    pub fn new_cache(&self) -> Vec<KvCache> {
        self.layers.iter().map(|_| KvCache::new()).collect()
    }

    /// Hidden states after the final norm, `[B, L, hidden]`, for token ids `[B, L]` that follow
    /// what `cache` holds.
    pub fn forward_hidden(&self, ids: &Array, cache: &mut [KvCache]) -> Result<Array> {
        let mut h = self.embed.forward(ids)?;
        let offset = cache.first().map_or(0, KvCache::offset);
        let len = ids.dim(1);
        let full_mask = self.mask(len, offset, None)?;
        let window_mask = self.config.sliding_window.map(|w| self.mask(len, offset, Some(w))).transpose()?;
        for (i, (layer, cache)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
            let mask = match (&window_mask, self.config.layer_window(i)) {
                (Some(m), Some(_)) => m,
                _ => &full_mask,
            };
            let r = layer.attention.forward(&layer.input_norm.forward(&h)?, mask, cache)?;
            let h1 = add(&h, &r)?;
            let r = layer.mlp.forward(&layer.post_attention_norm.forward(&h1)?)?;
            h = add(&h1, &r)?;
        }
        self.norm.forward(&h)
    }

    /// Logits over the vocabulary for hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed.as_linear(hidden),
        }
    }

    /// Logits `[B, L, vocab]` for every position of `ids`.
    pub fn forward(&self, ids: &Array, cache: &mut [KvCache]) -> Result<Array> {
        let hidden = self.forward_hidden(ids, cache)?;
        self.logits(&hidden)
    }

    /// The attention mask for `len` new tokens after `offset` cached ones.
    fn mask(&self, len: i32, offset: i32, window: Option<usize>) -> Result<AttentionMask> {
        match window {
            Some(window) if offset + len > window as i32 => {
                Ok(AttentionMask::Explicit(window_mask(len, offset, window as i32)?))
            }
            _ if len == 1 => Ok(AttentionMask::None),
            _ => Ok(AttentionMask::Causal),
        }
    }
}

/// `[len, offset + len]` booleans: query `i` (at position `offset + i`) may see key `j` when
/// `j <= offset + i` and `offset + i - j < window`.
fn window_mask(len: i32, offset: i32, window: i32) -> Result<Array> {
    let queries = Array::from_iter(offset..offset + len, &[len, 1]);
    let keys = Array::from_iter(0..offset + len, &[1, offset + len]);
    let distance = subtract(&queries, &keys)?;
    Ok(logical_and(ge(&distance, Array::from_int(0))?, lt(&distance, Array::from_int(window))?)?)
}
