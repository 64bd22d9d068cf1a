//! The Qwen3-VL vision tower (also Qwen3.5/3.6's): patches embedded by a linear map (the
//! reference's stride-equal 3D convolution), a learnt position table bilinearly resampled to each
//! image's grid, transformer blocks with 2D rotary positions attending within each image, and
//! mergers that fold each 2 x 2 group of patches into one language-model token (the final one,
//! and the "deepstack" ones taken after chosen blocks, which the language model adds to its
//! first layers' hidden states).

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{add, concatenate, cos, matmul, multiply, sin, split_equal};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use crate::model::error::{ModelError, Result};
use crate::model::layers::{LayerNorm, Linear};
use crate::model::weights::Weights;

pub use super::VisionFeatures;

/// The tower's shape: `config.json`'s `vision_config` (the reference's defaults where it is silent).
#[derive(Debug, Clone, Deserialize)]
pub struct QwenVisionConfig {
    #[serde(default = "defaults::depth")]
    pub depth: usize,
    #[serde(default = "defaults::hidden_size")]
    pub hidden_size: usize,
    #[serde(default = "defaults::intermediate_size")]
    pub intermediate_size: usize,
    #[serde(default = "defaults::out_hidden_size")]
    pub out_hidden_size: usize,
    #[serde(default = "defaults::num_heads")]
    pub num_heads: usize,
    #[serde(default = "defaults::patch_size")]
    pub patch_size: usize,
    #[serde(default = "defaults::temporal_patch_size")]
    pub temporal_patch_size: usize,
    #[serde(default = "defaults::spatial_merge_size")]
    pub spatial_merge_size: usize,
    #[serde(default = "defaults::in_channels")]
    pub in_channels: usize,
    #[serde(default = "defaults::num_position_embeddings")]
    pub num_position_embeddings: usize,
    #[serde(default)]
    pub deepstack_visual_indexes: Vec<usize>,
}

mod defaults {
    pub fn depth() -> usize {
        32
    }
    pub fn hidden_size() -> usize {
        1280
    }
    pub fn intermediate_size() -> usize {
        3420
    }
    pub fn out_hidden_size() -> usize {
        1536
    }
    pub fn num_heads() -> usize {
        16
    }
    pub fn patch_size() -> usize {
        14
    }
    pub fn temporal_patch_size() -> usize {
        2
    }
    pub fn spatial_merge_size() -> usize {
        2
    }
    pub fn in_channels() -> usize {
        3
    }
    pub fn num_position_embeddings() -> usize {
        2304
    }
}

/// LayerNorm's epsilon in the tower and its mergers.
const EPS: f32 = 1e-6;
/// The rotary base of the tower's 2D positions.
const ROPE_THETA: f32 = 10_000.0;

struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// Folds each merge group's patches into one token: LayerNorm before the fold (the final
/// merger) or after it (the deepstack ones), then a GELU MLP to the language model's width.
struct Merger {
    norm: LayerNorm,
    norm_after_fold: bool,
    fc1: Linear,
    fc2: Linear,
}

pub struct QwenVisionTower {
    pub config: QwenVisionConfig,
    /// `[hidden, channels * time * patch * patch]`: the convolution as a matrix, its inputs in
    /// the order the processor flattens a patch (channel, time, row, column).
    patch_weight: Array,
    patch_bias: Array,
    pos_embed: Array,
    blocks: Vec<Block>,
    merger: Merger,
    deepstack: Vec<Merger>,
}

impl QwenVisionTower {
    /// Takes the tower's tensors (named as in the reference, `prefix` before them: `vision_tower.`
    /// in mlx-community's checkpoints) out of `weights`.
    pub fn build(config: QwenVisionConfig, weights: &mut Weights, prefix: &str) -> Result<QwenVisionTower> {
        let c = &config;
        if !c.hidden_size.is_multiple_of(c.num_heads) || !(c.hidden_size / c.num_heads).is_multiple_of(4) {
            return Err(ModelError::Invalid(format!(
                "vision tower: hidden_size {} over {} heads must give a head size divisible by 4",
                c.hidden_size, c.num_heads
            )));
        }
        let side = (c.num_position_embeddings as f64).sqrt() as usize;
        if side * side != c.num_position_embeddings {
            return Err(ModelError::Invalid(format!(
                "vision tower: num_position_embeddings {} is not a square",
                c.num_position_embeddings
            )));
        }
        let (h, i) = (c.hidden_size as i32, c.intermediate_size as i32);
        let (ch, t, p) = (c.in_channels as i32, c.temporal_patch_size as i32, c.patch_size as i32);
        let name = |n: &str| format!("{prefix}{n}");
        let kernel = weights.take(&name("patch_embed.proj.weight"))?;
        // Converted checkpoints keep the kernel channels-last ([out, time, row, col, channel]),
        // Hugging Face's channels-first ([out, channel, time, row, col]).
        let kernel = match kernel.shape() {
            [o, kt, kh, kw, kc] if (*o, *kt, *kh, *kw, *kc) == (h, t, p, p, ch) => kernel.transpose_axes(&[0, 4, 1, 2, 3])?,
            [o, kc, kt, kh, kw] if (*o, *kc, *kt, *kh, *kw) == (h, ch, t, p, p) => kernel,
            other => {
                return Err(ModelError::Invalid(format!(
                    "vision tower: patch_embed.proj.weight is {other:?}, not [{h}, {t}, {p}, {p}, {ch}] or [{h}, {ch}, {t}, {p}, {p}]"
                )))
            }
        };
        let patch_weight = kernel.reshape(&[h, ch * t * p * p])?.as_dtype(weights.dtype)?;
        let patch_bias = weights.take_float(&name("patch_embed.proj.bias"), &[h])?;
        let pos_embed = weights.take_float(&name("pos_embed.weight"), &[c.num_position_embeddings as i32, h])?;
        let blocks = (0..c.depth)
            .map(|l| {
                let b = name(&format!("blocks.{l}"));
                Ok(Block {
                    norm1: weights.layer_norm(&format!("{b}.norm1"), h, EPS, true)?,
                    norm2: weights.layer_norm(&format!("{b}.norm2"), h, EPS, true)?,
                    qkv: weights.linear(&format!("{b}.attn.qkv"), 3 * h, h, true)?,
                    proj: weights.linear(&format!("{b}.attn.proj"), h, h, true)?,
                    fc1: weights.linear(&format!("{b}.mlp.linear_fc1"), i, h, true)?,
                    fc2: weights.linear(&format!("{b}.mlp.linear_fc2"), h, i, true)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let folded = h * (c.spatial_merge_size * c.spatial_merge_size) as i32;
        let out = c.out_hidden_size as i32;
        let mut merger = |m: &str, norm_after_fold: bool| -> Result<Merger> {
            Ok(Merger {
                norm: weights.layer_norm(&format!("{m}.norm"), if norm_after_fold { folded } else { h }, EPS, true)?,
                norm_after_fold,
                fc1: weights.linear(&format!("{m}.linear_fc1"), folded, folded, true)?,
                fc2: weights.linear(&format!("{m}.linear_fc2"), out, folded, true)?,
            })
        };
        let final_merger = merger(&name("merger"), false)?;
        let deepstack = (0..c.deepstack_visual_indexes.len())
            .map(|j| merger(&name(&format!("deepstack_merger_list.{j}")), true))
            .collect::<Result<Vec<_>>>()?;
        Ok(QwenVisionTower { config, patch_weight, patch_bias, pos_embed, blocks, merger: final_merger, deepstack })
    }

    /// The features of images whose patches are `pixels` (`[patches, row_len]`, the images one
    /// after another) on `grids` (time, height, width in patches, per image).
    pub fn forward(&self, pixels: &Array, grids: &[[usize; 3]]) -> Result<VisionFeatures> {
        let c = &self.config;
        let patches: usize = grids.iter().map(|g| g[0] * g[1] * g[2]).sum();
        if pixels.shape().first() != Some(&(patches as i32)) {
            return Err(ModelError::Invalid(format!(
                "vision tower: {:?} pixel rows for grids {grids:?} ({patches} patches)",
                pixels.shape()
            )));
        }
        let pixels = pixels.as_dtype(self.patch_weight.dtype())?;
        let mut x = add(&matmul(&pixels, self.patch_weight.t())?, &self.patch_bias)?;
        x = add(&x, &self.position_embeddings(grids)?)?;
        let (cos_table, sin_table) = self.rotary(grids, x.dtype())?;
        let heads = c.num_heads as i32;
        let head_dim = (c.hidden_size / c.num_heads) as i32;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut deepstack = Vec::new();
        for (l, block) in self.blocks.iter().enumerate() {
            let normed = block.norm1.forward(&x)?;
            let qkv = block.qkv.forward(&normed)?.reshape(&[patches as i32, 3, heads, head_dim])?;
            let rotate = |t: Array| -> Result<Array> {
                // x cos + rotate_half(x) sin, halves not interleaved; then [heads, patches, dim].
                let parts = split_equal(&t, 2, -1)?;
                let rotated = concatenate(&[parts[1].negative()?, parts[0].clone()], -1)?;
                let t = add(&multiply(&t, &cos_table)?, &multiply(&rotated, &sin_table)?)?;
                Ok(t.transpose_axes(&[1, 0, 2])?)
            };
            let split = split_equal(&qkv, 3, 1)?;
            let squeeze = |a: &Array| a.reshape(&[patches as i32, heads, head_dim]);
            let q = rotate(squeeze(&split[0])?)?;
            let k = rotate(squeeze(&split[1])?)?;
            let v = squeeze(&split[2])?.transpose_axes(&[1, 0, 2])?;
            // Each image attends within itself only.
            let mut outputs = Vec::with_capacity(grids.len());
            let mut start = 0i32;
            for g in grids {
                let n = (g[0] * g[1] * g[2]) as i32;
                let take =
                    |a: &Array| -> Result<Array> { Ok(a.try_index((.., start..start + n, ..))?.expand_dims(0)?) };
                let o =
                    mlx_rs::fast::scaled_dot_product_attention(&take(&q)?, &take(&k)?, &take(&v)?, scale, None, None)?;
                outputs.push(o.squeeze_axes(&[0])?);
                start += n;
            }
            let attended = concatenate(&outputs, 1)?.transpose_axes(&[1, 0, 2])?.reshape(&[patches as i32, -1])?;
            x = add(&x, &block.proj.forward(&attended)?)?;
            let mlp =
                block.fc2.forward(&mlx_rs::nn::gelu_approximate(block.fc1.forward(&block.norm2.forward(&x)?)?)?)?;
            x = add(&x, &mlp)?;
            if let Some(j) = c.deepstack_visual_indexes.iter().position(|&d| d == l) {
                deepstack.push(self.deepstack[j].forward(&x, c)?);
            }
        }
        Ok(VisionFeatures { merged: self.merger.forward(&x, c)?, deepstack })
    }

    /// The position table resampled to each image's grid (bilinear, corners aligned), rows in
    /// merge-group order.
    fn position_embeddings(&self, grids: &[[usize; 3]]) -> Result<Array> {
        let side = (self.config.num_position_embeddings as f64).sqrt() as usize;
        let m = self.config.spatial_merge_size;
        let mut indices: [Vec<i32>; 4] = Default::default();
        let mut weights: [Vec<f32>; 4] = Default::default();
        // As MLX's linspace computes them, in f32: start + i * step.
        let linspace = |n: usize| -> Vec<f32> {
            let step = if n > 1 { (side as f32 - 1.0) / (n as f32 - 1.0) } else { 0.0 };
            (0..n).map(|i| i as f32 * step).collect()
        };
        let spaced: Vec<(Vec<f32>, Vec<f32>)> = grids.iter().map(|&[_, h, w]| (linspace(h), linspace(w))).collect();
        for (image, row, col) in merge_order(grids, m) {
            let (y, x) = (spaced[image].0[row], spaced[image].1[col]);
            let (y0, x0) = (y as usize, x as usize);
            let (y1, x1) = ((y0 + 1).min(side - 1), (x0 + 1).min(side - 1));
            let (dy, dx) = (y - y0 as f32, x - x0 as f32);
            let corners = [(y0, x0), (y0, x1), (y1, x0), (y1, x1)];
            let mix = [(1.0 - dy) * (1.0 - dx), (1.0 - dy) * dx, dy * (1.0 - dx), dy * dx];
            for k in 0..4 {
                indices[k].push((corners[k].0 * side + corners[k].1) as i32);
                weights[k].push(mix[k]);
            }
        }
        let n = indices[0].len() as i32;
        let mut total: Option<Array> = None;
        for k in 0..4 {
            let rows = self.pos_embed.try_index(&Array::from_slice(&indices[k], &[n]))?;
            let w = Array::from_slice(&weights[k], &[n, 1]).as_dtype(rows.dtype())?;
            let term = multiply(&rows, &w)?;
            total = Some(match total {
                Some(sum) => add(&sum, &term)?,
                None => term,
            });
        }
        total.ok_or_else(|| ModelError::Invalid("vision tower: no image".into()))
    }

    /// Each patch's rotary cos and sin, `[patches, 1, head_dim]`: its row's angles, then its
    /// column's, the whole repeated once (halves rotated together).
    fn rotary(&self, grids: &[[usize; 3]], dtype: Dtype) -> Result<(Array, Array)> {
        let head_dim = self.config.hidden_size / self.config.num_heads;
        let dim = head_dim / 2;
        let m = self.config.spatial_merge_size;
        let inv_freq: Vec<f32> = (0..dim / 2).map(|j| 1.0 / ROPE_THETA.powf((2 * j) as f32 / dim as f32)).collect();
        let mut angles: Vec<f32> = Vec::new();
        for (_, row, col) in merge_order(grids, m) {
            let one: Vec<f32> =
                inv_freq.iter().map(|f| row as f32 * f).chain(inv_freq.iter().map(|f| col as f32 * f)).collect();
            angles.extend_from_slice(&one);
            angles.extend_from_slice(&one);
        }
        let n = (angles.len() / head_dim) as i32;
        let angles = Array::from_slice(&angles, &[n, 1, head_dim as i32]);
        Ok((cos(&angles)?.as_dtype(dtype)?, sin(&angles)?.as_dtype(dtype)?))
    }

    /// Bytes a tower call over `patches` patches in images of at most `largest` patches holds at
    /// its peak: the activations of a block, and, where attention is not fused (MLX's CPU device),
    /// each head's scores over the largest image.
    pub fn peak_bytes(&self, patches: usize, largest: usize, fused_attention: bool, dtype_bytes: usize) -> usize {
        let c = &self.config;
        let activations = patches * (6 * c.hidden_size + 2 * c.intermediate_size) * dtype_bytes;
        // One block's scores for every head at once, in f32, and a softmax's worth beside them
        // (measured: 352 MB for 4 heads over 4,000 patches, predicted 410 MB).
        let scores = if fused_attention { 0 } else { 3 * c.num_heads * largest * largest * 4 / 2 };
        activations + scores
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = vec![&self.patch_weight, &self.patch_bias, &self.pos_embed];
        for b in &self.blocks {
            all.extend(b.norm1.arrays());
            all.extend(b.norm2.arrays());
            for l in [&b.qkv, &b.proj, &b.fc1, &b.fc2] {
                all.extend(l.arrays());
            }
        }
        for m in std::iter::once(&self.merger).chain(&self.deepstack) {
            all.extend(m.norm.arrays());
            all.extend(m.fc1.arrays());
            all.extend(m.fc2.arrays());
        }
        all
    }
}

/// Each patch's image, row and column, image after image (every frame of it) and, within one, in
/// merge-group order: the order the processor cuts patches in, and so the tower's rows.
fn merge_order(grids: &[[usize; 3]], m: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    grids.iter().enumerate().flat_map(move |(image, &[t, h, w])| {
        let frame = (0..h / m).flat_map(move |bh| {
            (0..w / m)
                .flat_map(move |bw| (0..m).flat_map(move |mh| (0..m).map(move |mw| (image, bh * m + mh, bw * m + mw))))
        });
        let frame: Vec<(usize, usize, usize)> = frame.collect();
        (0..t).flat_map(move |_| frame.clone())
    })
}

impl Merger {
    fn forward(&self, x: &Array, c: &QwenVisionConfig) -> Result<Array> {
        let folded = (c.hidden_size * c.spatial_merge_size * c.spatial_merge_size) as i32;
        let x = if self.norm_after_fold {
            self.norm.forward(&x.reshape(&[-1, folded])?)?
        } else {
            self.norm.forward(x)?.reshape(&[-1, folded])?
        };
        self.fc2.forward(&mlx_rs::nn::gelu(self.fc1.forward(&x)?)?)
    }
}
