//! What prepares a prompt with images for the model, per family: the template's placeholders
//! expanded to each image's tokens (Qwen, Gemma 4: at the token level; Gemma 3: in the rendered
//! text, as its reference does, since the newlines it adds merge with the template's), the
//! images preprocessed, and, for Qwen, every token's M-RoPE positions. Host work, shared with the
//! HTTP tier, which prepares requests; the towers run in the engine (`tower.rs`).

use serde_json::Value;

use super::gemma::{Gemma3ImageConfig, Gemma4ImageConfig};
use super::mrope::mrope_positions;
use super::qwen::{preprocess, QwenImageConfig};
use super::{DecodedImage, Pixels};

/// The checkpoint families whose vision tower FastMLX runs (outer `model_type`).
pub const FAMILIES_THAT_SEE: [&str; 6] = ["qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "gemma3", "gemma4"];

/// Where a checkpoint keeps the tower's tensors, each layout with a tensor it always has:
/// mlx-community's, Hugging Face's, older ones'.
pub const TOWER_PREFIXES: [(&str, &str); 7] = [
    ("vision_tower.", "patch_embed.proj.weight"),
    ("model.visual.", "patch_embed.proj.weight"),
    ("visual.", "patch_embed.proj.weight"),
    ("vision_tower.vision_model.", "embeddings.patch_embedding.weight"),
    ("model.vision_tower.vision_model.", "embeddings.patch_embedding.weight"),
    ("vision_tower.", "patch_embedder.input_proj.weight"),
    ("model.vision_tower.", "patch_embedder.input_proj.weight"),
];

/// Gemma 3's image markers as its processor writes them.
const GEMMA3_BOI: &str = "<start_of_image>";
const GEMMA3_SOFT: &str = "<image_soft_token>";
const GEMMA3_EOI: &str = "<end_of_image>";

/// Which attention layers let one image's tokens see each other (all of them, the later ones
/// included), beside the causal mask: the model's own reference (transformers) decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImageAttention {
    pub full: bool,
    pub sliding: bool,
}

impl ImageAttention {
    /// Whether a prefill chunk must hold each image whole (its tokens' keys depend on later ones).
    pub fn whole_images(self) -> bool {
        self.full || self.sliding
    }
}

/// A family's preprocessing.
#[derive(Debug, Clone)]
pub enum Family {
    /// Qwen3-VL, Qwen3.5/3.6: `merge` x `merge` patches per token, M-RoPE positions.
    Qwen { image: QwenImageConfig, merge: usize },
    /// Gemma 3: a fixed number of tokens, expanded in the text.
    Gemma3 { image: Gemma3ImageConfig },
    /// Gemma 4: each placeholder becomes `boi`, the image's tokens, `eoi`.
    Gemma4 { image: Gemma4ImageConfig, boi: u32, eoi: u32 },
}

/// What prepares a prompt with images for the model.
#[derive(Debug, Clone)]
pub struct ImageProcessor {
    pub family: Family,
    /// The token each of an image's tokens is in the prompt (Qwen, Gemma 4: also the
    /// placeholder the template writes once per image).
    pub image_token: u32,
    pub attention: ImageAttention,
}

/// One image of a prompt: its pixels and where its tokens are.
#[derive(Debug, Clone)]
pub struct PromptImage {
    /// SHA-256 of the image's bytes: what caches know it by.
    pub hash: [u8; 32],
    pub pixels: Pixels,
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

fn id(config: &Value, keys: &[&str]) -> Option<u32> {
    keys.iter().find_map(|k| config.get(*k).and_then(Value::as_u64)).map(|v| v as u32)
}

impl ImageProcessor {
    /// From the checkpoint's `config.json` (outer `model_type`, token ids, `vision_config`) and
    /// processor files.
    pub fn from_json(config: &Value, preprocessor: &Value, processor: &Value) -> std::result::Result<Self, String> {
        let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or_default();
        let image_token = id(config, &["image_token_id", "image_token_index"]);
        match model_type {
            "gemma3" => {
                let image = Gemma3ImageConfig::from_json(config, preprocessor, processor)?;
                Ok(ImageProcessor {
                    family: Family::Gemma3 { image },
                    image_token: image_token.unwrap_or(262_144),
                    // transformers: bidirectional within an image on every layer.
                    attention: ImageAttention { full: true, sliding: true },
                })
            }
            "gemma4" => {
                let image = Gemma4ImageConfig::from_json(preprocessor, processor)?;
                let boi =
                    id(config, &["boi_token_id", "boi_token_index"]).ok_or("config.json names no boi_token_id")?;
                let eoi =
                    id(config, &["eoi_token_id", "eoi_token_index"]).ok_or("config.json names no eoi_token_id")?;
                let text = config.get("text_config").unwrap_or(config);
                let vision = text.get("use_bidirectional_attention").and_then(Value::as_str) == Some("vision");
                Ok(ImageProcessor {
                    family: Family::Gemma4 { image, boi, eoi },
                    image_token: image_token.ok_or("config.json names no image_token_id")?,
                    // transformers: on the sliding layers only (mlx-vlm 0.7.6 also on the full ones).
                    attention: ImageAttention { full: false, sliding: vision },
                })
            }
            _ => {
                let image = QwenImageConfig::from_json(preprocessor, processor)?;
                let merge = config
                    .get("vision_config")
                    .and_then(|v| v.get("spatial_merge_size"))
                    .and_then(Value::as_u64)
                    .unwrap_or(image.merge_size as u64) as usize;
                if merge != image.merge_size {
                    return Err(format!(
                        "the vision tower merges {merge} patches a side, the processor {}",
                        image.merge_size
                    ));
                }
                Ok(ImageProcessor {
                    family: Family::Qwen { image, merge },
                    image_token: image_token.ok_or("config.json names no image_token_id")?,
                    attention: ImageAttention::default(),
                })
            }
        }
    }

    /// How many prompt tokens an image of `height` x `width` becomes (before any pixel is decoded).
    pub fn image_tokens(&self, height: usize, width: usize) -> std::result::Result<usize, String> {
        match &self.family {
            Family::Qwen { image, .. } => image.image_tokens(height, width),
            // The markers and newlines around the image's tokens.
            Family::Gemma3 { image } => Ok(image.tokens + 4),
            Family::Gemma4 { image, .. } => Ok(image.image_tokens(height, width)? + 2),
        }
    }

    /// How many tokens an image with `pixels` has in the prompt.
    pub fn tokens_of(&self, pixels: &Pixels) -> usize {
        match &self.family {
            Family::Qwen { merge, .. } => pixels.patches() / (merge * merge),
            Family::Gemma3 { image } => image.tokens,
            Family::Gemma4 { image, .. } => pixels.patches() / (image.pooling * image.pooling),
        }
    }

    /// Bytes of one patch's pixel values.
    pub fn row_len_bytes(&self) -> usize {
        match &self.family {
            Family::Qwen { image, .. } => image.row_len_bytes(),
            Family::Gemma3 { image } => image.patch_size * image.patch_size * 3 * 4,
            Family::Gemma4 { image, .. } => image.patch_size * image.patch_size * 3 * 4,
        }
    }

    /// Whether prompts carry M-RoPE positions.
    pub fn has_positions(&self) -> bool {
        matches!(self.family, Family::Qwen { .. })
    }

    /// The rendered prompt with each image placeholder expanded, where the family expands them
    /// in text (Gemma 3: `\n\n<start_of_image>`, its soft tokens, `<end_of_image>\n\n`, as its
    /// processor does before tokenizing); `None` where it expands tokens instead.
    pub fn expand_text(&self, text: &str) -> Option<String> {
        let Family::Gemma3 { image } = &self.family else { return None };
        let full = format!("\n\n{GEMMA3_BOI}{}{GEMMA3_EOI}\n\n", GEMMA3_SOFT.repeat(image.tokens));
        Some(text.replace(GEMMA3_BOI, &full))
    }

    /// The prompt `ids` (one placeholder per image, or for Gemma 3 the text-expanded prompt) with
    /// each image's tokens in place, and the images prepared. Errors name what does not fit.
    pub fn prepare(
        &self,
        ids: &[u32],
        images: &[DecodedImage],
    ) -> std::result::Result<(Vec<u32>, PromptImages), String> {
        if let Family::Gemma3 { image } = &self.family {
            return self.prepare_expanded(ids, images, image);
        }
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
            let pixels = match &self.family {
                Family::Qwen { image: config, .. } => preprocess(image, config)?,
                Family::Gemma4 { image: config, .. } => config.preprocess(image)?,
                Family::Gemma3 { .. } => unreachable!("expanded in text"),
            };
            let tokens = self.tokens_of(&pixels);
            let marker = |ids: &mut Vec<u32>, keys: &mut Vec<u32>, token: Option<u32>| {
                if let Some(t) = token {
                    ids.push(t);
                    keys.push(t);
                }
            };
            let (boi, eoi) = match &self.family {
                Family::Gemma4 { boi, eoi, .. } => (Some(*boi), Some(*eoi)),
                _ => (None, None),
            };
            marker(&mut expanded, &mut key_ids, boi);
            let start = expanded.len();
            expanded.extend(std::iter::repeat_n(self.image_token, tokens));
            key_ids.extend((0..tokens).map(|j| key_token(&image.hash, j)));
            marker(&mut expanded, &mut key_ids, eoi);
            prepared.push(PromptImage { hash: image.hash, pixels, start, tokens });
        }
        let (positions, delta) = match &self.family {
            Family::Qwen { merge, .. } => {
                let grids: Vec<[usize; 3]> = prepared.iter().map(|p| p.pixels.grid).collect();
                mrope_positions(&expanded, self.image_token, &grids, *merge)?
            }
            _ => (Vec::new(), 0),
        };
        Ok((expanded, PromptImages { images: prepared, positions, delta, key_ids }))
    }

    /// Gemma 3: each run of soft tokens in the already expanded prompt is one image's.
    fn prepare_expanded(
        &self,
        ids: &[u32],
        images: &[DecodedImage],
        config: &Gemma3ImageConfig,
    ) -> std::result::Result<(Vec<u32>, PromptImages), String> {
        let mut runs = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            if ids[i] != self.image_token {
                i += 1;
                continue;
            }
            let start = i;
            while i < ids.len() && ids[i] == self.image_token {
                i += 1;
            }
            runs.push((start, i - start));
        }
        if runs.len() != images.len() || runs.iter().any(|&(_, n)| n != config.tokens) {
            return Err(format!(
                "the prompt has {} images' tokens for {} images (the chat template must write {GEMMA3_BOI} once per image)",
                runs.len(),
                images.len()
            ));
        }
        let mut key_ids = ids.to_vec();
        let mut prepared = Vec::with_capacity(images.len());
        for (&(start, tokens), image) in runs.iter().zip(images) {
            for j in 0..tokens {
                key_ids[start + j] = key_token(&image.hash, j);
            }
            prepared.push(PromptImage { hash: image.hash, pixels: config.preprocess(image), start, tokens });
        }
        Ok((ids.to_vec(), PromptImages { images: prepared, positions: Vec::new(), delta: 0, key_ids }))
    }
}
