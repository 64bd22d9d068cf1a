//! Mistral: Llama's layers plus sliding-window attention where the config asks for it
//! (`sliding_window`; with `layer_types`, in the layers marked "sliding_attention").

use super::HfConfig;
use crate::model::config::ModelConfig;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.sliding_window = hf.sliding_window;
    if let Some(types) = &hf.layer_types {
        if types.len() != config.num_layers {
            return Err(format!("layer_types lists {} layers, the model has {}", types.len(), config.num_layers));
        }
        config.sliding_layers = types.iter().map(|t| t == "sliding_attention").collect();
    }
    Ok(config)
}
