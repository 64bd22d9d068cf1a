//! Gemma 4's per-layer inputs (the E2B/E4B models): a second embedding table gives every token
//! a few features per layer; mixed with a projection of the input embedding, they gate an extra
//! residual update at the end of each layer.

use mlx_rs::ops::{add, multiply};
use mlx_rs::Array;

use crate::model::error::Result;
use crate::model::layers::{Embedding, Linear, RmsNorm};

/// Computes every layer's inputs from the token ids and the scaled input embedding.
pub struct PerLayerInputs {
    /// `[vocab, layers * size]`.
    pub embed: Embedding,
    /// hidden -> `layers * size`.
    pub projection: Linear,
    pub projection_norm: RmsNorm,
    pub layers: i32,
    pub size: i32,
    /// sqrt(size), hidden^-0.5: the embedding's and the projection's scales.
    pub embed_scale: f32,
    pub projection_scale: f32,
}

impl PerLayerInputs {
    /// `[B, L, layers, size]` for `ids` `[B, L]` whose embeddings (already scaled) are `h`.
    pub fn forward(&self, ids: &Array, h: &Array) -> Result<Array> {
        let (b, l) = (ids.dim(0), ids.dim(1));
        let shape = [b, l, self.layers, self.size];
        // Scalars in the activations' dtype, as the reference's Python floats act.
        let scalar = |x: f32| Array::from_f32(x).as_dtype(h.dtype());
        let from_ids = multiply(self.embed.forward(ids)?, scalar(self.embed_scale)?)?.reshape(&shape)?;
        let projected = multiply(self.projection.forward(h)?, scalar(self.projection_scale)?)?;
        let projected = self.projection_norm.forward(&projected.reshape(&shape)?)?;
        Ok(multiply(add(&projected, &from_ids)?, scalar(std::f32::consts::FRAC_1_SQRT_2)?)?)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.embed.arrays();
        out.extend(self.projection.arrays());
        out.push(&self.projection_norm.weight);
        out
    }
}

/// One layer's use of its input: `h + norm(proj(gelu(gate(h)) * input))`.
pub struct PerLayerGate {
    pub gate: Linear,
    pub projection: Linear,
    pub norm: RmsNorm,
}

impl PerLayerGate {
    pub fn forward(&self, h: &Array, input: &Array) -> Result<Array> {
        let gate = multiply(mlx_rs::nn::gelu_approximate(self.gate.forward(h)?)?, input)?;
        Ok(add(h, self.norm.forward(&self.projection.forward(&gate)?)?)?)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.gate.arrays();
        out.extend(self.projection.arrays());
        out.push(&self.norm.weight);
        out
    }
}
