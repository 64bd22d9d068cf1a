//! Phi-3/3.5: fused `qkv_proj` and `gate_up_proj`, "longrope" scaling, optional partial rotary.

use super::HfConfig;
use crate::model::config::ModelConfig;

pub fn adapt(mut config: ModelConfig, _hf: &HfConfig) -> Result<ModelConfig, String> {
    config.fused_projections = true;
    // Phi-3's config carries sliding_window but mlx-lm and llama.cpp attend over the full
    // context; follow them so outputs match the reference.
    Ok(config)
}
