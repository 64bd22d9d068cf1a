//! A Qwen-VL checkpoint's eyes: the processor that turns a prompt's image placeholders and its
//! decoded images into the tokens, positions and pixels the model takes (host work, shared with
//! the HTTP tier, which prepares requests), and the vision tower that encodes the pixels (MLX
//! work, in the engine's thread, as part of prefill).

use std::sync::Arc;

use mlx_rs::Array;
use serde_json::Value;

use super::mrope::mrope_positions;
use super::qwen::{preprocess, QwenImageConfig, QwenPixels};
use super::qwen_tower::{QwenVisionConfig, QwenVisionTower, VisionFeatures};
use super::DecodedImage;
use crate::model::error::{ModelError, Result};

/// The checkpoint families whose vision tower FastMLX runs (outer `model_type`).
pub const FAMILIES_THAT_SEE: [&str; 4] = ["qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"];

/// Where a checkpoint keeps the tower's tensors: mlx-community's layout, Hugging Face's, older ones'.
pub const TOWER_PREFIXES: [&str; 3] = ["vision_tower.", "model.visual.", "visual."];

/// What prepares a prompt with images for the model.
#[derive(Debug, Clone)]
pub struct ImageProcessor {
    pub image: QwenImageConfig,
    /// The placeholder the chat template writes once per image; expanded to the image's tokens.
    pub image_token: u32,
    /// Patches merged into one token per side (2: each 2 x 2 group is a token).
    pub merge: usize,
}

/// One image of a prompt: its pixels and where its tokens are.
#[derive(Debug, Clone)]
pub struct PromptImage {
    /// SHA-256 of the image's bytes: what caches know it by.
    pub hash: [u8; 32],
    pub pixels: QwenPixels,
    /// The prompt index of its first token, and how many it has.
    pub start: usize,
    pub tokens: usize,
}

/// A prompt's images and the positions they give its tokens.
#[derive(Debug, Clone)]
pub struct PromptImages {
    pub images: Vec<PromptImage>,
    /// The (time, row, column) position of each prompt token.
    pub positions: Vec<[i32; 3]>,
    /// What later tokens add to their index: their position is `index + delta` on every axis.
    pub delta: i32,
    /// The prompt with each image's tokens replaced by ones drawn from its hash, above every
    /// vocabulary: what the prefix cache keys on, so that two images never share an entry.
    pub key_ids: Vec<u32>,
}

impl PromptImages {
    /// Token `index`'s positions (past the prompt: generated tokens, the next turn's tail).
    pub fn position(&self, index: usize) -> [i32; 3] {
        match self.positions.get(index) {
            Some(p) => *p,
            None => [index as i32 + self.delta; 3],
        }
    }

    /// The images whose tokens meet `[from, to)`.
    pub fn overlapping(&self, from: usize, to: usize) -> impl Iterator<Item = (usize, &PromptImage)> {
        self.images.iter().enumerate().filter(move |(_, im)| im.start < to && im.start + im.tokens > from)
    }
}

/// Key tokens have the top bit set (no vocabulary comes near 2^31 tokens); token `j` of an image
/// carries 31 bits of its hash's word `j mod 8`, so a run of 8 tokens or more carries 248 of them.
fn key_token(hash: &[u8; 32], j: usize) -> u32 {
    let w = (j % 8) * 4;
    0x8000_0000 | (u32::from_le_bytes([hash[w], hash[w + 1], hash[w + 2], hash[w + 3]]) & 0x7FFF_FFFF)
}

impl ImageProcessor {
    /// From the checkpoint's `config.json` (`image_token_id`, `vision_config`) and processor files.
    pub fn from_json(config: &Value, preprocessor: &Value, processor: &Value) -> std::result::Result<Self, String> {
        let image = QwenImageConfig::from_json(preprocessor, processor)?;
        let image_token = config
            .get("image_token_id")
            .or_else(|| config.get("image_token_index"))
            .and_then(Value::as_u64)
            .ok_or("config.json names no image_token_id")? as u32;
        let merge = config
            .get("vision_config")
            .and_then(|v| v.get("spatial_merge_size"))
            .and_then(Value::as_u64)
            .unwrap_or(image.merge_size as u64) as usize;
        if merge != image.merge_size {
            return Err(format!("the vision tower merges {merge} patches a side, the processor {}", image.merge_size));
        }
        Ok(ImageProcessor { image, image_token, merge })
    }

    /// The prompt `ids` (one placeholder per image) with each placeholder expanded to its image's
    /// tokens, and the images prepared. Errors name what does not fit.
    pub fn prepare(
        &self,
        ids: &[u32],
        images: &[DecodedImage],
    ) -> std::result::Result<(Vec<u32>, PromptImages), String> {
        let placeholders = ids.iter().filter(|&&id| id == self.image_token).count();
        if placeholders != images.len() {
            return Err(format!(
                "the prompt has {placeholders} image placeholders for {} images (the chat template must write one per image)",
                images.len()
            ));
        }
        let mut prepared = Vec::with_capacity(images.len());
        let mut expanded = Vec::with_capacity(ids.len());
        let mut key_ids = Vec::with_capacity(ids.len());
        let mut next = images.iter();
        for &id in ids {
            if id != self.image_token {
                expanded.push(id);
                key_ids.push(id);
                continue;
            }
            let image = next.next().expect("counted");
            let pixels = preprocess(image, &self.image)?;
            let [t, h, w] = pixels.grid;
            let tokens = t * h * w / (self.merge * self.merge);
            let start = expanded.len();
            expanded.extend(std::iter::repeat_n(self.image_token, tokens));
            key_ids.extend((0..tokens).map(|j| key_token(&image.hash, j)));
            prepared.push(PromptImage { hash: image.hash, pixels, start, tokens });
        }
        let grids: Vec<[usize; 3]> = prepared.iter().map(|p| p.pixels.grid).collect();
        let (positions, delta) = mrope_positions(&expanded, self.image_token, &grids, self.merge)?;
        Ok((expanded, PromptImages { images: prepared, positions, delta, key_ids }))
    }
}

/// The checkpoint's vision side, as the engine holds it.
pub struct VisionModel {
    pub processor: Arc<ImageProcessor>,
    pub tower: QwenVisionTower,
}

impl VisionModel {
    /// The features of `images` (encoded together, one tower call), split per image.
    pub fn encode(&self, images: &[&QwenPixels]) -> Result<Vec<VisionFeatures>> {
        let Some(first) = images.first() else { return Ok(Vec::new()) };
        let row_len = first.row_len;
        let mut rows = Vec::with_capacity(images.iter().map(|p| p.values.len()).sum());
        for p in images {
            if p.row_len != row_len {
                return Err(ModelError::Invalid("images with different patch sizes in one batch".into()));
            }
            rows.extend_from_slice(&p.values);
        }
        let pixels = Array::from_slice(&rows, &[(rows.len() / row_len) as i32, row_len as i32]);
        let grids: Vec<[usize; 3]> = images.iter().map(|p| p.grid).collect();
        let features = self.tower.forward(&pixels, &grids)?;
        let merge = self.processor.merge * self.processor.merge;
        let mut bounds = Vec::with_capacity(images.len());
        let mut at = 0i32;
        for g in &grids {
            let tokens = (g[0] * g[1] * g[2] / merge) as i32;
            bounds.push((at, at + tokens));
            at += tokens;
        }
        use mlx_rs::ops::indexing::TryIndexOp;
        let slice = |a: &Array, (from, to): (i32, i32)| a.try_index(from..to);
        bounds
            .into_iter()
            .map(|b| {
                Ok(VisionFeatures {
                    merged: slice(&features.merged, b)?,
                    deepstack: features.deepstack.iter().map(|d| slice(d, b)).collect::<std::result::Result<_, _>>()?,
                })
            })
            .collect()
    }

    /// Bytes a tower call over `patches` patches in images of at most `largest` patches holds at
    /// its peak: the activations of a block, and, where attention is not fused (MLX's CPU device),
    /// each head's scores over the largest image.
    pub fn encode_bytes(&self, patches: usize, largest: usize, fused_attention: bool, dtype_bytes: usize) -> usize {
        let c = &self.tower.config;
        let activations = patches * (6 * c.hidden_size + 2 * c.intermediate_size) * dtype_bytes;
        // One block's scores for every head at once, in f32, and a softmax's worth beside them
        // (measured: 352 MB for 4 heads over 4,000 patches, predicted 410 MB).
        let scores = if fused_attention { 0 } else { 3 * c.num_heads * largest * largest * 4 / 2 };
        activations + scores + patches * self.processor.image.row_len_bytes()
    }

    pub fn arrays(&self) -> Vec<&Array> {
        self.tower.arrays()
    }

    pub fn config(&self) -> &QwenVisionConfig {
        &self.tower.config
    }
}
