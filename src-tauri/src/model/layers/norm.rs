//! RMS normalisation and LayerNorm (MLX's fused kernels).

use mlx_rs::Array;

use crate::model::error::Result;

pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(mlx_rs::fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

/// LayerNorm with its weight and (unless ModernBERT's) bias: the encoders' and vision towers'
/// norm, not the decoders' RMS norm.
pub struct LayerNorm {
    pub weight: Array,
    pub bias: Option<Array>,
    pub eps: f32,
}

impl LayerNorm {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(mlx_rs::fast::layer_norm(x, &self.weight, self.bias.as_ref(), self.eps)?)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        std::iter::once(&self.weight).chain(&self.bias).collect()
    }
}
