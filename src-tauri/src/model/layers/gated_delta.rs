//! Gated DeltaNet (Qwen3-Next, Qwen3.5): linear attention whose memory, per value head, is a
//! `[Dv, Dk]` matrix updated token by token by the gated delta rule, after a short causal
//! convolution over the projected q/k/v. Its state per sequence is fixed-size: the
//! convolution's last `kernel - 1` inputs and the matrices (f32). mlx-lm's `gated_delta.py`
//! ops path is the reference; the recurrence itself is in `kernels` (one Metal kernel on Apple
//! GPUs, as mlx-lm's, the ops form elsewhere).

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{
    concatenate, conv1d, exp, logaddexp, multiply, negative, sigmoid, split_at_indices, stack, zeros_dtype,
};
use mlx_rs::{Array, Dtype};

use crate::model::cache::LayerCache;
use crate::model::error::Result;
use crate::model::kernels::delta_rule;
use crate::model::layers::{Linear, RmsNorm};

pub enum DeltaProjections {
    /// Qwen3-Next: `[q | k | v | z]` grouped per key head in one projection, `[b | a]` in another.
    Grouped { qkvz: Linear, ba: Linear },
    /// Qwen3.5: `[q | k | v]` (the convolution's channel order), z, b and a apart.
    Separate { qkv: Linear, z: Linear, b: Linear, a: Linear },
}

pub struct GatedDeltaNet {
    pub projections: DeltaProjections,
    /// Depthwise convolution weights `[channels, kernel, 1]` (MLX's layout), no bias.
    pub conv: Array,
    pub dt_bias: Array,
    /// The decay's log rate, per value head, kept in f32.
    pub a_log: Array,
    /// The RMS norm per value head before the output gate.
    pub norm: RmsNorm,
    pub out: Linear,
    pub key_heads: i32,
    pub value_heads: i32,
    pub key_dim: i32,
    pub value_dim: i32,
    pub kernel: i32,
}

/// What the projections give, in the reference's shapes: the convolution's input
/// `[B, S, channels]`, z `[B, S, Hv, Dv]`, b and a `[B, S, Hv]`.
struct Projected {
    qkv: Array,
    z: Array,
    b: Array,
    a: Array,
}

impl GatedDeltaNet {
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out: Vec<&Array> = match &self.projections {
            DeltaProjections::Grouped { qkvz, ba } => [qkvz, ba].into_iter().flat_map(Linear::arrays).collect(),
            DeltaProjections::Separate { qkv, z, b, a } => {
                [qkv, z, b, a].into_iter().flat_map(Linear::arrays).collect()
            }
        };
        out.extend([&self.conv, &self.dt_bias, &self.a_log, &self.norm.weight]);
        out.extend(self.out.arrays());
        out
    }

    fn channels(&self) -> i32 {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    fn project(&self, x: &Array) -> Result<Projected> {
        let (b, s) = (x.dim(0), x.dim(1));
        let (nk, nv, dk, dv) = (self.key_heads, self.value_heads, self.key_dim, self.value_dim);
        Ok(match &self.projections {
            DeltaProjections::Grouped { qkvz, ba } => {
                // Per key head: its query, its key, then its nv/nk value heads' v and z.
                let group = nv / nk;
                let mixed = qkvz.forward(x)?.reshape(&[b, s, nk, -1])?;
                let parts = split_at_indices(&mixed, &[dk, 2 * dk, 2 * dk + group * dv], -1)?;
                let flat = |t: &Array| t.reshape(&[b, s, -1]);
                let qkv = concatenate(&[flat(&parts[0])?, flat(&parts[1])?, flat(&parts[2])?], -1)?;
                let gates = ba.forward(x)?.reshape(&[b, s, nk, -1])?;
                let gates = split_at_indices(&gates, &[group], -1)?;
                Projected {
                    qkv,
                    z: parts[3].reshape(&[b, s, nv, dv])?,
                    b: gates[0].reshape(&[b, s, nv])?,
                    a: gates[1].reshape(&[b, s, nv])?,
                }
            }
            DeltaProjections::Separate { qkv, z, b: bp, a } => Projected {
                qkv: qkv.forward(x)?,
                z: z.forward(x)?.reshape(&[b, s, nv, dv])?,
                b: bp.forward(x)?,
                a: a.forward(x)?,
            },
        })
    }

    /// `x`: `[B, S, hidden]` -> `[B, S, hidden]`, the rows' states in `cache` carried forward
    /// (a row without one starts from zeros, a fresh sequence).
    pub fn forward(&self, x: &Array, cache: &mut impl LayerCache) -> Result<Array> {
        let (b, s) = (x.dim(0), x.dim(1));
        let (nk, nv, dk, dv) = (self.key_heads, self.value_heads, self.key_dim, self.value_dim);
        let p = self.project(x)?;
        let channels = self.channels();
        let states = cache.states().to_vec();
        let conv_state = match states.first() {
            Some(state) => state.clone(),
            None => zeros_dtype(&[b, self.kernel - 1, channels], x.dtype())?,
        };
        let conv_input = concatenate(&[conv_state, p.qkv], 1)?;
        let total = conv_input.dim(1);
        let next_conv = conv_input.try_index((.., total - (self.kernel - 1).., ..))?.contiguous()?;
        let conv_out = conv1d(&conv_input, &self.conv, 1, 0, 1, channels)?;
        let conv_out = multiply(&conv_out, sigmoid(&conv_out)?)?;
        let parts = split_at_indices(&conv_out, &[nk * dk, 2 * nk * dk], -1)?;
        let q = parts[0].reshape(&[b, s, nk, dk])?;
        let k = parts[1].reshape(&[b, s, nk, dk])?;
        let v = parts[2].reshape(&[b, s, nv, dv])?;
        // Unit-length q and k (eps on the sum of squares), the readout scale folded into q.
        let inv = (dk as f32).powf(-0.5);
        let eps = 1e-6 * inv * inv;
        // Scalars in the activations' dtype, as the reference's Python floats (an f32 array
        // would promote a bf16 model's activations to f32).
        let scalar = |v: f32| Array::from_f32(v).as_dtype(x.dtype());
        let q = multiply(mlx_rs::fast::rms_norm(&q, None, eps)?, scalar(inv * inv)?)?;
        let k = multiply(mlx_rs::fast::rms_norm(&k, None, eps)?, scalar(inv)?)?;
        let beta = sigmoid(&p.b)?;
        // The decay in (0, 1]: exp(-exp(A_log) * softplus(a + dt_bias)), f32 from A_log on.
        let softplus = logaddexp(p.a.add(&self.dt_bias)?, scalar(0.0)?)?;
        let g = exp(negative(multiply(exp(&self.a_log)?, &softplus)?)?)?;
        let state = match states.get(1) {
            Some(state) => state.clone(),
            None => zeros_dtype(&[b, nv, dv, dk], Dtype::Float32)?,
        };
        let (y, state) = if cache.verifying() {
            // Checking drafted tokens: the recurrence one position at a time, keeping the state
            // after each (and the convolution's last inputs after each), so the step keeps the
            // state after the last token it accepts.
            let kernel = self.kernel - 1;
            let (mut ys, mut states, mut convs) = (Vec::new(), Vec::new(), Vec::new());
            let mut state = state;
            for t in 0..s {
                let at = |a: &Array| a.try_index((.., t..t + 1));
                let (y, next) = delta_rule(&at(&q)?, &at(&k)?, &at(&v)?, &at(&g)?, &at(&beta)?, state)?;
                ys.push(y);
                states.push(next.clone());
                convs.push(conv_input.try_index((.., t + 1..t + 1 + kernel, ..))?);
                state = next;
            }
            cache.set_step_states(vec![stack(&convs, 1)?, stack(&states, 1)?]);
            (concatenate(&ys, 1)?, state)
        } else {
            delta_rule(&q, &k, &v, &g, &beta, state)?
        };
        cache.set_states(vec![next_conv, state]);
        cache.advance(s);
        // RMS norm per head, then the SiLU of z as a gate (in f32, as the reference).
        let normed = self.norm.forward(&y)?;
        let z = p.z.as_dtype(Dtype::Float32)?;
        let gated = multiply(multiply(&z, sigmoid(&z)?)?, normed.as_dtype(Dtype::Float32)?)?.as_dtype(y.dtype())?;
        self.out.forward(&gated.reshape(&[b, s, nv * dv])?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KvCache;

    fn random(shape: &[i32], dtype: Dtype, seed: u64) -> Array {
        let key = mlx_rs::random::key(seed).unwrap();
        mlx_rs::random::normal::<f32>(shape, None, Some(0.2), &key).unwrap().as_dtype(dtype).unwrap()
    }

    /// A bf16 model stays in bf16 through the layer (the recurrence's state alone is f32), as
    /// mlx-lm keeps it: no f32 constant may promote the activations.
    #[test]
    fn half_precision_activations_stay_half_precision() {
        let dtype = Dtype::Bfloat16;
        let (hidden, nk, nv, dk, dv, kernel) = (16, 1, 2, 8, 4, 3);
        let channels = 2 * nk * dk + nv * dv;
        let dense =
            |rows: i32, cols: i32, seed: u64| Linear::Dense { weight: random(&[rows, cols], dtype, seed), bias: None };
        let layer = GatedDeltaNet {
            projections: DeltaProjections::Separate {
                qkv: dense(channels, hidden, 1),
                z: dense(nv * dv, hidden, 2),
                b: dense(nv, hidden, 3),
                a: dense(nv, hidden, 4),
            },
            conv: random(&[channels, kernel, 1], dtype, 5),
            dt_bias: random(&[nv], dtype, 6),
            a_log: random(&[nv], Dtype::Float32, 7),
            norm: RmsNorm { weight: random(&[dv], dtype, 8), eps: 1e-6 },
            out: dense(hidden, nv * dv, 9),
            key_heads: nk,
            value_heads: nv,
            key_dim: dk,
            value_dim: dv,
            kernel,
        };
        let mut cache = KvCache::new();
        let out = layer.forward(&random(&[1, 5, hidden], dtype, 10), &mut cache).unwrap();
        assert_eq!(out.dtype(), dtype);
        let states = cache.states();
        assert_eq!((states[0].dtype(), states[1].dtype()), (dtype, Dtype::Float32));
        assert_eq!(cache.len(), 5);
    }
}
