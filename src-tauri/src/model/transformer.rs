//! The decoder-only transformer every supported architecture is an instance of:
//! embeddings -> N x (norm, attention, residual, norm, feed-forward, residual) -> norm -> head.
//! The feed-forward is a dense MLP or a mixture of experts; Gemma adds norms on both branches'
//! outputs ("sandwich" norms).

use mlx_rs::ops::{add, clip, divide, multiply};
use mlx_rs::{Array, Dtype};

use crate::model::cache::LayerCache;
use crate::model::cache::Positions;
use crate::model::config::{ModelConfig, QueryScale, RopeConfig};
use crate::model::error::Result;
use crate::model::kv_cache::KvCache;
use crate::model::layers::{
    Attention, Embedding, Linear, Mlp, MlpProjections, MoeBlock, QkvProjection, RmsNorm, Rope, SharedExpert, Sinks,
    SwitchGlu,
};
use crate::model::weights::Weights;

pub enum FeedForward {
    Dense(Mlp),
    Experts(Box<MoeBlock>),
}

impl FeedForward {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward(x),
            FeedForward::Experts(moe) => moe.forward(x),
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            FeedForward::Dense(mlp) => mlp.arrays(),
            FeedForward::Experts(moe) => moe.arrays(),
        }
    }
}

/// Gemma's extra norms: before the feed-forward and on its output (its
/// `post_attention_layernorm` normalises the attention output instead).
pub struct SandwichNorms {
    pre_feedforward: RmsNorm,
    post_feedforward: RmsNorm,
}

pub struct DecoderLayer {
    input_norm: RmsNorm,
    attention: Attention,
    /// Before the feed-forward (Llama), or on the attention output (Gemma, with `sandwich`).
    post_attention_norm: RmsNorm,
    sandwich: Option<SandwichNorms>,
    feed_forward: FeedForward,
}

impl DecoderLayer {
    fn forward<C: LayerCache>(
        &self,
        h: &Array,
        mask: &crate::model::layers::AttentionMask,
        positions: &Positions,
        query_scale: Option<&Array>,
        cache: &mut C,
    ) -> Result<Array> {
        let r = self.attention.forward(&self.input_norm.forward(h)?, mask, positions, query_scale, cache)?;
        match &self.sandwich {
            None => {
                let h1 = add(h, &r)?;
                let r = self.feed_forward.forward(&self.post_attention_norm.forward(&h1)?)?;
                Ok(add(&h1, &r)?)
            }
            Some(norms) => {
                let h1 = residual(h, &self.post_attention_norm.forward(&r)?)?;
                let r = self.feed_forward.forward(&norms.pre_feedforward.forward(&h1)?)?;
                residual(&h1, &norms.post_feedforward.forward(&r)?)
            }
        }
    }
}

/// `x + y`; in float16 summed in f32 and clipped to the f16 range, as Gemma's reference does
/// (its activations outgrow f16).
fn residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::Float16 {
        return Ok(add(x, y)?);
    }
    let sum = add(x.as_dtype(Dtype::Float32)?, y.as_dtype(Dtype::Float32)?)?;
    Ok(clip(&sum, (-65504.0f32, 65504.0f32))?.as_dtype(Dtype::Float16)?)
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
    /// Gemma multiplies the embeddings by sqrt(hidden) (as an array in the compute dtype).
    embed_scale: Option<Array>,
}

impl Transformer {
    /// Builds the model from tensors named in the Hugging Face layout
    /// (`model.layers.N.self_attn.q_proj`, ...).
    pub fn build(config: ModelConfig, weights: &mut Weights) -> Result<Transformer> {
        let c = &config;
        let hidden = c.hidden_size as i32;
        let q_dim = (c.num_heads * c.head_dim) as i32;
        let kv_dim = (c.num_kv_heads * c.head_dim) as i32;
        let eps = c.rms_norm_eps;

        let embed = weights.embedding("model.embed_tokens", c.vocab_size as i32, hidden)?;
        let norm = |weights: &mut Weights, name: &str, dim: i32| -> Result<RmsNorm> {
            let mut n = weights.norm(name, dim, eps)?;
            if c.norm_plus_one {
                n.weight = add(&n.weight, Array::from_f32(1.0))?;
            }
            Ok(n)
        };
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
                    Some(norm(weights, &format!("{p}.self_attn.q_norm"), d)?),
                    Some(norm(weights, &format!("{p}.self_attn.k_norm"), d)?),
                )
            } else {
                (None, None)
            };
            let attention = Attention {
                qkv,
                o: weights.linear(&format!("{p}.self_attn.o_proj"), hidden, q_dim, c.o_bias)?,
                q_norm,
                k_norm,
                rope: Rope::new(&layer_rope(c, i), c.max_position_embeddings)?,
                num_heads: c.num_heads as i32,
                num_kv_heads: c.num_kv_heads as i32,
                head_dim: c.head_dim as i32,
                scale: c.attention_scale.unwrap_or((c.head_dim as f32).powf(-0.5)),
                sinks: if c.attention_sinks {
                    Some(Sinks::new(weights.take_float(&format!("{p}.self_attn.sinks"), &[c.num_heads as i32])?)?)
                } else {
                    None
                },
            };
            let sandwich = if c.sandwich_norms {
                Some(SandwichNorms {
                    pre_feedforward: norm(weights, &format!("{p}.pre_feedforward_layernorm"), hidden)?,
                    post_feedforward: norm(weights, &format!("{p}.post_feedforward_layernorm"), hidden)?,
                })
            } else {
                None
            };
            layers.push(DecoderLayer {
                input_norm: norm(weights, &format!("{p}.input_layernorm"), hidden)?,
                attention,
                post_attention_norm: norm(weights, &format!("{p}.post_attention_layernorm"), hidden)?,
                sandwich,
                feed_forward: feed_forward(c, i, weights)?,
            });
        }
        let norm = norm(weights, "model.norm", hidden)?;
        let lm_head = if c.tie_word_embeddings || !weights.contains("lm_head.weight") {
            None
        } else {
            Some(weights.linear("lm_head", c.vocab_size as i32, hidden, false)?)
        };
        let dtype = weights.dtype;
        let embed_scale = match &c.gemma {
            Some(g) => Some(Array::from_f32(g.embed_scale).as_dtype(dtype)?),
            None => None,
        };
        Ok(Transformer { config, dtype, embed, layers, norm, lm_head, embed_scale })
    }

    /// Every array of the model.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.embed.arrays();
        for layer in &self.layers {
            out.push(&layer.input_norm.weight);
            out.push(&layer.post_attention_norm.weight);
            if let Some(s) = &layer.sandwich {
                out.extend([&s.pre_feedforward.weight, &s.post_feedforward.weight]);
            }
            out.extend(layer.attention.arrays());
            out.extend(layer.feed_forward.arrays());
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
        if let Some(scale) = &self.embed_scale {
            h = multiply(&h, scale)?;
        }
        let len = ids.dim(1);
        let first = cache.first().ok_or_else(|| crate::model::ModelError::Mlx("no cache".into()))?;
        let positions = first.positions()?;
        let full_mask = first.mask(len, None)?;
        let window_mask = self.config.sliding_window.map(|w| first.mask(len, Some(w))).transpose()?;
        let query_scale = self.config.query_scale.map(|s| position_scale(s, &positions, len, h.dtype())).transpose()?;
        for (i, (layer, cache)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
            let mask = match (&window_mask, self.config.layer_window(i)) {
                (Some(m), Some(_)) => m,
                _ => &full_mask,
            };
            h = layer.forward(&h, mask, &positions, query_scale.as_ref(), cache)?;
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

/// Layer `i`'s rotary settings: Gemma's local layers use their own base and no scaling.
fn layer_rope(c: &ModelConfig, i: usize) -> RopeConfig {
    match &c.gemma {
        Some(g) if c.layer_window(i).is_some() => {
            RopeConfig { theta: g.local_rope_theta, scaling: None, ..c.rope.clone() }
        }
        _ => c.rope.clone(),
    }
}

/// Layer `i`'s feed-forward: experts where the config puts them, else a dense MLP.
fn feed_forward(c: &ModelConfig, i: usize, weights: &mut Weights) -> Result<FeedForward> {
    let p = format!("model.layers.{i}.mlp");
    let hidden = c.hidden_size as i32;
    let dense = |weights: &mut Weights, p: &str, inter: i32| -> Result<Mlp> {
        let projections = if c.fused_projections {
            MlpProjections::Fused {
                gate_up: weights.linear(&format!("{p}.gate_up_proj"), 2 * inter, hidden, false)?,
                down: weights.linear(&format!("{p}.down_proj"), hidden, inter, false)?,
            }
        } else {
            MlpProjections::Separate {
                gate: weights.linear(&format!("{p}.gate_proj"), inter, hidden, false)?,
                up: weights.linear(&format!("{p}.up_proj"), inter, hidden, false)?,
                down: weights.linear(&format!("{p}.down_proj"), hidden, inter, false)?,
            }
        };
        Ok(Mlp { projections, activation: c.activation })
    };
    let Some(moe) = c.moe.as_ref().filter(|m| m.is_sparse(i)) else {
        return Ok(FeedForward::Dense(dense(weights, &p, c.intermediate_size as i32)?));
    };
    let (n, inter) = (moe.num_experts as i32, moe.intermediate_size as i32);
    weights.stack_experts(&p, moe.num_experts)?;
    let b = moe.biases;
    let experts = SwitchGlu {
        gate: weights.switch_linear(&format!("{p}.switch_mlp.gate_proj"), n, inter, hidden, b)?,
        up: weights.switch_linear(&format!("{p}.switch_mlp.up_proj"), n, inter, hidden, b)?,
        down: weights.switch_linear(&format!("{p}.switch_mlp.down_proj"), n, hidden, inter, b)?,
        activation: c.activation,
    };
    let shared = match moe.shared_expert_size {
        Some(size) => Some(SharedExpert {
            mlp: dense(weights, &format!("{p}.shared_expert"), size as i32)?,
            gate: weights.linear(&format!("{p}.shared_expert_gate"), 1, hidden, false)?,
        }),
        None => None,
    };
    Ok(FeedForward::Experts(Box::new(MoeBlock {
        router: weights.linear(&format!("{p}.gate"), n, hidden, moe.biases)?,
        experts,
        top_k: moe.top_k as i32,
        routing: moe.routing,
        shared,
    })))
}

/// Ministral 3's query multiplier for `len` new tokens at `positions`: `[L, 1]` for one offset,
/// `[B, 1, L, 1]` for a batch's rows.
fn position_scale(scale: QueryScale, positions: &Positions, len: i32, dtype: Dtype) -> Result<Array> {
    let steps = Array::arange::<i32, f32>(0, len, 1)?;
    let at = match positions {
        Positions::Scalar(offset) => add(&steps, Array::from_f32(*offset as f32))?.reshape(&[len, 1])?,
        Positions::Rows { offsets, .. } => {
            let rows = offsets.dim(0);
            add(&offsets.as_dtype(Dtype::Float32)?.reshape(&[rows, 1])?, &steps)?.reshape(&[rows, 1, len, 1])?
        }
    };
    let windows = mlx_rs::ops::floor(divide(&at, Array::from_f32(scale.original_max_position_embeddings as f32))?)?;
    let factor = add(
        multiply(mlx_rs::ops::log(add(&windows, Array::from_f32(1.0))?)?, Array::from_f32(scale.beta))?,
        Array::from_f32(1.0),
    )?;
    Ok(factor.as_dtype(dtype)?)
}
