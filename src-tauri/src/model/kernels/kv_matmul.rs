//! Products with cached keys or values whatever their format: `x @ Kᵀ` (the scores) and
//! `p @ V` (the output). Quantized ones go through MLX's `quantized_matmul`, which reads the
//! packed words (mlx-lm's `quantized_scaled_dot_product_attention` does the same): on a GPU,
//! whose attention is bound by reading the cache, a quarter (4-bit) or half (8-bit) of f16's bytes.

use mlx_rs::ops::{matmul, quantized_matmul};
use mlx_rs::Array;

use crate::model::cache::KvTensor;
use crate::model::error::Result;

/// `x @ tᵀ` (`transpose`) or `x @ t`, `t` `[.., S, D]` keys or values (leading axes broadcast).
pub fn kv_matmul(x: &Array, t: &KvTensor, transpose: bool) -> Result<Array> {
    Ok(match t {
        KvTensor::Dense(a) if transpose => matmul(x, a.swap_axes(-1, -2)?)?,
        KvTensor::Dense(a) => matmul(x, a)?,
        KvTensor::Quantized { packed, scales, biases, quant } => {
            quantized_matmul(x, packed, scales, biases, transpose, quant.group_size, quant.bits)?
        }
    })
}

/// Attention over quantized keys and values with MLX's ops (where the host softmax does not
/// apply: a GPU, or a dtype the CPU path does not take), as mlx-lm's
/// `quantized_scaled_dot_product_attention`: the queries scaled, grouped per key head, scores
/// by quantized matmul, the mask, a softmax in f32 (`precise`), the output by quantized matmul.
/// `q` `[B, Hq, L, D]`; `allowed`: `None`, or booleans broadcasting to `[B, 1, L, S]`; `causal`
/// for the usual lower-triangular mask. `sinks` (gpt-oss): one more logit per query head.
pub fn quantized_attention(
    q: &Array,
    k: &KvTensor,
    v: &KvTensor,
    scale: f32,
    allowed: Option<&Array>,
    causal: bool,
    sinks: Option<&Array>,
) -> Result<Array> {
    use mlx_rs::ops::{arange, broadcast_to, concatenate, expand_dims, ge, select, softmax_axis};
    let (b, heads, l, d) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (kv_heads, s) = (k.dim(1), k.dim(2));
    let repeats = heads / kv_heads;
    let q = q.multiply(Array::from_f32(scale).as_dtype(q.dtype())?)?.reshape(&[b, kv_heads, repeats, l, d])?;
    let grouped = |t: &KvTensor| t.map(|a| Ok(expand_dims(a, -3)?));
    let (k, v) = (grouped(k)?, grouped(v)?);
    let mut scores = kv_matmul(&q, &k, true)?;
    let lowest = Array::from_f32(f32::MIN).as_dtype(scores.dtype())?;
    if causal {
        let queries = arange::<_, i32>(s - l, s, None)?.reshape(&[l, 1])?;
        let keys = arange::<_, i32>(0, s, None)?.reshape(&[1, s])?;
        scores = select(&ge(&queries, &keys)?, &scores, &lowest)?;
    }
    if let Some(allowed) = allowed {
        // `[B or 1, 1, L, S]` against scores `[B, Hkv, R, L, S]`.
        let allowed = if allowed.ndim() == 4 { expand_dims(allowed, -3)? } else { allowed.clone() };
        scores = select(&allowed, &scores, &lowest)?;
    }
    let probabilities = match sinks {
        Some(sinks) => {
            // The sink as a last column, dropped after the softmax.
            let column = sinks.as_dtype(scores.dtype())?.reshape(&[1, kv_heads, repeats, 1, 1])?;
            let column = broadcast_to(&column, &[b, kv_heads, repeats, l, 1])?;
            let all = softmax_axis(&concatenate(&[scores, column], -1)?, -1, true)?;
            all.try_index((.., .., .., .., ..s))?
        }
        None => softmax_axis(&scores, -1, true)?,
    };
    Ok(kv_matmul(&probabilities, &v, false)?.reshape(&[b, heads, l, d])?)
}

use mlx_rs::ops::indexing::TryIndexOp;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cache::{AttentionMask, KvQuant};

    fn normal(shape: &[i32], seed: u64) -> Array {
        let key = mlx_rs::random::key(seed).unwrap();
        mlx_rs::random::normal::<f32>(shape, None, None, Some(&key)).unwrap()
    }

    fn worst(a: &Array, b: &Array) -> f32 {
        let diff = mlx_rs::ops::abs(mlx_rs::ops::subtract(a, b).unwrap()).unwrap().max(None).unwrap();
        diff.item_exact::<f32>()
    }

    /// Attention over quantized keys and values (the ops form, and the CPU's host softmax) is
    /// attention over what they hold: the same keys and values dequantized, by MLX's fused kernel.
    #[test]
    fn quantized_attention_is_attention_over_the_dequantized_keys() {
        let (q, k, v) = (normal(&[2, 4, 3, 64], 1), normal(&[2, 2, 10, 64], 2), normal(&[2, 2, 10, 64], 3));
        let sinks = [0.5f32, -1.0, 2.0, 0.0];
        let sink_array = Array::from_slice(&sinks, &[4]);
        for quant in [KvQuant { bits: 8, group_size: 64 }, KvQuant { bits: 4, group_size: 32 }] {
            let (kq, vq) = (KvTensor::new(&k, Some(quant)).unwrap(), KvTensor::new(&v, Some(quant)).unwrap());
            let (kd, vd) = (kq.dense().unwrap(), vq.dense().unwrap());
            // Rounding is what it is: close to the originals, not equal.
            assert!(worst(&kd, &k) > 0.0 && worst(&kd, &k) < if quant.bits == 8 { 0.05 } else { 0.8 });
            for (causal, with_sinks) in [(false, false), (true, false), (true, true)] {
                let mask = if causal {
                    mlx_rs::fast::ScaledDotProductAttentionMask::Causal
                } else {
                    mlx_rs::fast::ScaledDotProductAttentionMask::Array(&Array::from_bool(true))
                };
                let sink = with_sinks.then_some(&sink_array);
                let want = mlx_rs::fast::scaled_dot_product_attention(&q, &kd, &vd, 0.125, mask, sink).unwrap();
                let ops = quantized_attention(&q, &kq, &vq, 0.125, None, causal, sink).unwrap();
                assert!(worst(&ops, &want) < 1e-4, "{quant:?} causal {causal} sinks {with_sinks}: ops form");
                let host_mask = if causal { AttentionMask::Causal } else { AttentionMask::None };
                let host = crate::model::kernels::host_softmax::attention(
                    &q,
                    &kq,
                    &vq,
                    0.125,
                    &host_mask,
                    with_sinks.then_some(&sinks[..]),
                )
                .unwrap();
                assert!(worst(&host, &want) < 1e-4, "{quant:?} causal {causal} sinks {with_sinks}: host form");
            }
        }
    }
}
