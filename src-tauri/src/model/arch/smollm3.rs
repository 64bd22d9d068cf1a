//! SmolLM3: Llama's layers, some without rotary positions ("NoPE"): `no_rope_layers` (1 where a
//! layer uses rotary, 0 where not) wins over `no_rope_layer_interval` (every n-th layer has
//! none, 4 by default), as in mlx-lm. Tied embeddings unless the config says otherwise (SmolLM3-3B
//! states nothing and ships no head).

use super::HfConfig;
use crate::model::config::ModelConfig;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    let layers = config.num_layers;
    config.tie_word_embeddings = hf.tie_word_embeddings.unwrap_or(true);
    config.nope_layers = match &hf.extra.no_rope_layers {
        Some(flags) if flags.len() != layers => {
            return Err(format!("no_rope_layers has {} entries for {layers} layers", flags.len()))
        }
        Some(flags) => flags.iter().enumerate().filter(|(_, &uses)| uses == 0).map(|(i, _)| i).collect(),
        None => {
            let every = hf.extra.no_rope_layer_interval.unwrap_or(4);
            if every == 0 {
                return Err("no_rope_layer_interval must be at least 1".into());
            }
            (0..layers).filter(|i| (i + 1) % every == 0).collect()
        }
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> Result<ModelConfig, String> {
        let mut json = serde_json::json!({"model_type": "smollm3", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4});
        json.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let hf: HfConfig = serde_json::from_value(json).unwrap();
        super::super::model_config(crate::model::Arch::SmolLm3, &hf)
    }

    #[test]
    fn the_explicit_list_wins_over_the_interval() {
        assert_eq!(config(serde_json::json!({})).unwrap().nope_layers, vec![3, 7], "every fourth by default");
        assert_eq!(config(serde_json::json!({"no_rope_layer_interval": 2})).unwrap().nope_layers, vec![1, 3, 5, 7]);
        let listed = serde_json::json!({"no_rope_layer_interval": 2, "no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 0]});
        assert_eq!(config(listed).unwrap().nope_layers, vec![1, 7]);
        let short = config(serde_json::json!({"no_rope_layers": [1, 0]})).unwrap_err();
        assert_eq!(short, "no_rope_layers has 2 entries for 8 layers");
    }
}
