//! Qwen3.5 / Qwen3.6, dense and with experts (`qwen3_5`, `qwen3_5_moe`; the text model of a
//! config with `text_config`): Qwen3-Next's layers with the Gated DeltaNet's projections apart
//! (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`), rotary settings in
//! `rope_parameters` (a quarter of each head by default; the multimodal sections are one
//! position for text), and, with experts, routed experts plus a gated shared expert in every
//! layer. mlx-lm's `qwen3_5.py` / `qwen3_5_moe.py` are the reference.

use super::{required, HfConfig};
use crate::model::config::{ModelConfig, MoeConfig, QkNorm, Routing};

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.qk_norm = Some(QkNorm::PerHead);
    config.hybrid = Some(super::qwen3_next::hybrid(&config, hf, false)?);
    config.mtp_layers = hf.extra.mtp_num_hidden_layers.unwrap_or(0);
    let x = &hf.extra;
    let rope = x.rope_parameters.as_ref();
    let number = |key: &str| rope.and_then(|r| r.get(key)).and_then(serde_json::Value::as_f64);
    // As the reference: `rope_parameters` (or its defaults), whatever the top level says.
    let partial = number("partial_rotary_factor").unwrap_or(0.25);
    config.rope.theta = number("rope_theta").unwrap_or(100_000.0) as f32;
    config.rope.dims = (config.head_dim as f64 * partial) as usize;
    config.rope.scaling = None;
    if x.num_experts.unwrap_or(0) > 0 {
        config.moe = Some(super::checked(MoeConfig {
            num_experts: required(x.num_experts, "num_experts")?,
            top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
            intermediate_size: required(x.moe_intermediate_size, "moe_intermediate_size")?,
            routing: Routing::SoftmaxThenTopK { normalize: x.norm_topk_prob.unwrap_or(true) },
            shared_expert_size: x.shared_expert_intermediate_size.filter(|&s| s > 0),
            shared_expert_gated: true,
            sparse_layers: Vec::new(),
            biases: false,
        })?);
    }
    Ok(config)
}
