//! Multi-head attention with grouped KV heads, rotary positions, optional q/k norms and an
//! optional sliding window, over a [`KvCache`].

use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::split_at_indices;
use mlx_rs::Array;

use crate::model::cache::{AttentionMask, KvTensor, LayerCache, Positions};
use crate::model::error::Result;
use crate::model::kernels::{host_softmax, kv_matmul};
use crate::model::layers::{shared_attention, CosSin, Linear, RmsNorm, Rope};

/// One logit per query head that joins every softmax with a zero value, so a head can attend
/// to nothing (gpt-oss): as an array for MLX's kernel and as host floats for the CPU path.
pub struct Sinks {
    pub array: Array,
    pub host: Vec<f32>,
}

impl Sinks {
    pub fn new(array: Array) -> Result<Sinks> {
        let array = array.as_dtype(mlx_rs::Dtype::Float32)?;
        array.eval()?;
        let host = array.as_slice::<f32>().to_vec();
        Ok(Sinks { array, host })
    }
}

pub enum QkvProjection {
    Separate {
        q: Linear,
        k: Linear,
        v: Linear,
    },
    /// Phi-3's `qkv_proj`: q, k and v rows one after the other.
    Fused(Linear),
    /// Gemma 4's larger global layers: the keys, before their norm and rotation, are the values.
    KeysAsValues {
        q: Linear,
        k: Linear,
    },
    /// Gemma 4's KV-shared layers: only queries; keys and values come from an earlier layer.
    QueryOnly(Linear),
}

/// What a layer attends over: its own keys and values, appended to its cache, or those an
/// earlier layer produced this step (Gemma 4's KV sharing), with that layer's cache.
pub enum KeysValues<'a> {
    Own,
    Reused(&'a (KvTensor, KvTensor)),
}

pub struct Attention {
    pub qkv: QkvProjection,
    pub o: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    /// The q/k norms span the whole projection (OLMo 3, MiniMax-M2), not each head.
    pub whole_qk_norm: bool,
    /// An RMS norm without weights on the values (Gemma 4).
    pub v_norm: Option<f32>,
    /// `None`: no rotary positions in this layer (SmolLM3's NoPE layers).
    pub rope: Option<Rope>,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    /// The attention logits' scale (`head_dim^-0.5` unless the config says otherwise).
    pub scale: f32,
    pub sinks: Option<Sinks>,
    /// The query projection also gives, per head, a gate on that head's output (sigmoid;
    /// Qwen3-Next, Qwen3.5): `[query | gate]` per head.
    pub output_gate: bool,
}

impl Attention {
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = match &self.qkv {
            QkvProjection::Separate { q, k, v } => [q, k, v].into_iter().flat_map(Linear::arrays).collect(),
            QkvProjection::KeysAsValues { q, k } => [q, k].into_iter().flat_map(Linear::arrays).collect(),
            QkvProjection::Fused(qkv) => qkv.arrays(),
            QkvProjection::QueryOnly(q) => q.arrays(),
        };
        out.extend(self.o.arrays());
        out.extend(self.q_norm.iter().chain(&self.k_norm).map(|n| &n.weight));
        out.extend(self.rope.iter().flat_map(Rope::arrays));
        out.extend(self.sinks.iter().map(|s| &s.array));
        out
    }

    /// Rotary positions, where this layer has them: the step's explicit rotation (M-RoPE with
    /// images) or the layer's own at the cache's positions.
    fn rotate(&self, x: Array, positions: &Positions, rotation: Option<&CosSin>) -> Result<Array> {
        match (&self.rope, rotation) {
            (None, _) => Ok(x),
            (Some(_), Some(rotation)) => super::mrope::apply(&x, rotation),
            (Some(rope), None) => rope.forward(&x, positions),
        }
    }

    /// `x`: `[B, L, hidden]` -> `[B, L, hidden]`, and the keys and values attended over (all
    /// the cached ones), for layers that reuse them.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        positions: &Positions,
        rotation: Option<&CosSin>,
        query_scale: Option<&Array>,
        cache: &mut impl LayerCache,
        kv: KeysValues,
    ) -> Result<(Array, (KvTensor, KvTensor))> {
        let (b, l) = (x.dim(0), x.dim(1));
        let heads = |t: Array, n: i32| -> Result<Array> { Ok(t.reshape(&[b, l, n, self.head_dim])?) };
        // `t`: `[B, L, n * head_dim]` -> `[B, n, L, head_dim]`, normalised over the whole
        // projection or per head.
        let normed = |t: Array, n: i32, norm: &Option<RmsNorm>| -> Result<Array> {
            let t = match norm {
                Some(norm) if self.whole_qk_norm => heads(norm.forward(&t)?, n)?,
                Some(norm) => norm.forward(&heads(t, n)?)?,
                None => heads(t, n)?,
            };
            Ok(t.transpose_axes(&[0, 2, 1, 3])?)
        };
        let (q, kv_new) = match &self.qkv {
            QkvProjection::Separate { q, k, v } => (q.forward(x)?, Some((k.forward(x)?, v.forward(x)?))),
            QkvProjection::KeysAsValues { q, k } => {
                let k = k.forward(x)?;
                (q.forward(x)?, Some((k.clone(), k)))
            }
            QkvProjection::QueryOnly(q) => (q.forward(x)?, None),
            QkvProjection::Fused(qkv) => {
                let q_size = self.num_heads * self.head_dim;
                let kv_size = self.num_kv_heads * self.head_dim;
                let mut parts = split_at_indices(qkv.forward(x)?, &[q_size, q_size + kv_size], -1)?;
                let v = parts.pop().expect("3 parts");
                let k = parts.pop().expect("3 parts");
                let q = parts.pop().expect("3 parts");
                (q, Some((k, v)))
            }
        };
        let (q, gate) = if self.output_gate {
            let both = q.reshape(&[b, l, self.num_heads, 2 * self.head_dim])?;
            let parts = split_at_indices(&both, &[self.head_dim], -1)?;
            (parts[0].clone(), Some(parts[1].reshape(&[b, l, self.num_heads * self.head_dim])?))
        } else {
            (q, None)
        };
        let q = normed(q, self.num_heads, &self.q_norm)?;
        let q = self.rotate(q, positions, rotation)?;
        // Ministral 3: queries scaled with their position (after the rotation, as the reference).
        let q = match query_scale {
            Some(s) => q.multiply(s)?,
            None => q,
        };
        let (k, v) = match (kv, kv_new) {
            (KeysValues::Reused(kv), _) => kv.clone(),
            (KeysValues::Own, Some((k, v))) => {
                let k = self.rotate(normed(k, self.num_kv_heads, &self.k_norm)?, positions, rotation)?;
                let v = heads(v, self.num_kv_heads)?;
                let v = match self.v_norm {
                    Some(eps) => mlx_rs::fast::rms_norm(&v, None, eps)?,
                    None => v,
                };
                cache.update(&k, &v.transpose_axes(&[0, 2, 1, 3])?)?
            }
            (KeysValues::Own, None) => {
                return Err(crate::model::ModelError::Mlx("a KV-shared layer was given no keys and values".into()))
            }
        };

        // Image tokens that see their image's later tokens: known now, with the keys' length.
        let resolved;
        let mask = match mask {
            AttentionMask::WithLaterKeys { base, later } => {
                resolved = base.with_later_keys(later, k.dim(2))?;
                &resolved
            }
            other => other,
        };
        let scale = self.scale;
        let sinks = self.sinks.as_ref().map(|s| s.array.as_dtype(q.dtype())).transpose()?;
        let sinks = sinks.as_ref();
        let out = match mask {
            AttentionMask::Shared { prefix, own } => {
                let shared = cache.shared().ok_or_else(|| {
                    crate::model::ModelError::Mlx("a shared-segment mask for a cache without one".into())
                })?;
                shared_attention::attention(&q, shared, &k, &v, scale, prefix.as_ref(), own, self.sinks.as_ref())?
            }
            // Quantized keys go through mlx-lm's composition (below) everywhere: its softmax, not
            // the host's, so that the rounding of the next layers' keys is the same as mlx-lm's
            // (a 4-bit step amplifies the last bit of a difference).
            _ if host_softmax::applies(q.dtype()) && k.quant().is_none() => {
                host_softmax::attention(&q, &k, &v, scale, mask, self.sinks.as_ref().map(|s| s.host.as_slice()))?
            }
            _ => match (&k, &v) {
                (KvTensor::Dense(k), KvTensor::Dense(v)) => match mask {
                    AttentionMask::Causal => {
                        scaled_dot_product_attention(&q, k, v, scale, ScaledDotProductAttentionMask::Causal, sinks)?
                    }
                    AttentionMask::Explicit(m) => scaled_dot_product_attention(&q, k, v, scale, m, sinks)?,
                    _ => scaled_dot_product_attention(&q, k, v, scale, None, sinks)?,
                },
                // Quantized: MLX has no fused kernel for them (mlx-lm composes it the same way).
                _ => {
                    let allowed = match mask {
                        AttentionMask::Explicit(m) => Some(m),
                        _ => None,
                    };
                    let causal = matches!(mask, AttentionMask::Causal);
                    kv_matmul::quantized_attention(&q, &k, &v, scale, allowed, causal, sinks)?
                }
            },
        };
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, self.num_heads * self.head_dim])?;
        let out = match gate {
            Some(gate) => out.multiply(mlx_rs::ops::sigmoid(&gate)?)?,
            None => out,
        };
        Ok((self.o.forward(&out)?, (k, v)))
    }
}
