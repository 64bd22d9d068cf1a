//! LFM2 (LiquidAI LFM2 350M-2.6B): short-convolution blocks, with grouped-query attention layers
//! (per-head q/k norms, full rotary) at `full_attn_idxs`; a SwiGLU MLP in every layer, tied
//! embeddings. Its own field names are mapped in `wrapped.rs`. mlx-lm's `lfm2.py` is the reference.

use super::{required, HfConfig};
use crate::model::config::{HybridStyle, ModelConfig, RecurrentKind};
use crate::model::error::Result;
use crate::model::weights::Weights;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.qk_norm = true;
    config.tie_word_embeddings = true;
    let types = hf.layer_types.as_ref().ok_or("full_attn_idxs or layer_types is missing")?;
    if types.len() != config.num_layers {
        return Err(format!("{} layer types for {} layers", types.len(), config.num_layers));
    }
    let kernel = required(hf.extra.conv_l_cache, "conv_L_cache")?;
    if kernel < 2 {
        return Err(format!("conv_L_cache {kernel} must be at least 2"));
    }
    config.hybrid = Some(HybridStyle {
        linear_layers: types.iter().map(|t| t != "full_attention").collect(),
        kind: RecurrentKind::ShortConv { channels: config.hidden_size, bias: hf.extra.conv_bias.unwrap_or(false) },
        key_heads: 0,
        value_heads: 0,
        key_dim: 0,
        value_dim: 0,
        conv_kernel: kernel,
        grouped_projections: false,
    });
    Ok(config)
}

/// Checkpoints as Hugging Face publishes them: the convolutions' `[C, 1, K]` become MLX's
/// `[C, K, 1]`.
pub fn sanitize(weights: &mut Weights, config: &ModelConfig) -> Result<()> {
    for l in (0..config.num_layers).filter(|&l| config.is_recurrent(l)) {
        let name = format!("model.layers.{l}.conv.conv.weight");
        if let Some(w) = weights.remove(&name) {
            let raw = w.ndim() == 3 && w.dim(-1) != 1;
            weights.insert(name, if raw { w.swap_axes(1, 2)? } else { w });
        }
    }
    Ok(())
}
