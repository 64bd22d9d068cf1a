//! Tiny random-weight models of every supported architecture, written to disk in the Hugging
//! Face layout (config, safetensors, a byte-level tokenizer, a ChatML template). Tests, the
//! reference scripts (`scripts/reference/tiny_models.py` runs mlx-lm on the same files) and
//! benchmarks use them; `fastmlx make-test-model` writes one.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::Array;
use serde_json::{json, Value};

use crate::model::config::{Arch, QuantMode, QuantSpec};
use crate::model::error::{ModelError, Result};
use crate::model::layers::quant_ops;
use crate::model::{synthetic_gemma4, synthetic_hybrid};
use crate::sampling::Rng;

/// Sizes of the tiny models: small enough for milliseconds per token on a CPU, large enough
/// for grouped KV heads, quantization groups of 64 and a few layers.
pub const VOCAB: usize = 259;
pub const HIDDEN: usize = 128;
const INTERMEDIATE: usize = 256;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;
/// Mistral's tiny model uses a window shorter than the test sequences, so it matters.
pub const MISTRAL_WINDOW: usize = 12;
/// Experts of the tiny mixture-of-experts models, and each one's hidden size.
const EXPERTS: usize = 8;
const EXPERT_INTERMEDIATE: usize = 64;
/// Qwen3-MoE routes each token to 4 experts, so a 21-token prompt (84 choices) takes the
/// sorted expert path and a decode step the unsorted one.
const QWEN3_MOE_TOP_K: usize = 4;

/// The spec `--bits` with `--mode` stands for (each float mode has one group size).
pub fn quant_spec(mode: &str, bits: i32) -> std::result::Result<QuantSpec, String> {
    let mode: QuantMode =
        serde_json::from_value(Value::from(mode)).map_err(|_| format!("unknown quantization mode {mode:?}"))?;
    let group_size = match mode {
        QuantMode::Affine => 64,
        QuantMode::Mxfp4 | QuantMode::Mxfp8 => 32,
        QuantMode::Nvfp4 => 16,
    };
    let spec = QuantSpec { group_size, bits, mode };
    if spec.is_supported() {
        Ok(spec)
    } else {
        Err(format!("{mode:?} cannot hold {bits} bits"))
    }
}

/// How a tiny model is written, beyond its architecture.
#[derive(Debug, Clone, Copy, Default)]
pub struct TinyOptions {
    /// Quantize the matrices (router gates at 8 bits, as mlx-lm's MoE recipes do).
    pub quant: Option<QuantSpec>,
    /// Experts as Hugging Face stores them (one tensor per expert) rather than stacked as MLX does.
    pub per_expert: bool,
    /// Inside a multimodal wrapper (`gemma3` / `mistral3` with `text_config`, weights under
    /// `language_model.`, and a vision tensor the loader must skip).
    pub wrapped: bool,
    /// The family's mixture-of-experts variant (Gemma 4).
    pub moe: bool,
}

/// Every architecture as the engine tests run it: each one's default tiny model, and the
/// variants whose layers differ in a way the caches see (Gemma 4's experts, with keys as values
/// and fewer KV heads in its global layers).
pub fn engine_variants() -> Vec<(Arch, TinyOptions)> {
    let mut out: Vec<(Arch, TinyOptions)> = Arch::ALL.iter().map(|&a| (a, TinyOptions::default())).collect();
    out.push((Arch::Gemma4, TinyOptions { moe: true, ..TinyOptions::default() }));
    out
}

/// The three special tokens after the 256 byte tokens.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

const CHATML_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

pub fn config_json(arch: Arch, quant: Option<QuantSpec>) -> Value {
    config_json_with(arch, &TinyOptions { quant, ..TinyOptions::default() })
}

pub fn config_json_with(arch: Arch, options: &TinyOptions) -> Value {
    let quant = options.quant;
    let mut c = json!({
        "model_type": arch.model_type(),
        "architectures": ["TinyForCausalLM"],
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": tied(arch),
        "eos_token_id": 258,
        "bos_token_id": 257,
        "torch_dtype": "float32",
    });
    match arch {
        Arch::Llama => {
            c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
        }
        Arch::Mistral => {
            c["sliding_window"] = json!(MISTRAL_WINDOW);
            // mlx-lm needs one full-attention layer; mixed layers are what newer Mistrals use.
            c["layer_types"] = json!(["sliding_attention", "full_attention"]);
        }
        Arch::Qwen2 => {
            c["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
        }
        Arch::Qwen3 => {
            c["head_dim"] = json!(48);
        }
        Arch::Phi3 => {
            // Rotary on half of each head; longrope factors for those 16 dims' 8 pairs, and a
            // pre-training window shorter than the model's so the magnitude scale applies.
            c["partial_rotary_factor"] = json!(0.5);
            c["original_max_position_embeddings"] = json!(128);
            c["rope_scaling"] = json!({"type": "longrope",
                "short_factor": [1.0, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, 4.0],
                "long_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0]});
        }
        Arch::Qwen3Moe => {
            // Layer 0 routed, layer 1 dense: both kinds in one model.
            c["head_dim"] = json!(HEAD_DIM);
            c["num_experts"] = json!(EXPERTS);
            c["num_experts_per_tok"] = json!(QWEN3_MOE_TOP_K);
            c["moe_intermediate_size"] = json!(EXPERT_INTERMEDIATE);
            c["decoder_sparse_step"] = json!(1);
            c["mlp_only_layers"] = json!([1]);
            c["norm_topk_prob"] = json!(true);
        }
        Arch::Qwen2Moe => {
            c["num_experts"] = json!(EXPERTS);
            c["num_experts_per_tok"] = json!(2);
            c["moe_intermediate_size"] = json!(EXPERT_INTERMEDIATE);
            c["shared_expert_intermediate_size"] = json!(INTERMEDIATE);
        }
        Arch::Mixtral => {
            c["num_local_experts"] = json!(EXPERTS);
            c["num_experts_per_tok"] = json!(2);
            c["intermediate_size"] = json!(EXPERT_INTERMEDIATE);
            c["rope_theta"] = json!(1e6);
        }
        Arch::GptOss => {
            // Sliding then full attention, YaRN, 4 of 8 experts (84 choices for a 21-token
            // prompt: the sorted path), a clamp the activations reach.
            c["head_dim"] = json!(HEAD_DIM);
            c["num_local_experts"] = json!(EXPERTS);
            c["num_experts_per_tok"] = json!(4);
            c["experts_per_token"] = json!(4);
            c["intermediate_size"] = json!(EXPERT_INTERMEDIATE);
            c["sliding_window"] = json!(MISTRAL_WINDOW);
            c["layer_types"] = json!(["sliding_attention", "full_attention"]);
            c["attention_bias"] = json!(true);
            c["swiglu_limit"] = json!(7.0);
            c["rope_theta"] = json!(150000);
            c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "original_max_position_embeddings": 64, "truncate": false});
        }
        Arch::Ministral3 => {
            // YaRN from rope_parameters, and a pre-training window of 8 so the query scale
            // changes every 8 positions of the test sequences; one sliding, one full layer.
            c["head_dim"] = json!(HEAD_DIM);
            c["sliding_window"] = json!(MISTRAL_WINDOW);
            c["layer_types"] = json!(["sliding_attention", "full_attention"]);
            c["rope_parameters"] = json!({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5});
        }
        Arch::Gemma3 => {
            // One local layer (window shorter than the test prompts), one global layer with
            // linear rope scaling; a query scale unlike head_dim's.
            c["head_dim"] = json!(HEAD_DIM);
            c["sliding_window"] = json!(MISTRAL_WINDOW);
            c["sliding_window_pattern"] = json!(2);
            c["query_pre_attn_scalar"] = json!(48);
            c["rope_theta"] = json!(1e6);
            c["rope_local_base_freq"] = json!(10000.0);
            c["rope_scaling"] = json!({"rope_type": "linear", "factor": 8.0});
            c["hidden_activation"] = json!("gelu_pytorch_tanh");
        }
        Arch::Gemma4 => synthetic_gemma4::config(&mut c, options),
        Arch::Qwen3Next | Arch::Qwen35 | Arch::Lfm2 => synthetic_hybrid::config(&mut c, arch, options),
    }
    if arch == Arch::GptOss && options.per_expert {
        // OpenAI's release: experts in mxfp4 blocks, everything else unquantized.
        c["quantization_config"] = json!({"quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]});
    }
    if let Some(q) = quant {
        let mut spec = json!({"group_size": q.group_size, "bits": q.bits});
        if q.mode != QuantMode::Affine {
            spec["mode"] = serde_json::to_value(format!("{:?}", q.mode).to_lowercase()).expect("a string");
        }
        for module in synthetic_gemma4::router_modules(options).into_iter().filter(|_| arch == Arch::Gemma4) {
            spec[format!("{}{module}", module_prefix(arch, options))] = json!({"group_size": q.group_size, "bits": 8});
        }
        if arch_has_experts(arch) {
            for l in 0..LAYERS {
                let router = if arch == Arch::GptOss { "router" } else { "gate" };
                spec[format!("{}model.layers.{l}.{}.{router}", module_prefix(arch, options), moe_block(arch))] =
                    json!({"group_size": q.group_size, "bits": 8});
            }
        }
        c["quantization"] = spec;
        c["quantization_config"] = c["quantization"].clone();
    }
    if wrapped(arch, options) {
        let outer = match arch {
            Arch::Gemma3 => "gemma3",
            Arch::Gemma4 => "gemma4",
            Arch::Qwen35 => synthetic_hybrid::outer_type(options),
            _ => "mistral3",
        };
        let mut text = c.clone();
        let mut top = json!({"model_type": outer, "architectures": ["TinyForConditionalGeneration"],
            "vocab_size": VOCAB, "eos_token_id": 258, "bos_token_id": 257, "torch_dtype": "float32",
            "vision_config": {"hidden_size": 16}});
        for key in ["quantization", "quantization_config"] {
            if let Some(v) = text.as_object_mut().and_then(|t| t.remove(key)) {
                top[key] = v;
            }
        }
        top["text_config"] = text;
        return top;
    }
    c
}

/// Whether the text model sits inside a multimodal wrapper (Qwen3.5's always does).
fn wrapped(arch: Arch, options: &TinyOptions) -> bool {
    options.wrapped || arch == Arch::Qwen35
}

/// Real Gemma 3 ties its head to the embeddings too, but a tiny tied model whose embeddings are
/// scaled by sqrt(hidden) only echoes its input; an own head (which the reference also
/// accepts) makes its outputs compare something.
fn tied(arch: Arch) -> bool {
    matches!(arch, Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Lfm2)
}

fn arch_has_experts(arch: Arch) -> bool {
    matches!(arch, Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Mixtral | Arch::GptOss)
}

/// The feed-forward block's name in the checkpoint.
fn moe_block(arch: Arch) -> &'static str {
    if arch == Arch::Mixtral {
        "block_sparse_moe"
    } else {
        "mlp"
    }
}

/// Where the text model's tensors live in the written checkpoint.
fn module_prefix(arch: Arch, options: &TinyOptions) -> &'static str {
    if wrapped(arch, options) {
        "language_model."
    } else {
        ""
    }
}

/// A named tensor as written: name, shape, values.
pub type Tensor = (String, Vec<i32>, Vec<f32>);

/// Random tensors in draw order (the order fixes every tiny model's weights): values uniform in
/// `center ± scale`.
pub(crate) struct Draws {
    rng: Rng,
    pub out: Vec<Tensor>,
}

impl Draws {
    pub fn new(seed: u64) -> Draws {
        Draws { rng: Rng::seeded(seed), out: Vec::new() }
    }

    pub fn tensor(&mut self, name: String, shape: Vec<i32>, scale: f32, center: f32) {
        let n: i32 = shape.iter().product();
        let data = (0..n).map(|_| center + scale * (2.0 * self.rng.next_f64() as f32 - 1.0)).collect();
        self.out.push((name, shape, data));
    }
}

/// The tensors of a tiny model of `arch`, named as in Hugging Face checkpoints.
pub fn random_weights(arch: Arch, seed: u64) -> Vec<Tensor> {
    random_weights_with(arch, seed, &TinyOptions::default())
}

pub fn random_weights_with(arch: Arch, seed: u64, options: &TinyOptions) -> Vec<Tensor> {
    if arch == Arch::Gemma4 {
        return synthetic_gemma4::random_weights(seed, options);
    }
    if matches!(arch, Arch::Qwen3Next | Arch::Qwen35 | Arch::Lfm2) {
        return synthetic_hybrid::random_weights(arch, seed, options);
    }
    let mut draws = Draws::new(seed);
    let mut tensor = |name: String, shape: Vec<i32>, scale: f32, center: f32| draws.tensor(name, shape, scale, center);
    let head_dim = if arch == Arch::Qwen3 { 48 } else { HEAD_DIM } as i32;
    let (h, i, q, kv) = (HIDDEN as i32, INTERMEDIATE as i32, HEADS as i32 * head_dim, KV_HEADS as i32 * head_dim);
    let proj = |fan_in: i32| 1.7 / (fan_in as f32).sqrt();
    // Gemma's norms scale by 1 + weight: centre its weights on 0.
    let norm_center = if arch == Arch::Gemma3 { 0.0 } else { 1.0 };
    tensor("model.embed_tokens.weight".into(), vec![VOCAB as i32, h], 1.0, 0.0);
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        tensor(format!("{p}.input_layernorm.weight"), vec![h], 0.1, norm_center);
        if arch == Arch::Gemma3 {
            // Branch outputs normalised, then scaled up against the sqrt(hidden)-scaled
            // embeddings so the layers matter.
            tensor(format!("{p}.post_attention_layernorm.weight"), vec![h], 0.5, 2.0);
            tensor(format!("{p}.pre_feedforward_layernorm.weight"), vec![h], 0.1, norm_center);
            tensor(format!("{p}.post_feedforward_layernorm.weight"), vec![h], 0.5, 2.0);
        } else {
            tensor(format!("{p}.post_attention_layernorm.weight"), vec![h], 0.1, norm_center);
        }
        // (The order of these draws fixes the older architectures' weights: keep it.)
        let routed = arch_has_experts(arch) && !(arch == Arch::Qwen3Moe && l == 1);
        if arch == Arch::Phi3 {
            tensor(format!("{p}.self_attn.qkv_proj.weight"), vec![q + 2 * kv, h], proj(h), 0.0);
            tensor(format!("{p}.mlp.gate_up_proj.weight"), vec![2 * i, h], proj(h), 0.0);
        } else {
            for (name, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                tensor(format!("{p}.self_attn.{name}.weight"), vec![rows, h], proj(h), 0.0);
                if matches!(arch, Arch::Qwen2 | Arch::Qwen2Moe | Arch::GptOss) {
                    tensor(format!("{p}.self_attn.{name}.bias"), vec![rows], 0.1, 0.0);
                }
            }
            if !routed {
                tensor(format!("{p}.mlp.gate_proj.weight"), vec![i, h], proj(h), 0.0);
                tensor(format!("{p}.mlp.up_proj.weight"), vec![i, h], proj(h), 0.0);
            }
        }
        if matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3) {
            tensor(format!("{p}.self_attn.q_norm.weight"), vec![head_dim], 0.1, norm_center);
            tensor(format!("{p}.self_attn.k_norm.weight"), vec![head_dim], 0.1, norm_center);
        }
        // Strong layer outputs: with tied embeddings a weak residual update would just
        // predict the input token again, which compares nothing.
        tensor(format!("{p}.self_attn.o_proj.weight"), vec![h, q], 4.0 * proj(q), 0.0);
        if arch == Arch::GptOss {
            tensor(format!("{p}.self_attn.o_proj.bias"), vec![h], 0.1, 0.0);
            tensor(format!("{p}.self_attn.sinks"), vec![HEADS as i32], 1.0, 0.0);
        }
        if !routed {
            tensor(format!("{p}.mlp.down_proj.weight"), vec![h, i], 4.0 * proj(i), 0.0);
            continue;
        }
        let (e, m) = (EXPERTS as i32, EXPERT_INTERMEDIATE as i32);
        let block = format!("{p}.{}", moe_block(arch));
        // A decisive router: well-separated expert scores, so no near-tie picks an expert.
        let router = if arch == Arch::GptOss { "router" } else { "gate" };
        tensor(format!("{block}.{router}.weight"), vec![e, h], 6.0 * proj(h), 0.0);
        if arch == Arch::GptOss {
            tensor(format!("{block}.router.bias"), vec![e], 0.5, 0.0);
        }
        let projections = [("gate_proj", "w1", m, h), ("up_proj", "w3", m, h), ("down_proj", "w2", h, m)];
        for (name, mixtral_name, rows, cols) in projections {
            let scale = if name == "down_proj" { 4.0 * proj(m) } else { proj(h) };
            if arch == Arch::GptOss {
                // MLX's layout (OpenAI's fused one is made from it when writing).
                tensor(format!("{block}.experts.{name}.weight"), vec![e, rows, cols], scale, 0.0);
                tensor(format!("{block}.experts.{name}.bias"), vec![e, rows], 0.1, 0.0);
            } else if options.per_expert {
                let name = if arch == Arch::Mixtral { mixtral_name } else { name };
                for x in 0..e {
                    tensor(format!("{block}.experts.{x}.{name}.weight"), vec![rows, cols], scale, 0.0);
                }
            } else {
                tensor(format!("{block}.switch_mlp.{name}.weight"), vec![e, rows, cols], scale, 0.0);
            }
        }
        if arch == Arch::Qwen2Moe {
            tensor(format!("{block}.shared_expert.gate_proj.weight"), vec![i, h], proj(h), 0.0);
            tensor(format!("{block}.shared_expert.up_proj.weight"), vec![i, h], proj(h), 0.0);
            tensor(format!("{block}.shared_expert.down_proj.weight"), vec![h, i], 4.0 * proj(i), 0.0);
            tensor(format!("{block}.shared_expert_gate.weight"), vec![1, h], proj(h), 0.0);
        }
    }
    tensor("model.norm.weight".into(), vec![h], 0.1, norm_center);
    if !tied(arch) {
        tensor("lm_head.weight".into(), vec![VOCAB as i32, h], proj(h) * 4.0, 0.0);
    }
    draws.out
}

/// gpt-oss as OpenAI releases it: each layer's expert gate and up rows interleaved into one
/// `gate_up_proj`, expert matrices as mxfp4 `*_blocks` bytes with `*_scales`, biases apart.
/// Moves the experts from `tensors` into `arrays`; returns the rest.
fn openai_expert_blocks(tensors: Vec<Tensor>, arrays: &mut HashMap<String, Array>) -> Result<Vec<Tensor>> {
    let (experts, rest): (Vec<_>, Vec<_>) = tensors.into_iter().partition(|(n, _, _)| n.contains(".mlp.experts."));
    let mut by_name: HashMap<String, Array> =
        experts.into_iter().map(|(n, shape, data)| (n, Array::from_slice(&data, &shape))).collect();
    let spec = QuantSpec { group_size: 32, bits: 4, mode: QuantMode::Mxfp4 };
    let blocks = |w: &Array| -> Result<(Array, Array)> {
        let (q, scales, _) = quant_ops::quantize(w, spec)?;
        let mut shape = q.shape().to_vec();
        let words = shape.pop().expect("a matrix");
        shape.extend([words * 4 / 16, 16]);
        Ok((q.view_dtype(mlx_rs::Dtype::Uint8)?.reshape(&shape)?, scales))
    };
    let interleave = |a: &Array, b: &Array| -> Result<Array> {
        let stacked = mlx_rs::ops::stack(&[a, b], -2)?;
        let mut shape = a.shape().to_vec();
        let n = shape.len();
        shape[n - 2] *= 2;
        Ok(stacked.reshape(&shape)?)
    };
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}.mlp.experts");
        let mut take = |name: &str| by_name.remove(&format!("{p}.{name}")).expect("written above");
        let (gate, up, down) = (take("gate_proj.weight"), take("up_proj.weight"), take("down_proj.weight"));
        let (gate_bias, up_bias, down_bias) = (take("gate_proj.bias"), take("up_proj.bias"), take("down_proj.bias"));
        let (b, s) = blocks(&interleave(&gate, &up)?)?;
        arrays.insert(format!("{p}.gate_up_proj_blocks"), b);
        arrays.insert(format!("{p}.gate_up_proj_scales"), s);
        let fused_bias = interleave(&gate_bias.expand_dims(-1)?, &up_bias.expand_dims(-1)?)?.squeeze_axes(&[-1])?;
        arrays.insert(format!("{p}.gate_up_proj_bias"), fused_bias);
        let (b, s) = blocks(&down)?;
        arrays.insert(format!("{p}.down_proj_blocks"), b);
        arrays.insert(format!("{p}.down_proj_scales"), s);
        arrays.insert(format!("{p}.down_proj_bias"), down_bias);
    }
    Ok(rest)
}

/// A byte-level BPE tokenizer over the 256 byte symbols (no merges) plus the special tokens.
pub fn tokenizer_json() -> Value {
    let bytes = byte_level_alphabet();
    let vocab: serde_json::Map<String, Value> =
        bytes.iter().enumerate().map(|(i, c)| (c.to_string(), json!(i))).collect();
    let added: Vec<Value> = SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(k, t)| json!({"id": 256 + k, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    })
}

/// The byte-level vocabulary's symbol for byte `b` (its token id is `b`).
pub fn byte_symbol(b: u8) -> char {
    byte_level_alphabet()[b as usize]
}

/// GPT-2's printable stand-ins for the 256 bytes, in byte order.
fn byte_level_alphabet() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap_or('?')
            }
        })
        .collect()
}

/// Writes a tiny `arch` model to `dir` (created if needed); quantized when `quant` is given.
pub fn write_tiny_model(dir: &Path, arch: Arch, seed: u64, quant: Option<QuantSpec>) -> Result<()> {
    write_tiny_model_with(dir, arch, seed, &TinyOptions { quant, ..TinyOptions::default() })
}

pub fn write_tiny_model_with(dir: &Path, arch: Arch, seed: u64, options: &TinyOptions) -> Result<()> {
    let quant = options.quant;
    let io = |e: std::io::Error| ModelError::Io { path: dir.to_path_buf(), source: e };
    std::fs::create_dir_all(dir).map_err(io)?;
    let write_json = |name: &str, value: &Value| -> Result<()> {
        let text = serde_json::to_string_pretty(value).expect("JSON values serialise");
        std::fs::write(dir.join(name), text).map_err(|source| ModelError::Io { path: dir.join(name), source })
    };
    write_json("config.json", &config_json_with(arch, options))?;
    write_json("tokenizer.json", &tokenizer_json())?;
    write_json(
        "tokenizer_config.json",
        &json!({
            "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHATML_TEMPLATE,
            "tokenizer_class": "PreTrainedTokenizerFast"
        }),
    )?;
    write_json("generation_config.json", &json!({"eos_token_id": [258, 256]}))?;

    let mut tensors = random_weights_with(arch, seed, options);
    if wrapped(arch, options) {
        for (name, _, _) in &mut tensors {
            *name = format!("language_model.{name}");
        }
        tensors.push(("vision_tower.patch_embed.weight".into(), vec![16, 3], vec![0.5; 48]));
    }
    let mut arrays: HashMap<String, Array> = HashMap::new();
    if arch == Arch::GptOss && options.per_expert {
        tensors = openai_expert_blocks(tensors, &mut arrays)?;
    }
    for (name, shape, data) in tensors {
        let array = Array::from_slice(&data, &shape);
        let quantizable = name.ends_with(".weight") && shape.len() >= 2 && !name.starts_with("vision_tower");
        let quantizable = quantizable && quant.is_some_and(|q| shape[shape.len() - 1] % q.group_size == 0);
        match (quant, quantizable) {
            (Some(q), true) => {
                // Router gates at 8 bits, as mlx-lm's MoE recipes write them.
                let router =
                    [".gate.weight", ".router.weight", ".router.proj.weight"].iter().any(|s| name.ends_with(s));
                let spec = if router { QuantSpec::affine(q.group_size, 8) } else { q };
                let (w, scales, biases) = quant_ops::quantize(&array, spec)?;
                let prefix = name.trim_end_matches(".weight");
                arrays.insert(format!("{prefix}.weight"), w);
                arrays.insert(format!("{prefix}.scales"), scales);
                if let Some(biases) = biases {
                    arrays.insert(format!("{prefix}.biases"), biases);
                }
            }
            _ => {
                arrays.insert(name, array);
            }
        }
    }
    let path = dir.join("model.safetensors");
    let metadata = HashMap::from([("format".to_string(), "mlx".to_string())]);
    Array::save_safetensors(arrays, &metadata, &path).map_err(|e| ModelError::Weights { path, message: e.to_string() })
}
