//! The decoder-only transformer every supported architecture is an instance of:
//! embeddings -> N x (norm, attention, residual, norm, MLP, residual) -> norm -> output head.

use mlx_rs::ops::add;
use mlx_rs::{Array, Dtype};

use crate::model::cache::LayerCache;
use crate::model::config::ModelConfig;
use crate::model::error::Result;
use crate::model::kv_cache::KvCache;
use crate::model::layers::{Attention, Embedding, Linear, Mlp, QkvProjection, RmsNorm, Rope};
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
                QkvProjection::Fused(weights.linear(
                    &format!("{p}.self_attn.qkv_proj"),
                    q_dim + 2 * kv_dim,
                    hidden,
                    c.qkv_bias,
                )?)
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

    /// Every array of the model.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.embed.arrays();
        for layer in &self.layers {
            out.push(&layer.input_norm.weight);
            out.push(&layer.post_attention_norm.weight);
            out.extend(layer.attention.arrays());
            out.extend(layer.mlp.arrays());
        }
        out.push(&self.norm.weight);
        out.extend(self.lm_head.iter().flat_map(Linear::arrays));
        out
    }

    /// Reads every weight into memory now (MLX loads lazily), so load errors surface at load
    /// time and the first request does not pay for the I/O. Returns the bytes they take.
    pub fn materialize(&self) -> Result<usize> {
        let arrays = self.arrays();
        mlx_rs::transforms::eval(arrays.iter().copied())?;
        Ok(arrays.iter().map(|a| a.nbytes()).sum())
    }

    /// Key/value cache bytes per token of one sequence (all layers).
    pub fn kv_bytes_per_token(&self) -> usize {
        let c = &self.config;
        let dtype_bytes = if self.dtype == Dtype::Float32 { 4 } else { 2 };
        2 * c.num_layers * c.num_kv_heads * c.head_dim * dtype_bytes
    }

    pub fn new_cache(&self) -> Vec<KvCache> {
        self.layers.iter().map(|_| KvCache::new()).collect()
    }

    /// Hidden states after the final norm, `[B, L, hidden]`, for token ids `[B, L]` that follow
    /// what `cache` holds (one cache per layer, all with the same layout).
    pub fn forward_hidden<C: LayerCache>(&self, ids: &Array, cache: &mut [C]) -> Result<Array> {
        let mut h = self.embed.forward(ids)?;
        let len = ids.dim(1);
        let first = cache.first().ok_or_else(|| crate::model::ModelError::Mlx("no cache".into()))?;
        let positions = first.positions()?;
        let full_mask = first.mask(len, None)?;
        let window_mask = self.config.sliding_window.map(|w| first.mask(len, Some(w))).transpose()?;
        for (i, (layer, cache)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
            let mask = match (&window_mask, self.config.layer_window(i)) {
                (Some(m), Some(_)) => m,
                _ => &full_mask,
            };
            let r = layer.attention.forward(&layer.input_norm.forward(&h)?, mask, &positions, cache)?;
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
    pub fn forward<C: LayerCache>(&self, ids: &Array, cache: &mut [C]) -> Result<Array> {
        let hidden = self.forward_hidden(ids, cache)?;
        self.logits(&hidden)
    }
}
