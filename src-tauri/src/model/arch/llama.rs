//! Llama 2/3.x, SmolLM2 and their fine-tunes: the base reading, nothing added.

use super::HfConfig;
use crate::model::config::ModelConfig;

pub fn adapt(config: ModelConfig, _hf: &HfConfig) -> Result<ModelConfig, String> {
    Ok(config)
}
