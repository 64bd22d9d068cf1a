//! Images in, for the families that see: decoding what a request carries (with limits, since an
//! image is untrusted input), each family's preprocessing into the pixel values its vision tower
//! takes (equal to the reference processor's), and the towers.

pub mod gemma;
pub mod gemma4_tower;
pub mod image;
pub mod mrope;
pub mod processor;
pub mod qwen;
pub mod qwen_tower;
pub mod resample;
mod settings;
pub mod siglip;
pub mod tower;

use mlx_rs::Array;

pub use image::{decode, inspect, DecodedImage, ImageError, ImageHeader, MediaType, MAX_PIXELS};
pub use processor::{Family, ImageAttention, ImageProcessor, PromptImage, PromptImages};
pub use tower::{Tower, VisionModel};

/// An image as a vision tower takes it: cut into patches, one row of pixel values per patch.
#[derive(Debug, Clone, PartialEq)]
pub struct Pixels {
    /// `grid[0] * grid[1] * grid[2]` rows of `row_len` values, in the order the family's tower
    /// reads them (Qwen: channel, time, row, column, in merge-group order; Gemma: row, column,
    /// channel, patches row-major).
    pub values: Vec<f32>,
    /// (time, height, width) in patches.
    pub grid: [usize; 3],
    pub row_len: usize,
}

impl Pixels {
    pub fn patches(&self) -> usize {
        self.grid.iter().product()
    }
}

/// What a tower makes of a batch of images: one row per language-model token, in the order of
/// the images; and, for Qwen3-VL, the "deepstack" features the language model adds to its first
/// layers' hidden states, row for row.
#[derive(Clone)]
pub struct VisionFeatures {
    pub merged: Array,
    pub deepstack: Vec<Array>,
}
