//! Granite 4.0-H (`granitemoehybrid`): Mamba-2 layers with a few attention layers
//! (`layer_types`), each followed by a SwiGLU feed-forward: experts (top k of the logits, then
//! a softmax) beside an always-on shared MLP, or one dense MLP. Its multipliers scale the
//! embeddings, both branches before the residual adds, the attention logits, and the output
//! logits (divided). Attention rotates the whole head without scaling, or not at all when
//! `position_embedding_type` is "nope". mlx-lm's `granitemoehybrid.py` is the reference.

use super::{required, HfConfig};
use crate::model::config::{HybridStyle, Mamba2Style, ModelConfig, MoeConfig, Multipliers, RecurrentKind, Routing};
use crate::model::error::Result;
use crate::model::weights::Weights;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let x = &hf.extra;
    let types = hf.layer_types.as_ref().ok_or("layer_types is missing")?;
    if types.len() != config.num_layers {
        return Err(format!("layer_types lists {} layers, the model has {}", types.len(), config.num_layers));
    }
    if let Some(other) = types.iter().find(|t| !matches!(t.as_str(), "mamba" | "attention")) {
        return Err(format!("unknown layer type {other:?} (Granite's are \"mamba\" and \"attention\")"));
    }
    config.tie_word_embeddings = hf.tie_word_embeddings.unwrap_or(true);
    config.o_bias = hf.attention_bias;
    config.mlp_bias = x.mlp_bias.unwrap_or(false);
    config.attention_scale = Some(x.attention_multiplier.ok_or("attention_multiplier is missing")?);
    config.multipliers = Some(Multipliers {
        embedding: x.embedding_multiplier.ok_or("embedding_multiplier is missing")?,
        residual: x.residual_multiplier.ok_or("residual_multiplier is missing")?,
        logits_scaling: x.logits_scaling.ok_or("logits_scaling is missing")?,
    });
    if let Some(theta) = x.rope_parameters.as_ref().and_then(|p| p.get("rope_theta")).and_then(|t| t.as_f64()) {
        config.rope.theta = theta as f32;
    }
    // The reference builds the rotary without `rope_scaling`.
    config.rope.scaling = None;
    if x.position_embedding_type.as_deref() == Some("nope") {
        config.nope_layers = (0..config.num_layers).collect();
    }
    let mamba = types.iter().any(|t| t == "mamba");
    if mamba {
        let heads = required(x.mamba_n_heads, "mamba_n_heads")?;
        let groups = required(x.mamba_n_groups, "mamba_n_groups")?;
        config.hybrid = Some(mamba_style(
            types.iter().map(|t| t == "mamba").collect(),
            (groups, required(x.mamba_d_state, "mamba_d_state")?),
            (heads, required(x.mamba_d_head, "mamba_d_head")?),
            required(x.mamba_d_conv, "mamba_d_conv")?,
            Mamba2Style {
                conv_bias: x.mamba_conv_bias.unwrap_or(false),
                proj_bias: x.mamba_proj_bias.unwrap_or(false),
                dt_limit: super::time_step_limit(hf, (0.001, 100.0))?,
                grouped_norm: false,
                norm_eps: config.rms_norm_eps,
            },
        )?);
    }
    if x.num_local_experts.is_some_and(|n| n > 0) {
        config.moe = Some(super::checked(MoeConfig {
            num_experts: required(x.num_local_experts, "num_local_experts")?,
            top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
            intermediate_size: config.intermediate_size,
            routing: Routing::TopKThenSoftmax { largest_last: true },
            shared_expert_size: Some(required(x.shared_intermediate_size, "shared_intermediate_size")?),
            shared_expert_gated: false,
            sparse_layers: vec![true; config.num_layers],
            biases: false,
        })?);
    }
    Ok(config)
}

/// A Mamba-2 hybrid's shape: `(groups, state)` for B and C, `(heads, head_dim)` for x, checked.
pub(super) fn mamba_style(
    linear_layers: Vec<bool>,
    (groups, state): (usize, usize),
    (heads, head_dim): (usize, usize),
    conv_kernel: usize,
    style: Mamba2Style,
) -> Result<HybridStyle, String> {
    if !heads.is_multiple_of(groups) {
        return Err(format!("the {heads} Mamba heads do not split into {groups} groups"));
    }
    if conv_kernel < 2 {
        return Err(format!("the Mamba convolution's width {conv_kernel} must be at least 2"));
    }
    Ok(HybridStyle {
        linear_layers,
        kind: RecurrentKind::Mamba2(style),
        key_heads: groups,
        value_heads: heads,
        key_dim: state,
        value_dim: head_dim,
        conv_kernel,
        grouped_projections: false,
    })
}

/// Checkpoints as Hugging Face publishes them: convolutions `[C, 1, K]` -> MLX's `[C, K, 1]`;
/// the experts' `input_linear` `[E, 2I, H]` split into gate (first half) and up, their
/// `output_linear` the down projection; the shared MLP's `input_linear` split the same way
/// (a dense model's shared MLP is its MLP); the router's `layer` is the router; a tied
/// `lm_head` dropped.
pub fn sanitize(weights: &mut Weights, config: &ModelConfig) -> Result<()> {
    super::mamba_conv_layout(weights, config)?;
    let moe = config.moe.is_some();
    weights.rename_modules(|name| {
        let renamed = name
            .replace(".mlp.gate.layer.", ".mlp.gate.")
            .replace(".mlp.output_linear.", ".mlp.switch_mlp.down_proj.")
            .replace(
                ".shared_mlp.output_linear.",
                if moe { ".mlp.shared_experts.down_proj." } else { ".mlp.down_proj." },
            );
        Some(renamed)
    });
    for l in 0..config.num_layers {
        let p = format!("model.layers.{l}");
        if let Some(fused) = weights.remove(&format!("{p}.mlp.input_linear.weight")) {
            let halves = mlx_rs::ops::split_equal(&fused, 2, -2)?;
            weights.insert(format!("{p}.mlp.switch_mlp.gate_proj.weight"), halves[0].clone());
            weights.insert(format!("{p}.mlp.switch_mlp.up_proj.weight"), halves[1].clone());
        }
        let shared = if moe { format!("{p}.mlp.shared_experts") } else { format!("{p}.mlp") };
        for part in ["weight", "scales", "biases"] {
            if let Some(fused) = weights.remove(&format!("{p}.shared_mlp.input_linear.{part}")) {
                let halves = mlx_rs::ops::split_equal(&fused, 2, 0)?;
                weights.insert(format!("{shared}.gate_proj.{part}"), halves[0].clone());
                weights.insert(format!("{shared}.up_proj.{part}"), halves[1].clone());
            }
        }
        if let Some(spec) = weights.quant.overrides.remove(&format!("{p}.shared_mlp.input_linear")) {
            weights.quant.overrides.insert(format!("{shared}.gate_proj"), spec);
            weights.quant.overrides.insert(format!("{shared}.up_proj"), spec);
        }
    }
    if config.tie_word_embeddings {
        for part in ["weight", "scales", "biases"] {
            weights.remove(&format!("lm_head.{part}"));
        }
    }
    Ok(())
}
