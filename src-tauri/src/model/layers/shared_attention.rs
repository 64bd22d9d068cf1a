//! Attention over keys in two parts: a prompt start several rows share, held once
//! ([`SharedKv`], `[1, Hkv, P, D]`), then each row's own keys (`[B, Hkv, W, D]`). One softmax
//! over both parts, so the result is attention over the row's whole sequence.
//!
//! The queries of every row and head are multiplied with the shared keys in one product per key
//! head (`[B * R * L, D] x [D, P]`): the shared keys and values are read once per step, not once
//! per row. On MLX's CPU device (f32) the softmax runs on the host over both parts in place
//! (`host_softmax`); elsewhere it is composed from MLX ops in f32.

use mlx_rs::ops::{add, divide, exp, maximum, select, subtract};
use mlx_rs::{Array, Dtype};

use crate::model::cache::{AttentionMask, KvTensor, SharedKv};
use crate::model::error::{ModelError, Result};
use crate::model::kernels::host_softmax;
use crate::model::kernels::kv_matmul::kv_matmul;
use crate::model::layers::Sinks;

/// `q` `[B, Hq, L, D]` (Hq a multiple of Hkv); `k`/`v` the rows' own keys `[B, Hkv, W, D]`;
/// `prefix`: which shared keys each query sees (`[B, 1, L or 1, P or 1]`, `None`: all); `own`:
/// the mask over the own keys; `sinks`: per-head logits in every softmax (gpt-oss). Returns
/// `[B, Hq, L, D]`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &Array,
    shared: &SharedKv,
    k: &KvTensor,
    v: &KvTensor,
    scale: f32,
    prefix: Option<&Array>,
    own: &AttentionMask,
    sinks: Option<&Sinks>,
) -> Result<Array> {
    let (b, heads, l, d) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (kv_heads, w, p) = (k.dim(1), k.dim(2), shared.len());
    let r = heads / kv_heads;
    let rows = b * r * l;
    let on_host = host_softmax::applies(q.dtype());
    if on_host {
        // As in `host_softmax::attention`: what the layers before left pending (the previous
        // layer's scores among them) is computed and freed before the scores are allocated.
        mlx_rs::transforms::eval(std::iter::once(q).chain(k.parts()).chain(v.parts()))?;
    }
    // Each key head's queries as one matrix, rows ordered (batch, repeat, query).
    let q = q
        .multiply(Array::from_f32(scale).as_dtype(q.dtype())?)?
        .reshape(&[b, kv_heads, r * l, d])?
        .transpose_axes(&[1, 0, 2, 3])?
        .reshape(&[kv_heads, rows, d])?;
    // The segment's keys and values `[Hkv, P, ..]`, the rows' own `[Hkv, B, W, ..]` (the last
    // axis a quantized part's own width).
    let segment = |t: &KvTensor| t.map(|a| Ok(a.reshape(&[kv_heads, p, a.dim(-1)])?));
    let heads_first = |t: &KvTensor| t.map(|a| Ok(a.transpose_axes(&[1, 0, 2, 3])?));
    let mut first = kv_matmul(&q, &segment(&shared.keys)?, true)?;
    let mut second =
        kv_matmul(&q.reshape(&[kv_heads, b, r * l, d])?, &heads_first(k)?, true)?.reshape(&[kv_heads, rows, w])?;
    // Masks are `[B, 1, L, S]`-shaped; the scores seen as `[Hkv, B, R, L, S]`.
    let masked = |scores: Array, allowed: &Array, width: i32| -> Result<Array> {
        let allowed = if allowed.ndim() == 4 { allowed.expand_dims(0)? } else { allowed.clone() };
        let grouped = scores.reshape(&[kv_heads, b, r, l, width])?;
        Ok(select(&allowed, &grouped, Array::from_f32(f32::NEG_INFINITY))?.reshape(&[kv_heads, rows, width])?)
    };
    if let Some(allowed) = prefix {
        first = masked(first, allowed, p)?;
    }
    let causal = match own {
        AttentionMask::Explicit(allowed) => {
            second = masked(second, allowed, w)?;
            false
        }
        AttentionMask::Causal => true,
        AttentionMask::None => false,
        AttentionMask::Shared { .. } | AttentionMask::WithLaterKeys { .. } => {
            return Err(ModelError::Mlx("an unresolved mask inside a shared mask".into()))
        }
    };
    let (first, second) = if on_host {
        // Rows are (key head, batch, repeat, query): the query head is (key head, repeat).
        let host = sinks.map(|s| s.host.as_slice());
        let sink = |row: usize| {
            let (l, b, r) = (l as usize, b as usize, r as usize);
            host.map_or(f32::NEG_INFINITY, |s| s[row / (b * r * l) * r + (row / l) % r])
        };
        host_probabilities(first, second, p, w, l, causal, sink)?
    } else {
        let second = if causal { masked(second, &causal_mask(l, w)?, w)? } else { second };
        // The sinks as one more score per row: `[Hkv, B, R, L, 1]` from `[Hkv * R]`.
        let sink = match sinks {
            Some(s) => Some(
                mlx_rs::ops::broadcast_to(s.array.reshape(&[kv_heads, 1, r, 1, 1])?, &[kv_heads, b, r, l, 1])?
                    .reshape(&[kv_heads, rows, 1])?,
            ),
            None => None,
        };
        probabilities(first, second, sink.as_ref(), v.dtype())?
    };
    let out_shared = kv_matmul(&first, &segment(&shared.values)?, false)?.reshape(&[kv_heads, b, r * l, d])?;
    let out_own = kv_matmul(&second.reshape(&[kv_heads, b, r * l, w])?, &heads_first(v)?, false)?;
    let out = add(&out_shared, &out_own)?.reshape(&[kv_heads, b, r, l, d])?;
    Ok(out.transpose_axes(&[1, 0, 2, 3, 4])?.reshape(&[b, heads, l, d])?)
}

/// The softmax on the host, written over both score arrays (`[Hkv, rows, P]` and `[Hkv, rows,
/// W]`, the same rows in the same order).
fn host_probabilities(
    mut first: Array,
    mut second: Array,
    p: i32,
    w: i32,
    l: i32,
    causal: bool,
    sink: impl Fn(usize) -> f32 + Sync,
) -> Result<(Array, Array)> {
    mlx_rs::transforms::eval([&first, &second])?;
    let not_contiguous = || ModelError::Mlx("attention scores are not one contiguous buffer".into());
    {
        let a = crate::mlx::exclusive_f32(&mut first).ok_or_else(not_contiguous)?;
        let b = crate::mlx::exclusive_f32(&mut second).ok_or_else(not_contiguous)?;
        // Causal: query `i` (the row's place among the L queries) sees own keys up to `W - L + i`.
        let visible = |row: usize| if causal { (w - l) as usize + row % l as usize + 1 } else { w as usize };
        host_softmax::softmax_row_pairs(a, p as usize, b, w as usize, visible, sink);
    }
    Ok((first, second))
}

/// The softmax from MLX ops, in f32, cast back to `dtype` for the products with the values;
/// `sink`: one more logit per row (`[.., rows, 1]`) in the denominator.
fn probabilities(first: Array, second: Array, sink: Option<&Array>, dtype: Dtype) -> Result<(Array, Array)> {
    let (first, second) = (first.as_dtype(Dtype::Float32)?, second.as_dtype(Dtype::Float32)?);
    let mut max = maximum(first.max_axis(-1, true)?, second.max_axis(-1, true)?)?;
    if let Some(sink) = sink {
        max = maximum(&max, sink.as_dtype(Dtype::Float32)?)?;
    }
    let first = exp(subtract(&first, &max)?)?;
    let second = exp(subtract(&second, &max)?)?;
    let mut sum = add(first.sum_axis(-1, true)?, second.sum_axis(-1, true)?)?;
    if let Some(sink) = sink {
        sum = add(&sum, exp(subtract(sink.as_dtype(Dtype::Float32)?, &max)?)?)?;
    }
    Ok((divide(&first, &sum)?.as_dtype(dtype)?, divide(&second, &sum)?.as_dtype(dtype)?))
}

/// `[L, W]`: query `i` (the last L of W positions) sees keys up to `W - L + i`.
fn causal_mask(l: i32, w: i32) -> Result<Array> {
    let queries = Array::from_iter(w - l..w, &[l, 1]);
    let keys = Array::from_iter(0..w, &[1, w]);
    Ok(mlx_rs::ops::ge(&queries, &keys)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::fast::scaled_dot_product_attention;
    use mlx_rs::ops::{broadcast_to, concatenate};
    use mlx_rs::random::normal;

    fn random(shape: &[i32], seed: u64) -> Array {
        let key = mlx_rs::random::key(seed).unwrap();
        normal::<f32>(shape, None, None, Some(&key)).unwrap()
    }

    /// The same attention with the shared keys copied in front of every row's own keys.
    fn reference(q: &Array, shared: &SharedKv, k: &Array, v: &Array, scale: f32, mask: &Array) -> Array {
        reference_with_sinks(q, shared, k, v, scale, mask, None)
    }

    fn reference_with_sinks(
        q: &Array,
        shared: &SharedKv,
        k: &Array,
        v: &Array,
        scale: f32,
        mask: &Array,
        sinks: Option<&Array>,
    ) -> Array {
        let (b, kv_heads, p, d) = (k.dim(0), k.dim(1), shared.len(), k.dim(3));
        let wide = |s: &Array, own: &Array| {
            concatenate(&[broadcast_to(s, &[b, kv_heads, p, d]).unwrap(), own.clone()], 2).unwrap()
        };
        let (k, v) = (wide(&shared.keys.dense().unwrap(), k), wide(&shared.values.dense().unwrap(), v));
        let repeats = q.dim(1) / kv_heads;
        let repeat = |x: &Array| {
            let s = x.shape().to_vec();
            broadcast_to(x.expand_dims(2).unwrap(), &[s[0], s[1], repeats, s[2], s[3]])
                .unwrap()
                .reshape(&[s[0], s[1] * repeats, s[2], s[3]])
                .unwrap()
        };
        scaled_dot_product_attention(q, repeat(&k), repeat(&v), scale, mask, sinks).unwrap()
    }

    fn close(a: &Array, b: &Array) {
        let (a, b) = (a.as_slice::<f32>(), b.as_slice::<f32>());
        assert_eq!(a.len(), b.len());
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "worst difference {worst}");
    }

    #[test]
    fn two_parts_give_attention_over_the_whole_sequence() {
        let (b, heads, kv_heads, d, p, w, l) = (3, 6, 2, 8, 37, 11, 4);
        let q = random(&[b, heads, l, d], 1);
        let shared = SharedKv {
            id: 1,
            keys: KvTensor::Dense(random(&[1, kv_heads, p, d], 2)),
            values: KvTensor::Dense(random(&[1, kv_heads, p, d], 3)),
        };
        let (k, v) = (random(&[b, kv_heads, w, d], 4), random(&[b, kv_heads, w, d], 5));
        let (kt, vt) = (KvTensor::Dense(k.clone()), KvTensor::Dense(v.clone()));
        let scale = 0.3;
        // Row 1 does not follow the shared segment; row 2 has two columns of left padding.
        let follows = [true, false, true];
        let mut own = Vec::new();
        let mut whole = Vec::new();
        for (row, &f) in follows.iter().enumerate() {
            for i in 0..l {
                let column = w - l + i;
                let own_row: Vec<bool> = (0..w).map(|j| j <= column && !(row == 2 && j < 2)).collect();
                whole.extend(std::iter::repeat_n(f, p as usize).chain(own_row.iter().copied()));
                own.extend(own_row);
            }
        }
        let whole = Array::from_slice(&whole, &[b, 1, l, p + w]);
        let want = reference(&q, &shared, &k, &v, scale, &whole);
        let prefix = Array::from_slice(&follows, &[b, 1, 1, 1]);
        let own = AttentionMask::Explicit(Array::from_slice(&own, &[b, 1, l, w]));
        // Both the host softmax (f32 on the CPU) and the MLX-ops form.
        let got = attention(&q, &shared, &kt, &vt, scale, Some(&prefix), &own, None).unwrap();
        close(&got, &want);
        // (Separate arrays: the host form writes over its inputs.)
        let rows = b * (heads / kv_heads) * l;
        let scores = || (random(&[kv_heads, rows, p], 6), random(&[kv_heads, rows, w], 7));
        let (first, second) = scores();
        let (hf, hs) = host_probabilities(first, second, p, w, l, false, |_| f32::NEG_INFINITY).unwrap();
        let (first, second) = scores();
        let (mf, ms) = probabilities(first, second, None, Dtype::Float32).unwrap();
        close(&hf, &mf);
        close(&hs, &ms);

        // Every row follows it, aligned: a causal mask over the own keys and none on the shared.
        let causal: Vec<bool> = (0..l).flat_map(|i| (0..p + w).map(move |j| j < p || j - p <= w - l + i)).collect();
        let want = reference(&q, &shared, &k, &v, scale, &Array::from_slice(&causal, &[1, 1, l, p + w]));
        let got = attention(&q, &shared, &kt, &vt, scale, None, &AttentionMask::Causal, None).unwrap();
        close(&got, &want);
        let (hf, hs) =
            host_probabilities(random(&[2, 24, p], 8), random(&[2, 24, w], 9), p, w, l, true, |_| f32::NEG_INFINITY)
                .unwrap();
        let causal_scores = select(
            causal_mask(l, w).unwrap(),
            random(&[2, 24, w], 9).reshape(&[2, 6, l, w]).unwrap(),
            Array::from_f32(f32::NEG_INFINITY),
        )
        .unwrap();
        let (mf, ms) =
            probabilities(random(&[2, 24, p], 8), causal_scores.reshape(&[2, 24, w]).unwrap(), None, Dtype::Float32)
                .unwrap();
        close(&hf, &mf);
        close(&hs, &ms);

        // With sinks (gpt-oss), in both forms: one more logit per query head in every softmax.
        let sinks =
            crate::model::layers::Sinks::new(Array::from_slice(&[0.5f32, -2.0, 1.5, 0.0, 3.0, -0.5], &[6])).unwrap();
        let want = reference_with_sinks(
            &q,
            &shared,
            &k,
            &v,
            scale,
            &Array::from_slice(&causal, &[1, 1, l, p + w]),
            Some(&sinks.array),
        );
        let got = attention(&q, &shared, &kt, &vt, scale, None, &AttentionMask::Causal, Some(&sinks)).unwrap();
        close(&got, &want);
        let sink_rows = mlx_rs::ops::broadcast_to(sinks.array.reshape(&[2, 1, 3, 1, 1]).unwrap(), &[2, 1, 3, l, 1])
            .unwrap()
            .reshape(&[2, 3 * l, 1])
            .unwrap();
        let host = sinks.host.clone();
        let host_sink = |row: usize| host[row / (3 * l as usize) * 3 + (row / l as usize) % 3];
        let (hf, hs) =
            host_probabilities(random(&[2, 12, p], 10), random(&[2, 12, w], 11), p, w, l, false, host_sink).unwrap();
        let (mf, ms) =
            probabilities(random(&[2, 12, p], 10), random(&[2, 12, w], 11), Some(&sink_rows), Dtype::Float32).unwrap();
        close(&hf, &mf);
        close(&hs, &ms);
    }
}
