//! Token embeddings, dense or quantized; also used as the output head when embeddings are tied.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{dequantize, quantized_matmul};
use mlx_rs::Array;

use crate::model::config::QuantSpec;
use crate::model::error::Result;

pub enum Embedding {
    Dense { weight: Array },
    Quantized { weight: Array, scales: Array, biases: Array, quant: QuantSpec },
}

impl Embedding {
    /// `ids` of any shape -> `[..ids, hidden]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        Ok(match self {
            Embedding::Dense { weight } => weight.try_index(ids)?,
            Embedding::Quantized { weight, scales, biases, quant } => dequantize(
                weight.try_index(ids)?,
                scales.try_index(ids)?,
                &biases.try_index(ids)?,
                quant.group_size,
                quant.bits,
            )?,
        })
    }

    /// Tied output head: `x E^T`.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            Embedding::Dense { weight } => x.matmul(weight.t())?,
            Embedding::Quantized { weight, scales, biases, quant } => {
                quantized_matmul(x, weight, scales, biases, true, quant.group_size, quant.bits)?
            }
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Embedding::Dense { weight } => vec![weight],
            Embedding::Quantized { weight, scales, biases, .. } => vec![weight, scales, biases],
        }
    }
}
