//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head
//! q/k norms, explicit head_dim) with routed experts in every `decoder_sparse_step`-th layer
//! except `mlp_only_layers`; softmax over all experts, then the top k, optionally renormalised.

use super::{required, HfConfig};
use crate::model::config::{ModelConfig, MoeConfig, Routing};

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.qk_norm = true;
    let x = &hf.extra;
    let step = x.decoder_sparse_step.unwrap_or(1).max(1);
    let dense = x.mlp_only_layers.clone().unwrap_or_default();
    let sparse_layers = (0..config.num_layers).map(|l| !dense.contains(&l) && (l + 1) % step == 0).collect();
    config.moe = Some(super::checked(MoeConfig {
        num_experts: required(x.num_experts, "num_experts")?,
        top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
        intermediate_size: required(x.moe_intermediate_size, "moe_intermediate_size")?,
        routing: Routing::SoftmaxThenTopK { normalize: x.norm_topk_prob.unwrap_or(false) },
        shared_expert_size: None,
        sparse_layers,
        biases: false,
    })?);
    Ok(config)
}
