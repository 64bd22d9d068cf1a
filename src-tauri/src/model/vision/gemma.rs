//! Gemma 3's and Gemma 4's image processors. Gemma 3 squashes every image to the tower's fixed
//! square (Pillow's bilinear; transformers' `Gemma3ImageProcessorPil`, which mlx-vlm uses), so an
//! image is always the same number of tokens; Gemma 4 keeps the aspect ratio, resizing (Pillow's
//! bicubic) to the largest multiple of its pooled patch within a patch budget, so its token count
//! follows the image. Both cut the result into row-major patches whose values run (row, column,
//! channel), the order the towers' patch projection reads.

use serde_json::Value;

use super::resample::{resize, Filter};
use super::settings::{processor_keys, three, uint};
use super::{DecodedImage, Pixels};

/// Gemma 3's processor settings: `preprocessor_config.json` and the tower's shape from
/// `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3ImageConfig {
    /// The square every image is resized to (the tower's `image_size`).
    pub size: usize,
    pub patch_size: usize,
    /// Language-model tokens per image (`mm_tokens_per_image`).
    pub tokens: usize,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub rescale_factor: f64,
    pub do_normalize: bool,
}

/// Gemma 4's processor settings (`processor_config.json`'s `image_processor`).
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4ImageConfig {
    pub patch_size: usize,
    /// Patches pooled into one token per side (3).
    pub pooling: usize,
    /// The most tokens an image becomes (`max_soft_tokens`: 280 in the published checkpoints).
    pub max_soft_tokens: usize,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Gemma3ImageConfig {
    pub fn from_json(config: &Value, preprocessor: &Value, processor: &Value) -> Result<Self, String> {
        let raw = processor_keys(preprocessor, processor);
        let vision = config.get("vision_config").cloned().unwrap_or(Value::Null);
        let image_size = uint(&vision, "image_size")?.unwrap_or(896);
        let patch_size = uint(&vision, "patch_size")?.unwrap_or(14);
        let tokens = uint(config, "mm_tokens_per_image")?
            .or(uint(config.get("text_config").unwrap_or(&Value::Null), "mm_tokens_per_image")?)
            .unwrap_or(256);
        let size = match raw.get("size") {
            Some(s) => {
                let (h, w) = (uint(s, "height")?, uint(s, "width")?);
                match (h, w) {
                    (Some(h), Some(w)) if h == w => h,
                    (None, None) => image_size,
                    _ => return Err(format!("the processor's size must be a square: {s}")),
                }
            }
            None => image_size,
        };
        if size != image_size {
            return Err(format!("the processor resizes to {size} pixels, the vision tower takes {image_size}"));
        }
        if raw.get("do_pan_and_scan").and_then(Value::as_bool) == Some(true) {
            return Err("pan-and-scan crops are not supported (do_pan_and_scan)".into());
        }
        let side = size / patch_size;
        let per_side = (tokens as f64).sqrt() as usize;
        if !size.is_multiple_of(patch_size) || per_side * per_side != tokens || !side.is_multiple_of(per_side) {
            return Err(format!(
                "{size} pixels in patches of {patch_size} do not pool evenly into {tokens} tokens (mm_tokens_per_image)"
            ));
        }
        let c = Gemma3ImageConfig {
            size,
            patch_size,
            tokens,
            mean: three(&raw, "image_mean")?.unwrap_or([0.5; 3]),
            std: three(&raw, "image_std")?.unwrap_or([0.5; 3]),
            rescale_factor: raw.get("rescale_factor").and_then(Value::as_f64).unwrap_or(1.0 / 255.0),
            do_normalize: raw.get("do_normalize").and_then(Value::as_bool).unwrap_or(true),
        };
        if c.std.contains(&0.0) {
            return Err("image_std must not be zero".into());
        }
        Ok(c)
    }

    /// `image` squashed to the square, rescaled and normalised, in row-major patches.
    pub fn preprocess(&self, image: &DecodedImage) -> Pixels {
        let (width, height, s) = (image.width as usize, image.height as usize, self.size);
        let resized = if (width, height) == (s, s) {
            image.rgb.clone()
        } else {
            resize(&image.rgb, width, height, s, s, Filter::Bilinear)
        };
        let values = rescaled(&resized, self.rescale_factor, self.do_normalize.then_some((self.mean, self.std)));
        patches(&values, s, s, self.patch_size)
    }
}

impl Gemma4ImageConfig {
    pub fn from_json(preprocessor: &Value, processor: &Value) -> Result<Self, String> {
        let raw = processor_keys(preprocessor, processor);
        let c = Gemma4ImageConfig {
            patch_size: uint(&raw, "patch_size")?.unwrap_or(16),
            pooling: uint(&raw, "pooling_kernel_size")?.unwrap_or(3),
            max_soft_tokens: uint(&raw, "max_soft_tokens")?.unwrap_or(280),
            rescale_factor: raw.get("rescale_factor").and_then(Value::as_f64).unwrap_or(1.0 / 255.0),
            do_normalize: raw.get("do_normalize").and_then(Value::as_bool).unwrap_or(false),
            mean: three(&raw, "image_mean")?.unwrap_or([0.0; 3]),
            std: three(&raw, "image_std")?.unwrap_or([1.0; 3]),
        };
        if c.std.contains(&0.0) {
            return Err("image_std must not be zero".into());
        }
        Ok(c)
    }

    /// The size (height, width) an image of `height` x `width` is resized to: the largest
    /// multiples of the pooled patch keeping the aspect within the patch budget, as the reference
    /// computes it (a side rounding to nothing becomes one pooled patch, the other its ratio).
    pub fn target_size(&self, height: usize, width: usize) -> Result<(usize, usize), String> {
        let max_patches = self.max_soft_tokens * self.pooling * self.pooling;
        let side = self.pooling * self.patch_size;
        let (h, w) = (height as f64, width as f64);
        let factor = ((max_patches * self.patch_size * self.patch_size) as f64 / (h * w)).sqrt();
        let mut th = (factor * h / side as f64).floor() as usize * side;
        let mut tw = (factor * w / side as f64).floor() as usize * side;
        let longest = self.max_soft_tokens * side;
        match (th, tw) {
            (0, 0) => return Err(format!("the image is {width} x {height}: too small to resize")),
            (0, _) => {
                th = side;
                tw = ((w / h).floor() as usize * side).min(longest);
            }
            (_, 0) => {
                tw = side;
                th = ((h / w).floor() as usize * side).min(longest);
            }
            _ => {}
        }
        Ok((th, tw))
    }

    /// How many language-model tokens an image of `height` x `width` becomes.
    pub fn image_tokens(&self, height: usize, width: usize) -> Result<usize, String> {
        let (h, w) = self.target_size(height, width)?;
        Ok((h / self.patch_size) * (w / self.patch_size) / (self.pooling * self.pooling))
    }

    /// `image` resized and rescaled to [0, 1] (the tower maps it to [-1, 1] itself), in row-major
    /// patches.
    pub fn preprocess(&self, image: &DecodedImage) -> Result<Pixels, String> {
        let (width, height) = (image.width as usize, image.height as usize);
        let (h, w) = self.target_size(height, width)?;
        let resized = if (h, w) == (height, width) {
            image.rgb.clone()
        } else {
            resize(&image.rgb, width, height, w, h, Filter::Bicubic)
        };
        // As transformers rescales; mlx-vlm's f32 product is one bit off for half the byte values.
        let values = rescaled(&resized, self.rescale_factor, self.do_normalize.then_some((self.mean, self.std)));
        Ok(patches(&values, h, w, self.patch_size))
    }
}

/// 8-bit values as transformers rescales them (in f64, then to f32), then normalised in f32
/// with (mean, std) per channel where given.
fn rescaled(rgb: &[u8], factor: f64, normalize: Option<([f32; 3], [f32; 3])>) -> Vec<f32> {
    rgb.iter()
        .enumerate()
        .map(|(i, &u)| {
            let v = (f64::from(u) * factor) as f32;
            match normalize {
                Some((mean, std)) => (v - mean[i % 3]) / std[i % 3],
                None => v,
            }
        })
        .collect()
}

/// Interleaved RGB values of an `h` x `w` image cut into `p` x `p` patches, row-major, each
/// patch's values in (row, column, channel) order.
fn patches(values: &[f32], h: usize, w: usize, p: usize) -> Pixels {
    let (gh, gw) = (h / p, w / p);
    let row_len = p * p * 3;
    let mut out = Vec::with_capacity(gh * gw * row_len);
    for py in 0..gh {
        for px in 0..gw {
            for y in 0..p {
                let start = ((py * p + y) * w + px * p) * 3;
                out.extend_from_slice(&values[start..start + p * 3]);
            }
        }
    }
    Pixels { values: out, grid: [1, gh, gw], row_len }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gemma4_sizes_keep_the_aspect_within_the_budget() {
        let c =
            Gemma4ImageConfig::from_json(&Value::Null, &json!({"image_processor": {"max_soft_tokens": 280}})).unwrap();
        // A square: 768 x 768, 48 x 48 patches, 256 tokens.
        assert_eq!(c.target_size(1000, 1000).unwrap(), (768, 768));
        assert_eq!(c.image_tokens(1000, 1000).unwrap(), 256);
        assert_eq!(c.image_tokens(768, 1024).unwrap(), 14 * 19);
        // A thin strip: one pooled patch high, its ratio wide (capped).
        assert_eq!(c.target_size(10, 4000).unwrap(), (48, 48 * 280));
        assert_eq!(c.target_size(10, 1000).unwrap().0, 48);
        for (h, w) in [(800, 1280), (1, 1), (3000, 17), (333, 777)] {
            let tokens = c.image_tokens(h, w).unwrap();
            assert!((1..=280).contains(&tokens), "{h} x {w}: {tokens}");
        }
    }

    #[test]
    fn patches_run_row_column_channel() {
        // 4 x 2 pixels, patches of 2: two patches side by side.
        let values: Vec<f32> = (0..4 * 2 * 3).map(|v| v as f32).collect();
        let p = patches(&values, 2, 4, 2);
        assert_eq!((p.grid, p.row_len), ([1, 1, 2], 12));
        // The first patch: pixels (0,0), (0,1), then (1,0), (1,1).
        assert_eq!(&p.values[..12], &[0., 1., 2., 3., 4., 5., 12., 13., 14., 15., 16., 17.]);
        assert_eq!(p.values[12], 6.0);
    }

    #[test]
    fn gemma3_refuses_what_it_cannot_pool_or_crop() {
        let config = json!({"vision_config": {"image_size": 896, "patch_size": 14}, "mm_tokens_per_image": 256});
        let c = Gemma3ImageConfig::from_json(&config, &json!({"size": {"height": 896, "width": 896}}), &Value::Null)
            .unwrap();
        assert_eq!((c.size, c.tokens), (896, 256));
        assert!(Gemma3ImageConfig::from_json(&config, &json!({"do_pan_and_scan": true}), &Value::Null).is_err());
        let odd = json!({"vision_config": {"image_size": 896, "patch_size": 14}, "mm_tokens_per_image": 250});
        assert!(Gemma3ImageConfig::from_json(&odd, &Value::Null, &Value::Null).is_err());
    }
}
