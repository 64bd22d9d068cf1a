//! Decoder-only checkpoints used as encoders: embedding models trained from a chat family
//! (Qwen3-Embedding: causal attention, the last token pooled; EmbeddingGemma: bidirectional
//! attention, mean-pooled, then Dense layers) and rerankers read at their last token
//! (Qwen3-Reranker: the odds of "yes" against "no"). The family's own transformer runs once
//! over the rows, padded on the right; nothing is cached.

use std::path::Path;

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{sigmoid, subtract};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

use crate::model::cache::{AttentionMask, KvTensor, LayerCache, Positions};
use crate::model::error::{ModelError, Result};
use crate::model::Transformer;

/// How a decoder checkpoint serves as an encoder, from its folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderRole {
    /// The sentence-transformers layout around it (`modules.json` with a Pooling module).
    Embedding,
    /// A causal LM trained to answer "yes" or "no" (Qwen3-Reranker: its folder says "reranker").
    YesNo,
}

/// What the folder at `dir` with `config.json` `raw` is, when it is a decoder used as an encoder.
pub fn decoder_role(dir: &Path, raw: &Value) -> Option<DecoderRole> {
    let model_type = raw.get("model_type").and_then(Value::as_str)?;
    crate::model::config::Arch::from_model_type(model_type)?;
    if has_pooling_module(dir) {
        return Some(DecoderRole::Embedding);
    }
    let name = dir.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    (name.contains("reranker") && answers_in_words(dir, raw)).then_some(DecoderRole::YesNo)
}

/// Whether the checkpoint keeps a language-model head to read "yes" and "no" from: a
/// `...ForSequenceClassification` conversion (one score column, no vocabulary) does not.
fn answers_in_words(dir: &Path, raw: &Value) -> bool {
    let architectures = raw.get("architectures").and_then(Value::as_array);
    let classifier = architectures
        .is_some_and(|a| a.iter().filter_map(Value::as_str).any(|a| a.ends_with("ForSequenceClassification")));
    let tied = raw.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false);
    !classifier
        && (tied || crate::model::checkpoint::tensor_names(dir).is_ok_and(|n| n.iter().any(|n| n == "lm_head.weight")))
}

fn has_pooling_module(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("modules.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v.as_array().cloned())
        .is_some_and(|modules| {
            modules.iter().any(|m| m.get("type").and_then(Value::as_str).is_some_and(|t| t.ends_with(".Pooling")))
        })
}

/// A decoder's transformer run as an encoder.
pub struct DecoderEncoder {
    pub transformer: Transformer,
    /// Every token sees every other (EmbeddingGemma) rather than those before it.
    bidirectional: bool,
}

impl DecoderEncoder {
    /// The transformer of the folder at `dir` (loaded by `model::load`, which reads folders),
    /// with `config.json`'s text part `raw`, made an encoder.
    pub fn new(dir: &Path, mut transformer: Transformer, raw: &Value) -> Result<DecoderEncoder> {
        if transformer.config.hybrid.is_some() {
            return Err(ModelError::Config {
                path: dir.join("config.json"),
                message: "recurrent (linear-attention) layers are not supported in embedding models".into(),
            });
        }
        if transformer.config.gemma.is_some() {
            // EmbeddingGemma scales by sqrt(hidden) in the weights' dtype, unrounded (as
            // transformers' Gemma3TextScaledWordEmbedding and mlx-embeddings do).
            transformer.set_embed_scale((transformer.config.hidden_size as f32).sqrt())?;
        }
        // Gemma 3's `true`, Gemma 4's `"all"` ("vision" leaves text causal).
        let bidirectional = match raw.get("use_bidirectional_attention") {
            Some(Value::Bool(on)) => *on,
            Some(Value::String(which)) => which == "all",
            _ => false,
        };
        Ok(DecoderEncoder { transformer, bidirectional })
    }

    /// The last hidden states (after the final norm) of `ids` `[rows, len]`, row `r` holding
    /// `lengths[r]` tokens padded on the right.
    pub fn forward(&self, ids: &Array, lengths: &[usize]) -> Result<Array> {
        let len = ids.shape()[1] as usize;
        let mut caches: Vec<OnePass> = (0..self.transformer.config.kv_cache_layers())
            .map(|_| OnePass { lengths, len, bidirectional: self.bidirectional })
            .collect();
        self.transformer.forward_hidden(ids, &mut caches)
    }

    /// Each row's hidden state at its last token, `[rows, hidden]`.
    pub fn last_tokens(hidden: &Array, lengths: &[usize]) -> Result<Array> {
        let last: Vec<i32> = lengths.iter().map(|&n| n.saturating_sub(1) as i32).collect();
        let index = Array::from_slice(&last, &[lengths.len() as i32, 1, 1]);
        Ok(hidden.take_along_axis(&index, 1)?.squeeze_axes(&[1])?)
    }

    /// A reranker's relevance of each row: P("yes") against "no" at its last token, the
    /// softmax of the two logits as Qwen3-Reranker's own scoring takes it.
    pub fn judge(&self, hidden: &Array, lengths: &[usize], yes: u32, no: u32) -> Result<Vec<f32>> {
        // In f32 before the difference: two close bf16 logits would lose it.
        let logits = self.transformer.logits(&Self::last_tokens(hidden, lengths)?)?.as_dtype(Dtype::Float32)?;
        let logit = subtract(logits.try_index((.., yes as i32))?, logits.try_index((.., no as i32))?)?;
        let scores = sigmoid(&logit)?;
        scores.eval()?;
        Ok(scores.as_slice::<f32>().to_vec())
    }

    /// Attention heads per layer (the batch planner sizes the attention's scores with it).
    pub fn heads(&self) -> usize {
        self.transformer.config.num_heads
    }

    pub fn arrays(&self) -> Vec<&Array> {
        self.transformer.arrays()
    }
}

/// The cache of one forward over right-padded rows: it keeps nothing, positions start at 0 in
/// every row, and its masks hide each row's padding (and, causal, the tokens after a query;
/// windowed, those beyond the window).
struct OnePass<'a> {
    lengths: &'a [usize],
    len: usize,
    bidirectional: bool,
}

impl LayerCache for OnePass<'_> {
    fn positions(&self) -> Result<Positions> {
        Ok(Positions::Scalar(0))
    }

    fn mask(&self, _new_tokens: i32, window: Option<usize>) -> Result<AttentionMask> {
        Ok(AttentionMask::Explicit(pass_mask(self.lengths, self.len, self.bidirectional, window)))
    }

    fn update(&mut self, keys: &Array, values: &Array) -> Result<(KvTensor, KvTensor)> {
        Ok((KvTensor::Dense(keys.clone()), KvTensor::Dense(values.clone())))
    }

    fn drop_outside(&mut self, _window: usize) -> Result<()> {
        Ok(())
    }

    fn states(&self) -> &[Array] {
        &[]
    }

    fn set_states(&mut self, _states: Vec<Array>) {}

    fn advance(&mut self, _n: i32) {}
}

/// Which keys each query sees, `[rows, 1, len, len]`. A bidirectional window of `w` reaches
/// `w / 2` tokens each way (Hugging Face's Gemma 3 config halves it, `w / 2 + 1` exclusive); a
/// causal one `w - 1` back. A padding query sees itself at least, so its softmax has a term
/// (its output is never read, but a NaN would reach the pooling's sums).
pub(super) fn pass_mask(lengths: &[usize], len: usize, bidirectional: bool, window: Option<usize>) -> Array {
    let mut allowed = Vec::with_capacity(lengths.len() * len * len);
    for &n in lengths {
        for i in 0..len {
            for j in 0..len {
                let in_window = match window {
                    None => true,
                    Some(w) if bidirectional => i.abs_diff(j) < w / 2 + 1,
                    Some(w) => i.abs_diff(j) < w,
                };
                let seen = j < n && (bidirectional || j <= i) && in_window;
                allowed.push(seen || i == j);
            }
        }
    }
    Array::from_slice(&allowed, &[lengths.len() as i32, 1, len as i32, len as i32])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(mask: &Array) -> Vec<bool> {
        mask.as_slice::<bool>().to_vec()
    }

    #[test]
    fn causal_mask_hides_later_tokens_and_padding() {
        // One row of 2 tokens padded to 3.
        let m = rows(&pass_mask(&[2], 3, false, None));
        #[rustfmt::skip]
        let want = [true, false, false,
                    true, true, false,
                    true, true, true]; // the padding query sees the real keys and itself
        assert_eq!(m, want);
    }

    #[test]
    fn bidirectional_window_reaches_half_each_way() {
        // Gemma's window 4: two tokens each way.
        let m = rows(&pass_mask(&[5], 5, true, Some(4)));
        let row0: Vec<bool> = m[..5].to_vec();
        assert_eq!(row0, [true, true, true, false, false]);
        let row2: Vec<bool> = m[10..15].to_vec();
        assert_eq!(row2, [true, true, true, true, true]);
    }
}
