//! LFM2 (LiquidAI LFM2 350M-2.6B): short-convolution blocks, with grouped-query attention layers
//! (per-head q/k norms, full rotary) at `full_attn_idxs`; a SwiGLU MLP in every layer, tied
//! embeddings. LFM2-MoE (`lfm2_moe`, LFM2-8B-A1B) is the same with experts after its first
//! `num_dense_layers` layers, chosen by sigmoid scores (plus a learned bias). Its own field
//! names are mapped in `wrapped.rs`. mlx-lm's `lfm2.py` and `lfm2_moe.py` are the reference.

use super::{required, HfConfig};
use crate::model::config::{HybridStyle, ModelConfig, MoeConfig, QkNorm, RecurrentKind, Routing};
use crate::model::error::Result;
use crate::model::weights::Weights;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.qk_norm = Some(QkNorm::PerHead);
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
    let x = &hf.extra;
    if x.num_experts.is_some_and(|n| n > 0) {
        let dense = required(x.num_dense_layers, "num_dense_layers")?;
        config.moe = Some(super::checked(MoeConfig {
            num_experts: required(x.num_experts, "num_experts")?,
            top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
            intermediate_size: required(x.moe_intermediate_size, "moe_intermediate_size")?,
            routing: Routing::SigmoidThenTopK {
                normalize: x.norm_topk_prob.ok_or("norm_topk_prob is missing")?,
                expert_bias: x.use_expert_bias.ok_or("use_expert_bias is missing")?,
                scale: x.routed_scaling_factor.unwrap_or(1.0),
            },
            shared_expert_size: None,
            shared_expert_gated: false,
            sparse_layers: (0..config.num_layers).map(|l| l >= dense).collect(),
            biases: false,
        })?);
    }
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
