//! The bidirectional encoder of the BERT and RoBERTa families: embeddings (word + position +
//! token type, then LayerNorm), post-norm layers of full self-attention and a GELU MLP. Rows of
//! a batch are padded on the right; the padding is masked out of every row's attention.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{add, arange};
use mlx_rs::{Array, Dtype};

use super::config::EncoderConfig;
use crate::model::error::Result;
use crate::model::layers::{Embedding, LayerNorm, Linear};
use crate::model::weights::Weights;

struct EncoderLayer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    up: Linear,
    down: Linear,
    output_norm: LayerNorm,
}

pub struct Encoder {
    pub config: EncoderConfig,
    words: Embedding,
    positions: Array,
    token_types: Array,
    embedding_norm: LayerNorm,
    layers: Vec<EncoderLayer>,
}

impl Encoder {
    /// Takes the encoder's tensors (named as in Hugging Face's `BertModel`, prefixes such as
    /// `bert.` already removed) out of `weights`.
    pub fn build(config: EncoderConfig, weights: &mut Weights) -> Result<Encoder> {
        let (h, i, eps) = (config.hidden_size, config.intermediate_size, config.layer_norm_eps);
        let words = weights.embedding("embeddings.word_embeddings", config.vocab_size, h)?;
        let positions = weights.take_float("embeddings.position_embeddings.weight", &[config.max_positions, h])?;
        let token_types =
            weights.take_float("embeddings.token_type_embeddings.weight", &[config.type_vocab_size, h])?;
        let embedding_norm = weights.layer_norm("embeddings.LayerNorm", h, eps, true)?;
        let layers = (0..config.num_layers)
            .map(|l| {
                let p = format!("encoder.layer.{l}");
                Ok(EncoderLayer {
                    query: weights.linear(&format!("{p}.attention.self.query"), h, h, true)?,
                    key: weights.linear(&format!("{p}.attention.self.key"), h, h, true)?,
                    value: weights.linear(&format!("{p}.attention.self.value"), h, h, true)?,
                    attention_out: weights.linear(&format!("{p}.attention.output.dense"), h, h, true)?,
                    attention_norm: weights.layer_norm(&format!("{p}.attention.output.LayerNorm"), h, eps, true)?,
                    up: weights.linear(&format!("{p}.intermediate.dense"), i, h, true)?,
                    down: weights.linear(&format!("{p}.output.dense"), h, i, true)?,
                    output_norm: weights.layer_norm(&format!("{p}.output.LayerNorm"), h, eps, true)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Encoder { config, words, positions, token_types, embedding_norm, layers })
    }

    /// `ids` and `type_ids`: `[rows, len]` int32, each row padded on the right to `len`;
    /// `key_mask`: `[rows, 1, 1, len]` additive (0 for tokens, a large negative for padding).
    /// Returns the last hidden states, `[rows, len, hidden]`.
    pub fn forward(&self, ids: &Array, type_ids: &Array, key_mask: &Array) -> Result<Array> {
        let (rows, len) = (ids.shape()[0], ids.shape()[1]);
        let offset = self.config.position_offset;
        let position_ids = arange::<_, i32>(offset, offset + len, None)?;
        let x = add(
            &add(&self.words.forward(ids)?, &self.positions.try_index(&position_ids)?)?,
            &self.token_types.try_index(type_ids)?,
        )?;
        let mut x = self.embedding_norm.forward(&x)?;
        let heads = self.config.num_heads;
        let head_dim = self.config.hidden_size / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mask = key_mask.as_dtype(x.dtype())?;
        let split = |t: Array| -> Result<Array> {
            Ok(t.reshape(&[rows, len, heads, head_dim])?.transpose_axes(&[0, 2, 1, 3])?)
        };
        for layer in &self.layers {
            let q = split(layer.query.forward(&x)?)?;
            let k = split(layer.key.forward(&x)?)?;
            let v = split(layer.value.forward(&x)?)?;
            let attended = mlx_rs::fast::scaled_dot_product_attention(&q, &k, &v, scale, &mask, None)?;
            let attended = attended.transpose_axes(&[0, 2, 1, 3])?.reshape(&[rows, len, self.config.hidden_size])?;
            x = layer.attention_norm.forward(&add(&layer.attention_out.forward(&attended)?, &x)?)?;
            let mlp = layer.down.forward(&mlx_rs::nn::gelu(layer.up.forward(&x)?)?)?;
            x = layer.output_norm.forward(&add(&mlp, &x)?)?;
        }
        Ok(x)
    }

    /// The additive key mask for rows of `lengths` tokens padded to `len`.
    pub fn key_mask(lengths: &[usize], len: usize) -> Result<Array> {
        let values: Vec<f32> =
            lengths.iter().flat_map(|&n| (0..len).map(move |j| if j < n { 0.0 } else { f32::MIN / 2.0 })).collect();
        Ok(Array::from_slice(&values, &[lengths.len() as i32, 1, 1, len as i32]).as_dtype(Dtype::Float32)?)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = self.words.arrays();
        all.extend([&self.positions, &self.token_types]);
        all.extend(self.embedding_norm.arrays());
        for l in &self.layers {
            for linear in [&l.query, &l.key, &l.value, &l.attention_out, &l.up, &l.down] {
                all.extend(linear.arrays());
            }
            all.extend(l.attention_norm.arrays());
            all.extend(l.output_norm.arrays());
        }
        all
    }
}
