//! Mistral: Llama's layers plus sliding-window attention where the config asks for it
//! (`sliding_window`; with `layer_types`, in the layers marked "sliding_attention").

use super::HfConfig;
use crate::model::config::ModelConfig;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.sliding_window = hf.sliding_window;
    if let Some(layers) = super::sliding_layers(hf, config.num_layers)? {
        config.sliding_layers = layers;
    }
    Ok(config)
}
