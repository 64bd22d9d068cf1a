//! GLM-4.5 / 4.6 / 4.7 (`glm4_moe`): Llama's pre-norm layers with GQA, per-head q/k norms
//! (`use_qk_norm`), biases on q/k/v (`attention_bias`), rotary over `partial_rotary_factor` of
//! each head with no scaling (the reference ignores `rope_scaling`); dense MLPs in the first
//! `first_k_dense_replace` layers, then experts chosen as DeepSeek-V3 does (biased sigmoid
//! scores in groups) beside an ungated shared expert. The head is never tied. The checkpoint's
//! multi-token-prediction layer (`model.layers.{num_hidden_layers}`) is dropped, as mlx-lm does.
//! mlx-lm's `glm4_moe.py` is the reference.

use super::{required, HfConfig};
use crate::model::config::{GroupedRouting, ModelConfig, MoeConfig, QkNorm, Routing};
use crate::model::error::Result as ModelResult;
use crate::model::weights::Weights;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let x = &hf.extra;
    if hf.head_dim.is_none() {
        return Err("head_dim is missing".into());
    }
    if x.use_qk_norm.unwrap_or(false) {
        config.qk_norm = Some(QkNorm::PerHead);
    }
    config.rope.scaling = None;
    config.tie_word_embeddings = false;
    let dense = x.first_k_dense_replace.unwrap_or(0);
    config.moe = Some(super::checked(MoeConfig {
        num_experts: required(x.n_routed_experts, "n_routed_experts")?,
        top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
        intermediate_size: required(x.moe_intermediate_size, "moe_intermediate_size")?,
        routing: Routing::SigmoidGrouped(grouped_routing(hf, 0.0)?),
        shared_expert_size: x.n_shared_experts.filter(|&n| n > 0).map(|n| n * x.moe_intermediate_size.unwrap_or(0)),
        shared_expert_gated: false,
        sparse_layers: (0..config.num_layers).map(|l| l >= dense).collect(),
        biases: false,
    })?);
    Ok(config)
}

/// DeepSeek-V3's expert choice as the config states it (`n_group`, `topk_group`,
/// `norm_topk_prob`, `routed_scaling_factor`); `norm_eps` is the family's.
pub(super) fn grouped_routing(hf: &HfConfig, norm_eps: f32) -> Result<GroupedRouting, String> {
    let x = &hf.extra;
    if let Some(method) = x.topk_method.as_deref().filter(|m| *m != "noaux_tc") {
        return Err(format!("topk_method {method:?} is not supported (only \"noaux_tc\")"));
    }
    if let Some(func) = x.scoring_func.as_deref().filter(|f| *f != "sigmoid") {
        return Err(format!("scoring_func {func:?} is not supported (only \"sigmoid\")"));
    }
    let experts = x.n_routed_experts.or(x.num_local_experts).unwrap_or(0);
    let n_group = x.n_group.unwrap_or(1).max(1);
    let topk_group = x.topk_group.unwrap_or(n_group);
    if !experts.is_multiple_of(n_group) || topk_group == 0 || topk_group > n_group {
        return Err(format!("{experts} experts cannot form {n_group} groups with the best {topk_group} kept"));
    }
    if n_group > 1 && experts / n_group < 2 {
        return Err(format!("groups of {} experts: a group's score needs two", experts / n_group));
    }
    Ok(GroupedRouting {
        n_group,
        topk_group,
        normalize: x.norm_topk_prob.unwrap_or(true) && x.num_experts_per_tok.unwrap_or(1) > 1,
        norm_eps,
        scale: x.routed_scaling_factor.unwrap_or(1.0),
        f32_router: false,
    })
}

/// Drops the multi-token-prediction layer, which FastMLX does not use for GLM (mlx-lm drops it
/// too).
pub fn sanitize(weights: &mut Weights, config: &ModelConfig) -> ModelResult<()> {
    let mtp = format!("model.layers.{}.", config.num_layers);
    weights.rename_all(|name| (!name.starts_with(&mtp)).then(|| name.to_string()));
    Ok(())
}
