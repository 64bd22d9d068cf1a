//! Gemma 3 (text): five sliding-window layers to one global layer (`sliding_window_pattern`, or
//! `layer_types`), a smaller rotary base in the local layers, RMS norms that scale by
//! `1 + weight`, four norms per block, q/k norms, attention scaled by `query_pre_attn_scalar`,
//! embeddings scaled by sqrt(hidden), GELU (tanh) feed-forward.

use super::HfConfig;
use crate::model::config::{Activation, GemmaStyle, ModelConfig, NormPlacement, QkNorm, RopeConfig};

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let x = &hf.extra;
    if hf.head_dim.is_none() {
        // The reference's default; every published config states it.
        config.head_dim = 256;
        config.rope.dims = 256;
    }
    // Gemma ties its head to the embeddings unless the config says otherwise.
    config.tie_word_embeddings = hf.tie_word_embeddings.unwrap_or(true);
    config.qk_norm = Some(QkNorm::PerHead);
    config.norm_plus_one = true;
    config.norms = NormPlacement::Sandwich;
    config.activation = Activation::GeluTanh;
    config.attention_scale = Some(x.query_pre_attn_scalar.unwrap_or(256.0).powf(-0.5));
    config.sliding_window = Some(hf.sliding_window.unwrap_or(512));
    config.sliding_layers = match super::sliding_layers(hf, config.num_layers)? {
        Some(layers) => layers,
        None => {
            let pattern = x.sliding_window_pattern.unwrap_or(6).max(1);
            (0..config.num_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    config.sliding_rope =
        Some(RopeConfig { theta: x.rope_local_base_freq.unwrap_or(10_000.0), scaling: None, ..config.rope.clone() });
    config.gemma = Some(GemmaStyle { embed_scale: round_to_bf16((config.hidden_size as f32).sqrt()) });
    Ok(config)
}

/// The reference multiplies by sqrt(hidden) held as a bfloat16 (34.0 for 1152, not 33.94).
fn round_to_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(rounded)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_embedding_scale_is_rounded_as_bfloat16() {
        assert_eq!(super::round_to_bf16(1152f32.sqrt()), 34.0);
        assert_eq!(super::round_to_bf16(640f32.sqrt()), 25.25);
        assert_eq!(super::round_to_bf16(2.0), 2.0);
    }
}
