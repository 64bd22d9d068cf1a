//! The Qwen-VL image processor (Qwen2-VL through Qwen3.5/3.6): an image resized to multiples of
//! the merged patch within a pixel budget ("smart resize"), by Pillow's bicubic, normalised, and cut
//! into patches in the order the vision tower reads them (each 2 x 2 group of patches that merges
//! into one language-model token kept together).

use serde_json::Value;

use super::resample::resize_bicubic;
use super::settings::{processor_keys, three, uint};
use super::{DecodedImage, Pixels};

/// The processor's settings, from the checkpoint's `preprocessor_config.json` (overridden by
/// `processor_config.json`'s `image_processor`, as the reference reads them).
#[derive(Debug, Clone, PartialEq)]
pub struct QwenImageConfig {
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub rescale_factor: f32,
    pub do_rescale: bool,
    pub do_normalize: bool,
}

impl Default for QwenImageConfig {
    /// The reference processor's defaults (a checkpoint's files override them).
    fn default() -> Self {
        QwenImageConfig {
            patch_size: 16,
            temporal_patch_size: 2,
            merge_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 14 * 14 * 4 * 1280,
            mean: [0.5; 3],
            std: [0.5; 3],
            rescale_factor: (1.0f64 / 255.0) as f32,
            do_rescale: true,
            do_normalize: true,
        }
    }
}

impl QwenImageConfig {
    /// From `preprocessor_config.json` and `processor_config.json` (either may be absent: `Null`).
    pub fn from_json(preprocessor: &Value, processor: &Value) -> Result<QwenImageConfig, String> {
        let raw = processor_keys(preprocessor, processor);
        let mut c = QwenImageConfig::default();
        let uint = |key: &str| uint(&raw, key);
        let three = |key: &str| three(&raw, key);
        if let Some(n) = uint("patch_size")? {
            c.patch_size = n;
        }
        if let Some(n) = uint("temporal_patch_size")? {
            c.temporal_patch_size = n;
        }
        if let Some(n) = uint("merge_size")? {
            c.merge_size = n;
        }
        let size = raw.get("size").cloned().unwrap_or(Value::Null);
        if let Some(n) = size.get("shortest_edge").and_then(Value::as_u64) {
            c.min_pixels = n;
        }
        if let Some(n) = size.get("longest_edge").and_then(Value::as_u64) {
            c.max_pixels = n;
        }
        if let Some(n) = uint("min_pixels")? {
            c.min_pixels = n as u64;
        }
        if let Some(n) = uint("max_pixels")? {
            c.max_pixels = n as u64;
        }
        if let Some(v) = three("image_mean")? {
            c.mean = v;
        }
        if let Some(v) = three("image_std")? {
            c.std = v;
        }
        if let Some(f) = raw.get("rescale_factor").and_then(Value::as_f64) {
            c.rescale_factor = f as f32;
        }
        if let Some(b) = raw.get("do_rescale").and_then(Value::as_bool) {
            c.do_rescale = b;
        }
        if let Some(b) = raw.get("do_normalize").and_then(Value::as_bool) {
            c.do_normalize = b;
        }
        if c.min_pixels > c.max_pixels {
            return Err(format!("min_pixels {} is above max_pixels {}", c.min_pixels, c.max_pixels));
        }
        if c.std.contains(&0.0) {
            return Err("image_std must not be zero".into());
        }
        Ok(c)
    }

    /// Bytes of one patch's pixel values (f32).
    pub fn row_len_bytes(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size * 4
    }

    /// The side every resized dimension is a multiple of: a merged group of patches.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// The size an image of `height` x `width` is resized to: each side rounded to the factor,
    /// then scaled into [min_pixels, max_pixels] keeping the aspect. Python's arithmetic, to the
    /// pixel: `round` halves to even.
    pub fn smart_resize(&self, height: usize, width: usize) -> Result<(usize, usize), String> {
        let (h, w, f) = (height as f64, width as f64, self.factor() as f64);
        if h.max(w) / h.min(w) > 200.0 {
            return Err(format!("the image is {width} x {height}: its aspect ratio must be below 200"));
        }
        let mut h_bar = (h / f).round_ties_even() * f;
        let mut w_bar = (w / f).round_ties_even() * f;
        let (min, max) = (self.min_pixels as f64, self.max_pixels as f64);
        if h_bar * w_bar > max {
            let beta = (h * w / max).sqrt();
            h_bar = f.max((h / beta / f).floor() * f);
            w_bar = f.max((w / beta / f).floor() * f);
        } else if h_bar * w_bar < min {
            let beta = (min / (h * w)).sqrt();
            h_bar = (h * beta / f).ceil() * f;
            w_bar = (w * beta / f).ceil() * f;
        }
        Ok((h_bar as usize, w_bar as usize))
    }

    /// How many language-model tokens an image of `height` x `width` becomes.
    pub fn image_tokens(&self, height: usize, width: usize) -> Result<usize, String> {
        let (h, w) = self.smart_resize(height, width)?;
        Ok((h / self.patch_size) * (w / self.patch_size) / (self.merge_size * self.merge_size))
    }
}

/// `image` resized, normalised and cut into patches as the reference processor does.
pub fn preprocess(image: &DecodedImage, config: &QwenImageConfig) -> Result<Pixels, String> {
    let (width, height) = (image.width as usize, image.height as usize);
    let (h, w) = config.smart_resize(height, width)?;
    let resized =
        if (h, w) == (height, width) { image.rgb.clone() } else { resize_bicubic(&image.rgb, width, height, w, h) };
    // Channel-planar floats, each step in f32 as the reference's numpy does.
    let mut planes = vec![0f32; 3 * h * w];
    for (i, px) in resized.chunks_exact(3).enumerate() {
        for c in 0..3 {
            let mut v = f32::from(px[c]);
            if config.do_rescale {
                v *= config.rescale_factor;
            }
            if config.do_normalize {
                v = (v - config.mean[c]) / config.std[c];
            }
            planes[c * h * w + i] = v;
        }
    }
    let (ps, ms, tps) = (config.patch_size, config.merge_size, config.temporal_patch_size);
    let (gh, gw) = (h / ps, w / ps);
    let row_len = 3 * tps * ps * ps;
    let mut values = Vec::with_capacity(gh * gw * row_len);
    // Rows: merge groups across then down, and within a group its patches across then down.
    for bh in 0..gh / ms {
        for bw in 0..gw / ms {
            for mh in 0..ms {
                for mw in 0..ms {
                    let (top, left) = ((bh * ms + mh) * ps, (bw * ms + mw) * ps);
                    // Columns: channel, then the frame (an image is its own frame repeated), then pixels.
                    for c in 0..3 {
                        for _ in 0..tps {
                            for y in 0..ps {
                                let start = c * h * w + (top + y) * w + left;
                                values.extend_from_slice(&planes[start..start + ps]);
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(Pixels { values, grid: [1, gh, gw], row_len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn smart_resize_follows_pythons_rounding_and_the_budget() {
        let c = QwenImageConfig { max_pixels: 16_777_216, min_pixels: 65_536, ..Default::default() };
        // A screenshot keeps its size (multiples of 32 already); 48 rounds to 64 (1.5 halves to even: 2).
        assert_eq!(c.smart_resize(800, 1280).unwrap(), (800, 1280));
        assert_eq!(c.smart_resize(80, 48).unwrap().0 % 32, 0);
        assert_eq!(
            QwenImageConfig::default().smart_resize(80, 80).unwrap(),
            (64, 64),
            "2.5 halves to even: 2 patches of 32"
        );
        // Over the budget: scaled down keeping the aspect, each side a multiple of 32.
        let d = QwenImageConfig::default();
        assert_eq!(d.smart_resize(800, 1280).unwrap(), (768, 1248));
        assert!(d.smart_resize(10, 2_100).is_err(), "aspect ratio past 200");
        assert_eq!(d.image_tokens(800, 1280).unwrap(), 768 / 16 * 1248 / 16 / 4);
    }

    #[test]
    fn the_checkpoint_files_set_the_processor_as_the_reference_reads_them() {
        let pre = json!({"patch_size": 14, "merge_size": 2, "size": {"shortest_edge": 3136, "longest_edge": 12845056},
                         "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]});
        let c = QwenImageConfig::from_json(&pre, &Value::Null).unwrap();
        assert_eq!((c.patch_size, c.min_pixels, c.max_pixels), (14, 3136, 12_845_056));
        assert_eq!(c.mean[0], 0.481_454_66);
        let over = json!({"image_processor": {"max_pixels": 1_000_000}});
        assert_eq!(QwenImageConfig::from_json(&pre, &over).unwrap().max_pixels, 1_000_000);
        assert!(QwenImageConfig::from_json(&json!({"patch_size": -1}), &Value::Null).is_err());
        assert!(QwenImageConfig::from_json(&json!({"image_std": [0, 1, 1]}), &Value::Null).is_err());
    }

    #[test]
    fn patches_come_in_merge_group_order() {
        // 64 x 32 pixels, patch 16, merge 2: a grid of 2 x 4 patches, two merge groups.
        let c = QwenImageConfig { do_normalize: false, do_rescale: false, min_pixels: 1, ..Default::default() };
        let rgb: Vec<u8> = (0..32 * 64).flat_map(|i| [(i % 64) as u8, (i / 64) as u8, 0]).collect();
        let image =
            DecodedImage { width: 64, height: 32, rgb, media_type: super::super::MediaType::Png, hash: [0; 32] };
        let p = preprocess(&image, &c).unwrap();
        assert_eq!((p.grid, p.row_len), ([1, 2, 4], 3 * 2 * 16 * 16));
        assert_eq!(p.values.len(), 8 * p.row_len);
        // Row 1: the first group's patch across (column 16); row 2: the one below (row 16).
        let first_pixel = |row: usize, channel: usize| p.values[row * p.row_len + channel * 2 * 256];
        assert_eq!((first_pixel(1, 0), first_pixel(1, 1)), (16.0, 0.0));
        assert_eq!((first_pixel(2, 0), first_pixel(2, 1)), (0.0, 16.0));
        // Row 4 starts the second group, at column 32.
        assert_eq!(first_pixel(4, 0), 32.0);
        // The frame repeated: the second copy equals the first.
        assert_eq!(p.values[256..512], p.values[0..256]);
    }
}
