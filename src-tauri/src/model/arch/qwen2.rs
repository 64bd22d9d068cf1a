//! Qwen2/2.5: Llama's layers with biases on the q/k/v projections.

use super::HfConfig;
use crate::model::config::ModelConfig;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.qkv_bias = true;
    if hf.use_sliding_window == Some(true) {
        config.sliding_window = hf.sliding_window;
    }
    Ok(config)
}
