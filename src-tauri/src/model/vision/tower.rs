//! The checkpoint's vision side as the engine holds it: the processor (shared with the HTTP
//! tier) and the family's tower, which encodes a batch of prepared images into the features the
//! language model takes at their tokens.

use std::sync::Arc;

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use super::gemma4_tower::Gemma4Tower;
use super::qwen_tower::QwenVisionTower;
use super::siglip::SiglipTower;
use super::{ImageProcessor, Pixels, VisionFeatures};
use crate::model::error::{ModelError, Result};

/// A family's vision tower.
pub enum Tower {
    Qwen(QwenVisionTower),
    /// Gemma 3's SigLIP and its projector.
    Siglip(SiglipTower),
    /// Gemma 4's tower and its embedder.
    Gemma4(Gemma4Tower),
}

pub struct VisionModel {
    pub processor: Arc<ImageProcessor>,
    pub tower: Tower,
}

/// `images`' patch rows stacked, `[patches, row_len]`.
fn stacked(images: &[&Pixels]) -> Result<Array> {
    let row_len = images[0].row_len;
    if images.iter().any(|p| p.row_len != row_len) {
        return Err(ModelError::Invalid("images with different patch sizes in one batch".into()));
    }
    let rows: Vec<f32> = images.iter().flat_map(|p| p.values.iter().copied()).collect();
    Ok(Array::from_slice(&rows, &[(rows.len() / row_len) as i32, row_len as i32]))
}

impl VisionModel {
    /// The features of `images` (encoded together where the tower batches them), per image.
    pub fn encode(&self, images: &[&Pixels]) -> Result<Vec<VisionFeatures>> {
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let tokens: Vec<i32> = images.iter().map(|p| self.processor.tokens_of(p) as i32).collect();
        let split = |all: &Array, deepstack: &[Array]| -> Result<Vec<VisionFeatures>> {
            let mut at = 0;
            tokens
                .iter()
                .map(|&n| {
                    let range = at..at + n;
                    at += n;
                    Ok(VisionFeatures {
                        merged: all.try_index(range.clone())?,
                        deepstack: deepstack
                            .iter()
                            .map(|d| d.try_index(range.clone()))
                            .collect::<std::result::Result<_, _>>()?,
                    })
                })
                .collect()
        };
        match &self.tower {
            Tower::Qwen(tower) => {
                let grids: Vec<[usize; 3]> = images.iter().map(|p| p.grid).collect();
                let features = tower.forward(&stacked(images)?, &grids)?;
                split(&features.merged, &features.deepstack)
            }
            Tower::Siglip(tower) => {
                if images.iter().any(|p| p.patches() != tower.patches()) {
                    return Err(ModelError::Invalid("an image not of the tower's size".into()));
                }
                split(&tower.forward(&stacked(images)?, images.len())?, &[])
            }
            // Each image its own grid: one at a time.
            Tower::Gemma4(tower) => images
                .iter()
                .map(|p| {
                    let merged = tower.forward(&stacked(&[p])?, [p.grid[1], p.grid[2]])?;
                    Ok(VisionFeatures { merged, deepstack: Vec::new() })
                })
                .collect(),
        }
    }

    /// Bytes a tower call over `images` (patches per image) holds at its peak, with their pixels.
    pub fn encode_bytes(&self, images: &[usize], fused_attention: bool, dtype_bytes: usize) -> usize {
        let patches: usize = images.iter().sum();
        let largest = images.iter().copied().max().unwrap_or(0);
        let peak = match &self.tower {
            Tower::Qwen(tower) => tower.peak_bytes(patches, largest, fused_attention, dtype_bytes),
            Tower::Siglip(tower) => tower.peak_bytes(images.len(), fused_attention, dtype_bytes),
            Tower::Gemma4(tower) => tower.peak_bytes(largest, fused_attention, dtype_bytes),
        };
        peak + patches * self.processor.row_len_bytes()
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match &self.tower {
            Tower::Qwen(t) => t.arrays(),
            Tower::Siglip(t) => t.arrays(),
            Tower::Gemma4(t) => t.arrays(),
        }
    }
}
