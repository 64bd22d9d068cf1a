//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head
//! q/k norms, explicit head_dim) with routed experts in every `decoder_sparse_step`-th layer
//! except `mlp_only_layers`; softmax over all experts, then the top k, optionally renormalised.

use mlx_rs::ops::indexing::TryIndexOp;

use super::{required, HfConfig};
use crate::model::config::{ModelConfig, MoeConfig, QkNorm, Routing};
use crate::model::error::Result;
use crate::model::weights::Weights;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> std::result::Result<ModelConfig, String> {
    config.qk_norm = Some(QkNorm::PerHead);
    let x = &hf.extra;
    let step = x.decoder_sparse_step.unwrap_or(1).max(1);
    let dense = x.mlp_only_layers.clone().unwrap_or_default();
    let sparse_layers = (0..config.num_layers).map(|l| !dense.contains(&l) && (l + 1) % step == 0).collect();
    config.moe = Some(super::checked(MoeConfig {
        num_experts: required(x.num_experts, "num_experts")?,
        top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
        intermediate_size: required(x.moe_intermediate_size, "moe_intermediate_size")?,
        // Qwen3-VL-MoE's configs default to renormalising (transformers' and mlx-vlm's default).
        routing: Routing::SoftmaxThenTopK {
            normalize: x.norm_topk_prob.unwrap_or(hf.model_type.starts_with("qwen3_vl_moe")),
        },
        shared_expert_size: None,
        shared_expert_gated: false,
        sparse_layers,
        biases: false,
    })?);
    Ok(config)
}

/// Qwen3-VL-MoE's Hugging Face checkpoints keep each layer's experts fused: `experts.gate_up_proj`
/// `[experts, hidden, 2 * inter]` (gate columns, then up) and `experts.down_proj` `[experts, inter,
/// hidden]`, inputs first. Split and turned into the stacked `switch_mlp` matrices, outputs first,
/// as mlx-vlm's conversion writes them (mlx-community's checkpoints already are).
pub fn split_fused_experts(weights: &mut Weights, layers: usize) -> Result<()> {
    for l in 0..layers {
        let p = format!("model.layers.{l}.mlp");
        let fused = format!("{p}.experts.gate_up_proj");
        if !weights.contains(&fused) {
            continue;
        }
        let gate_up = weights.take(&fused)?;
        let half = gate_up.dim(-1) / 2;
        let gate = gate_up.try_index((.., .., ..half))?.transpose_axes(&[0, 2, 1])?;
        let up = gate_up.try_index((.., .., half..))?.transpose_axes(&[0, 2, 1])?;
        let down = weights.take(&format!("{p}.experts.down_proj"))?.transpose_axes(&[0, 2, 1])?;
        weights.insert(format!("{p}.switch_mlp.gate_proj.weight"), gate);
        weights.insert(format!("{p}.switch_mlp.up_proj.weight"), up);
        weights.insert(format!("{p}.switch_mlp.down_proj.weight"), down);
    }
    Ok(())
}
