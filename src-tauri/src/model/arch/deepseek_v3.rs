//! DeepSeek-V3.x, Kimi K2 (`deepseek_v3`, `kimi_k2`) and GLM-4.7-Flash (`glm4_moe_lite`):
//! pre-norm layers of multi-head latent attention (a low-rank query with its norm, one latent and
//! one rotary key per token, interleaved rotary over `qk_rope_head_dim` with YaRN, the logits'
//! scale grown by YaRN's `mscale_all_dim`) and DeepSeek's experts (biased sigmoid scores in
//! groups, an ungated shared expert, dense first layers). GLM-4.7-Flash differs in its norms'
//! epsilon (the model's, not 1e-6), its defaults and a 1e-20 in the routing weights' sum.
//!
//! Checkpoints: Hugging Face's `kv_b_proj` (`[heads * (nope + value), rank]`, quantized or not)
//! is split into mlx-lm's `embed_q` (`[heads, rank, nope]`) and `unembed_out` (`[heads, value,
//! rank]`), which MLX conversions already hold; multi-token-prediction layers are dropped. The
//! FP8 and int4 originals need converting first. mlx-lm's `deepseek_v3.py` and
//! `glm4_moe_lite.py` are the reference.

use super::{required, HfConfig};
use crate::model::config::{Arch, MlaStyle, ModelConfig, MoeConfig, RopeScaling, Routing};
use crate::model::error::{ModelError, Result as ModelResult};
use crate::model::layers::quant_ops;
use crate::model::weights::Weights;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let x = &hf.extra;
    let glm = config.arch == Arch::Glm4MoeLite;
    // The references' defaults where a config leaves a size out.
    let (q_default, nope_default, value_default) = if glm { (768, 192, 256) } else { (1536, 128, 128) };
    let mla = MlaStyle {
        q_lora_rank: match x.q_lora_rank {
            None => Some(q_default),
            Some(rank) => rank,
        },
        kv_lora_rank: x.kv_lora_rank.unwrap_or(512),
        nope_dim: x.qk_nope_head_dim.unwrap_or(nope_default),
        rope_dim: x.qk_rope_head_dim.unwrap_or(64),
        value_dim: x.v_head_dim.unwrap_or(value_default),
        lora_eps: if glm { config.rms_norm_eps } else { 1e-6 },
    };
    if mla.kv_lora_rank == 0 || mla.rope_dim == 0 || !mla.rope_dim.is_multiple_of(2) || mla.value_dim == 0 {
        return Err(format!("latent attention sizes out of range: {mla:?}"));
    }
    config.head_dim = mla.nope_dim + mla.rope_dim;
    config.num_kv_heads = config.num_heads;
    config.rope.dims = mla.rope_dim;
    config.rope.traditional = true;
    // The logits' scale grows with YaRN's magnitude over all dimensions, squared.
    let mut scale = (config.head_dim as f32).powf(-0.5);
    if let Some(RopeScaling::Yarn { factor, mscale_all_dim, .. }) = config.rope.scaling {
        if mscale_all_dim != 0.0 && factor > 1.0 {
            let s = 0.1 * mscale_all_dim * factor.ln() + 1.0;
            scale *= s * s;
        }
    }
    config.attention_scale = Some(scale);
    config.o_bias = hf.attention_bias;
    config.tie_word_embeddings = false;
    config.mla = Some(mla);
    let experts = x.n_routed_experts.or(glm.then_some(64)).filter(|&n| n > 0);
    if let Some(experts) = experts {
        let dense = x.first_k_dense_replace.unwrap_or(usize::from(glm));
        let every = x.moe_layer_freq.unwrap_or(1).max(1);
        let width = required(x.moe_intermediate_size, "moe_intermediate_size")?;
        let shared = x.n_shared_experts.or(glm.then_some(1)).filter(|&n| n > 0);
        config.moe = Some(super::checked(MoeConfig {
            num_experts: experts,
            top_k: x.num_experts_per_tok.unwrap_or(if glm { 4 } else { 1 }),
            intermediate_size: width,
            routing: Routing::SigmoidGrouped(super::glm4_moe::grouped_routing(hf, if glm { 1e-20 } else { 0.0 })?),
            shared_expert_size: shared.map(|n| n * width),
            shared_expert_gated: false,
            sparse_layers: (0..config.num_layers).map(|l| l >= dense && l % every == 0).collect(),
            biases: false,
        })?);
    }
    Ok(config)
}

/// Drops the multi-token-prediction layers (numbered past the model's) and splits each layer's
/// `kv_b_proj` as mlx-lm does: a quantized one is expanded, split and quantized again with the
/// same bits and group size.
pub fn sanitize(weights: &mut Weights, config: &ModelConfig) -> ModelResult<()> {
    let layers = config.num_layers;
    weights.rename_all(|name| {
        let beyond = name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n >= layers);
        (!beyond).then(|| name.to_string())
    });
    let Some(mla) = config.mla else { return Ok(()) };
    let heads = config.num_heads as i32;
    let (nope, value, rank) = (mla.nope_dim as i32, mla.value_dim as i32, mla.kv_lora_rank as i32);
    for l in 0..layers {
        let p = format!("model.layers.{l}.self_attn");
        let Some(kv_b) = weights.remove(&format!("{p}.kv_b_proj.weight")) else { continue };
        let packed = match weights.remove(&format!("{p}.kv_b_proj.scales")) {
            Some(scales) => {
                let biases = weights.remove(&format!("{p}.kv_b_proj.biases"));
                let bits = kv_b.dim(-1) * 32 / rank;
                let spec = crate::model::config::QuantSpec::affine(rank / scales.dim(-1), bits);
                if !spec.is_supported() {
                    return Err(ModelError::Mlx(format!(
                        "{p}.kv_b_proj: {bits} bits in groups of {}",
                        spec.group_size
                    )));
                }
                Some((quant_ops::dequantize(&kv_b, &scales, biases.as_ref(), spec)?, spec))
            }
            None => None,
        };
        let (matrix, spec) = match packed {
            Some((matrix, spec)) => (matrix, Some(spec)),
            None => (kv_b, None),
        };
        if matrix.shape() != [heads * (nope + value), rank] {
            return Err(ModelError::Mlx(format!(
                "{p}.kv_b_proj is {:?}, not [{}, {rank}]",
                matrix.shape(),
                heads * (nope + value)
            )));
        }
        let per_head = matrix.reshape(&[heads, nope + value, rank])?;
        let parts = mlx_rs::ops::split_at_indices(&per_head, &[nope], 1)?;
        let embed_q = parts[0].swap_axes(-1, -2)?.contiguous()?;
        let unembed_out = parts[1].contiguous()?;
        for (name, w) in [("embed_q", embed_q), ("unembed_out", unembed_out)] {
            match spec {
                Some(spec) => {
                    let (w, scales, biases) = quant_ops::quantize(&w, spec)?;
                    weights.insert(format!("{p}.{name}.weight"), w);
                    weights.insert(format!("{p}.{name}.scales"), scales);
                    if let Some(biases) = biases {
                        weights.insert(format!("{p}.{name}.biases"), biases);
                    }
                }
                None => weights.insert(format!("{p}.{name}.weight"), w),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(arch: Arch, extra: serde_json::Value) -> ModelConfig {
        let mut json = serde_json::json!({"model_type": arch.model_type(), "vocab_size": 64, "hidden_size": 2048,
            "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 20, "moe_intermediate_size": 32,
            "rms_norm_eps": 1e-5, "rope_scaling": {"type": "yarn", "factor": 40.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096}});
        json.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let hf: HfConfig = serde_json::from_value(json).unwrap();
        super::super::model_config(arch, &hf).unwrap()
    }

    #[test]
    fn absent_and_null_query_ranks_differ_and_yarn_grows_the_scale() {
        let c = config(Arch::DeepseekV3, serde_json::json!({"n_routed_experts": 8, "num_experts_per_tok": 2}));
        let mla = c.mla.unwrap();
        assert_eq!((mla.q_lora_rank, mla.kv_lora_rank, c.head_dim, c.rope.dims), (Some(1536), 512, 192, 64));
        assert_eq!(mla.lora_eps, 1e-6);
        // DeepSeek-V3's: 192^-0.5 x (0.1 ln 40 + 1)^2.
        assert!((c.attention_scale.unwrap() - 0.072_168_78 * 1.368_888_f32.powi(2)).abs() < 1e-6);
        let c = config(Arch::Glm4MoeLite, serde_json::json!({"q_lora_rank": null}));
        let mla = c.mla.unwrap();
        assert_eq!((mla.q_lora_rank, mla.nope_dim, mla.value_dim, mla.lora_eps), (None, 192, 256, 1e-5));
        assert_eq!(c.moe.as_ref().map(|m| (m.num_experts, m.top_k)), Some((64, 4)), "GLM-4.7-Flash's defaults");
        assert!(c.check_kv_format(crate::model::KvFormat { quant: c.kv_quant_for(8), start: 0 }).is_ok());
        assert!(c.kv_quant_for(8).is_none(), "no quantized cache for latent attention");
    }
}
