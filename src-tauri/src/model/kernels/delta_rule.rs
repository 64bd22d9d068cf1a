//! The gated delta rule as MLX ops, token by token: mlx-lm's `gated_delta.py` ops path, the
//! reference the Metal kernel is checked against and the path on every other device.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{broadcast_to, expand_dims, multiply, stack, subtract, sum_axis};
use mlx_rs::Array;

use crate::model::error::Result;

/// `[B, S, Hk, D]` -> `[B, S, Hv, D]`: each key head serves the `Hv / Hk` value heads that
/// follow one another.
pub(crate) fn repeat_heads(t: &Array, value_heads: i32) -> Result<Array> {
    let (b, s, hk, d) = (t.dim(0), t.dim(1), t.dim(2), t.dim(3));
    if hk == value_heads {
        return Ok(t.clone());
    }
    let wide = broadcast_to(expand_dims(t, 3)?, &[b, s, hk, value_heads / hk, d])?;
    Ok(wide.reshape(&[b, s, value_heads, d])?)
}

/// The gated delta rule over `S` tokens: per step the state decays by `g`, takes the key's
/// correction towards its value (`beta`), and is read by the query. q, k `[B, S, Hv, Dk]`,
/// v `[B, S, Hv, Dv]`, g and beta `[B, S, Hv]`, state `[B, Hv, Dv, Dk]` (f32). Returns the
/// outputs `[B, S, Hv, Dv]` (q's dtype) and the new state.
pub(crate) fn recurrence(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Array,
) -> Result<(Array, Array)> {
    let steps = q.dim(1);
    let mut state = state;
    let mut ys = Vec::with_capacity(steps as usize);
    for t in 0..steps {
        let at = |a: &Array| a.try_index((.., t));
        let (qt, kt, vt) = (at(q)?, at(k)?, at(v)?);
        let decay = expand_dims(expand_dims(at(g)?, -1)?, -1)?;
        state = multiply(&state, &decay)?;
        let k_row = expand_dims(&kt, -2)?;
        let remembered = sum_axis(multiply(&state, &k_row)?, -1, false)?;
        let delta = multiply(subtract(&vt, &remembered)?, expand_dims(at(beta)?, -1)?)?;
        state = state.add(multiply(&k_row, expand_dims(&delta, -1)?)?)?;
        let y = sum_axis(multiply(&state, expand_dims(&qt, -2)?)?, -1, false)?;
        ys.push(y.as_dtype(q.dtype())?);
    }
    Ok((stack(&ys, 1)?, state))
}
