//! Linear layers, dense or MLX affine-quantized (`weight` packed in uint32 with `scales`/`biases`).

use mlx_rs::ops::add;
use mlx_rs::Array;

use crate::model::config::QuantSpec;
use crate::model::error::Result;
use crate::model::layers::quant_ops;

/// `y = x W^T (+ b)`, with `W` of shape `[out, in]` (dense) or packed `[out, in * bits / 32]`.
pub enum Linear {
    Dense {
        weight: Array,
        bias: Option<Array>,
    },
    /// `biases`: the affine mode's per-group offsets (the float modes have none).
    Quantized {
        weight: Array,
        scales: Array,
        biases: Option<Array>,
        bias: Option<Array>,
        quant: QuantSpec,
    },
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (y, bias) = match self {
            Linear::Dense { weight, bias } => (x.matmul(weight.t())?, bias),
            Linear::Quantized { weight, scales, biases, bias, quant } => {
                (quant_ops::quantized_matmul(x, weight, scales, biases.as_ref(), *quant)?, bias)
            }
        };
        Ok(match bias {
            Some(b) => add(&y, b)?,
            None => y,
        })
    }

    /// Every array the layer holds (to evaluate and measure them).
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Linear::Dense { weight, bias } => std::iter::once(weight).chain(bias).collect(),
            Linear::Quantized { weight, scales, biases, bias, .. } => {
                [weight, scales].into_iter().chain(biases).chain(bias).collect()
            }
        }
    }
}
