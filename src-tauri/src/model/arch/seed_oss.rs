//! Seed-OSS: Llama's layers with biases where the config puts them: `attention_bias` on q/k/v,
//! `attention_out_bias` on the output projection, `mlp_bias` on the MLP. Embeddings are tied
//! unless the config says otherwise (mlx-lm's default for the family).

use super::HfConfig;
use crate::model::config::ModelConfig;

pub fn adapt(mut config: ModelConfig, hf: &HfConfig) -> Result<ModelConfig, String> {
    config.o_bias = hf.extra.attention_out_bias.unwrap_or(false);
    config.mlp_bias = hf.extra.mlp_bias.unwrap_or(false);
    config.tie_word_embeddings = hf.tie_word_embeddings.unwrap_or(true);
    Ok(config)
}
