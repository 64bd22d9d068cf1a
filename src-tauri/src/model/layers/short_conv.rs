//! LFM2's short-convolution block: the input projected to two gates and a signal, the gated
//! signal through a short causal depthwise convolution (its last `kernel - 1` inputs are the
//! row's state), gated again, projected back. No activation. mlx-lm's `lfm2.py` is the reference.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{concatenate, conv1d, multiply, split_equal, zeros_dtype};
use mlx_rs::Array;

use crate::model::cache::LayerCache;
use crate::model::error::Result;
use crate::model::layers::Linear;

pub struct ShortConv {
    /// `[B | C | x]`, each the hidden size.
    pub in_proj: Linear,
    /// Depthwise weights `[channels, kernel, 1]` (MLX's layout), and their bias.
    pub conv: Array,
    pub conv_bias: Option<Array>,
    pub out: Linear,
    pub kernel: i32,
}

impl ShortConv {
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.in_proj.arrays();
        out.push(&self.conv);
        out.extend(&self.conv_bias);
        out.extend(self.out.arrays());
        out
    }

    /// `x`: `[B, S, hidden]` -> `[B, S, hidden]`, each row's last inputs in `cache` carried
    /// forward (zeros for a row that has none: a fresh sequence).
    pub fn forward(&self, x: &Array, cache: &mut impl LayerCache) -> Result<Array> {
        let (b, s) = (x.dim(0), x.dim(1));
        let parts = split_equal(&self.in_proj.forward(x)?, 3, -1)?;
        let gated = multiply(&parts[0], &parts[2])?;
        let channels = gated.dim(-1);
        let state = match cache.states().first() {
            Some(state) => state.clone(),
            None => zeros_dtype(&[b, self.kernel - 1, channels], gated.dtype())?,
        };
        let input = concatenate(&[state, gated], 1)?;
        let total = input.dim(1);
        let next = input.try_index((.., total - (self.kernel - 1).., ..))?.contiguous()?;
        let mut conv = conv1d(&input, &self.conv, 1, 0, 1, channels)?;
        if let Some(bias) = &self.conv_bias {
            conv = conv.add(bias)?;
        }
        if cache.verifying() {
            // Checking drafted tokens: the last inputs after each position, so the step keeps
            // those after the last token it accepts.
            let kernel = self.kernel - 1;
            let after: Vec<Array> =
                (1..=s).map(|t| input.try_index((.., t..t + kernel, ..))).collect::<std::result::Result<_, _>>()?;
            cache.set_step_states(vec![mlx_rs::ops::stack(&after, 1)?]);
        }
        cache.set_states(vec![next]);
        cache.advance(s);
        self.out.forward(&multiply(&parts[1], &conv)?)
    }
}
