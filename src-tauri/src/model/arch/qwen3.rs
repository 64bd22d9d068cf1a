//! Qwen3 (dense): an RMS norm on each head of q and k before rotary; explicit head_dim.

use super::HfConfig;
use crate::model::config::{ModelConfig, QkNorm};

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.qk_norm = Some(QkNorm::PerHead);
    if hf.use_sliding_window == Some(true) {
        config.sliding_window = hf.sliding_window;
    }
    Ok(config)
}
