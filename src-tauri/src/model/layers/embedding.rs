//! Token embeddings, dense or quantized; also used as the output head when embeddings are tied.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use crate::model::config::QuantSpec;
use crate::model::error::Result;
use crate::model::layers::quant_ops;

pub enum Embedding {
    Dense { weight: Array },
    Quantized { weight: Array, scales: Array, biases: Option<Array>, quant: QuantSpec },
}

impl Embedding {
    /// `ids` of any shape -> `[..ids, hidden]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        Ok(match self {
            Embedding::Dense { weight } => weight.try_index(ids)?,
            Embedding::Quantized { weight, scales, biases, quant } => {
                let biases = biases.as_ref().map(|b| b.try_index(ids)).transpose()?;
                quant_ops::dequantize(&weight.try_index(ids)?, &scales.try_index(ids)?, biases.as_ref(), *quant)?
            }
        })
    }

    /// Tied output head: `x E^T`.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            Embedding::Dense { weight } => x.matmul(weight.t())?,
            Embedding::Quantized { weight, scales, biases, quant } => {
                quant_ops::quantized_matmul(x, weight, scales, biases.as_ref(), *quant)?
            }
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Embedding::Dense { weight } => vec![weight],
            Embedding::Quantized { weight, scales, biases, .. } => [weight, scales].into_iter().chain(biases).collect(),
        }
    }
}
