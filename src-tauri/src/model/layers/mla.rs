//! Multi-head latent attention (DeepSeek-V3, Kimi K2, GLM-4.7-Flash), as mlx-lm computes it: the
//! keys and values of a token are one compressed latent (`kv_lora_rank` wide) and one rotary key
//! shared by every head, and that is all the cache holds (the latent as the keys, the rotary key
//! as the values). The rotary part of the scores is computed apart and joins the attention as
//! its additive mask. One query token (decode) takes the absorbed form: the query is carried
//! into the latent space and the output out of it. Several (prefill, verification) take the
//! expanded form: every cached latent is projected to per-head keys and values. The reference
//! chooses by the step's length alone, and so does this layer.

use mlx_rs::fast::scaled_dot_product_attention;
use mlx_rs::ops::{arange, select, split_at_indices};
use mlx_rs::{Array, Dtype};

use crate::model::cache::{AttentionMask, KvTensor, LayerCache, Positions};
use crate::model::error::{ModelError, Result};
use crate::model::layers::quant_ops;
use crate::model::layers::{Linear, RmsNorm, Rope, SwitchMatrix};

/// One matrix per head, `[heads, out, in]` (mlx-lm's `MultiLinear`).
pub struct MultiLinear(pub SwitchMatrix);

impl MultiLinear {
    /// `x W^T` per head (`transpose`), or `x W`.
    fn forward(&self, x: &Array, transpose: bool) -> Result<Array> {
        match &self.0 {
            SwitchMatrix::Dense { weight } if transpose => Ok(x.matmul(weight.swap_axes(-1, -2)?)?),
            SwitchMatrix::Dense { weight } => Ok(x.matmul(weight)?),
            SwitchMatrix::Quantized { weight, scales, biases, quant } => {
                quant_ops::quantized_matmul_as(x, weight, scales, biases.as_ref(), transpose, *quant)
            }
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        match &self.0 {
            SwitchMatrix::Dense { weight } => vec![weight],
            SwitchMatrix::Quantized { weight, scales, biases, .. } => {
                [weight, scales].into_iter().chain(biases).collect()
            }
        }
    }
}

/// The query projection: through a low-rank bottleneck with its norm, or direct.
pub enum LatentQuery {
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
    Direct(Linear),
}

pub struct LatentAttention {
    pub query: LatentQuery,
    /// `[latent | rotary key]` from the hidden state.
    pub kv_a: Linear,
    pub kv_norm: RmsNorm,
    /// Per head: the latent to the non-rotary key part, `[heads, rank, nope]`...
    pub embed_q: MultiLinear,
    /// ...and to the value, `[heads, value, rank]`.
    pub unembed_out: MultiLinear,
    pub o: Linear,
    pub rope: Rope,
    pub heads: i32,
    pub nope_dim: i32,
    pub rope_dim: i32,
    pub rank: i32,
    pub scale: f32,
}

impl LatentAttention {
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = match &self.query {
            LatentQuery::LowRank { a, norm, b } => {
                let mut v = a.arrays();
                v.push(&norm.weight);
                v.extend(b.arrays());
                v
            }
            LatentQuery::Direct(q) => q.arrays(),
        };
        out.extend(self.kv_a.arrays());
        out.push(&self.kv_norm.weight);
        out.extend(self.embed_q.arrays());
        out.extend(self.unembed_out.arrays());
        out.extend(self.o.arrays());
        out.extend(self.rope.arrays());
        out
    }

    /// `x`: `[B, L, hidden]` -> `[B, L, hidden]`.
    pub fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        positions: &Positions,
        cache: &mut impl LayerCache,
    ) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let q = match &self.query {
            LatentQuery::LowRank { a, norm, b } => b.forward(&norm.forward(&a.forward(x)?)?)?,
            LatentQuery::Direct(q) => q.forward(x)?,
        };
        let q = q.reshape(&[b, l, self.heads, self.nope_dim + self.rope_dim])?.transpose_axes(&[0, 2, 1, 3])?;
        let parts = split_at_indices(&q, &[self.nope_dim], -1)?;
        let (q_nope, q_pe) = (&parts[0], &parts[1]);
        let kv = self.kv_a.forward(x)?;
        let parts = split_at_indices(&kv, &[self.rank], -1)?;
        let k_pe = parts[1].reshape(&[b, l, 1, self.rope_dim])?.transpose_axes(&[0, 2, 1, 3])?;
        let latent = self.kv_norm.forward(&parts[0])?.expand_dims(1)?;
        let q_pe = self.rope.forward(q_pe, positions)?;
        let k_pe = self.rope.forward(&k_pe, positions)?;
        let (latent, k_pe) = match cache.update(&latent, &k_pe)? {
            (KvTensor::Dense(k), KvTensor::Dense(v)) => (k, v),
            _ => return Err(ModelError::Mlx("latent attention keeps its cache unquantized".into())),
        };
        let scale = Array::from_f32(self.scale).as_dtype(q_pe.dtype())?;
        let pe = q_pe.multiply(&scale)?.matmul(k_pe.swap_axes(-1, -2)?)?;
        let pe = match allowed(mask, l, latent.dim(2))? {
            Some(allowed) => select(&allowed, &pe, lowest(pe.dtype())?)?,
            None => pe,
        };
        let out = if l == 1 {
            let q = self.embed_q.forward(q_nope, true)?;
            let out = scaled_dot_product_attention(&q, &latent, &latent, self.scale, &pe, None)?;
            self.unembed_out.forward(&out, true)?
        } else {
            let k = self.embed_q.forward(&latent, false)?;
            let v = self.unembed_out.forward(&latent, true)?;
            scaled_dot_product_attention(q_nope, &k, &v, self.scale, &pe, None)?
        };
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o.forward(&out)
    }
}

/// The dtype's lowest finite value (`mx.finfo(dtype).min`), what masked scores are set to.
fn lowest(dtype: Dtype) -> Result<Array> {
    let value = match dtype {
        Dtype::Float16 => -65504.0,
        // bfloat16's largest finite magnitude: f32::MIN would round to -inf.
        Dtype::Bfloat16 => -3.389_531_4e38,
        _ => f32::MIN,
    };
    Ok(Array::from_f32(value).as_dtype(dtype)?)
}

/// The keys each query may see, as the boolean mask the reference builds (`None`: all): the
/// step's `l` queries are the last of the `keys`.
fn allowed(mask: &AttentionMask, l: i32, keys: i32) -> Result<Option<Array>> {
    Ok(match mask {
        AttentionMask::None => None,
        AttentionMask::Causal if l == 1 => None,
        AttentionMask::Causal => {
            let queries = arange::<_, i32>(keys - l, keys, None)?.reshape(&[l, 1])?;
            let columns = arange::<_, i32>(0, keys, None)?.reshape(&[1, keys])?;
            Some(columns.le(&queries)?)
        }
        AttentionMask::Explicit(m) => Some(m.as_dtype(Dtype::Bool)?),
        AttentionMask::WithLaterKeys { base, later } => return allowed(&base.with_later_keys(later, keys)?, l, keys),
        AttentionMask::Shared { .. } => {
            return Err(ModelError::Mlx("latent attention takes no shared segment".into()));
        }
    })
}
