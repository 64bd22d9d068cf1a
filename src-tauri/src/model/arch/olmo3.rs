//! OLMo 3 (Ai2, 7B and 32B): norms on the branch outputs only (no norm on a layer's input, a
//! plain residual add), RMS norms over the whole q and k projections, biases on q/k/v and the
//! output when `attention_bias`, three sliding-window layers to one full (`layer_types`, that
//! pattern by default). Only the full layers' rotary takes `rope_scaling` (YaRN in the long
//! context releases); the sliding ones rotate plainly. mlx-lm's `olmo3.py` is the reference.

use super::HfConfig;
use crate::model::config::{ModelConfig, NormPlacement, QkNorm, RopeConfig};

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.norms = NormPlacement::Post;
    config.qk_norm = Some(QkNorm::Whole);
    config.o_bias = hf.attention_bias;
    let window = hf.sliding_window.filter(|&w| w > 0).ok_or("sliding_window is missing or zero")?;
    config.sliding_window = Some(window);
    config.sliding_layers = match super::sliding_layers(hf, config.num_layers)? {
        Some(layers) => layers,
        None => (0..config.num_layers).map(|i| (i + 1) % 4 != 0).collect(),
    };
    if config.sliding_layers.iter().all(|&s| s) || config.sliding_layers.iter().all(|&s| !s) {
        // The reference indexes both kinds' masks by the first layer of each.
        return Err("layer_types must list both sliding_attention and full_attention layers".into());
    }
    config.sliding_rope = Some(RopeConfig { scaling: None, ..config.rope.clone() });
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> Result<ModelConfig, String> {
        let mut json = serde_json::json!({"model_type": "olmo3", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4, "sliding_window": 16,
            "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}});
        json.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let hf: HfConfig = serde_json::from_value(json).unwrap();
        super::super::model_config(crate::model::Arch::Olmo3, &hf)
    }

    #[test]
    fn every_fourth_layer_is_full_and_only_full_layers_scale_positions() {
        let c = config(serde_json::json!({})).unwrap();
        let full: Vec<usize> = (0..8).filter(|&i| c.layer_window(i).is_none()).collect();
        assert_eq!(full, vec![3, 7]);
        assert!(c.rope.scaling.is_some() && c.sliding_rope.as_ref().is_some_and(|r| r.scaling.is_none()));
        assert_eq!((c.norms, c.qk_norm), (NormPlacement::Post, Some(QkNorm::Whole)));
        let err = config(serde_json::json!({"layer_types": vec!["sliding_attention"; 8]})).unwrap_err();
        assert!(err.contains("both"), "{err}");
        assert!(config(serde_json::json!({"sliding_window": null})).is_err());
    }
}
