//! Mixtral 8x7B / 8x22B: Llama's attention with 8 SwiGLU experts per layer, the top 2 chosen
//! by logit and weighted by a softmax over those two. Hugging Face names the block
//! `block_sparse_moe` and the experts' matrices `w1`/`w2`/`w3` (renamed at load).

use super::{required, HfConfig};
use crate::model::config::{ModelConfig, MoeConfig, Routing};

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let x = &hf.extra;
    config.moe = Some(super::checked(MoeConfig {
        num_experts: required(x.num_local_experts, "num_local_experts")?,
        top_k: x.num_experts_per_tok.unwrap_or(2),
        intermediate_size: config.intermediate_size,
        routing: Routing::TopKThenSoftmax { largest_last: false },
        shared_expert_size: None,
        shared_expert_gated: false,
        sparse_layers: Vec::new(),
        biases: false,
    })?);
    Ok(config)
}
