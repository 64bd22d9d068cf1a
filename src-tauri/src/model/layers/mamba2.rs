//! Mamba-2 (Granite 4.0-H, Nemotron-H): a selective state-space layer. The input projection
//! gives a gate, the convolution's input and a time step per head; a depthwise causal
//! convolution (its last `kernel - 1` inputs kept per row) and SiLU give `x | B | C`; the SSM
//! state per row is `[heads, head_dim, state]` in f32. The scan is mlx-lm's chunked form
//! (`ssm_attn`, chunks of 256: within a chunk a masked "attention" of C·B with the decays,
//! across chunks the carried state), for prefill and for a decode step alike (mlx-lm's Metal
//! kernel for one step is not ported: the same sums in another order). Then the gated RMS norm
//! (Granite: one norm over the whole width; Nemotron: per group, its weight applied apart) and
//! the output projection. mlx-lm's `ssm.py`, `granitemoehybrid.py` and `nemotron_h.py` are the
//! reference.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{
    add, clip, concatenate, conv1d, cumsum, exp, logaddexp, matmul, multiply, negative, repeat_axis, sigmoid,
    split_at_indices, stack, tril, zeros_dtype,
};
use mlx_rs::{Array, Dtype};

use crate::model::cache::LayerCache;
use crate::model::error::Result;
use crate::model::layers::Linear;

/// mlx-lm's chunk length for the chunked scan.
const STEP: i32 = 256;

/// How the gated output is normalised.
pub enum GatedNorm {
    /// Granite: `rms_norm(silu(gate) * y, weight, eps)` over the whole width.
    Whole { weight: Array, eps: f32 },
    /// Nemotron: RMS-normalised in `groups` groups without a weight, then times it.
    Grouped { weight: Array, eps: f32, groups: i32 },
}

pub struct Mamba2 {
    /// `[gate (I) | conv input (I + 2 G N) | dt (H)]`.
    pub in_proj: Linear,
    /// Depthwise convolution `[conv_dim, kernel, 1]` (MLX's layout) and its optional bias.
    pub conv: Array,
    pub conv_bias: Option<Array>,
    pub dt_bias: Array,
    /// In its stored dtype: the reference takes the exp there, then casts to f32.
    pub a_log: Array,
    pub d: Array,
    pub norm: GatedNorm,
    pub out_proj: Linear,
    pub heads: i32,
    pub head_dim: i32,
    pub state: i32,
    pub groups: i32,
    pub kernel: i32,
    /// The time step's clip, `(min, max)` (max may be infinite).
    pub dt_limit: (f32, f32),
}

/// What the scan reads, per position: `x` `[B, L, H, Dh]`, `B`/`C` `[B, L, G, N]` (the
/// activations' dtype), `dt·x` `[B, L, H, Dh]` and `dt·A` `[B, L, H]` (f32).
struct ScanInputs {
    x: Array,
    b: Array,
    c: Array,
    dtx: Array,
    dta: Array,
}

impl ScanInputs {
    /// Positions `start..end`.
    fn slice(&self, start: i32, end: i32) -> Result<ScanInputs> {
        let part = |t: &Array| t.try_index((.., start..end));
        Ok(ScanInputs {
            x: part(&self.x)?,
            b: part(&self.b)?,
            c: part(&self.c)?,
            dtx: part(&self.dtx)?,
            dta: part(&self.dta)?,
        })
    }
}

impl Mamba2 {
    fn width(&self) -> i32 {
        self.heads * self.head_dim
    }

    fn conv_dim(&self) -> i32 {
        self.width() + 2 * self.groups * self.state
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.in_proj.arrays();
        out.push(&self.conv);
        out.extend(&self.conv_bias);
        out.extend([&self.dt_bias, &self.a_log, &self.d]);
        out.push(match &self.norm {
            GatedNorm::Whole { weight, .. } | GatedNorm::Grouped { weight, .. } => weight,
        });
        out.extend(self.out_proj.arrays());
        out
    }

    /// `x`: `[B, L, hidden]` -> `[B, L, hidden]`, the rows' states carried in `cache`
    /// (`[conv inputs, ssm state]`; none: a fresh sequence).
    pub fn forward(&self, x: &Array, cache: &mut impl LayerCache) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let (width, conv_dim, keep) = (self.width(), self.conv_dim(), self.kernel - 1);
        let projected = self.in_proj.forward(x)?;
        let parts = split_at_indices(&projected, &[width, width + conv_dim], -1)?;
        let (gate, conv_in, dt) = (&parts[0], &parts[1], &parts[2]);
        let states = cache.states().to_vec();
        let conv_state = match states.first() {
            Some(state) => state.clone(),
            None => zeros_dtype(&[b, keep, conv_dim], conv_in.dtype())?,
        };
        let padded = concatenate(&[conv_state, conv_in.clone()], 1)?;
        let next_conv = padded.try_index((.., l.., ..))?.contiguous()?;
        let mut conv_out = conv1d(&padded, &self.conv, 1, 0, 1, conv_dim)?;
        if let Some(bias) = &self.conv_bias {
            conv_out = add(&conv_out, bias)?;
        }
        let conv_out = multiply(&conv_out, sigmoid(&conv_out)?)?;
        let gn = self.groups * self.state;
        let parts = split_at_indices(&conv_out, &[width, width + gn], -1)?;
        let xs = parts[0].reshape(&[b, l, self.heads, self.head_dim])?;
        // dt in f32: softplus (`logaddexp(x, 0)`), clipped; A = -exp(A_log) taken in A_log's
        // stored dtype, as the reference.
        let dt = logaddexp(add(dt.as_dtype(Dtype::Float32)?, &self.dt_bias)?, Array::from_f32(0.0))?;
        let dt = clip(&dt, (self.dt_limit.0, self.dt_limit.1))?;
        let a = negative(exp(&self.a_log)?.as_dtype(Dtype::Float32)?)?;
        let inputs = ScanInputs {
            dtx: multiply(dt.reshape(&[b, l, self.heads, 1])?, &xs)?,
            dta: multiply(&dt, a.reshape(&[1, 1, self.heads])?)?,
            x: xs,
            b: parts[1].reshape(&[b, l, self.groups, self.state])?,
            c: parts[2].reshape(&[b, l, self.groups, self.state])?,
        };
        let state = states.get(1).cloned();
        let (y, state) = if cache.verifying() {
            // Checking drafted tokens: one position at a time, keeping the state (and the
            // convolution's last inputs) after each, so the step keeps the state after the last
            // token it accepts.
            let (mut ys, mut ssm, mut convs) = (Vec::new(), Vec::new(), Vec::new());
            let mut state = state;
            for t in 0..l {
                let (y, next) = self.scan(&inputs.slice(t, t + 1)?, state)?;
                ys.push(y);
                ssm.push(next.clone());
                convs.push(padded.try_index((.., t + 1..t + 1 + keep, ..))?);
                state = Some(next);
            }
            cache.set_step_states(vec![stack(&convs, 1)?, stack(&ssm, 1)?]);
            (concatenate(&ys, 1)?, state.expect("at least one position"))
        } else {
            self.scan(&inputs, state)?
        };
        cache.set_states(vec![next_conv, state]);
        cache.advance(l);
        let y = y.reshape(&[b, l, width])?;
        let gated = multiply(multiply(gate, sigmoid(gate)?)?, &y)?;
        let normed = match &self.norm {
            GatedNorm::Whole { weight, eps } => mlx_rs::fast::rms_norm(&gated, Some(weight), *eps)?,
            GatedNorm::Grouped { weight, eps, groups } => {
                let grouped = gated.reshape(&[b, l, *groups, width / groups])?;
                let normed = mlx_rs::fast::rms_norm(&grouped, None, *eps)?.reshape(&[b, l, width])?;
                multiply(weight, &normed)?
            }
        };
        self.out_proj.forward(&normed)
    }

    /// mlx-lm's `ssm_attn` over `inputs`, from `state` (none: zeros, its terms skipped as the
    /// reference skips them); returns `y` `[B, L, H, Dh]` in x's dtype and the state after the
    /// last position (f32).
    fn scan(&self, inputs: &ScanInputs, state: Option<Array>) -> Result<(Array, Array)> {
        let x = &inputs.x;
        let (b, l, h, dh) = (x.dim(0), x.dim(1), x.dim(2), x.dim(3));
        let (g, n) = (self.groups, self.state);
        let repeats = h / g;
        let mut state = state;
        let mut ys = Vec::new();
        let mut start = 0;
        while start < l {
            let end = (start + STEP).min(l);
            let chunk = inputs.slice(start, end)?;
            let s = end - start;
            let b_t = chunk.b.transpose_axes(&[0, 2, 3, 1])?; // [B, G, N, s]
            let cb = matmul(chunk.c.swap_axes(1, 2)?, &b_t)?; // [B, G, s, s]
            let cb = repeat_axis::<f32>(cb, repeats, 1)?; // [B, H, s, s]
            let decay = exp(segsum(&chunk.dta.swap_axes(1, 2)?)?)?; // [B, H, s, s]
            let surrogate = tril(multiply(&cb, &decay)?, 0)?;
            let mut y = matmul(&surrogate, chunk.dtx.swap_axes(1, 2)?)?.swap_axes(1, 2)?; // [B, s, H, Dh]
            let last = decay.try_index((.., .., s - 1..s, ..))?.transpose_axes(&[0, 3, 1, 2])?; // [B, s, H, 1]
            let b_rep = repeat_axis::<f32>(b_t, repeats, 1)?.swap_axes(2, 3)?; // [B, H, s, N]
            let dtx_decay = multiply(&chunk.dtx, &last)?.swap_axes(1, 2)?.swap_axes(2, 3)?; // [B, H, Dh, s]
            let mut next = matmul(&dtx_decay, &b_rep)?; // [B, H, Dh, N]
            if let Some(prev) = &state {
                let cum = exp(cumsum(&chunk.dta, -2, None, None)?)?; // [B, s, H]
                let last_cum = cum.try_index((.., s - 1, ..))?.reshape(&[b, h, 1, 1])?;
                next = add(&next, multiply(&last_cum, prev)?)?;
                let c6 = chunk.c.reshape(&[b, s, g, 1, n, 1])?;
                let y_prev =
                    matmul(prev.reshape(&[b, 1, g, repeats, dh, n])?, &c6)?.squeeze_axes(&[-1])?.flatten(2, 3)?; // [B, s, H, Dh]
                y = add(&y, multiply(cum.expand_dims(-1)?, &y_prev)?)?;
            }
            ys.push(y.as_dtype(x.dtype())?);
            state = Some(next);
            start = end;
        }
        let skip = multiply(x, self.d.as_dtype(x.dtype())?.reshape(&[1, 1, h, 1])?)?;
        let y = add(concatenate(&ys, 1)?, &skip)?;
        Ok((y, state.expect("at least one position")))
    }
}

/// `segsum(x)`: `x` `[.., s]` -> `[.., s, s]`, entry (i, j) the sum of x over (j, i] below the
/// diagonal (mlx-lm's form: repeat, strict lower triangle, cumulative sum down the rows).
fn segsum(x: &Array) -> Result<Array> {
    let s = x.dim(-1);
    let repeated = repeat_axis::<f32>(x.expand_dims(-1)?, s, -1)?;
    let lower = tril(&repeated, -1)?;
    Ok(cumsum(&lower, -2, None, None)?)
}
