//! Attention for MLX's CPU backend, with the softmax on the host.
//!
//! MLX has no fused attention kernel for the CPU: its `scaled_dot_product_attention` falls back
//! to composed ops whose softmax calls the C library's `expf` once per score, ~12 ns each on
//! this project's x86 machines. Past a few thousand tokens of context that is most of a forward:
//! a 28-token chunk over 4,300 keys (SmolLM2's 9 heads) measured 13 ms of softmax against 3 ms
//! for both matmuls, per layer. Here the matmuls stay in MLX (BLAS) and the softmax runs on the
//! host: a polynomial `exp` the compiler vectorises, rows split across the cores. On a GPU MLX's
//! fused kernel is used instead (`Attention::forward`).

use mlx_rs::ops::select;
use mlx_rs::{Array, Dtype};

use super::kv_matmul::kv_matmul;
use crate::model::cache::{AttentionMask, KvTensor};
use crate::model::error::Result;

/// Whether attention in `dtype` should take this path: on MLX's CPU device, for f32 (the only
/// dtype the CPU computes in), unless `FASTMLX_CPU_ATTENTION=mlx` asks for MLX's own (to compare).
pub fn applies(dtype: Dtype) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    dtype == Dtype::Float32
        && *ON.get_or_init(|| {
            !crate::mlx::gpu_available() && std::env::var("FASTMLX_CPU_ATTENTION").map_or(true, |v| v != "mlx")
        })
}

/// Scaled dot-product attention: `q` `[B, Hq, L, D]`, `k`/`v` `[B, Hkv, S, D]` (Hq a multiple of
/// Hkv, query head `h` using key head `h / (Hq / Hkv)`; at full precision or quantized, see
/// [`kv_matmul`]); returns `[B, Hq, L, D]`. `sinks`: one
/// logit per query head that joins every softmax with a zero value (gpt-oss).
pub fn attention(
    q: &Array,
    k: &KvTensor,
    v: &KvTensor,
    scale: f32,
    mask: &AttentionMask,
    sinks: Option<&[f32]>,
) -> Result<Array> {
    let (b, heads, l, d) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (kv_heads, s) = (k.dim(1), k.dim(2));
    let repeats = heads / kv_heads;
    // What the layers before left pending (the previous layer's scores among them) is computed
    // and freed before the scores, the step's largest buffer, are allocated: otherwise MLX's
    // evaluation order may keep both alive (measured: one more score matrix at the peak for
    // layers without rotary positions, and 3-10 % more for the others).
    mlx_rs::transforms::eval(std::iter::once(q).chain(k.parts()).chain(v.parts()))?;
    // Each key head's queries as one matrix: rows are (repeat, query).
    let q = q.multiply(Array::from_f32(scale))?.reshape(&[b, kv_heads, repeats * l, d])?;
    let mut scores = kv_matmul(&q, k, true)?;
    if let AttentionMask::Explicit(allowed) = mask {
        // `allowed`: [B or 1, 1, L, S] or [L, S]; scores seen as [B, Hkv, repeats, L, S].
        let allowed = if allowed.ndim() == 4 { allowed.expand_dims(1)? } else { allowed.clone() };
        let grouped = scores.reshape(&[b, kv_heads, repeats, l, s])?;
        scores =
            select(&allowed, &grouped, Array::from_f32(f32::NEG_INFINITY))?.reshape(&[b, kv_heads, repeats * l, s])?;
    }
    scores.eval()?;
    let causal = matches!(mask, AttentionMask::Causal);
    let visible = |row: usize| {
        // Causal: query `i` (the row's place among the L queries) sees keys up to `S - L + i`.
        if causal {
            (s - l) as usize + row % l as usize + 1
        } else {
            s as usize
        }
    };
    // The probabilities are written over the scores (which nothing else holds): no allocation
    // and no copy back into MLX.
    let data = crate::mlx::exclusive_f32(&mut scores)
        .ok_or_else(|| crate::model::ModelError::Mlx("attention scores are not one contiguous buffer".into()))?;
    // Rows are (batch, key head, repeat, query): the query head is the row's (key head, repeat).
    let sink = |row: usize| sinks.map_or(f32::NEG_INFINITY, |s| s[(row / l as usize) % heads as usize]);
    softmax_rows(data, s as usize, visible, sink);
    Ok(kv_matmul(&scores, v, false)?.reshape(&[b, heads, l, d])?)
}

/// Softmax of each `width`-long row of `scores`, in place; row `r` uses its first `visible(r)`
/// entries (the rest become 0) and `sink(r)` as one more logit whose probability is dropped
/// (`-inf`: none). A row with nothing finite to see is all zeros.
fn softmax_rows(
    scores: &mut [f32],
    width: usize,
    visible: impl Fn(usize) -> usize + Sync,
    sink: impl Fn(usize) -> f32 + Sync,
) {
    let rows = scores.len() / width.max(1);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(rows.max(1));
    // Small jobs stay on this thread (a spawn costs more than a few thousand exps).
    let threads = if scores.len() < 64 * 1024 { 1 } else { threads };
    let per_thread = rows.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (chunk, rows) in scores.chunks_mut(per_thread * width).enumerate() {
            let (visible, sink) = (&visible, &sink);
            let mut work = move || {
                for (i, row) in rows.chunks_mut(width).enumerate() {
                    let r = chunk * per_thread + i;
                    let n = visible(r).min(width);
                    let (seen, unseen) = row.split_at_mut(n);
                    softmax_pair(seen, &mut [], sink(r));
                    unseen.fill(0.0);
                }
            };
            if threads == 1 {
                work();
            } else {
                scope.spawn(work);
            }
        }
    });
}

/// Softmax over each row made of `first`'s row and `second`'s (rows `first_width` and
/// `second_width` long, the same number of rows), in place: the keys of a shared segment and a
/// row's own keys, one distribution over both. Row `r` uses the first `second_visible(r)`
/// entries of its `second` part (the rest become 0), and `sink(r)` as in [`softmax_rows`].
pub(crate) fn softmax_row_pairs(
    first: &mut [f32],
    first_width: usize,
    second: &mut [f32],
    second_width: usize,
    second_visible: impl Fn(usize) -> usize + Sync,
    sink: impl Fn(usize) -> f32 + Sync,
) {
    let rows = first.len() / first_width.max(1);
    debug_assert_eq!(rows, second.len() / second_width.max(1));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(rows.max(1));
    let threads = if first.len() + second.len() < 64 * 1024 { 1 } else { threads };
    let per_thread = rows.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let chunks = first.chunks_mut(per_thread * first_width).zip(second.chunks_mut(per_thread * second_width));
        for (chunk, (a, b)) in chunks.enumerate() {
            let (visible, sink) = (&second_visible, &sink);
            let mut work = move || {
                for (i, (x, y)) in a.chunks_mut(first_width).zip(b.chunks_mut(second_width)).enumerate() {
                    let r = chunk * per_thread + i;
                    let n = visible(r).min(second_width);
                    let (seen, unseen) = y.split_at_mut(n);
                    softmax_pair(x, seen, sink(r));
                    unseen.fill(0.0);
                }
            };
            if threads == 1 {
                work();
            } else {
                scope.spawn(work);
            }
        }
    });
}

/// One softmax over `a` then `b`, as if they were one row, in f32 like MLX's: eight lanes at a
/// time with AVX2 where the CPU has it, else in the portable form (the same operations in the
/// same order either way). `sink`: one more logit in the denominator (`-inf`: none, and then
/// nothing changes, not even rounding).
fn softmax_pair(a: &mut [f32], b: &mut [f32], sink: f32) {
    let seen = kernels::max(a).max(kernels::max(b));
    if seen == f32::NEG_INFINITY {
        a.fill(0.0);
        b.fill(0.0);
        return;
    }
    let max = seen.max(sink);
    let sink_term = if sink == f32::NEG_INFINITY { 0.0 } else { (sink - max).exp() };
    let inverse = 1.0 / (kernels::exp_sum(a, max) + kernels::exp_sum(b, max) + sink_term);
    kernels::scale(a, inverse);
    kernels::scale(b, inverse);
}

#[cfg(test)]
fn softmax_portable(x: &mut [f32]) {
    // The portable kernels on one row, no sink: what `softmax_pair` computes without AVX2.
    let max = portable::max(x);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let inverse = 1.0 / portable::exp_sum(x, max);
    portable::scale(x, inverse);
}

/// The three passes of a softmax, with AVX2 where the CPU has it.
mod kernels {
    pub fn max(x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { super::avx2::max(x) };
        }
        super::portable::max(x)
    }

    pub fn exp_sum(x: &mut [f32], max: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { super::avx2::exp_sum(x, max) };
        }
        super::portable::exp_sum(x, max)
    }

    pub fn scale(x: &mut [f32], by: f32) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { super::avx2::scale(x, by) };
        }
        super::portable::scale(x, by)
    }
}

mod portable {
    use super::exp;

    pub fn max(x: &[f32]) -> f32 {
        x.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
    }

    /// `x = e^(x - max)`; returns the sum: eight partial sums, added up at the end, as the AVX2
    /// form does.
    pub fn exp_sum(x: &mut [f32], max: f32) -> f32 {
        let mut sums = [0.0f32; 8];
        let mut rows = x.chunks_exact_mut(8);
        for chunk in &mut rows {
            for (v, sum) in chunk.iter_mut().zip(&mut sums) {
                *v = exp(*v - max);
                *sum += *v;
            }
        }
        let mut sum: f32 = sums.iter().sum();
        for v in rows.into_remainder() {
            *v = exp(*v - max);
            sum += *v;
        }
        sum
    }

    pub fn scale(x: &mut [f32], by: f32) {
        x.iter_mut().for_each(|v| *v *= by);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// The [`super::portable`] passes eight lanes at a time (the compiler does not vectorise
    /// the polynomial `exp` itself: measured 2 ns per score portable, 0.75 ns here).
    #[target_feature(enable = "avx2")]
    pub unsafe fn max(x: &[f32]) -> f32 {
        let whole = x.len() / 8 * 8;
        let p = x.as_ptr();
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..whole).step_by(8) {
            m = _mm256_max_ps(m, _mm256_loadu_ps(p.add(i)));
        }
        lanes(m).into_iter().chain(x[whole..].iter().copied()).fold(f32::NEG_INFINITY, |m, v| if v > m { v } else { m })
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn exp_sum(x: &mut [f32], max: f32) -> f32 {
        let whole = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        let shift = _mm256_set1_ps(max);
        let mut sums = _mm256_setzero_ps();
        for i in (0..whole).step_by(8) {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), shift));
            _mm256_storeu_ps(p.add(i), e);
            sums = _mm256_add_ps(sums, e);
        }
        let mut sum: f32 = lanes(sums).iter().sum();
        for v in &mut x[whole..] {
            *v = super::exp(*v - max);
            sum += *v;
        }
        sum
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn scale(x: &mut [f32], by: f32) {
        let whole = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        let scale = _mm256_set1_ps(by);
        for i in (0..whole).step_by(8) {
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), scale));
        }
        x[whole..].iter_mut().for_each(|v| *v *= by);
    }

    #[target_feature(enable = "avx2")]
    unsafe fn lanes(v: __m256) -> [f32; 8] {
        let mut out = [0.0; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), v);
        out
    }

    /// [`super::exp`] on eight lanes: the same operations in the same order.
    #[target_feature(enable = "avx2")]
    unsafe fn exp(x: __m256) -> __m256 {
        use super::{C, LN2_HI, LN2_LO, ROUND};
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
        let t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)), _mm256_set1_ps(ROUND));
        let n = _mm256_sub_ps(t, _mm256_set1_ps(ROUND));
        let r = _mm256_sub_ps(
            _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))),
            _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)),
        );
        let mut p = _mm256_set1_ps(C[7]);
        for &c in C[..7].iter().rev() {
            p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
        }
        let n = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(ROUND.to_bits() as i32));
        let two_to_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(n, _mm256_set1_epi32(127)));
        _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n))
    }
}

/// Rounds to the nearest integer by adding and subtracting it (exact for |t| < 2^22); the low
/// mantissa bits of `t + ROUND` are then that integer.
const ROUND: f32 = 12_582_912.0;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1/k! for k = 0..=7.
const C: [f32; 8] = [1.0, 1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0];

/// `e^x` for `x <= 0` (scores minus their row's maximum), within 2e-7 relative of the C
/// library's: `x = n ln 2 + r` (Cody-Waite: `ln 2` in two parts, so `r` stays exact), `2^n` put
/// in the exponent bits, `e^r` (`|r| <= ln 2 / 2`) by its degree-7 Taylor polynomial.
/// Branch-free, the form [`avx2::exp`] computes eight at a time.
#[inline(always)]
fn exp(x: f32) -> f32 {
    // Below this e^x is under f32's smallest normal: flushed to (nearly) zero.
    let x = if x < -87.0 { -87.0 } else { x };
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = C[7];
    for &c in C[..7].iter().rev() {
        p = p * r + c;
    }
    let n = t.to_bits().wrapping_sub(ROUND.to_bits());
    p * f32::from_bits(n.wrapping_add(127) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_the_c_library() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NEG_INFINITY) < 1e-37);
    }

    /// `softmax_rows` on a copy of `scores`.
    fn softmax_of(scores: &[f32], width: usize, visible: impl Fn(usize) -> usize + Sync) -> Vec<f32> {
        let mut out = scores.to_vec();
        softmax_rows(&mut out, width, visible, |_| f32::NEG_INFINITY);
        out
    }

    fn softmax(x: &mut [f32]) {
        softmax_pair(x, &mut [], f32::NEG_INFINITY);
    }

    #[test]
    fn a_sink_takes_its_share_of_the_distribution() {
        let x = [0.5f32, -1.0, 2.0, 0.0];
        for sink in [-3.0f32, 1.0, 4.0] {
            let mut got = x.to_vec();
            softmax_pair(&mut got, &mut [], sink);
            let max = x.iter().copied().fold(sink, f32::max) as f64;
            let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>() + (sink as f64 - max).exp();
            for (g, v) in got.iter().zip(x) {
                assert!((*g as f64 - (v as f64 - max).exp() / sum).abs() < 1e-6, "sink {sink}");
            }
        }
    }

    /// Against MLX's own attention with sinks (the reference's kernel), masked and not.
    #[test]
    fn attention_with_sinks_matches_mlx() {
        let key = |seed| mlx_rs::random::key(seed).unwrap();
        let normal = |shape: &[i32], seed| mlx_rs::random::normal::<f32>(shape, None, None, Some(&key(seed))).unwrap();
        let (q, k, v) = (normal(&[2, 4, 5, 8], 1), normal(&[2, 2, 9, 8], 2), normal(&[2, 2, 9, 8], 3));
        let sinks = [0.3f32, -1.0, 2.5, 0.0];
        let sink_array = Array::from_slice(&sinks, &[4]);
        for causal in [false, true] {
            let (mask, mlx_mask) = if causal {
                (AttentionMask::Causal, mlx_rs::fast::ScaledDotProductAttentionMask::Causal)
            } else {
                (AttentionMask::None, mlx_rs::fast::ScaledDotProductAttentionMask::Array(&Array::from_bool(true)))
            };
            let (kt, vt) = (KvTensor::Dense(k.clone()), KvTensor::Dense(v.clone()));
            let got = attention(&q, &kt, &vt, 0.35, &mask, Some(&sinks)).unwrap();
            let want =
                mlx_rs::fast::scaled_dot_product_attention(&q, &k, &v, 0.35, mlx_mask, Some(&sink_array)).unwrap();
            let diff = mlx_rs::ops::abs(mlx_rs::ops::subtract(&got, &want).unwrap()).unwrap().max(None).unwrap();
            let diff = diff.item_exact::<f32>();
            assert!(diff < 1e-5, "causal {causal}: {diff}");
        }
    }

    #[test]
    fn softmax_rows_match_the_definition_with_masked_tails() {
        let width = 37;
        let scores: Vec<f32> = (0..width * 5).map(|i| ((i * 7919) % 101) as f32 / 9.0 - 5.0).collect();
        let visible = |row: usize| [37, 1, 20, 0, 36][row];
        let got = softmax_of(&scores, width, visible);
        for row in 0..5 {
            let (x, y) = (&scores[row * width..][..width], &got[row * width..][..width]);
            let n = visible(row);
            let max = x[..n].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = x[..n].iter().map(|&v| ((v - max) as f64).exp()).sum();
            for j in 0..width {
                let want = if j < n { ((x[j] - max) as f64).exp() / sum } else { 0.0 };
                assert!((y[j] as f64 - want).abs() < 1e-6, "row {row} col {j}: {} vs {want}", y[j]);
            }
        }
        // Rows split across threads give the same as one thread.
        let big: Vec<f32> = (0..4096 * 40).map(|i| ((i * 31) % 97) as f32 / 7.0).collect();
        let threaded = softmax_of(&big, 4096, |_| 4096);
        let single: Vec<f32> = big.chunks(4096).flat_map(|r| softmax_of(r, 4096, |_| 4096)).collect();
        assert_eq!(threaded, single);
    }

    #[test]
    fn the_simd_form_gives_the_portable_results() {
        // Lengths around the 8-lane boundary, -inf entries (masked scores) and a wide range.
        for len in [1, 7, 8, 9, 16, 23, 4099] {
            let mut x: Vec<f32> = (0..len).map(|i| ((i * 7919) % 1001) as f32 / 10.0 - 60.0).collect();
            if len > 3 {
                x[2] = f32::NEG_INFINITY;
            }
            let (mut simd, mut portable) = (x.clone(), x.clone());
            softmax(&mut simd);
            softmax_portable(&mut portable);
            assert_eq!(simd, portable, "length {len}");
        }
        let mut masked = vec![f32::NEG_INFINITY; 12];
        softmax(&mut masked);
        assert_eq!(masked, vec![0.0; 12]);
    }

    #[test]
    fn a_row_in_two_parts_is_one_distribution() {
        let (wa, wb, rows) = (29, 13, 40);
        let a: Vec<f32> = (0..wa * rows).map(|i| ((i * 7919) % 101) as f32 / 9.0 - 5.0).collect();
        let b: Vec<f32> = (0..wb * rows).map(|i| ((i * 104_729) % 89) as f32 / 8.0 - 4.0).collect();
        let visible = |row: usize| row % (wb + 1);
        let (mut pa, mut pb) = (a.clone(), b.clone());
        softmax_row_pairs(&mut pa, wa, &mut pb, wb, visible, |_| f32::NEG_INFINITY);
        for row in 0..rows {
            // The same row as one: the first part, then the visible entries of the second.
            let n = visible(row);
            let joined: Vec<f32> = a[row * wa..][..wa].iter().chain(&b[row * wb..][..n]).copied().collect();
            let want = softmax_of(&joined, joined.len(), |_| joined.len());
            let got: Vec<f32> = pa[row * wa..][..wa].iter().chain(&pb[row * wb..][..wb]).copied().collect();
            for (j, g) in got.iter().enumerate() {
                let w = want.get(j).copied().unwrap_or(0.0);
                assert!((g - w).abs() < 1e-6, "row {row} col {j}: {g} vs {w}");
            }
        }
    }
}
