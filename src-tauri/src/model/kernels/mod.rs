//! Compute paths written by hand beside MLX's ops, where MLX's own are slow on a device: the
//! attention softmax on the host for MLX's CPU device (`host_softmax`), and the gated delta
//! rule's recurrence as one Metal kernel on Apple GPUs (`gated_delta_metal`, checked against
//! the ops form, `delta_rule`, on first use), and products with quantized keys and values
//! (`kv_matmul`). The layers call them; they call no layer.

mod delta_rule;
mod gated_delta_metal;
pub(crate) mod host_softmax;
pub(crate) mod kv_matmul;

use mlx_rs::Array;

use crate::model::error::Result;

/// The gated delta rule over `S` tokens (see [`delta_rule::recurrence`]): q, k `[B, S, Hk, Dk]`,
/// v `[B, S, Hv, Dv]`, g and beta `[B, S, Hv]`, state `[B, Hv, Dv, Dk]` (f32). One Metal kernel
/// on Apple GPUs (checked against the ops form on first use), the ops form elsewhere.
pub(crate) fn delta_rule(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Array,
) -> Result<(Array, Array)> {
    let (value_heads, key_dim) = (v.dim(2), q.dim(3));
    if gated_delta_metal::usable(key_dim) {
        return gated_delta_metal::recurrence(q, k, v, g, beta, &state);
    }
    let wide = |a: &Array| delta_rule::repeat_heads(a, value_heads);
    delta_rule::recurrence(&wide(q)?, &wide(k)?, v, g, beta, state)
}
