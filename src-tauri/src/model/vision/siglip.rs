//! Gemma 3's eyes: a SigLIP vision tower (a fixed-size image in patches, a learnt position per
//! patch, pre-norm transformer blocks attending across the whole image, a final LayerNorm) and
//! the projector that average-pools the patch grid to the image's tokens, RMS-normalises them
//! (Gemma's `1 + weight`) and maps them to the language model's width.

use mlx_rs::ops::{add, matmul};
use mlx_rs::Array;
use serde::Deserialize;

use crate::model::error::{ModelError, Result};
use crate::model::layers::{LayerNorm, Linear, RmsNorm};
use crate::model::weights::Weights;

/// The tower's shape: `config.json`'s `vision_config` (SigLIP-So400m's where it is silent).
#[derive(Debug, Clone, Deserialize)]
pub struct SiglipConfig {
    #[serde(default = "defaults::hidden_size")]
    pub hidden_size: usize,
    #[serde(default = "defaults::intermediate_size")]
    pub intermediate_size: usize,
    #[serde(default = "defaults::num_attention_heads")]
    pub num_attention_heads: usize,
    #[serde(default = "defaults::num_hidden_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "defaults::image_size")]
    pub image_size: usize,
    #[serde(default = "defaults::patch_size")]
    pub patch_size: usize,
    /// transformers applies it to every LayerNorm, the last one included (mlx-vlm 0.7.6 leaves
    /// the last at MLX's 1e-5: a departure FastMLX does not follow).
    #[serde(default = "defaults::layer_norm_eps")]
    pub layer_norm_eps: f32,
}

mod defaults {
    pub fn hidden_size() -> usize {
        1152
    }
    pub fn intermediate_size() -> usize {
        4304
    }
    pub fn num_attention_heads() -> usize {
        16
    }
    pub fn num_hidden_layers() -> usize {
        27
    }
    pub fn image_size() -> usize {
        896
    }
    pub fn patch_size() -> usize {
        14
    }
    pub fn layer_norm_eps() -> f32 {
        1e-6
    }
}

struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    fc1: Linear,
    fc2: Linear,
}

pub struct SiglipTower {
    pub config: SiglipConfig,
    /// `[hidden, patch * patch * 3]`: the stride-equal convolution as a matrix, its inputs in the
    /// order the processor flattens a patch (row, column, channel).
    patch_weight: Array,
    patch_bias: Array,
    positions: Array,
    blocks: Vec<Block>,
    post_norm: LayerNorm,
    /// The projector: `1 + weight` folded in at load.
    soft_norm: RmsNorm,
    /// `[hidden, text hidden]` (a raw matrix, inputs first, never quantized).
    projection: Array,
    /// Language-model tokens per image side.
    tokens_per_side: usize,
}

impl SiglipTower {
    /// Takes the tower's tensors (under `tower`, e.g. `vision_tower.vision_model.`) and the
    /// projector's (under `projector`) out of `weights`.
    pub fn build(
        config: SiglipConfig,
        tokens: usize,
        text_hidden: usize,
        weights: &mut Weights,
        tower: &str,
        projector: &str,
    ) -> Result<SiglipTower> {
        let c = &config;
        let invalid = |m: String| ModelError::Invalid(format!("vision tower: {m}"));
        if !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(invalid(format!("hidden_size {} over {} heads", c.hidden_size, c.num_attention_heads)));
        }
        let side = c.image_size / c.patch_size;
        let tokens_per_side = (tokens as f64).sqrt() as usize;
        if tokens_per_side == 0 || tokens_per_side * tokens_per_side != tokens || !side.is_multiple_of(tokens_per_side)
        {
            return Err(invalid(format!("{side} x {side} patches do not pool into {tokens} tokens")));
        }
        let (h, i, p) = (c.hidden_size as i32, c.intermediate_size as i32, c.patch_size as i32);
        let name = |n: &str| format!("{tower}{n}");
        let kernel = weights.take(&name("embeddings.patch_embedding.weight"))?;
        // Converted checkpoints keep the kernel channels-last ([out, row, col, channel]), Hugging
        // Face's channels-first ([out, channel, row, col]).
        let kernel = match kernel.shape() {
            [o, kh, kw, 3] if (*o, *kh, *kw) == (h, p, p) => kernel,
            [o, 3, kh, kw] if (*o, *kh, *kw) == (h, p, p) => kernel.transpose_axes(&[0, 2, 3, 1])?,
            other => {
                return Err(invalid(format!(
                    "patch_embedding.weight is {other:?}, not [{h}, {p}, {p}, 3] or [{h}, 3, {p}, {p}]"
                )))
            }
        };
        let patch_weight = kernel.reshape(&[h, p * p * 3])?.as_dtype(weights.dtype)?;
        let patch_bias = weights.take_float(&name("embeddings.patch_embedding.bias"), &[h])?;
        let positions =
            weights.take_float(&name("embeddings.position_embedding.weight"), &[(side * side) as i32, h])?;
        let eps = c.layer_norm_eps;
        let blocks = (0..c.num_hidden_layers)
            .map(|l| {
                let b = name(&format!("encoder.layers.{l}"));
                Ok(Block {
                    norm1: weights.layer_norm(&format!("{b}.layer_norm1"), h, eps, true)?,
                    norm2: weights.layer_norm(&format!("{b}.layer_norm2"), h, eps, true)?,
                    q: weights.linear(&format!("{b}.self_attn.q_proj"), h, h, true)?,
                    k: weights.linear(&format!("{b}.self_attn.k_proj"), h, h, true)?,
                    v: weights.linear(&format!("{b}.self_attn.v_proj"), h, h, true)?,
                    out: weights.linear(&format!("{b}.self_attn.out_proj"), h, h, true)?,
                    fc1: weights.linear(&format!("{b}.mlp.fc1"), i, h, true)?,
                    fc2: weights.linear(&format!("{b}.mlp.fc2"), h, i, true)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let post_norm = weights.layer_norm(&name("post_layernorm"), h, eps, true)?;
        let norm = weights.take_float(&format!("{projector}mm_soft_emb_norm.weight"), &[h])?;
        let soft_norm = RmsNorm { weight: add(&norm, &Array::from_f32(1.0).as_dtype(norm.dtype())?)?, eps };
        let projection =
            weights.take_float(&format!("{projector}mm_input_projection_weight"), &[h, text_hidden as i32])?;
        Ok(SiglipTower {
            config,
            patch_weight,
            patch_bias,
            positions,
            blocks,
            post_norm,
            soft_norm,
            projection,
            tokens_per_side,
        })
    }

    /// Patches per image.
    pub fn patches(&self) -> usize {
        let side = self.config.image_size / self.config.patch_size;
        side * side
    }

    /// The language-model features of `n` images whose patches are `pixels` (`[n * patches,
    /// row_len]`, image after image): `[n * tokens, text hidden]`.
    pub fn forward(&self, pixels: &Array, n: usize) -> Result<Array> {
        let c = &self.config;
        let p = self.patches() as i32;
        let (n, h) = (n as i32, c.hidden_size as i32);
        if pixels.shape().first() != Some(&(n * p)) {
            return Err(ModelError::Invalid(format!("vision tower: {:?} pixel rows for {n} images", pixels.shape())));
        }
        let pixels = pixels.as_dtype(self.patch_weight.dtype())?;
        let x = add(&matmul(&pixels, self.patch_weight.t())?, &self.patch_bias)?.reshape(&[n, p, h])?;
        let mut x = add(&x, &self.positions)?;
        let heads = c.num_attention_heads as i32;
        let head_dim = h / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        for block in &self.blocks {
            let normed = block.norm1.forward(&x)?;
            let split = |l: &Linear| -> Result<Array> {
                Ok(l.forward(&normed)?.reshape(&[n, p, heads, head_dim])?.transpose_axes(&[0, 2, 1, 3])?)
            };
            // Every patch sees every patch of its own image.
            let o = mlx_rs::fast::scaled_dot_product_attention(
                &split(&block.q)?,
                &split(&block.k)?,
                &split(&block.v)?,
                scale,
                None,
                None,
            )?;
            let o = o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[n, p, h])?;
            x = add(&x, &block.out.forward(&o)?)?;
            let mlp =
                block.fc2.forward(&mlx_rs::nn::gelu_approximate(block.fc1.forward(&block.norm2.forward(&x)?)?)?)?;
            x = add(&x, &mlp)?;
        }
        let x = self.post_norm.forward(&x)?;
        // The patch grid average-pooled to the tokens' grid, row-major.
        let side = (c.image_size / c.patch_size) as i32;
        let t = self.tokens_per_side as i32;
        let k = side / t;
        let pooled = x.reshape(&[n, t, k, t, k, h])?.mean_axes(&[2, 4], None)?.reshape(&[n * t * t, h])?;
        let normed = self.soft_norm.forward(&pooled)?;
        Ok(matmul(&normed, &self.projection)?)
    }

    /// Bytes a tower call over `images` images holds at its peak: a block's activations, and,
    /// where attention is not fused, every image's scores at once (they attend in one batch).
    pub fn peak_bytes(&self, images: usize, fused_attention: bool, dtype_bytes: usize) -> usize {
        let c = &self.config;
        let patches = images * self.patches();
        let activations = patches * (6 * c.hidden_size + 2 * c.intermediate_size) * dtype_bytes;
        let scores = if fused_attention { 0 } else { 3 * c.num_attention_heads * patches * self.patches() * 4 / 2 };
        activations + scores
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = vec![&self.patch_weight, &self.patch_bias, &self.positions, &self.projection];
        all.push(&self.soft_norm.weight);
        all.extend(self.post_norm.arrays());
        for b in &self.blocks {
            all.extend(b.norm1.arrays());
            all.extend(b.norm2.arrays());
            for l in [&b.q, &b.k, &b.v, &b.out, &b.fc1, &b.fc2] {
                all.extend(l.arrays());
            }
        }
        all
    }
}
