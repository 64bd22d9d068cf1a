//! Mistral: Llama's layers plus sliding-window attention where the config asks for it
//! (`sliding_window`; with `layer_types`, only when its layers say "sliding_attention").

use super::HfConfig;
use crate::model::config::ModelConfig;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let sliding = match &hf.layer_types {
        Some(types) if types.iter().all(|t| t == "sliding_attention") => true,
        Some(types) if types.iter().all(|t| t == "full_attention") => false,
        Some(_) => return Err("mixed sliding/full attention layers are not supported".into()),
        None => true,
    };
    config.sliding_window = if sliding { hf.sliding_window } else { None };
    Ok(config)
}
