//! Gemma 4 (text): Gemma 3's block (four norms, q/k norms, GELU-tanh, sliding-window layers
//! with one full layer every `sliding_window_pattern`) with plain `weight` norms, a norm on the
//! values, unscaled attention logits, and:
//! - full-attention layers with their own head size (`global_head_dim`), KV heads and keys
//!   doubling as values (`attention_k_eq_v`), and a partial "proportional" rotary;
//! - the last `num_kv_shared_layers` layers reusing the keys and values of the last earlier
//!   layer of their kind (no cache of their own), with double-wide MLPs;
//! - per-layer input embeddings (E2B/E4B) gating a second input into every layer;
//! - optionally a mixture of experts beside each dense MLP (26B-A4B);
//! - a learned scalar per layer and soft-capped logits.

use serde_json::Value;

use super::{required, HfConfig};
use crate::model::config::{
    Activation, Gemma4Style, ModelConfig, MoeConfig, NormPlacement, PerLayerInput, QkNorm, RopeConfig, Routing,
};
use crate::model::error::Result;
use crate::model::weights::Weights;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> std::result::Result<ModelConfig, String> {
    let x = &hf.extra;
    if hf.head_dim.is_none() {
        config.head_dim = 256;
    }
    config.tie_word_embeddings = hf.tie_word_embeddings.unwrap_or(true);
    config.qk_norm = Some(QkNorm::PerHead);
    config.norms = NormPlacement::Sandwich;
    config.activation = Activation::GeluTanh;
    config.attention_scale = Some(1.0);
    config.sliding_window = Some(hf.sliding_window.unwrap_or(512));
    let layers = config.num_layers;
    config.sliding_layers = match super::sliding_layers(hf, layers)? {
        Some(types) => types,
        None => {
            let pattern = x.sliding_window_pattern.unwrap_or(5).max(1);
            (0..layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    // Absent fields take the reference's defaults (mlx-lm's, shaped like E2B).
    let global_head_dim = x.global_head_dim.filter(|&d| d > 0).unwrap_or(512);
    let (local_rope, global_rope) = rope_by_kind(hf.extra.rope_parameters.as_ref(), &config, global_head_dim)?;
    let shared = x.num_kv_shared_layers.unwrap_or(20).min(layers);
    let first_kv_shared = layers - shared;
    let per_layer_input = match x.hidden_size_per_layer_input.unwrap_or(256) {
        0 => None,
        size => Some(PerLayerInput { size, vocab_size: x.vocab_size_per_layer_input.unwrap_or(262_144) }),
    };
    config.rope = local_rope.clone();
    config.gemma4 = Some(Gemma4Style {
        global_head_dim,
        global_kv_heads: x.num_global_key_value_heads.unwrap_or(config.num_kv_heads),
        global_keys_as_values: x.attention_k_eq_v.unwrap_or(false),
        global_rope,
        local_rope,
        first_kv_shared,
        per_layer_input,
        double_wide_mlp: x.use_double_wide_mlp.unwrap_or(true),
        // Absent: the reference's 30; an explicit null: none.
        final_logit_softcap: match x.final_logit_softcapping {
            None => Some(30.0),
            Some(cap) => cap.filter(|&c| c > 0.0),
        },
    });
    if x.enable_moe_block.unwrap_or(false) {
        config.moe = Some(super::checked(MoeConfig {
            num_experts: required(x.num_experts, "num_experts")?,
            top_k: required(x.top_k_experts, "top_k_experts")?,
            intermediate_size: required(
                x.moe_intermediate_size.or(x.expert_intermediate_size),
                "moe_intermediate_size",
            )?,
            routing: Routing::TopKThenSoftmax { largest_last: true },
            shared_expert_size: None,
            shared_expert_gated: false,
            sparse_layers: Vec::new(),
            biases: false,
        })?);
    }
    // Every shared layer needs an earlier layer of its kind to take keys and values from.
    for i in first_kv_shared..layers {
        if config.layer_attention(i).kv_source.is_none() {
            return Err(format!("layer {i} shares keys and values, but no earlier layer of its kind has them"));
        }
    }
    Ok(config)
}

/// The rotary settings of sliding and full layers (`rope_parameters` keyed by layer kind; the
/// reference's defaults when absent).
fn rope_by_kind(
    params: Option<&Value>,
    config: &ModelConfig,
    global_head_dim: usize,
) -> std::result::Result<(RopeConfig, RopeConfig), String> {
    let defaults = serde_json::json!({
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
        "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10_000.0, "rope_type": "default"},
    });
    let params = params.filter(|p| p.is_object()).unwrap_or(&defaults);
    let kind = |key: &str, head_dim: usize| -> std::result::Result<RopeConfig, String> {
        let empty = serde_json::json!({});
        let p = params.get(key).unwrap_or(&empty);
        Ok(RopeConfig {
            theta: p.get("rope_theta").and_then(Value::as_f64).unwrap_or(10_000.0) as f32,
            dims: head_dim,
            traditional: config.rope.traditional,
            scaling: super::rope_scaling(Some(p), None)?,
        })
    };
    Ok((kind("sliding_attention", config.head_dim)?, kind("full_attention", global_head_dim)?))
}

/// Hugging Face's layout -> the one the transformer reads: experts' fused `gate_up_proj`
/// (`[E, 2I, H]`, gate rows first) split, `down_proj` named as a weight, and the key/value
/// projections KV-shared layers carry but never use dropped.
pub fn sanitize(weights: &mut Weights, config: &ModelConfig) -> Result<()> {
    // Activation-range statistics some exports carry (unused by inference).
    weights.rename_all(|name| {
        let stat = ["input_max", "input_min", "output_max", "output_min"].iter().any(|s| name.ends_with(s));
        (!stat).then(|| name.to_string())
    });
    let first_shared = config.kv_cache_layers();
    for l in 0..config.num_layers {
        let p = format!("model.layers.{l}");
        if let Some(fused) = weights.remove(&format!("{p}.experts.gate_up_proj")) {
            let mut halves = mlx_rs::ops::split_equal(&fused, 2, -2)?;
            let up = halves.pop().expect("split into 2");
            let gate = halves.pop().expect("split into 2");
            weights.insert(format!("{p}.experts.switch_glu.gate_proj.weight"), gate);
            weights.insert(format!("{p}.experts.switch_glu.up_proj.weight"), up);
        }
        if let Some(down) = weights.remove(&format!("{p}.experts.down_proj")) {
            weights.insert(format!("{p}.experts.switch_glu.down_proj.weight"), down);
        }
        if l >= first_shared {
            for name in ["k_proj", "v_proj", "k_norm"] {
                for part in ["weight", "scales", "biases"] {
                    weights.remove(&format!("{p}.self_attn.{name}.{part}"));
                }
            }
        }
    }
    Ok(())
}
