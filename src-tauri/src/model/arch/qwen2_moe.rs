//! Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention (q/k/v biases) with routed experts in every
//! layer plus a shared expert every token goes through, scaled by its own sigmoid gate.

use super::{required, HfConfig};
use crate::model::config::{ModelConfig, MoeConfig, Routing};

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.qkv_bias = true;
    let x = &hf.extra;
    config.moe = Some(super::checked(MoeConfig {
        num_experts: required(x.num_experts, "num_experts")?,
        top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
        intermediate_size: required(x.moe_intermediate_size, "moe_intermediate_size")?,
        // mlx-lm (the reference) keeps the top-k softmax weights as they are.
        routing: Routing::SoftmaxThenTopK { normalize: false },
        shared_expert_size: Some(required(x.shared_expert_intermediate_size, "shared_expert_intermediate_size")?),
        shared_expert_gated: true,
        sparse_layers: Vec::new(),
        biases: false,
    })?);
    Ok(config)
}
