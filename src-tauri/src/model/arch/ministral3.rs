//! Ministral 3 (3B/8B/14B, the text model of its `mistral3` checkpoints): Mistral's layers with
//! the rotary settings in `rope_parameters` (YaRN), queries scaled with their position beyond
//! the pre-training window (`llama_4_scaling_beta`), and sliding-window layers where
//! `layer_types` says so (none otherwise, as the reference reads it).

use super::HfConfig;
use crate::model::config::{ModelConfig, QueryScale};

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let params = hf.extra.rope_parameters.as_ref().ok_or("ministral3 needs rope_parameters")?;
    let number = |key: &str| params.get(key).and_then(serde_json::Value::as_f64);
    if let Some(theta) = number("rope_theta") {
        config.rope.theta = theta as f32;
    }
    config.rope.scaling = super::rope_scaling(Some(params), hf.original_max_position_embeddings)?;
    let original = number("original_max_position_embeddings")
        .ok_or("rope_parameters needs original_max_position_embeddings")? as usize;
    config.query_scale = Some(QueryScale {
        beta: number("llama_4_scaling_beta").ok_or("rope_parameters needs llama_4_scaling_beta")? as f32,
        original_max_position_embeddings: original.max(1),
    });
    if let Some(layers) = super::sliding_layers(hf, config.num_layers)? {
        config.sliding_window = hf.sliding_window;
        config.sliding_layers = layers;
    }
    Ok(config)
}
