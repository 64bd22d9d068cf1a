//! The tiny linear-attention hybrids (config and random weights) of
//! [`crate::model::synthetic`]: Qwen3-Next and Qwen3.5, four layers each (Gated DeltaNet,
//! attention, Gated DeltaNet, attention), two key heads serving four value heads, a rotary over
//! a quarter of each attention head. Qwen3-Next has experts (a gated shared expert beside them)
//! in three layers and a dense MLP in the third; Qwen3.5 is dense unless `moe`, then experts in
//! every layer. Written as MLX saves them (convolutions `[C, K, 1]`, experts stacked, norms as
//! they are used), Qwen3.5 inside its multimodal wrapper. LFM2: four layers (short convolution
//! with biases, attention, short convolution, attention), its own field and tensor names, tied
//! embeddings, an MLP width derived from `block_ff_dim` as the family does; with `moe`, LFM2-MoE:
//! a dense first layer, then experts chosen by sigmoid scores plus a bias (`lfm2_moe`).

use serde_json::{json, Value};

use super::config::Arch;
use super::synthetic::{Draws, Tensor, TinyOptions, HIDDEN, VOCAB};

pub const LAYERS: usize = 4;
const INTERMEDIATE: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const KEY_HEADS: usize = 2;
const VALUE_HEADS: usize = 4;
const KEY_DIM: usize = 32;
const VALUE_DIM: usize = 16;
const CONV_KERNEL: usize = 4;
const EXPERTS: usize = 8;
const TOP_K: usize = 2;
const EXPERT_INTERMEDIATE: usize = 64;
const SHARED_INTERMEDIATE: usize = 128;

fn is_linear(l: usize) -> bool {
    l.is_multiple_of(2)
}

/// Whether layer `l`'s MLP is routed experts.
fn routed(arch: Arch, options: &TinyOptions, l: usize) -> bool {
    match arch {
        Arch::Qwen3Next => l != 2,
        _ => options.moe,
    }
}

/// LFM2's fields: `block_ff_dim` 384 gives an MLP of 256 (two thirds, rounded to 64). LFM2-MoE
/// states its dense width (256) and its experts'.
fn lfm2_config(c: &mut Value, options: &TinyOptions) {
    let fields = c.as_object_mut().expect("an object");
    fields.remove("rms_norm_eps");
    fields.remove("intermediate_size");
    c["num_hidden_layers"] = json!(LAYERS);
    c["num_attention_heads"] = json!(HEADS);
    c["num_key_value_heads"] = json!(KV_HEADS);
    c["norm_eps"] = json!(1e-5);
    c["conv_bias"] = json!(true);
    c["conv_L_cache"] = json!(3);
    c["block_dim"] = json!(HIDDEN);
    c["block_ff_dim"] = json!(384);
    c["block_multiple_of"] = json!(64);
    c["block_ffn_dim_multiplier"] = json!(1.0);
    c["block_auto_adjust_ff_dim"] = json!(true);
    c["full_attn_idxs"] = json!([1, 3]);
    c["rope_theta"] = json!(1_000_000.0);
    if options.moe {
        c["model_type"] = json!("lfm2_moe");
        c["intermediate_size"] = json!(LFM2_FF);
        c["moe_intermediate_size"] = json!(EXPERT_INTERMEDIATE);
        c["num_experts"] = json!(EXPERTS);
        c["num_experts_per_tok"] = json!(TOP_K);
        c["norm_topk_prob"] = json!(true);
        c["use_expert_bias"] = json!(true);
        c["num_dense_layers"] = json!(1);
        c["routed_scaling_factor"] = json!(1.5);
        // Read by LFM2 alone: LFM2-MoE's dense layers are `intermediate_size` wide.
        c["block_ff_dim"] = json!(768);
    }
}

/// LFM2's MLP width from the config above.
const LFM2_FF: usize = 256;
const LFM2_KERNEL: usize = 3;

fn lfm2_weights(seed: u64, options: &TinyOptions) -> Vec<Tensor> {
    let mut draws = Draws::new(seed);
    let mut tensor = |name: String, shape: Vec<i32>, scale: f32, center: f32| draws.tensor(name, shape, scale, center);
    let h = HIDDEN as i32;
    let proj = |fan_in: i32| 1.7 / (fan_in as f32).sqrt();
    tensor("model.embed_tokens.weight".into(), vec![VOCAB as i32, h], 1.0, 0.0);
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        tensor(format!("{p}.operator_norm.weight"), vec![h], 0.1, 1.0);
        tensor(format!("{p}.ffn_norm.weight"), vec![h], 0.1, 1.0);
        if is_linear(l) {
            tensor(format!("{p}.conv.in_proj.weight"), vec![3 * h, h], proj(h), 0.0);
            tensor(format!("{p}.conv.in_proj.bias"), vec![3 * h], 0.1, 0.0);
            tensor(format!("{p}.conv.conv.weight"), vec![h, LFM2_KERNEL as i32, 1], 0.5, 0.0);
            tensor(format!("{p}.conv.conv.bias"), vec![h], 0.1, 0.0);
            tensor(format!("{p}.conv.out_proj.weight"), vec![h, h], 4.0 * proj(h), 0.0);
            tensor(format!("{p}.conv.out_proj.bias"), vec![h], 0.1, 0.0);
        } else {
            let (q, kv) = ((HEADS * HEAD_DIM) as i32, (KV_HEADS * HEAD_DIM) as i32);
            tensor(format!("{p}.self_attn.q_proj.weight"), vec![q, h], proj(h), 0.0);
            tensor(format!("{p}.self_attn.k_proj.weight"), vec![kv, h], proj(h), 0.0);
            tensor(format!("{p}.self_attn.v_proj.weight"), vec![kv, h], proj(h), 0.0);
            tensor(format!("{p}.self_attn.out_proj.weight"), vec![h, q], 4.0 * proj(q), 0.0);
            tensor(format!("{p}.self_attn.q_layernorm.weight"), vec![HEAD_DIM as i32], 0.1, 1.0);
            tensor(format!("{p}.self_attn.k_layernorm.weight"), vec![HEAD_DIM as i32], 0.1, 1.0);
        }
        let f = LFM2_FF as i32;
        if options.moe && l >= 1 {
            // As mlx-lm saves LFM2-MoE: the router, its f32 bias, the experts stacked.
            let (e, m) = (EXPERTS as i32, EXPERT_INTERMEDIATE as i32);
            tensor(format!("{p}.feed_forward.gate.weight"), vec![e, h], 6.0 * proj(h), 0.0);
            tensor(format!("{p}.feed_forward.expert_bias"), vec![e], 0.5, 0.0);
            let x = format!("{p}.feed_forward.switch_mlp");
            tensor(format!("{x}.gate_proj.weight"), vec![e, m, h], proj(h), 0.0);
            tensor(format!("{x}.up_proj.weight"), vec![e, m, h], proj(h), 0.0);
            tensor(format!("{x}.down_proj.weight"), vec![e, h, m], 4.0 * proj(m), 0.0);
        } else if options.moe {
            tensor(format!("{p}.feed_forward.gate_proj.weight"), vec![f, h], proj(h), 0.0);
            tensor(format!("{p}.feed_forward.up_proj.weight"), vec![f, h], proj(h), 0.0);
            tensor(format!("{p}.feed_forward.down_proj.weight"), vec![h, f], 4.0 * proj(f), 0.0);
        } else {
            tensor(format!("{p}.feed_forward.w1.weight"), vec![f, h], proj(h), 0.0);
            tensor(format!("{p}.feed_forward.w3.weight"), vec![f, h], proj(h), 0.0);
            tensor(format!("{p}.feed_forward.w2.weight"), vec![h, f], 4.0 * proj(f), 0.0);
        }
    }
    tensor("model.embedding_norm.weight".into(), vec![h], 0.1, 1.0);
    draws.out
}

/// Adds the family's fields to the shared part of the tiny config.
pub fn config(c: &mut Value, arch: Arch, options: &TinyOptions) {
    if arch == Arch::Lfm2 {
        return lfm2_config(c, options);
    }
    c["num_hidden_layers"] = json!(LAYERS);
    c["intermediate_size"] = json!(INTERMEDIATE);
    c["num_attention_heads"] = json!(HEADS);
    c["num_key_value_heads"] = json!(KV_HEADS);
    c["head_dim"] = json!(HEAD_DIM);
    c["full_attention_interval"] = json!(2);
    c["linear_num_key_heads"] = json!(KEY_HEADS);
    c["linear_num_value_heads"] = json!(VALUE_HEADS);
    c["linear_key_head_dim"] = json!(KEY_DIM);
    c["linear_value_head_dim"] = json!(VALUE_DIM);
    c["linear_conv_kernel_dim"] = json!(CONV_KERNEL);
    c["tie_word_embeddings"] = json!(false);
    if arch == Arch::Qwen3Next {
        c["rope_theta"] = json!(1_000_000.0);
        c["partial_rotary_factor"] = json!(0.25);
        c["decoder_sparse_step"] = json!(1);
        c["mlp_only_layers"] = json!([2]);
        c["norm_topk_prob"] = json!(true);
    } else {
        c["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 100_000.0,
            "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 2]});
        // The reference reads these with no default: present in every published config.
        c["decoder_sparse_step"] = json!(1);
        c["mlp_only_layers"] = json!([]);
    }
    if arch == Arch::Qwen3Next || options.moe {
        c["num_experts"] = json!(EXPERTS);
        c["num_experts_per_tok"] = json!(TOP_K);
        c["moe_intermediate_size"] = json!(EXPERT_INTERMEDIATE);
        c["shared_expert_intermediate_size"] = json!(SHARED_INTERMEDIATE);
    } else {
        c["num_experts"] = json!(0);
        c["num_experts_per_tok"] = json!(0);
        c["moe_intermediate_size"] = json!(0);
        c["shared_expert_intermediate_size"] = json!(0);
    }
}

/// The multimodal wrapper's `model_type` (Qwen3.5's checkpoints always come in one).
pub fn outer_type(options: &TinyOptions) -> &'static str {
    if options.moe {
        "qwen3_5_moe"
    } else {
        "qwen3_5"
    }
}

pub fn random_weights(arch: Arch, seed: u64, options: &TinyOptions) -> Vec<Tensor> {
    if arch == Arch::Lfm2 {
        return lfm2_weights(seed, options);
    }
    let mut draws = Draws::new(seed);
    let mut tensor = |name: String, shape: Vec<i32>, scale: f32, center: f32| draws.tensor(name, shape, scale, center);
    let h = HIDDEN as i32;
    let proj = |fan_in: i32| 1.7 / (fan_in as f32).sqrt();
    let (nk, nv, dk, dv) = (KEY_HEADS as i32, VALUE_HEADS as i32, KEY_DIM as i32, VALUE_DIM as i32);
    let channels = 2 * nk * dk + nv * dv;
    tensor("model.embed_tokens.weight".into(), vec![VOCAB as i32, h], 1.0, 0.0);
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        tensor(format!("{p}.input_layernorm.weight"), vec![h], 0.1, 1.0);
        tensor(format!("{p}.post_attention_layernorm.weight"), vec![h], 0.1, 1.0);
        if is_linear(l) {
            let a = format!("{p}.linear_attn");
            if arch == Arch::Qwen3Next {
                tensor(format!("{a}.in_proj_qkvz.weight"), vec![channels + nv * dv, h], proj(h), 0.0);
                tensor(format!("{a}.in_proj_ba.weight"), vec![2 * nv, h], proj(h), 0.0);
            } else {
                tensor(format!("{a}.in_proj_qkv.weight"), vec![channels, h], proj(h), 0.0);
                tensor(format!("{a}.in_proj_z.weight"), vec![nv * dv, h], proj(h), 0.0);
                tensor(format!("{a}.in_proj_b.weight"), vec![nv, h], proj(h), 0.0);
                tensor(format!("{a}.in_proj_a.weight"), vec![nv, h], proj(h), 0.0);
            }
            tensor(format!("{a}.conv1d.weight"), vec![channels, CONV_KERNEL as i32, 1], 0.5, 0.0);
            tensor(format!("{a}.dt_bias"), vec![nv], 0.5, 1.0);
            // log of decay rates between e^-1 and e^2 (the reference draws them in (0, 16)).
            tensor(format!("{a}.A_log"), vec![nv], 1.5, 0.5);
            tensor(format!("{a}.norm.weight"), vec![dv], 0.1, 1.0);
            tensor(format!("{a}.out_proj.weight"), vec![h, nv * dv], 4.0 * proj(nv * dv), 0.0);
        } else {
            let (q, kv) = ((HEADS * HEAD_DIM) as i32, (KV_HEADS * HEAD_DIM) as i32);
            tensor(format!("{p}.self_attn.q_proj.weight"), vec![2 * q, h], proj(h), 0.0);
            tensor(format!("{p}.self_attn.k_proj.weight"), vec![kv, h], proj(h), 0.0);
            tensor(format!("{p}.self_attn.v_proj.weight"), vec![kv, h], proj(h), 0.0);
            tensor(format!("{p}.self_attn.o_proj.weight"), vec![h, q], 4.0 * proj(q), 0.0);
            tensor(format!("{p}.self_attn.q_norm.weight"), vec![HEAD_DIM as i32], 0.1, 1.0);
            tensor(format!("{p}.self_attn.k_norm.weight"), vec![HEAD_DIM as i32], 0.1, 1.0);
        }
        if routed(arch, options, l) {
            let (e, m, s) = (EXPERTS as i32, EXPERT_INTERMEDIATE as i32, SHARED_INTERMEDIATE as i32);
            // A decisive router: well-separated expert scores, so no near-tie picks an expert.
            tensor(format!("{p}.mlp.gate.weight"), vec![e, h], 6.0 * proj(h), 0.0);
            let x = format!("{p}.mlp.switch_mlp");
            tensor(format!("{x}.gate_proj.weight"), vec![e, m, h], proj(h), 0.0);
            tensor(format!("{x}.up_proj.weight"), vec![e, m, h], proj(h), 0.0);
            tensor(format!("{x}.down_proj.weight"), vec![e, h, m], 4.0 * proj(m), 0.0);
            let x = format!("{p}.mlp.shared_expert");
            tensor(format!("{x}.gate_proj.weight"), vec![s, h], proj(h), 0.0);
            tensor(format!("{x}.up_proj.weight"), vec![s, h], proj(h), 0.0);
            tensor(format!("{x}.down_proj.weight"), vec![h, s], 4.0 * proj(s), 0.0);
            tensor(format!("{p}.mlp.shared_expert_gate.weight"), vec![1, h], proj(h), 0.0);
        } else {
            let i = INTERMEDIATE as i32;
            tensor(format!("{p}.mlp.gate_proj.weight"), vec![i, h], proj(h), 0.0);
            tensor(format!("{p}.mlp.up_proj.weight"), vec![i, h], proj(h), 0.0);
            tensor(format!("{p}.mlp.down_proj.weight"), vec![h, i], 4.0 * proj(i), 0.0);
        }
    }
    tensor("model.norm.weight".into(), vec![h], 0.1, 1.0);
    tensor("lm_head.weight".into(), vec![VOCAB as i32, h], proj(h), 0.0);
    draws.out
}
