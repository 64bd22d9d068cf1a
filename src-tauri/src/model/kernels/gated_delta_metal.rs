//! The gated delta rule as one Metal kernel, for Apple GPUs: the ops form
//! (`delta_rule::recurrence`) is a loop of a dozen small ops per token, each a kernel launch;
//! here one launch runs every token of a chunk with the state in registers. One SIMD group
//! (32 lanes) owns one row of one value head's `[Dv, Dk]` state matrix, each lane `Dk / 32` of
//! its columns; the two dot products per token are SIMD sums.
//!
//! It is used only where it can be checked: on a Metal device, for key heads of a multiple of
//! 32, and only once it has answered as the ops form does on a small random case (the first
//! use runs both and compares); otherwise, and on every other device, the ops form runs.

use std::cell::OnceCell;
use std::sync::OnceLock;

use mlx_rs::{Array, Dtype};

use crate::mlx::metal_kernel::{metal_available, MetalKernel, Output, Template};
use crate::model::error::{ModelError, Result};

const SOURCE: &str = r#"
    const uint lane = thread_position_in_threadgroup.x;
    const uint row = thread_position_in_grid.y;
    const uint n = thread_position_in_grid.z;
    const uint b = n / Hv;
    const uint hv = n % Hv;
    const uint hk = hv / (Hv / Hk);
    constexpr int per_lane = Dk / 32;

    auto q_at = q + (b * T * Hk + hk) * Dk + lane * per_lane;
    auto k_at = k + (b * T * Hk + hk) * Dk + lane * per_lane;
    auto v_at = v + (b * T * Hv + hv) * Dv + row;
    auto y_at = y + (b * T * Hv + hv) * Dv + row;
    auto g_at = g + b * T * Hv + hv;
    auto beta_at = beta + b * T * Hv + hv;
    const uint state_at = (n * Dv + row) * Dk + lane * per_lane;

    float s[per_lane];
    for (int i = 0; i < per_lane; ++i) {
        s[i] = static_cast<float>(state_in[state_at + i]);
    }
    for (int t = 0; t < T; ++t) {
        const float decay = static_cast<float>(g_at[t * Hv]);
        float remembered = 0.0f;
        for (int i = 0; i < per_lane; ++i) {
            s[i] *= decay;
            remembered += s[i] * static_cast<float>(k_at[i]);
        }
        remembered = simd_sum(remembered);
        const float delta = (static_cast<float>(v_at[t * Hv * Dv]) - remembered) * static_cast<float>(beta_at[t * Hv]);
        float read = 0.0f;
        for (int i = 0; i < per_lane; ++i) {
            s[i] += static_cast<float>(k_at[i]) * delta;
            read += s[i] * static_cast<float>(q_at[i]);
        }
        read = simd_sum(read);
        if (lane == 0) {
            y_at[t * Hv * Dv] = static_cast<OutT>(read);
        }
        q_at += Hk * Dk;
        k_at += Hk * Dk;
    }
    for (int i = 0; i < per_lane; ++i) {
        state_out[state_at + i] = s[i];
    }
"#;

/// Whether the kernel runs the recurrence for key heads of `key_dim`: a Metal device, a head
/// size the lanes divide, and the kernel checked against the ops form once.
pub fn usable(key_dim: i32) -> bool {
    static CHECKED: OnceLock<bool> = OnceLock::new();
    key_dim >= 32
        && key_dim % 32 == 0
        && *CHECKED.get_or_init(|| {
            if !metal_available() {
                return false;
            }
            match agrees_with_the_ops_form() {
                Ok(true) => true,
                Ok(false) => {
                    tracing::warn!("gated delta: the Metal kernel differs from the ops form; using the ops form");
                    false
                }
                Err(e) => {
                    tracing::warn!("gated delta: the Metal kernel cannot run ({e}); using the ops form");
                    false
                }
            }
        })
}

/// The gated delta rule over `T` tokens, as `gated_delta::recurrence` computes it: q, k
/// `[B, T, Hk, Dk]` (not repeated per value head), v `[B, T, Hv, Dv]`, g and beta `[B, T, Hv]`,
/// state `[B, Hv, Dv, Dk]` (f32). Returns the outputs `[B, T, Hv, Dv]` in q's dtype and the new
/// state.
pub fn recurrence(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<(Array, Array)> {
    thread_local! {
        // Built once per thread that runs a model (the engine's).
        static KERNEL: OnceCell<std::result::Result<MetalKernel, String>> = const { OnceCell::new() };
    }
    let (b, t, hk, dk) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (hv, dv) = (v.dim(2), v.dim(3));
    let state = state.as_dtype(Dtype::Float32)?;
    let steps = Array::from_int(t);
    let template = [
        ("OutT", Template::Dtype(q.dtype())),
        ("Dk", Template::Int(dk)),
        ("Dv", Template::Int(dv)),
        ("Hk", Template::Int(hk)),
        ("Hv", Template::Int(hv)),
    ];
    let outputs = [
        Output { shape: vec![b, t, hv, dv], dtype: q.dtype() },
        Output { shape: vec![b, hv, dv, dk], dtype: Dtype::Float32 },
    ];
    // SAFETY: with row-contiguous inputs of the shapes above, thread (lane, row, n) reads
    // q/k columns `lane * Dk/32 ..` of key head `hv / (Hv/Hk)` and element `row` of v, g and
    // beta of its own (b, hv) for t < T, and state row (n, row): all in bounds. Lane 0 of each
    // SIMD group writes y[b, t, hv, row] for every t, every lane its own Dk/32 state columns:
    // the grid (32, Dv, B*Hv) writes every output element once, and no input.
    let out = KERNEL.with(|kernel| {
        let kernel = kernel
            .get_or_init(|| {
                let inputs = ["q", "k", "v", "g", "beta", "state_in", "T"];
                MetalKernel::new("fastmlx_gated_delta", &inputs, &["y", "state_out"], SOURCE)
            })
            .as_ref()
            .map_err(|e| ModelError::Mlx(e.clone()))?;
        let inputs = [q, k, v, g, beta, &state, &steps];
        unsafe { kernel.apply(&inputs, &outputs, (32, dv, b * hv), (32, dv.min(4), 1), &template) }
            .map_err(ModelError::Mlx)
    })?;
    let mut out = out.into_iter();
    match (out.next(), out.next()) {
        (Some(y), Some(state)) => Ok((y, state)),
        _ => Err(ModelError::Mlx("the gated delta kernel returned no outputs".into())),
    }
}

/// Runs the kernel and the ops form on a small random case (two rows, grouped key heads, a few
/// tokens, a non-zero start state) and compares.
fn agrees_with_the_ops_form() -> Result<bool> {
    let (b, t, hk, hv, dk, dv) = (2, 5, 2, 4, 64, 8);
    let key = |seed: u64| mlx_rs::random::key(seed);
    let normal = |shape: &[i32], seed: u64| -> Result<Array> {
        Ok(mlx_rs::random::normal::<f32>(shape, None, Some(0.3), &key(seed)?)?)
    };
    let unit = |shape: &[i32], seed: u64| -> Result<Array> {
        Ok(mlx_rs::ops::sigmoid(&mlx_rs::random::normal::<f32>(shape, None, None, &key(seed)?)?)?)
    };
    let (q, k, v) = (normal(&[b, t, hk, dk], 1)?, normal(&[b, t, hk, dk], 2)?, normal(&[b, t, hv, dv], 3)?);
    let (g, beta, state) = (unit(&[b, t, hv], 4)?, unit(&[b, t, hv], 5)?, normal(&[b, hv, dv, dk], 6)?);
    let (y, s) = recurrence(&q, &k, &v, &g, &beta, &state)?;
    let wide = |a: &Array| super::delta_rule::repeat_heads(a, hv);
    let (y_ops, s_ops) = super::delta_rule::recurrence(&wide(&q)?, &wide(&k)?, &v, &g, &beta, state)?;
    let close = |a: &Array, b: &Array| -> Result<bool> { Ok(a.all_close(b, 1e-4, 1e-4, None)?) };
    Ok(close(&y, &y_ops)? && close(&s, &s_ops)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On Metal the kernel is chosen for head sizes the lanes divide, and agrees with the ops
    /// form. Off Metal (a CPU build) it is never chosen, and asking for it anyway is an error,
    /// not a crash: the ops form runs.
    #[test]
    fn the_kernel_runs_on_metal_only_and_answers_as_the_ops_form() {
        crate::mlx::Backend::init();
        assert!(!usable(16), "head sizes the 32 lanes do not divide");
        if metal_available() {
            assert!(usable(128) && agrees_with_the_ops_form().unwrap());
            return;
        }
        assert!(!usable(128));
        let x = Array::from_slice(&[0f32; 64], &[1, 1, 1, 64]);
        let (v, gate) = (Array::from_slice(&[0f32; 4], &[1, 1, 1, 4]), Array::from_slice(&[0.5f32], &[1, 1, 1]));
        let state = Array::from_slice(&[0f32; 256], &[1, 1, 4, 64]);
        let run =
            recurrence(&x, &x, &v, &gate, &gate, &state).and_then(|(y, s)| Ok(mlx_rs::transforms::eval([&y, &s])?));
        assert!(run.is_err(), "a Metal kernel cannot run on a CPU build");
    }
}
