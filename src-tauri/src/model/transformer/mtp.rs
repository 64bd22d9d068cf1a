//! A checkpoint's own multi-token-prediction head (Qwen3.5 / Qwen3.6 and Qwen3-Next `mtp.*`):
//! one more decoder layer that predicts the token after next. Its input at a position is the
//! next token's embedding beside the model's hidden state there (after the final norm), each
//! normalised, concatenated and projected back to the hidden size (`fc`); then a full-attention
//! layer of the model's own kind (experts included) with its own keys and values, a norm, and
//! the model's own head. Fed its own output in place of the model's hidden state, it drafts
//! further tokens. mlx-vlm 0.7.6's `qwen3_5_mtp` drafter is the reference (mlx-lm drops these
//! tensors); Hugging Face's layout stores its norms zero-centred, as the model's own.

use mlx_rs::ops::concatenate;
use mlx_rs::Array;

use super::{DecoderLayer, NormLoader, Transformer};
use crate::model::cache::LayerCache;
use crate::model::error::Result;
use crate::model::layers::{Linear, RmsNorm};
use crate::model::weights::Weights;
use crate::model::ModelConfig;

use crate::model::config::MTP_PREFIX as PREFIX;

pub struct MtpHead {
    embedding_norm: RmsNorm,
    hidden_norm: RmsNorm,
    fc: Linear,
    layer: DecoderLayer,
    norm: RmsNorm,
    kv_elements: usize,
}

impl MtpHead {
    /// The head from `mtp.*`, when the config has one and the checkpoint ships it (a
    /// conversion that dropped it, as mlx-lm's does, loads without).
    pub fn build(c: &ModelConfig, weights: &mut Weights, norm: &NormLoader) -> Result<Option<MtpHead>> {
        if c.mtp_layers == 0 || !weights.contains(&format!("{PREFIX}.fc.weight")) {
            return Ok(None);
        }
        let hidden = c.hidden_size as i32;
        let p = PREFIX;
        Ok(Some(MtpHead {
            embedding_norm: norm(weights, &format!("{p}.pre_fc_norm_embedding"), hidden)?,
            hidden_norm: norm(weights, &format!("{p}.pre_fc_norm_hidden"), hidden)?,
            fc: weights.linear(&format!("{p}.fc"), hidden, 2 * hidden, false)?,
            layer: DecoderLayer::build_full_attention(c, &format!("{p}.layers.0"), weights, norm)?,
            norm: norm(weights, &format!("{p}.norm"), hidden)?,
            kv_elements: 2 * c.num_kv_heads * c.head_dim,
        }))
    }

    /// Key and value elements its layer caches per token.
    pub fn kv_elements_per_token(&self) -> usize {
        self.kv_elements
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = vec![&self.embedding_norm.weight, &self.hidden_norm.weight, &self.norm.weight];
        out.extend(self.fc.arrays());
        out.extend(self.layer.arrays());
        out
    }

    /// The head's hidden states `[B, L, hidden]` (after its norm: the model's `logits` give its
    /// predictions) for tokens `ids` `[B, L]` beside the hidden states `hidden` `[B, L, hidden]`
    /// that precede them (the model's at the position before each token, or the head's own
    /// output when drafting further), after what `cache` holds.
    pub fn forward<C: LayerCache>(
        &self,
        model: &Transformer,
        ids: &Array,
        hidden: &Array,
        cache: &mut C,
    ) -> Result<Array> {
        let embedded = self.embedding_norm.forward(&model.embed_tokens(ids)?)?;
        let before = self.hidden_norm.forward(hidden)?;
        let h = self.fc.forward(&concatenate(&[embedded, before], -1)?)?;
        let h = self.layer.forward_alone(&h, cache)?;
        self.norm.forward(&h)
    }
}
