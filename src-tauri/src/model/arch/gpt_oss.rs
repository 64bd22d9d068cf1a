//! gpt-oss (20b, 120b): sliding-window and full attention layers alternating (`layer_types`),
//! a learned sink logit per head, biases on every projection, YaRN rotary scaling, and in each
//! layer 32 or 128 experts with biases and a clamped SwiGLU (`swiglu_limit`), the top 4 chosen
//! by logit and weighted by a softmax over them. Released in `mxfp4`.
//!
//! OpenAI's checkpoints fuse each expert's gate and up rows, interleaved, and store the mxfp4
//! weights as `*_blocks` bytes; [`split_fused_experts`] turns them into MLX's layout (what an
//! MLX conversion holds already).

use mlx_rs::Dtype;

use super::{required, HfConfig};
use crate::model::config::{Activation, ModelConfig, MoeConfig, Routing};
use crate::model::error::Result;
use crate::model::weights::Weights;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> std::result::Result<ModelConfig, String> {
    let x = &hf.extra;
    config.qkv_bias = true;
    config.o_bias = true;
    config.attention_sinks = true;
    config.activation = Activation::SwigluClamped { alpha: 1.702, limit: x.swiglu_limit.unwrap_or(7.0) };
    config.sliding_window = Some(hf.sliding_window.unwrap_or(128));
    config.sliding_layers = match super::sliding_layers(hf, config.num_layers)? {
        Some(layers) => layers,
        None => (0..config.num_layers).map(|i| i % 2 == 0).collect(),
    };
    config.moe = Some(super::checked(MoeConfig {
        num_experts: required(x.num_local_experts, "num_local_experts")?,
        top_k: x.num_experts_per_tok.unwrap_or(4),
        intermediate_size: config.intermediate_size,
        routing: Routing::TopKThenSoftmax { largest_last: true },
        shared_expert_size: None,
        shared_expert_gated: false,
        sparse_layers: Vec::new(),
        biases: true,
    })?);
    Ok(config)
}

/// OpenAI's layout -> MLX's, for every layer that has it: `experts.gate_up_proj_blocks` (uint8
/// `[E, 2I, in/32, 16]`, gate and up rows interleaved), `_scales` and `_bias`, and
/// `experts.down_proj_*`, become `switch_mlp.{gate,up,down}_proj.{weight,scales,bias}`.
pub fn split_fused_experts(weights: &mut Weights, layers: usize) -> Result<()> {
    for l in 0..layers {
        let p = format!("model.layers.{l}.mlp.experts");
        let to = format!("model.layers.{l}.mlp.switch_mlp");
        if let Some(blocks) = weights.remove(&format!("{p}.gate_up_proj_blocks")) {
            let packed = packed_words(&blocks)?;
            let (gate, up) = deinterleave(&packed)?;
            weights.insert(format!("{to}.gate_proj.weight"), gate);
            weights.insert(format!("{to}.up_proj.weight"), up);
        }
        if let Some(scales) = weights.remove(&format!("{p}.gate_up_proj_scales")) {
            let (gate, up) = deinterleave(&scales)?;
            weights.insert(format!("{to}.gate_proj.scales"), gate);
            weights.insert(format!("{to}.up_proj.scales"), up);
        }
        if let Some(bias) = weights.remove(&format!("{p}.gate_up_proj_bias")) {
            let (gate, up) = deinterleave(&bias.expand_dims(-1)?)?;
            weights.insert(format!("{to}.gate_proj.bias"), gate.squeeze_axes(&[-1])?);
            weights.insert(format!("{to}.up_proj.bias"), up.squeeze_axes(&[-1])?);
        }
        if let Some(blocks) = weights.remove(&format!("{p}.down_proj_blocks")) {
            weights.insert(format!("{to}.down_proj.weight"), packed_words(&blocks)?);
        }
        for (from, name) in [("down_proj_scales", "scales"), ("down_proj_bias", "bias")] {
            if let Some(t) = weights.remove(&format!("{p}.{from}")) {
                weights.insert(format!("{to}.down_proj.{name}"), t);
            }
        }
    }
    Ok(())
}

/// `[.., in/32, 16]` bytes -> `[.., in/8]` uint32 words, MLX's packing of 4-bit values.
fn packed_words(blocks: &mlx_rs::Array) -> Result<mlx_rs::Array> {
    let words = blocks.view_dtype(Dtype::Uint32)?;
    let shape = words.shape();
    let (lead, tail) = shape.split_at(shape.len() - 2);
    let mut flat = lead.to_vec();
    flat.push(tail.iter().product());
    Ok(words.reshape(&flat)?)
}

/// Rows `0, 2, 4, ..` and `1, 3, 5, ..` of the second-to-last axis.
fn deinterleave(x: &mlx_rs::Array) -> Result<(mlx_rs::Array, mlx_rs::Array)> {
    let shape = x.shape().to_vec();
    let n = shape.len();
    let mut pairs = shape.clone();
    pairs[n - 2] /= 2;
    pairs.insert(n - 1, 2);
    let paired = x.reshape(&pairs)?;
    let pick = |i: i32| -> Result<mlx_rs::Array> {
        Ok(paired.take_axis(mlx_rs::Array::from_int(i), (n - 1) as i32)?.contiguous()?)
    };
    Ok((pick(0)?, pick(1)?))
}
