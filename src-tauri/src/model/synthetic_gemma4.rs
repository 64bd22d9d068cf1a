//! The tiny Gemma 4 models (config and random weights) of [`crate::model::synthetic`]: small
//! enough for tests, with every part of the family in use.
//!
//! The default model is shaped like the E2B/E4B models: four layers (sliding, full, sliding,
//! full), the last two reusing the first two's keys and values with double-wide MLPs, per-layer
//! inputs, a partial "proportional" rotary on the full layers (head size 64 there, 32 in the
//! sliding ones). With `moe` it is shaped like 26B-A4B: two layers, the full one's keys doubling
//! as values with its own KV head count, and experts beside every dense MLP.

use serde_json::{json, Value};

use super::synthetic::{Draws, Tensor, TinyOptions, HIDDEN, MISTRAL_WINDOW, VOCAB};

const INTERMEDIATE: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const GLOBAL_HEAD_DIM: usize = 64;
const PER_LAYER: usize = 64;
const EXPERTS: usize = 8;
const TOP_K: usize = 4;
const EXPERT_INTERMEDIATE: usize = 64;

/// Layers of the two variants.
pub fn layers(options: &TinyOptions) -> usize {
    if options.moe {
        2
    } else {
        4
    }
}

fn is_global(l: usize) -> bool {
    l % 2 == 1
}

/// Adds the family's fields to the shared part of the tiny config.
pub fn config(c: &mut Value, options: &TinyOptions) {
    let n = layers(options);
    c["num_hidden_layers"] = json!(n);
    c["intermediate_size"] = json!(INTERMEDIATE);
    c["num_attention_heads"] = json!(HEADS);
    c["num_key_value_heads"] = json!(KV_HEADS);
    c["head_dim"] = json!(HEAD_DIM);
    c["global_head_dim"] = json!(GLOBAL_HEAD_DIM);
    c["sliding_window"] = json!(MISTRAL_WINDOW);
    c["layer_types"] =
        json!((0..n).map(|l| if is_global(l) { "full_attention" } else { "sliding_attention" }).collect::<Vec<_>>());
    c["rope_parameters"] = json!({
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
    });
    c["final_logit_softcapping"] = json!(30.0);
    c["hidden_activation"] = json!("gelu_pytorch_tanh");
    if options.moe {
        c["num_kv_shared_layers"] = json!(0);
        c["hidden_size_per_layer_input"] = json!(0);
        c["attention_k_eq_v"] = json!(true);
        c["num_global_key_value_heads"] = json!(1);
        c["enable_moe_block"] = json!(true);
        c["num_experts"] = json!(EXPERTS);
        c["top_k_experts"] = json!(TOP_K);
        c["moe_intermediate_size"] = json!(EXPERT_INTERMEDIATE);
    } else {
        c["num_kv_shared_layers"] = json!(2);
        c["hidden_size_per_layer_input"] = json!(PER_LAYER);
        c["vocab_size_per_layer_input"] = json!(VOCAB);
        c["use_double_wide_mlp"] = json!(true);
    }
}

/// The router projections, quantized at 8 bits as mlx-lm's recipe for the family does.
pub fn router_modules(options: &TinyOptions) -> Vec<String> {
    if !options.moe {
        return Vec::new();
    }
    (0..layers(options)).map(|l| format!("model.layers.{l}.router.proj")).collect()
}

pub fn random_weights(seed: u64, options: &TinyOptions) -> Vec<Tensor> {
    let mut draws = Draws::new(seed);
    let mut tensor = |name: String, shape: Vec<i32>, scale: f32, center: f32| draws.tensor(name, shape, scale, center);
    let n = layers(options);
    let shared_from = if options.moe { n } else { 2 };
    let h = HIDDEN as i32;
    let proj = |fan_in: i32| 1.7 / (fan_in as f32).sqrt();
    tensor("model.embed_tokens.weight".into(), vec![VOCAB as i32, h], 1.0, 0.0);
    for l in 0..n {
        let p = format!("model.layers.{l}");
        let global = is_global(l);
        let head_dim = if global { GLOBAL_HEAD_DIM } else { HEAD_DIM } as i32;
        let kv_heads = if global && options.moe { 1 } else { KV_HEADS } as i32;
        let (q, kv) = (HEADS as i32 * head_dim, kv_heads * head_dim);
        tensor(format!("{p}.input_layernorm.weight"), vec![h], 0.1, 1.0);
        // Branch outputs normalised, then scaled up against the sqrt(hidden)-scaled embeddings
        // so the layers matter.
        tensor(format!("{p}.post_attention_layernorm.weight"), vec![h], 0.5, 2.0);
        tensor(format!("{p}.pre_feedforward_layernorm.weight"), vec![h], 0.1, 1.0);
        tensor(format!("{p}.post_feedforward_layernorm.weight"), vec![h], 0.5, 2.0);
        tensor(format!("{p}.self_attn.q_proj.weight"), vec![q, h], proj(h), 0.0);
        tensor(format!("{p}.self_attn.q_norm.weight"), vec![head_dim], 0.1, 1.0);
        if l < shared_from {
            tensor(format!("{p}.self_attn.k_proj.weight"), vec![kv, h], proj(h), 0.0);
            if !(global && options.moe) {
                tensor(format!("{p}.self_attn.v_proj.weight"), vec![kv, h], proj(h), 0.0);
            }
            tensor(format!("{p}.self_attn.k_norm.weight"), vec![head_dim], 0.1, 1.0);
        }
        tensor(format!("{p}.self_attn.o_proj.weight"), vec![h, q], 4.0 * proj(q), 0.0);
        let i = if l >= shared_from { 2 * INTERMEDIATE } else { INTERMEDIATE } as i32;
        tensor(format!("{p}.mlp.gate_proj.weight"), vec![i, h], proj(h), 0.0);
        tensor(format!("{p}.mlp.up_proj.weight"), vec![i, h], proj(h), 0.0);
        tensor(format!("{p}.mlp.down_proj.weight"), vec![h, i], 4.0 * proj(i), 0.0);
        tensor(format!("{p}.layer_scalar"), vec![1], 0.3, 1.0);
        if options.moe {
            let (e, m) = (EXPERTS as i32, EXPERT_INTERMEDIATE as i32);
            // A decisive router: well-separated expert scores, so no near-tie picks an expert.
            tensor(format!("{p}.router.proj.weight"), vec![e, h], 6.0 * proj(h), 0.0);
            tensor(format!("{p}.router.scale"), vec![h], 0.2, 1.0);
            tensor(format!("{p}.router.per_expert_scale"), vec![e], 0.3, 1.0);
            tensor(format!("{p}.post_feedforward_layernorm_1.weight"), vec![h], 0.5, 2.0);
            tensor(format!("{p}.pre_feedforward_layernorm_2.weight"), vec![h], 0.1, 1.0);
            tensor(format!("{p}.post_feedforward_layernorm_2.weight"), vec![h], 0.5, 2.0);
            let x = format!("{p}.experts.switch_glu");
            tensor(format!("{x}.gate_proj.weight"), vec![e, m, h], proj(h), 0.0);
            tensor(format!("{x}.up_proj.weight"), vec![e, m, h], proj(h), 0.0);
            tensor(format!("{x}.down_proj.weight"), vec![e, h, m], 4.0 * proj(m), 0.0);
        } else {
            let s = PER_LAYER as i32;
            tensor(format!("{p}.per_layer_input_gate.weight"), vec![s, h], proj(h), 0.0);
            tensor(format!("{p}.per_layer_projection.weight"), vec![h, s], proj(s), 0.0);
            tensor(format!("{p}.post_per_layer_input_norm.weight"), vec![h], 0.5, 2.0);
        }
    }
    if !options.moe {
        let width = (n * PER_LAYER) as i32;
        tensor("model.embed_tokens_per_layer.weight".into(), vec![VOCAB as i32, width], 1.0, 0.0);
        tensor("model.per_layer_model_projection.weight".into(), vec![width, h], proj(h), 0.0);
        tensor("model.per_layer_projection_norm.weight".into(), vec![PER_LAYER as i32], 0.1, 1.0);
    }
    tensor("model.norm.weight".into(), vec![h], 0.1, 1.0);
    tensor("lm_head.weight".into(), vec![VOCAB as i32, h], proj(h) * 4.0, 0.0);
    draws.out
}
