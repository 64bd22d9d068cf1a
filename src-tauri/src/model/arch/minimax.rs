//! MiniMax-M2 (`minimax`, `minimax_m2`): pre-norm layers whose feed-forward is experts in every
//! layer (no dense or shared MLP), chosen by sigmoid scores plus a learned bias from a router
//! run in f32, the chosen weights rescaled to sum to one and summed in the input's dtype; RMS
//! norms over the whole q and k projections (`use_qk_norm`, on by default); rotary over
//! `rotary_dim` of each head. Hugging Face names the block `block_sparse_moe` (renamed at
//! load, as Mixtral's). mlx-lm's `minimax.py` is the reference; the original FP8 release
//! needs converting first (mlx-community's conversions load).

use super::{required, HfConfig};
use crate::model::config::{GroupedRouting, ModelConfig, MoeConfig, QkNorm, Routing};

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let x = &hf.extra;
    if x.use_qk_norm.unwrap_or(true) {
        config.qk_norm = Some(QkNorm::Whole);
    }
    let rotary = required(x.rotary_dim, "rotary_dim")?;
    if rotary > config.head_dim || rotary % 2 != 0 {
        return Err(format!("rotary_dim {rotary} must be even and at most head_dim {}", config.head_dim));
    }
    config.rope.dims = rotary;
    config.rope.scaling = None;
    config.moe = Some(super::checked(MoeConfig {
        num_experts: required(x.num_local_experts, "num_local_experts")?,
        top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
        intermediate_size: config.intermediate_size,
        routing: Routing::SigmoidGrouped(GroupedRouting {
            n_group: 1,
            topk_group: 1,
            normalize: true,
            norm_eps: 1e-20,
            scale: 1.0,
            f32_router: true,
        }),
        shared_expert_size: None,
        shared_expert_gated: false,
        sparse_layers: Vec::new(),
        biases: false,
    })?);
    Ok(config)
}
