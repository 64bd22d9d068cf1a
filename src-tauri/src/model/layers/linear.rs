//! Linear layers, dense or MLX affine-quantized (`weight` packed in uint32 with `scales`/`biases`).

use mlx_rs::ops::{add, quantized_matmul};
use mlx_rs::Array;

use crate::model::config::QuantSpec;
use crate::model::error::Result;

/// `y = x W^T (+ b)`, with `W` of shape `[out, in]` (dense) or packed `[out, in * bits / 32]`.
pub enum Linear {
    Dense { weight: Array, bias: Option<Array> },
    Quantized { weight: Array, scales: Array, biases: Array, bias: Option<Array>, quant: QuantSpec },
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (y, bias) = match self {
            Linear::Dense { weight, bias } => (x.matmul(weight.t())?, bias),
            Linear::Quantized { weight, scales, biases, bias, quant } => {
                (quantized_matmul(x, weight, scales, biases, true, quant.group_size, quant.bits)?, bias)
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
                [weight, scales, biases].into_iter().chain(bias).collect()
            }
        }
    }
}
