//! One file per architecture: how its `config.json` maps onto [`ModelConfig`] and how its
//! checkpoint names map onto the shared transformer's. The maths lives in `model::layers`.

mod deepseek_v3;
mod gemma3;
mod gemma4;
mod glm4_moe;
mod gpt_oss;
mod granite_hybrid;
mod lfm2;
mod llama;
mod minimax;
mod ministral3;
mod mistral;
mod mixtral;
mod nemotron_h;
mod olmo3;
mod phi3;
mod qwen2;
mod qwen2_moe;
mod qwen3;
mod qwen3_5;
mod qwen3_moe;
mod qwen3_next;
mod seed_oss;
mod smollm3;
mod wrapped;

use serde::Deserialize;
use serde_json::Value;

use crate::model::config::{
    Activation, Arch, ModelConfig, MoeConfig, MropeConfig, NormPlacement, RopeConfig, RopeScaling,
};

pub use wrapped::{canonical_tensor_name, text_config};

/// The fields of a Hugging Face `config.json` the supported architectures read. Unknown keys
/// are ignored; missing ones take the Hugging Face defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct HfConfig {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Checked where a dense MLP needs it (Qwen3.5's expert models state none).
    #[serde(default)]
    pub intermediate_size: usize,
    /// Nemotron-H may leave it out (its block pattern's length).
    #[serde(default)]
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_positions")]
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: Option<bool>,
    pub sliding_window: Option<usize>,
    pub use_sliding_window: Option<bool>,
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub attention_bias: bool,
    pub partial_rotary_factor: Option<f32>,
    /// Phi-3 keeps the pre-training window here rather than in `rope_scaling`.
    pub original_max_position_embeddings: Option<usize>,
    /// What only some families read (experts, Gemma's attention layout).
    #[serde(flatten)]
    pub extra: HfExtras,
}

/// The `config.json` fields of the mixture-of-experts and Gemma families.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HfExtras {
    /// Qwen MoE's expert count...
    pub num_experts: Option<usize>,
    /// ...and Mixtral's.
    pub num_local_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub shared_expert_intermediate_size: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    /// Every n-th layer has experts (Qwen MoE)...
    pub decoder_sparse_step: Option<usize>,
    /// ...except these, which keep a dense MLP.
    pub mlp_only_layers: Option<Vec<usize>>,
    pub query_pre_attn_scalar: Option<f32>,
    pub rope_local_base_freq: Option<f32>,
    pub sliding_window_pattern: Option<usize>,
    pub hidden_activation: Option<String>,
    /// gpt-oss's clamp on its SwiGLU.
    pub swiglu_limit: Option<f32>,
    /// Newer configs' rotary settings in one place (`rope_theta`, `rope_type`, the scaling's
    /// fields; Ministral 3 also `llama_4_scaling_beta`).
    pub rope_parameters: Option<Value>,
    /// Gemma 4: full-attention layers' head size and KV heads, keys as values...
    pub global_head_dim: Option<usize>,
    pub num_global_key_value_heads: Option<usize>,
    pub attention_k_eq_v: Option<bool>,
    /// ...layers that reuse earlier layers' keys and values, per-layer inputs...
    pub num_kv_shared_layers: Option<usize>,
    pub hidden_size_per_layer_input: Option<usize>,
    pub vocab_size_per_layer_input: Option<usize>,
    pub use_double_wide_mlp: Option<bool>,
    /// `None` when absent, `Some(None)` when null.
    #[serde(default, deserialize_with = "present")]
    pub final_logit_softcapping: Option<Option<f32>>,
    /// ...and its experts beside the dense MLP.
    pub enable_moe_block: Option<bool>,
    pub top_k_experts: Option<usize>,
    /// What some transformers versions save `moe_intermediate_size` as (Gemma 4).
    pub expert_intermediate_size: Option<usize>,
    /// Linear-attention hybrids (Qwen3-Next, Qwen3.5): the Gated DeltaNet layers' shape...
    pub linear_num_key_heads: Option<usize>,
    pub linear_num_value_heads: Option<usize>,
    pub linear_key_head_dim: Option<usize>,
    pub linear_value_head_dim: Option<usize>,
    pub linear_conv_kernel_dim: Option<usize>,
    /// ...and every n-th layer is full attention.
    pub full_attention_interval: Option<usize>,
    /// Their multi-token-prediction layers (`num_nextn_predict_layers` in some re-saves).
    #[serde(alias = "num_nextn_predict_layers")]
    pub mtp_num_hidden_layers: Option<usize>,
    /// LFM2's short convolutions: their width (the state keeps one input less) and biases.
    #[serde(rename = "conv_L_cache")]
    pub conv_l_cache: Option<usize>,
    pub conv_bias: Option<bool>,
    /// LFM2-MoE: dense MLPs in the first layers, a bias on the scores that choose experts, a
    /// factor on the chosen experts' weights.
    pub num_dense_layers: Option<usize>,
    pub use_expert_bias: Option<bool>,
    pub routed_scaling_factor: Option<f32>,
    /// SmolLM3: per layer, 1 where it uses rotary positions and 0 where not; else every n-th
    /// layer has none.
    pub no_rope_layers: Option<Vec<u8>>,
    pub no_rope_layer_interval: Option<usize>,
    /// Seed-OSS: a bias on the attention output and on the MLP's projections.
    pub attention_out_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    /// DeepSeek-style experts (GLM-4.x): their count, the shared ones, the dense first layers...
    pub n_routed_experts: Option<usize>,
    pub n_shared_experts: Option<usize>,
    pub first_k_dense_replace: Option<usize>,
    /// ...and how they are chosen: groups of experts, the best groups kept, the method.
    pub n_group: Option<usize>,
    pub topk_group: Option<usize>,
    pub topk_method: Option<String>,
    pub scoring_func: Option<String>,
    /// GLM-4.x (per head) and MiniMax-M2 (whole projections): q/k norms.
    pub use_qk_norm: Option<bool>,
    /// MiniMax-M2: how many dimensions of each head rotate.
    pub rotary_dim: Option<usize>,
    /// Latent attention (DeepSeek-V3): the bottlenecks (`q_lora_rank` absent: 1536, null: none)...
    #[serde(default, deserialize_with = "present_usize")]
    pub q_lora_rank: Option<Option<usize>>,
    pub kv_lora_rank: Option<usize>,
    /// ...and each head's parts.
    pub qk_nope_head_dim: Option<usize>,
    pub qk_rope_head_dim: Option<usize>,
    pub v_head_dim: Option<usize>,
    /// DeepSeek: every n-th layer past the dense ones has experts.
    pub moe_layer_freq: Option<usize>,
    /// Mamba-2 hybrids: Granite's names for the layer's shape...
    pub mamba_n_heads: Option<usize>,
    pub mamba_d_head: Option<usize>,
    pub mamba_d_state: Option<usize>,
    pub mamba_d_conv: Option<usize>,
    pub mamba_n_groups: Option<usize>,
    pub mamba_conv_bias: Option<bool>,
    pub mamba_proj_bias: Option<bool>,
    /// ...Nemotron's...
    pub mamba_num_heads: Option<usize>,
    pub mamba_head_dim: Option<usize>,
    pub ssm_state_size: Option<usize>,
    pub conv_kernel: Option<usize>,
    pub n_groups: Option<usize>,
    pub use_conv_bias: Option<bool>,
    pub layer_norm_epsilon: Option<f32>,
    /// ...the time step's clip (may hold infinities: see `model::json::json_float`)...
    pub time_step_limit: Option<Value>,
    /// ...Nemotron's blocks: a string or list of `M`, `*`, `-`, `E` (or their names)...
    pub hybrid_override_pattern: Option<Value>,
    pub layers_block_type: Option<Vec<String>>,
    pub moe_shared_expert_intermediate_size: Option<usize>,
    pub moe_latent_size: Option<usize>,
    /// ...and Granite's multipliers, shared MLP and positions.
    pub embedding_multiplier: Option<f32>,
    pub attention_multiplier: Option<f32>,
    pub residual_multiplier: Option<f32>,
    pub logits_scaling: Option<f32>,
    pub shared_intermediate_size: Option<usize>,
    pub position_embedding_type: Option<String>,
}

/// A field that may be null: `Some(None)` tells null from absent (`None`, by `default`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<f32>>, D::Error> {
    Ok(Some(Option::deserialize(d)?))
}

/// [`present`] for an integer.
fn present_usize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<usize>>, D::Error> {
    Ok(Some(Option::deserialize(d)?))
}

fn default_eps() -> f32 {
    1e-6
}
fn default_theta() -> f32 {
    10000.0
}
fn default_positions() -> usize {
    4096
}

/// Builds the normalised config of `arch` from its `config.json`.
pub fn model_config(arch: Arch, hf: &HfConfig) -> Result<ModelConfig, String> {
    let config = base_config(arch, hf)?;
    let config = match arch {
        Arch::Llama => llama::adapt(config, hf),
        Arch::Mistral => mistral::adapt(config, hf),
        Arch::Qwen2 => qwen2::adapt(config, hf),
        Arch::Qwen3 => qwen3::adapt(config, hf),
        Arch::Phi3 => phi3::adapt(config, hf),
        Arch::Qwen3Moe => qwen3_moe::adapt(config, hf),
        Arch::Qwen2Moe => qwen2_moe::adapt(config, hf),
        Arch::Mixtral => mixtral::adapt(config, hf),
        Arch::Gemma3 => gemma3::adapt(config, hf),
        Arch::GptOss => gpt_oss::adapt(config, hf),
        Arch::Ministral3 => ministral3::adapt(config, hf),
        Arch::Gemma4 => gemma4::adapt(config, hf),
        Arch::Qwen3Next => qwen3_next::adapt(config, hf),
        Arch::Qwen35 => qwen3_5::adapt(config, hf),
        Arch::Lfm2 => lfm2::adapt(config, hf),
        Arch::SmolLm3 => smollm3::adapt(config, hf),
        Arch::SeedOss => seed_oss::adapt(config, hf),
        Arch::Olmo3 => olmo3::adapt(config, hf),
        Arch::Glm4Moe => glm4_moe::adapt(config, hf),
        Arch::MiniMax => minimax::adapt(config, hf),
        Arch::DeepseekV3 | Arch::Glm4MoeLite => deepseek_v3::adapt(config, hf),
        Arch::GraniteMoeHybrid => granite_hybrid::adapt(config, hf),
        Arch::NemotronH => nemotron_h::adapt(config, hf),
    }?;
    if let Some(m) = config.mrope.filter(|m| m.section.iter().sum::<usize>() != config.rope.dims / 2) {
        return Err(format!(
            "mrope_section {:?} must sum to half the {} rotating dimensions",
            m.section, config.rope.dims
        ));
    }
    Ok(config)
}

/// The llama-family reading every architecture starts from.
fn base_config(arch: Arch, hf: &HfConfig) -> Result<ModelConfig, String> {
    // Latent attention's heads are sized by their own fields, whatever hidden / heads is (its
    // adapter sets them).
    let sized_apart = hf.head_dim.is_some() || matches!(arch, Arch::DeepseekV3 | Arch::Glm4MoeLite);
    if hf.num_attention_heads == 0 || !hf.hidden_size.is_multiple_of(hf.num_attention_heads) && !sized_apart {
        return Err(format!(
            "hidden_size {} is not a multiple of num_attention_heads {}",
            hf.hidden_size, hf.num_attention_heads
        ));
    }
    if hf.num_hidden_layers == 0 && arch != Arch::NemotronH {
        return Err("num_hidden_layers is missing or zero".into());
    }
    let num_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
    if num_kv_heads == 0 || !hf.num_attention_heads.is_multiple_of(num_kv_heads) {
        return Err(format!(
            "num_attention_heads {} is not a multiple of num_key_value_heads {num_kv_heads}",
            hf.num_attention_heads
        ));
    }
    let experts_everywhere = arch == Arch::Qwen35 && hf.extra.num_experts.unwrap_or(0) > 0;
    if hf.intermediate_size == 0 && !experts_everywhere {
        return Err("intermediate_size is missing or zero".into());
    }
    let head_dim = hf.head_dim.unwrap_or(hf.hidden_size / hf.num_attention_heads);
    let rotary = (head_dim as f32 * hf.partial_rotary_factor.unwrap_or(1.0)) as usize;
    Ok(ModelConfig {
        arch,
        vocab_size: hf.vocab_size,
        hidden_size: hf.hidden_size,
        intermediate_size: hf.intermediate_size,
        num_layers: hf.num_hidden_layers,
        num_heads: hf.num_attention_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: hf.rms_norm_eps,
        rope: RopeConfig {
            theta: hf.rope_theta,
            dims: rotary,
            traditional: hf.rope_traditional,
            scaling: rope_scaling(hf.rope_scaling.as_ref(), hf.original_max_position_embeddings)?,
        },
        max_position_embeddings: hf.max_position_embeddings,
        tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
        sliding_window: None,
        sliding_layers: Vec::new(),
        qkv_bias: hf.attention_bias,
        o_bias: false,
        mlp_bias: false,
        nope_layers: Vec::new(),
        attention_sinks: false,
        qk_norm: None,
        fused_projections: false,
        activation: Activation::Silu,
        attention_scale: None,
        norm_plus_one: false,
        norms: NormPlacement::Pre,
        sliding_rope: None,
        gemma: None,
        moe: None,
        query_scale: None,
        gemma4: None,
        hybrid: None,
        mtp_layers: 0,
        mrope: mrope(hf.rope_scaling.as_ref().or(hf.extra.rope_parameters.as_ref()))?,
        mla: None,
        multipliers: None,
        no_ffn_layers: Vec::new(),
    })
}

/// M-RoPE's sections, where the rotary settings name them.
fn mrope(value: Option<&Value>) -> Result<Option<MropeConfig>, String> {
    let Some(section) = value.and_then(|v| v.get("mrope_section")).filter(|s| !s.is_null()) else { return Ok(None) };
    let parts: Vec<usize> = section
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).map(|n| n as usize).collect())
        .unwrap_or_default();
    let [t, h, w] = parts[..] else { return Err(format!("mrope_section must be three integers: {section}")) };
    let interleaved = value.and_then(|v| v.get("mrope_interleaved")).and_then(Value::as_bool).unwrap_or(false);
    Ok(Some(MropeConfig { section: [t, h, w], interleaved }))
}

/// Reads `rope_scaling` (`type` or `rope_type`; "default" means none).
fn rope_scaling(value: Option<&Value>, original_max_positions: Option<usize>) -> Result<Option<RopeScaling>, String> {
    let Some(v) = value.filter(|v| !v.is_null()) else { return Ok(None) };
    let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(Value::as_str).unwrap_or("default");
    let num = |key: &str| v.get(key).and_then(Value::as_f64).map(|x| x as f32);
    let need = |key: &str| num(key).ok_or_else(|| format!("rope_scaling {kind:?} needs a numeric {key:?}"));
    let floats = |key: &str| -> Result<Vec<f32>, String> {
        v.get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_f64).map(|x| x as f32).collect())
            .ok_or_else(|| format!("rope_scaling {kind:?} needs a list {key:?}"))
    };
    Ok(Some(match kind {
        "default" => return Ok(None),
        "linear" => RopeScaling::Linear { factor: need("factor")? },
        "dynamic" => RopeScaling::Dynamic { factor: need("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: num("low_freq_factor").unwrap_or(1.0),
            high_freq_factor: num("high_freq_factor").unwrap_or(4.0),
            original_max_position_embeddings: num("original_max_position_embeddings").unwrap_or(8192.0) as usize,
        },
        // DeepSeek's configs name its YaRN so; the maths is the same.
        "yarn" | "deepseek_yarn" => RopeScaling::Yarn {
            factor: need("factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")
                .map(|n| n as usize)
                .or(original_max_positions)
                .ok_or("rope_scaling \"yarn\" needs original_max_position_embeddings")?,
            beta_fast: num("beta_fast").unwrap_or(32.0),
            beta_slow: num("beta_slow").unwrap_or(1.0),
            mscale: num("mscale").unwrap_or(1.0),
            mscale_all_dim: num("mscale_all_dim").unwrap_or(0.0),
        },
        "longrope" | "su" => RopeScaling::LongRope {
            short_factor: floats("short_factor")?,
            long_factor: floats("long_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")
                .map(|n| n as usize)
                .or(original_max_positions)
                .ok_or("rope_scaling \"longrope\" needs original_max_position_embeddings")?,
            short_mscale: num("short_mscale"),
            long_mscale: num("long_mscale"),
        },
        "proportional" => RopeScaling::Proportional {
            factor: num("factor").unwrap_or(1.0),
            partial_rotary_factor: num("partial_rotary_factor").unwrap_or(1.0),
        },
        other => {
            return Err(format!(
                "unsupported rope_scaling type {other:?} (supported: linear, dynamic, llama3, yarn, longrope, proportional)"
            ))
        }
    }))
}

/// Which layers `layer_types` marks "sliding_attention", if the config has the list (checked
/// against the layer count).
fn sliding_layers(hf: &HfConfig, layers: usize) -> Result<Option<Vec<bool>>, String> {
    match &hf.layer_types {
        None => Ok(None),
        Some(types) if types.len() != layers => {
            Err(format!("layer_types lists {} layers, the model has {layers}", types.len()))
        }
        Some(types) => Ok(Some(types.iter().map(|t| t == "sliding_attention").collect())),
    }
}

/// Checkpoint layouts a family must convert before its tensors are read (gpt-oss's, Gemma 4's
/// and Qwen3-VL-MoE's fused experts); a no-op for the others.
pub fn sanitize(config: &ModelConfig, weights: &mut crate::model::weights::Weights) -> crate::model::error::Result<()> {
    match config.arch {
        Arch::GptOss => gpt_oss::split_fused_experts(weights, config.num_layers),
        Arch::Gemma4 => gemma4::sanitize(weights, config),
        Arch::Qwen3Next | Arch::Qwen35 => qwen3_next::sanitize(weights, config),
        Arch::Lfm2 => lfm2::sanitize(weights, config),
        Arch::Qwen3Moe => qwen3_moe::split_fused_experts(weights, config.num_layers),
        Arch::Glm4Moe => glm4_moe::sanitize(weights, config),
        Arch::DeepseekV3 | Arch::Glm4MoeLite => deepseek_v3::sanitize(weights, config),
        Arch::GraniteMoeHybrid => granite_hybrid::sanitize(weights, config),
        Arch::NemotronH => nemotron_h::sanitize(weights, config),
        _ => Ok(()),
    }
}

/// Mamba-2 convolutions as Hugging Face stores them, `[C, 1, K]` -> MLX's `[C, K, 1]`.
fn mamba_conv_layout(
    weights: &mut crate::model::weights::Weights,
    config: &ModelConfig,
) -> crate::model::error::Result<()> {
    for l in (0..config.num_layers).filter(|&l| config.is_recurrent(l)) {
        let name = format!("model.layers.{l}.mamba.conv1d.weight");
        if let Some(w) = weights.remove(&name) {
            let raw = w.ndim() == 3 && w.dim(-1) != 1;
            weights.insert(name, if raw { w.swap_axes(1, 2)? } else { w });
        }
    }
    Ok(())
}

/// Checks an expert layout before anything is built from it.
fn checked(moe: MoeConfig) -> Result<MoeConfig, String> {
    if moe.top_k == 0 || moe.top_k > moe.num_experts {
        return Err(format!("num_experts_per_tok {} must be between 1 and the {} experts", moe.top_k, moe.num_experts));
    }
    Ok(moe)
}

/// The Mamba-2 time step's clip: `time_step_limit` (a pair; infinities as Python's json or
/// mlx-lm write them), else `default`.
fn time_step_limit(hf: &HfConfig, default: (f32, f32)) -> Result<(f32, f32), String> {
    let Some(value) = hf.extra.time_step_limit.as_ref().filter(|v| !v.is_null()) else { return Ok(default) };
    let pair: Vec<f64> =
        value.as_array().map(|a| a.iter().filter_map(crate::model::json::json_float).collect()).unwrap_or_default();
    match pair[..] {
        [lo, hi] if !lo.is_nan() && !hi.is_nan() && lo <= hi => Ok((lo as f32, hi as f32)),
        _ => Err(format!("time_step_limit must be two numbers, the smaller first: {value}")),
    }
}

/// A field every expert family needs, or a clear error naming it.
fn required(value: Option<usize>, name: &str) -> Result<usize, String> {
    value.filter(|&n| n > 0).ok_or_else(|| format!("{name} is missing or zero"))
}
