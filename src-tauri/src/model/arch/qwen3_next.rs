//! Qwen3-Next (Qwen3-Next-80B-A3B, Qwen3-Coder-Next): three Gated DeltaNet layers for every
//! full-attention layer (`full_attention_interval`), the attention with per-head q/k norms, a
//! rotary over a quarter of each head and a sigmoid gate on its output; routed experts with a
//! gated shared expert (as Qwen2-MoE's). mlx-lm's `qwen3_next.py` is the reference.

use super::{required, HfConfig};
use crate::model::config::{HybridStyle, ModelConfig, MoeConfig, QkNorm, RecurrentKind, Routing};
use crate::model::error::Result;
use crate::model::weights::Weights;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.qk_norm = Some(QkNorm::PerHead);
    config.hybrid = Some(hybrid(&config, hf, true)?);
    config.mtp_layers = hf.extra.mtp_num_hidden_layers.unwrap_or(0);
    // Configs re-saved by newer transformers keep the rotary settings in `rope_parameters`.
    let rope = hf.extra.rope_parameters.as_ref();
    let number = |key: &str| rope.and_then(|r| r.get(key)).and_then(serde_json::Value::as_f64);
    if let Some(theta) = number("rope_theta") {
        config.rope.theta = theta as f32;
    }
    if let Some(partial) = number("partial_rotary_factor").filter(|p| *p > 0.0 && *p <= 1.0) {
        config.rope.dims = (config.head_dim as f64 * partial) as usize;
    }
    let x = &hf.extra;
    if x.num_experts.unwrap_or(0) > 0 {
        let step = x.decoder_sparse_step.unwrap_or(1).max(1);
        let dense = x.mlp_only_layers.clone().unwrap_or_default();
        config.moe = Some(super::checked(MoeConfig {
            num_experts: required(x.num_experts, "num_experts")?,
            top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
            intermediate_size: required(x.moe_intermediate_size, "moe_intermediate_size")?,
            routing: Routing::SoftmaxThenTopK { normalize: x.norm_topk_prob.unwrap_or(false) },
            shared_expert_size: x.shared_expert_intermediate_size.filter(|&s| s > 0),
            shared_expert_gated: true,
            sparse_layers: (0..config.num_layers).map(|l| !dense.contains(&l) && (l + 1) % step == 0).collect(),
            biases: false,
        })?);
    }
    Ok(config)
}

/// The Gated DeltaNet layers' shape; every `full_attention_interval`-th layer (4 unless said)
/// is full attention, as the reference decides (it ignores `layer_types`).
pub(super) fn hybrid(config: &ModelConfig, hf: &HfConfig, grouped: bool) -> Result<HybridStyle, String> {
    let x = &hf.extra;
    let interval = x.full_attention_interval.unwrap_or(4).max(1);
    let style = HybridStyle {
        linear_layers: (0..config.num_layers).map(|l| (l + 1) % interval != 0).collect(),
        kind: RecurrentKind::GatedDelta,
        key_heads: required(x.linear_num_key_heads, "linear_num_key_heads")?,
        value_heads: required(x.linear_num_value_heads, "linear_num_value_heads")?,
        key_dim: required(x.linear_key_head_dim, "linear_key_head_dim")?,
        value_dim: required(x.linear_value_head_dim, "linear_value_head_dim")?,
        conv_kernel: required(x.linear_conv_kernel_dim, "linear_conv_kernel_dim")?,
        grouped_projections: grouped,
    };
    if !style.value_heads.is_multiple_of(style.key_heads) {
        return Err(format!(
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            style.value_heads, style.key_heads
        ));
    }
    if style.conv_kernel < 2 {
        return Err(format!("linear_conv_kernel_dim {} must be at least 2", style.conv_kernel));
    }
    Ok(style)
}

/// Checkpoints as Hugging Face publishes them (the MLX conversions are already in this form):
/// the convolution weights `[C, 1, K]` become MLX's `[C, K, 1]`, and the norms that compute
/// `x * (1 + w)` there get the 1 added (all but the Gated DeltaNet's own gated norm).
pub fn sanitize(weights: &mut Weights, config: &ModelConfig) -> Result<()> {
    let Some(h) = &config.hybrid else { return Ok(()) };
    let conv = (0..config.num_layers)
        .find(|&l| h.linear_layers[l])
        .map(|l| format!("model.layers.{l}.linear_attn.conv1d.weight"));
    let raw = match conv.as_ref().and_then(|name| weights.remove(name).map(|a| (name.clone(), a))) {
        Some((name, array)) => {
            let raw = array.ndim() == 3 && array.dim(-1) != 1;
            weights.insert(name, array);
            raw
        }
        None => false,
    };
    split_fused_experts(weights, config)?;
    if !raw {
        return Ok(());
    }
    let mut norms = vec!["model.norm.weight".to_string()];
    for l in 0..config.num_layers {
        let p = format!("model.layers.{l}");
        if h.linear_layers[l] {
            let name = format!("{p}.linear_attn.conv1d.weight");
            if let Some(w) = weights.remove(&name) {
                weights.insert(name, w.swap_axes(1, 2)?);
            }
        }
        norms.extend(layer_norms(&p, !h.linear_layers[l]));
    }
    // The multi-token-prediction head's norms follow the model's convention.
    let mtp = crate::model::config::MTP_PREFIX;
    for name in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"] {
        norms.push(format!("{mtp}.{name}.weight"));
    }
    for l in 0..config.mtp_layers {
        norms.extend(layer_norms(&format!("{mtp}.layers.{l}"), true));
    }
    let one = mlx_rs::Array::from_f32(1.0);
    for name in norms {
        if let Some(w) = weights.remove(&name) {
            let shifted = mlx_rs::ops::add(&w, &one)?.as_dtype(w.dtype())?;
            weights.insert(name, shifted);
        }
    }
    Ok(())
}

/// A layer's norms that compute `x * (1 + w)` in Hugging Face's layout.
fn layer_norms(p: &str, attention: bool) -> Vec<String> {
    let mut norms = vec![format!("{p}.input_layernorm.weight"), format!("{p}.post_attention_layernorm.weight")];
    if attention {
        norms.extend([format!("{p}.self_attn.q_norm.weight"), format!("{p}.self_attn.k_norm.weight")]);
    }
    norms
}

/// Qwen3.5/3.6-MoE as Hugging Face publishes it: each layer's experts fused in
/// `mlp.experts.gate_up_proj` (`[E, 2I, H]`, gate rows first) and `mlp.experts.down_proj`.
fn split_fused_experts(weights: &mut Weights, config: &ModelConfig) -> Result<()> {
    let layers = (0..config.num_layers).map(|l| format!("model.layers.{l}"));
    let mtp = (0..config.mtp_layers).map(|l| format!("{}.layers.{l}", crate::model::config::MTP_PREFIX));
    for layer in layers.chain(mtp) {
        let p = format!("{layer}.mlp");
        if let Some(fused) = weights.remove(&format!("{p}.experts.gate_up_proj")) {
            let mut halves = mlx_rs::ops::split_equal(&fused, 2, -2)?;
            let up = halves.pop().expect("split into 2");
            let gate = halves.pop().expect("split into 2");
            weights.insert(format!("{p}.switch_mlp.gate_proj.weight"), gate);
            weights.insert(format!("{p}.switch_mlp.up_proj.weight"), up);
        }
        if let Some(down) = weights.remove(&format!("{p}.experts.down_proj")) {
            weights.insert(format!("{p}.switch_mlp.down_proj.weight"), down);
        }
    }
    Ok(())
}
