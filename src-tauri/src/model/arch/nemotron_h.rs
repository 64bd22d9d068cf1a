//! Nemotron-H and Nemotron 3 (`nemotron_h`): a stack of single-purpose blocks, each
//! `x + block(norm(x))`: Mamba-2 (`M`), attention without rotary (`*`), a ReLU² MLP (`-`) and
//! ReLU² experts chosen as DeepSeek-V3 chooses them beside a shared expert (`E`), in the order
//! `hybrid_override_pattern` gives. A mixer block and the MLP block right after it are exactly
//! one pre-norm decoder layer (the mixer's norm its input norm, the MLP's its post-attention
//! norm), so the stack is read as such layers; a mixer with no MLP after it has none. mlx-lm's
//! `nemotron_h.py` is the reference.

use serde_json::Value;

use super::{required, HfConfig};
use crate::model::config::{Activation, Mamba2Style, ModelConfig, MoeConfig, Routing};
use crate::model::error::Result;
use crate::model::weights::Weights;

/// One block of the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Mamba,
    Attention,
    Mlp,
    Experts,
}

impl Block {
    fn from_char(c: char) -> Option<Block> {
        Some(match c {
            'M' => Block::Mamba,
            '*' => Block::Attention,
            '-' => Block::Mlp,
            'E' => Block::Experts,
            _ => return None,
        })
    }

    /// transformers' names for the blocks (and their older spellings), as mlx-lm maps them.
    fn from_name(name: &str) -> Option<Block> {
        Some(match name {
            "full_attention" | "attention" => Block::Attention,
            "linear_attention" | "mamba" | "conv" => Block::Mamba,
            "moe" => Block::Experts,
            "mlp" => Block::Mlp,
            _ => return None,
        })
    }

    fn is_mixer(self) -> bool {
        matches!(self, Block::Mamba | Block::Attention)
    }
}

/// The config's blocks: `hybrid_override_pattern` (a string or a list of characters), else
/// `layers_block_type` or `layer_types` (names).
fn blocks(hf: &HfConfig) -> Result<Vec<Block>, String> {
    let x = &hf.extra;
    let chars = |s: &str| -> Result<Vec<Block>, String> {
        s.chars().map(|c| Block::from_char(c).ok_or_else(|| format!("unknown block {c:?} in the pattern"))).collect()
    };
    match x.hybrid_override_pattern.as_ref().filter(|v| !v.is_null()) {
        Some(Value::String(s)) => return chars(s),
        Some(Value::Array(items)) => {
            return items.iter().map(|v| v.as_str().ok_or("the pattern's entries must be strings")).try_fold(
                Vec::new(),
                |mut out, s| {
                    out.extend(chars(s?)?);
                    Ok(out)
                },
            )
        }
        Some(other) => return Err(format!("hybrid_override_pattern must be a string or a list: {other}")),
        None => {}
    }
    let names =
        x.layers_block_type.as_ref().or(hf.layer_types.as_ref()).ok_or(
            "the config must give the layer stack (hybrid_override_pattern, layers_block_type or layer_types)",
        )?;
    names.iter().map(|n| Block::from_name(n).ok_or_else(|| format!("unknown block type {n:?}"))).collect()
}

/// Each mixer block with the MLP block that follows it, if one does.
fn layers(blocks: &[Block]) -> Result<Vec<(Block, Option<Block>)>, String> {
    let mut out: Vec<(Block, Option<Block>)> = Vec::new();
    for (j, &block) in blocks.iter().enumerate() {
        match out.last_mut() {
            _ if block.is_mixer() => out.push((block, None)),
            Some((_, ffn @ None)) => *ffn = Some(block),
            _ => return Err(format!("block {j} is an MLP with no Mamba or attention block before it")),
        }
    }
    if out.is_empty() {
        return Err("the layer stack is empty".into());
    }
    Ok(out)
}

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let x = &hf.extra;
    let blocks = blocks(hf)?;
    // mlx-lm counts the pattern's blocks whatever `num_hidden_layers` says.
    let layers = layers(&blocks)?;
    config.num_layers = layers.len();
    config.rms_norm_eps = x.layer_norm_epsilon.ok_or("layer_norm_epsilon is missing")?;
    config.activation = Activation::Relu2;
    config.o_bias = hf.attention_bias;
    config.mlp_bias = x.mlp_bias.unwrap_or(false);
    config.nope_layers = (0..layers.len()).collect();
    config.rope.scaling = None;
    config.tie_word_embeddings = false;
    config.no_ffn_layers = (0..layers.len()).filter(|&i| layers[i].1.is_none()).collect();
    if x.moe_latent_size.is_some() {
        return Err("moe_latent_size (experts in a latent space) is not supported yet".into());
    }
    if layers.iter().any(|l| l.0 == Block::Mamba) {
        let groups = required(x.n_groups, "n_groups")?;
        config.hybrid = Some(super::granite_hybrid::mamba_style(
            layers.iter().map(|l| l.0 == Block::Mamba).collect(),
            (groups, required(x.ssm_state_size, "ssm_state_size")?),
            (required(x.mamba_num_heads, "mamba_num_heads")?, required(x.mamba_head_dim, "mamba_head_dim")?),
            required(x.conv_kernel, "conv_kernel")?,
            Mamba2Style {
                conv_bias: x.use_conv_bias.unwrap_or(false),
                proj_bias: x.mamba_proj_bias.unwrap_or(false),
                dt_limit: super::time_step_limit(hf, (0.0, f32::INFINITY))?,
                grouped_norm: true,
                norm_eps: config.rms_norm_eps,
            },
        )?);
    }
    if layers.iter().any(|l| l.1 == Some(Block::Experts)) {
        let mut routing = super::glm4_moe::grouped_routing(hf, 1e-20)?;
        // The reference reads an absent `norm_topk_prob` as false.
        routing.normalize = x.norm_topk_prob.unwrap_or(false) && x.num_experts_per_tok.unwrap_or(1) > 1;
        config.moe = Some(super::checked(MoeConfig {
            num_experts: required(x.n_routed_experts, "n_routed_experts")?,
            top_k: required(x.num_experts_per_tok, "num_experts_per_tok")?,
            intermediate_size: required(x.moe_intermediate_size, "moe_intermediate_size")?,
            routing: Routing::SigmoidGrouped(routing),
            shared_expert_size: match x.n_shared_experts {
                Some(_) => {
                    Some(required(x.moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size")?)
                }
                None => None,
            },
            shared_expert_gated: false,
            sparse_layers: layers.iter().map(|l| l.1 == Some(Block::Experts)).collect(),
            biases: false,
        })?);
    }
    Ok(config)
}

/// The checkpoint's blocks (`backbone.layers.{j}.{norm, mixer}`, `backbone.embeddings`,
/// `backbone.norm_f`) -> the paired decoder layers' names; experts one by one
/// (`experts.{e}.up_proj`) or stacked (`switch_mlp.fc1`) -> the shared layout's; the
/// multi-token-prediction head (`mtp.*`) dropped, as mlx-lm drops it; convolutions to MLX's
/// layout.
pub fn sanitize(weights: &mut Weights, config: &ModelConfig) -> Result<()> {
    // Block j's place: (layer, whether it is the layer's MLP).
    let mut place = Vec::new();
    for i in 0..config.num_layers {
        place.push((i, false));
        if !config.no_ffn_layers.contains(&i) {
            place.push((i, true));
        }
    }
    let recurrent: Vec<bool> = (0..config.num_layers).map(|i| config.is_recurrent(i)).collect();
    weights.rename_modules(|name| {
        if name.starts_with("mtp.") {
            return None;
        }
        if let Some(rest) = name.strip_prefix("backbone.embeddings.") {
            return Some(format!("model.embed_tokens.{rest}"));
        }
        if let Some(rest) = name.strip_prefix("backbone.norm_f.") {
            return Some(format!("model.norm.{rest}"));
        }
        let Some(rest) = name.strip_prefix("backbone.layers.") else { return Some(name.to_string()) };
        let (j, tail) = rest.split_once('.')?;
        let &(i, is_ffn) = place.get(j.parse::<usize>().ok()?)?;
        let p = format!("model.layers.{i}");
        if let Some(norm) = tail.strip_prefix("norm.") {
            let which = if is_ffn { "post_attention_layernorm" } else { "input_layernorm" };
            return Some(format!("{p}.{which}.{norm}"));
        }
        let mixer = tail.strip_prefix("mixer.")?;
        Some(match (is_ffn, recurrent[i]) {
            (false, true) => format!("{p}.mamba.{mixer}"),
            (false, false) => format!("{p}.self_attn.{mixer}"),
            (true, _) => {
                let mixer = mixer
                    .replace("switch_mlp.fc1.", "switch_mlp.up_proj.")
                    .replace("switch_mlp.fc2.", "switch_mlp.down_proj.")
                    .replace("gate.e_score_correction_bias", "expert_bias");
                format!("{p}.mlp.{mixer}")
            }
        })
    });
    super::mamba_conv_layout(weights, config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixers_take_the_mlp_after_them() {
        let pattern: Vec<Block> = "MEM*EM-M".chars().filter_map(Block::from_char).collect();
        let paired = layers(&pattern).unwrap();
        use Block::*;
        assert_eq!(
            paired,
            [(Mamba, Some(Experts)), (Mamba, None), (Attention, Some(Experts)), (Mamba, Some(Mlp)), (Mamba, None)]
        );
        let err = layers(&[Experts, Mamba]).unwrap_err();
        assert!(err.contains("block 0"), "{err}");
        let err = layers(&[Mamba, Mlp, Experts]).unwrap_err();
        assert!(err.contains("block 2"), "{err}");
    }
}
