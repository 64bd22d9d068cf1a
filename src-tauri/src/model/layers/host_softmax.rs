//! Attention for MLX's CPU backend, with the softmax on the host.
//!
//! MLX has no fused attention kernel for the CPU: its `scaled_dot_product_attention` falls back
//! to composed ops whose softmax calls the C library's `expf` once per score, ~12 ns each on
//! this project's x86 machines. Past a few thousand tokens of context that is most of a forward:
//! a 28-token chunk over 4,300 keys (SmolLM2's 9 heads) measured 13 ms of softmax against 3 ms
//! for both matmuls, per layer. Here the matmuls stay in MLX (BLAS) and the softmax runs on the
//! host: a polynomial `exp` the compiler vectorises, rows split across the cores. On a GPU MLX's
//! fused kernel is used instead (`Attention::forward`).

use mlx_rs::ops::{matmul, select};
use mlx_rs::{Array, Dtype};

use crate::model::error::Result;
use crate::model::layers::AttentionMask;

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
/// Hkv, query head `h` using key head `h / (Hq / Hkv)`); returns `[B, Hq, L, D]`.
pub fn attention(q: &Array, k: &Array, v: &Array, scale: f32, mask: &AttentionMask) -> Result<Array> {
    let (b, heads, l, d) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (kv_heads, s) = (k.dim(1), k.dim(2));
    let repeats = heads / kv_heads;
    // Each key head's queries as one matrix: rows are (repeat, query).
    let q = q.multiply(Array::from_f32(scale))?.reshape(&[b, kv_heads, repeats * l, d])?;
    let mut scores = matmul(&q, k.swap_axes(-1, -2)?)?;
    if let AttentionMask::Explicit(allowed) = mask {
        // `allowed`: [B or 1, 1, L, S] or [L, S]; scores seen as [B, Hkv, repeats, L, S].
        let allowed = if allowed.ndim() == 4 { allowed.expand_dims(1)? } else { allowed.clone() };
        let grouped = scores.reshape(&[b, kv_heads, repeats, l, s])?;
        scores =
            select(&allowed, &grouped, Array::from_f32(f32::NEG_INFINITY))?.reshape(&[b, kv_heads, repeats * l, s])?;
    }
    scores.eval()?;
    let causal = matches!(mask, AttentionMask::Causal);
    let probs = softmax_rows(scores.as_slice::<f32>(), s as usize, |row| {
        // Causal: query `i` (the row's place among the L queries) sees keys up to `S - L + i`.
        if causal {
            (s - l) as usize + row % l as usize + 1
        } else {
            s as usize
        }
    });
    let probs = Array::from_slice(&probs, &[b, kv_heads, repeats * l, s]);
    Ok(matmul(&probs, v)?.reshape(&[b, heads, l, d])?)
}

/// Softmax of each `width`-long row of `scores`; row `r` uses its first `visible(r)` entries
/// (the rest are 0). A row with nothing finite to see is all zeros.
fn softmax_rows(scores: &[f32], width: usize, visible: impl Fn(usize) -> usize + Sync) -> Vec<f32> {
    let mut out = vec![0.0f32; scores.len()];
    let rows = scores.len() / width.max(1);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(rows.max(1));
    // Small jobs stay on this thread (a spawn costs more than a few thousand exps).
    let threads = if scores.len() < 64 * 1024 { 1 } else { threads };
    let per_thread = rows.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (chunk, out) in out.chunks_mut(per_thread * width).enumerate() {
            let visible = &visible;
            let mut work = move || {
                for (i, out) in out.chunks_mut(width).enumerate() {
                    let row = chunk * per_thread + i;
                    let n = visible(row).min(width);
                    softmax(&scores[row * width..row * width + n], &mut out[..n]);
                }
            };
            if threads == 1 {
                work();
            } else {
                scope.spawn(work);
            }
        }
    });
    out
}

/// `out = softmax(x)`, in f32 like MLX's.
fn softmax(x: &[f32], out: &mut [f32]) {
    const LANES: usize = 8;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = if v > *m { v } else { *m };
        }
    }
    let max = chunks.remainder().iter().chain(&lanes).fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if max == f32::NEG_INFINITY {
        out.fill(0.0);
        return;
    }
    let mut sums = [0.0f32; LANES];
    let (mut xs, mut os) = (x.chunks_exact(LANES), out.chunks_exact_mut(LANES));
    for (xc, oc) in (&mut xs).zip(&mut os) {
        for ((o, &v), s) in oc.iter_mut().zip(xc).zip(sums.iter_mut()) {
            *o = exp(v - max);
            *s += *o;
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for (o, &v) in os.into_remainder().iter_mut().zip(xs.remainder()) {
        *o = exp(v - max);
        sum += *o;
    }
    let inverse = 1.0 / sum;
    for o in out.iter_mut() {
        *o *= inverse;
    }
}

/// `e^x` for `x <= 0` (scores minus their row's maximum), within 2e-7 relative of the C
/// library's: `x = n ln 2 + r` (Cody-Waite: `ln 2` in two parts, so `r` stays exact), `2^n` put
/// in the exponent bits, `e^r` (`|r| <= ln 2 / 2`) by its degree-7 Taylor polynomial.
/// Branch-free, so that loops over it vectorise.
#[inline(always)]
fn exp(x: f32) -> f32 {
    // Below this e^x is under f32's smallest normal: flushed to (nearly) zero.
    let x = x.max(-87.0);
    // Round to nearest by the 1.5 * 2^23 trick (exact for |t| < 2^22).
    const ROUND: f32 = 12_582_912.0;
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // 1/k! for k = 0..=7.
    const C: [f32; 8] = [1.0, 1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0];
    let mut p = C[7];
    for &c in C[..7].iter().rev() {
        p = p * r + c;
    }
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
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

    #[test]
    fn softmax_rows_match_the_definition_with_masked_tails() {
        let width = 37;
        let scores: Vec<f32> = (0..width * 5).map(|i| ((i * 7919) % 101) as f32 / 9.0 - 5.0).collect();
        let visible = |row: usize| [37, 1, 20, 0, 36][row];
        let got = softmax_rows(&scores, width, visible);
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
        let threaded = softmax_rows(&big, 4096, |_| 4096);
        let single: Vec<f32> = big.chunks(4096).flat_map(|r| softmax_rows(r, 4096, |_| 4096)).collect();
        assert_eq!(threaded, single);
    }
}
