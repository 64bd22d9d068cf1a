//! A single GGUF file: hyper-parameters (experts included) tokenizer and chat template from its
//! metadata, tensors (read by `gguf_tensors.rs`) renamed to the Hugging Face layout, and
//! llama.cpp's Q/K row permutation undone so the shared rotary code applies.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::Dtype;

use super::gguf_header::{GgufHeader, MetaValue};
use super::gguf_tensors;
use crate::mlx::Backend;
use crate::model::arch::{self, HfConfig};
use crate::model::config::Arch;
use crate::model::error::{ModelError, Result};
use crate::model::weights::{QuantConfig, Weights};
use crate::model::Transformer;
use crate::tokenizer::{tokenizer_from_gguf_metadata, ChatTemplate, GgufTokenizerMetadata, Tokenizer};

/// Whether this build reads tensors of ggml type `t`.
pub fn is_readable_type(t: u32) -> bool {
    gguf_tensors::is_readable(t)
}

/// The name of a ggml tensor type, for messages.
pub fn ggml_type_name(t: u32) -> String {
    let known = [
        (0, "F32"),
        (1, "F16"),
        (2, "Q4_0"),
        (3, "Q4_1"),
        (6, "Q5_0"),
        (7, "Q5_1"),
        (8, "Q8_0"),
        (9, "Q8_1"),
        (10, "Q2_K"),
        (11, "Q3_K"),
        (12, "Q4_K"),
        (13, "Q5_K"),
        (14, "Q6_K"),
        (15, "Q8_K"),
        (30, "BF16"),
        (39, "MXFP4"),
    ];
    known.iter().find(|(id, _)| *id == t).map_or_else(|| format!("type {t} (IQ or newer)"), |(_, n)| n.to_string())
}

pub fn load(
    path: &Path,
    backend: &Backend,
    options: &super::LoadOptions,
) -> Result<(Transformer, Tokenizer, Option<ChatTemplate>)> {
    // Reading the header first also rejects what is not GGUF, with the file's name.
    let header = super::gguf_header::read_all(path)
        .map_err(|e| ModelError::Weights { path: path.to_path_buf(), message: e.to_string() })?;
    check_tensor_types(&header, path)?;
    let meta = Metadata { header: &header, path };
    let (arch_name, tok, config) = config_of(&meta)?;

    let expand = super::expand_quantized(options, backend, config.parameter_count());
    let tensors = gguf_tensors::read(path, &header, expand)?;
    let mut weights = Weights::new(
        tensors,
        path.to_path_buf(),
        QuantConfig { infer_bits_with_group: Some(gguf_tensors::GROUP as i32), ..Default::default() },
        backend.compute_dtype(Dtype::Float16),
    );
    weights.expand_quantized = expand;
    // Llama 3.1 GGUFs carry their rope scaling as precomputed per-pair factors.
    let mut config = config;
    if let Some(factors) = weights.remove("rope_freqs.weight") {
        let factors = factors.as_dtype(Dtype::Float32)?;
        factors.eval()?;
        config.rope.scaling =
            Some(crate::model::config::RopeScaling::Factors { factors: factors.as_slice::<f32>().to_vec() });
    }
    let fused_up = config.fused_projections;
    weights.rename_all(|name| hf_tensor_name(name, fused_up));
    // llama.cpp's converter permutes the q/k rows of its "llama" architecture (Mixtral's too).
    if arch_name == "llama" {
        unpermute_qk(&mut weights, &config)?;
    }
    // Qwen2-MoE's shared-expert gate is a vector in GGUF, a 1-row matrix in the layout read.
    for l in 0..config.num_layers {
        let name = format!("model.layers.{l}.mlp.shared_expert_gate.weight");
        if let Some(gate) = weights.remove(&name) {
            let gate = if gate.ndim() == 1 { gate.reshape(&[1, -1])? } else { gate };
            weights.insert(name, gate);
        }
    }
    config.tie_word_embeddings = !weights.contains("lm_head.weight");
    let transformer = Transformer::build(config, &mut weights)?;

    let tokenizer_err = |message: String| ModelError::Tokenizer { path: path.to_path_buf(), message };
    let inner = tokenizer_from_gguf_metadata(&tok).map_err(|e| tokenizer_err(e.to_string()))?;
    let token_text = |id: Option<u32>| id.and_then(|i| tok.tokens.get(i as usize).cloned());
    let bos_id = meta.uint("tokenizer.ggml.bos_token_id")?;
    let eos_id = meta.uint("tokenizer.ggml.eos_token_id")?;
    let mut stop_ids: Vec<u32> = eos_id.into_iter().collect();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        stop_ids.extend(meta.uint(key)?);
    }
    let add_bos = meta.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let (bos, eos) = (token_text(bos_id), token_text(eos_id));
    let tokenizer = Tokenizer::new(inner, bos.clone(), eos.clone(), &stop_ids, if add_bos { bos_id } else { None });
    let template = meta
        .string("tokenizer.chat_template")?
        .map(|s| ChatTemplate::new(&s, bos, eos))
        .transpose()
        .map_err(|e| tokenizer_err(e.to_string()))?;
    Ok((transformer, tokenizer, template))
}

/// The architecture of a GGUF's `general.architecture` (llama.cpp's names; Mixtral is "llama"
/// with experts).
/// The model's shape from the GGUF header alone (no tensor data read).
pub fn read_config(path: &Path) -> Result<crate::model::ModelConfig> {
    let header = super::gguf_header::read_all(path)
        .map_err(|e| ModelError::Weights { path: path.to_path_buf(), message: e.to_string() })?;
    Ok(config_of(&Metadata { header: &header, path })?.2)
}

/// The architecture's name, the tokenizer's metadata and the model's configuration.
fn config_of(meta: &Metadata) -> Result<(String, GgufTokenizerMetadata, crate::model::ModelConfig)> {
    let path = meta.path;
    let arch_name = meta.string("general.architecture")?.unwrap_or_default();
    let experts = meta.number(&format!("{arch_name}.expert_count"))?.unwrap_or(0.0) > 0.0;
    let arch = gguf_arch(&arch_name, experts).ok_or_else(|| ModelError::Config {
        path: path.to_path_buf(),
        message: format!(
            "GGUF files of the {arch_name:?} architecture are not read (GGUF architectures read: llama, {}); \
             load the model's MLX or Hugging Face folder instead",
            GGUF_ARCHS.join(", ")
        ),
    })?;
    let tok = tokenizer_metadata(meta)?;
    let mut hf = hf_config(meta, &arch_name, tok.tokens.len())?;
    hf.extra = expert_config(meta, &arch_name, arch)?;
    let config =
        arch::model_config(arch, &hf).map_err(|message| ModelError::Config { path: path.to_path_buf(), message })?;
    Ok((arch_name, tok, config))
}

/// llama.cpp's architectures whose tensors map onto the shared layout here (`hf_tensor_name`):
/// Llama's layers, with q/k norms, a fused qkv, or experts. Others (Gemma's sandwich norms,
/// the hybrids' states, DeepSeek's latent attention, Nemotron-H's blocks) are refused by name.
const GGUF_ARCHS: [&str; 6] = ["mistral", "qwen2", "qwen3", "phi3", "qwen2moe", "qwen3moe"];

pub fn gguf_arch(name: &str, experts: bool) -> Option<Arch> {
    match name {
        "llama" if experts => Some(Arch::Mixtral),
        "llama" => Some(Arch::Llama),
        "qwen3moe" => Some(Arch::Qwen3Moe),
        "qwen2moe" => Some(Arch::Qwen2Moe),
        other if GGUF_ARCHS.contains(&other) => Arch::from_model_type(other),
        _ => None,
    }
}

/// The mixture-of-experts fields of `config.json` from llama.cpp's `<arch>.expert_*` keys.
fn expert_config(meta: &Metadata, arch_name: &str, arch: Arch) -> Result<arch::HfExtras> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let count = |k: &str| -> Result<Option<usize>> { Ok(meta.number(&key(k))?.map(|n| n as usize)) };
    let experts = count("expert_count")?;
    Ok(arch::HfExtras {
        num_experts: experts,
        num_local_experts: experts,
        num_experts_per_tok: count("expert_used_count")?,
        moe_intermediate_size: count("expert_feed_forward_length")?,
        shared_expert_intermediate_size: count("expert_shared_feed_forward_length")?,
        // llama.cpp renormalises Qwen3-MoE's top-k weights (as every Qwen3-MoE config asks),
        // and not Qwen2-MoE's.
        norm_topk_prob: Some(arch == Arch::Qwen3Moe),
        ..Default::default()
    })
}

/// A file with tensors of a type not read fails here, naming the type and a tensor.
fn check_tensor_types(header: &GgufHeader, path: &Path) -> Result<()> {
    let unreadable = header.tensor_types.iter().zip(&header.tensor_names).find(|(t, _)| !is_readable_type(**t));
    match unreadable {
        None => Ok(()),
        Some((t, name)) => Err(ModelError::Weights {
            path: path.to_path_buf(),
            message: format!(
                "{} tensors ({name}) are not read yet; GGUF files of {} tensors load, or use an MLX conversion",
                ggml_type_name(*t),
                gguf_tensors::readable_names().join(", ")
            ),
        }),
    }
}

struct Metadata<'a> {
    header: &'a GgufHeader,
    path: &'a Path,
}

impl Metadata<'_> {
    fn err(&self, key: &str, e: impl std::fmt::Display) -> ModelError {
        ModelError::Config { path: self.path.to_path_buf(), message: format!("metadata {key:?}: {e}") }
    }

    fn string(&self, key: &str) -> Result<Option<String>> {
        match self.header.get(key) {
            Some(MetaValue::Str(s)) => Ok(Some(s.clone())),
            None => Ok(None),
            Some(_) => Err(self.err(key, "expected a string")),
        }
    }

    fn list(&self, key: &str) -> Result<&[MetaValue]> {
        match self.header.get(key) {
            Some(MetaValue::List(items)) => Ok(items),
            None => Ok(&[]),
            Some(_) => Err(self.err(key, "expected a list")),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>> {
        self.list(key)?
            .iter()
            .map(|v| match v {
                MetaValue::Str(s) => Ok(s.clone()),
                _ => Err(self.err(key, "expected a list of strings")),
            })
            .collect()
    }

    fn number(&self, key: &str) -> Result<Option<f64>> {
        match self.header.get(key) {
            Some(MetaValue::Int(i)) => Ok(Some(*i as f64)),
            Some(MetaValue::Float(f)) => Ok(Some(*f)),
            None => Ok(None),
            Some(_) => Err(self.err(key, "expected a number")),
        }
    }

    fn uint(&self, key: &str) -> Result<Option<u32>> {
        match self.header.get(key) {
            Some(MetaValue::Int(i)) => u32::try_from(*i).map(Some).map_err(|_| self.err(key, "out of range")),
            None => Ok(None),
            Some(_) => Err(self.err(key, "expected an integer")),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.header.get(key) {
            Some(MetaValue::Bool(b)) => Ok(Some(*b)),
            None => Ok(None),
            Some(_) => Err(self.err(key, "expected a boolean")),
        }
    }

    fn ints(&self, key: &str) -> Result<Vec<i32>> {
        self.list(key)?
            .iter()
            .map(|v| match v {
                MetaValue::Int(i) => i32::try_from(*i).map_err(|_| self.err(key, "out of range")),
                _ => Err(self.err(key, "expected a list of integers")),
            })
            .collect()
    }

    fn required(&self, key: &str) -> Result<usize> {
        self.number(key)?.map(|n| n as usize).ok_or_else(|| self.err(key, "missing"))
    }
}

fn tokenizer_metadata(meta: &Metadata) -> Result<GgufTokenizerMetadata> {
    Ok(GgufTokenizerMetadata {
        model: meta.string("tokenizer.ggml.model")?.unwrap_or_default(),
        pre: meta.string("tokenizer.ggml.pre")?,
        tokens: meta.strings("tokenizer.ggml.tokens")?,
        merges: meta.strings("tokenizer.ggml.merges")?,
        token_types: meta.ints("tokenizer.ggml.token_type")?,
    })
}

/// The GGUF hyper-parameters (`<arch>.*`) as the `config.json` fields they came from.
fn hf_config(meta: &Metadata, arch: &str, n_tokens: usize) -> Result<HfConfig> {
    let key = |k: &str| format!("{arch}.{k}");
    let heads = meta.required(&key("attention.head_count"))?;
    let hidden = meta.required(&key("embedding_length"))?;
    let head_dim = meta.number(&key("attention.key_length"))?.map(|n| n as usize);
    let rotary = meta.number(&key("rope.dimension_count"))?.map(|n| n as usize);
    let scaling = match (meta.string(&key("rope.scaling.type"))?, meta.number(&key("rope.scaling.factor"))?) {
        (Some(kind), Some(factor)) if kind != "none" => Some(serde_json::json!({"type": kind, "factor": factor})),
        _ => None,
    };
    let head_dim_or_default = head_dim.unwrap_or(hidden / heads.max(1));
    Ok(HfConfig {
        model_type: arch.to_string(),
        vocab_size: meta.number(&key("vocab_size"))?.map_or(n_tokens, |n| n as usize),
        hidden_size: hidden,
        intermediate_size: meta.required(&key("feed_forward_length"))?,
        num_hidden_layers: meta.required(&key("block_count"))?,
        num_attention_heads: heads,
        num_key_value_heads: meta.number(&key("attention.head_count_kv"))?.map(|n| n as usize),
        head_dim,
        rms_norm_eps: meta.number(&key("attention.layer_norm_rms_epsilon"))?.map_or(1e-5, |n| n as f32),
        rope_theta: meta.number(&key("rope.freq_base"))?.map_or(10000.0, |n| n as f32),
        rope_traditional: false,
        rope_scaling: scaling,
        max_position_embeddings: meta.number(&key("context_length"))?.map_or(4096, |n| n as usize),
        tie_word_embeddings: None,
        sliding_window: meta.number(&key("attention.sliding_window"))?.map(|n| n as usize),
        use_sliding_window: None,
        layer_types: None,
        attention_bias: false,
        partial_rotary_factor: rotary.map(|r| r as f32 / head_dim_or_default as f32),
        original_max_position_embeddings: None,
        extra: Default::default(),
    })
}

/// llama.cpp's tensor names -> Hugging Face's. `None` drops a tensor nothing reads.
fn hf_tensor_name(name: &str, fused_up: bool) -> Option<String> {
    let (base, suffix) = name.rsplit_once('.')?;
    let mapped = match base {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        _ => {
            let rest = base.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let hf = match part {
                "attn_norm" => "input_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_qkv" => "self_attn.qkv_proj",
                "attn_output" => "self_attn.o_proj",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" if fused_up => "mlp.gate_up_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                // Experts: the router, every expert's matrices stacked, a shared expert.
                "ffn_gate_inp" => "mlp.gate",
                "ffn_gate_exps" => "mlp.switch_mlp.gate_proj",
                "ffn_up_exps" => "mlp.switch_mlp.up_proj",
                "ffn_down_exps" => "mlp.switch_mlp.down_proj",
                "ffn_gate_inp_shexp" => "mlp.shared_expert_gate",
                "ffn_gate_shexp" => "mlp.shared_expert.gate_proj",
                "ffn_up_shexp" => "mlp.shared_expert.up_proj",
                "ffn_down_shexp" => "mlp.shared_expert.down_proj",
                // Older Mixtral files: one tensor per expert (`ffn_gate.3`), stacked at load.
                _ => match part.rsplit_once('.').filter(|(_, e)| e.parse::<usize>().is_ok()) {
                    Some((proj @ ("ffn_gate" | "ffn_up" | "ffn_down"), expert)) => {
                        let proj = &proj["ffn_".len()..];
                        return Some(format!("model.layers.{layer}.mlp.experts.{expert}.{proj}_proj.{suffix}"));
                    }
                    _ => return Some(name.to_string()),
                },
            };
            format!("model.layers.{layer}.{hf}")
        }
    };
    Some(format!("{mapped}.{suffix}"))
}

/// llama.cpp stores llama's q/k rows interleaved per head for its rotary kernel
/// (`w.reshape(heads, 2, d/2, ..).swapaxes(1, 2)`); this reverses it (reshape to
/// `(heads, d/2, 2, ..)`, swap back). Packed weights, scales
/// and biases all have one row per output feature, so the same row shuffle applies to each.
fn unpermute_qk(weights: &mut Weights, config: &crate::model::ModelConfig) -> Result<()> {
    let mut undo = HashMap::new();
    for i in 0..config.num_layers {
        for (proj, heads) in [("q_proj", config.num_heads), ("k_proj", config.num_kv_heads)] {
            for part in ["weight", "scales", "biases", "bias"] {
                undo.insert(format!("model.layers.{i}.self_attn.{proj}.{part}"), heads as i32);
            }
        }
    }
    for (name, heads) in undo {
        let Some(w) = weights.remove(&name) else { continue };
        let shape = w.shape().to_vec();
        let rows = shape[0];
        if rows % (2 * heads) != 0 {
            return Err(ModelError::Shape {
                path: weights.source.clone(),
                name,
                expected: vec![heads * 2, -1],
                got: shape,
            });
        }
        let mut split = vec![heads, rows / heads / 2, 2];
        split.extend_from_slice(&shape[1..]);
        let w = w.reshape(&split)?.swap_axes(1, 2)?.reshape(&shape)?;
        weights.insert(name, w);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_architectures_whose_tensors_map_are_read() {
        assert_eq!(gguf_arch("llama", false), Some(Arch::Llama));
        assert_eq!(gguf_arch("llama", true), Some(Arch::Mixtral));
        assert_eq!(gguf_arch("qwen3", false), Some(Arch::Qwen3));
        // Families FastMLX loads from folders, whose GGUF layouts are not mapped.
        for name in ["nemotron_h", "deepseek2", "glm4moe", "gemma3", "lfm2", "olmo3", "smollm3"] {
            assert_eq!(gguf_arch(name, false), None, "{name}");
        }
    }
}
