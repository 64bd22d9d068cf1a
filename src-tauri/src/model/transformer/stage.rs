//! A pipeline stage: the consecutive layers one rank of a cluster holds (issue 38). The model
//! is built whole but lazily (MLX reads a weight only when it is evaluated), then cut down to
//! its stage before [`Transformer::materialize`], so another rank's layers are never read.

use std::ops::Range;

use mlx_rs::Array;

use super::{DecoderLayer, Transformer};
use crate::model::cache::LayerCache;
use crate::model::error::{ModelError, Result};

/// The part of a model one process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The layers it runs, by the model's numbering.
    pub layers: Range<usize>,
    /// Whether it also holds the ends: embeddings, final norm and output head (the rank that
    /// samples).
    pub ends: bool,
}

impl Transformer {
    /// Each layer's weight bytes, from the shapes (nothing is read).
    pub fn layer_weight_bytes(&self) -> Vec<u64> {
        self.layers.iter().map(|l| DecoderLayer::arrays(l).iter().map(|a| a.nbytes() as u64).sum()).collect()
    }

    /// The bytes of the ends (embeddings, final norm, output head, an MTP head).
    pub fn ends_weight_bytes(&self) -> u64 {
        self.end_arrays().iter().map(|a| a.nbytes() as u64).sum()
    }

    /// Why the model cannot run as pipeline stages, if it cannot: a layer reading another
    /// layer's cache (Gemma 4's shared KV) or inputs computed from the token ids at every layer
    /// (Gemma 4's per-layer inputs) would need more than the residual stream between ranks.
    pub fn stage_refusal(&self) -> Option<String> {
        if self.config.kv_cache_layers() < self.config.num_layers {
            return Some("its later layers reuse earlier layers' keys and values (shared KV)".into());
        }
        if self.per_layer_inputs.is_some() {
            return Some("every layer takes per-layer inputs computed from the token ids".into());
        }
        None
    }

    /// Keeps only `stage`'s layers (and the ends where it holds them); the rest are dropped
    /// unread. The multi-token-prediction head stays with the ends (the rank that samples drafts).
    pub fn keep_stage(&mut self, stage: Stage) -> Result<()> {
        if let Some(why) = self.stage_refusal() {
            return Err(ModelError::Invalid(format!("this model cannot be split across machines: {why}")));
        }
        if self.is_split() || stage.layers.is_empty() || stage.layers.end > self.layers.len() {
            return Err(ModelError::Invalid(format!(
                "layers {:?} are not a stage of a model of {} layers",
                stage.layers,
                self.layers.len()
            )));
        }
        self.layers.truncate(stage.layers.end);
        self.layers.drain(..stage.layers.start);
        if !stage.ends {
            self.mtp = None;
        }
        self.stage = Some(stage);
        Ok(())
    }

    /// The decoder layers this process holds (a stage's, where split into stages).
    pub fn held_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether this process holds only part of the model (a pipeline stage or a tensor share).
    pub fn is_split(&self) -> bool {
        self.stage.is_some() || self.tensor.is_some()
    }

    /// The part of the model this process holds (`None`: all of it).
    pub fn stage(&self) -> Option<&Stage> {
        self.stage.as_ref()
    }

    /// The model's number of its first layer held here.
    pub fn first_layer(&self) -> usize {
        self.stage.as_ref().map_or(0, |s| s.layers.start)
    }

    /// One cache per layer held that keeps one.
    pub fn cache_count(&self) -> usize {
        match &self.stage {
            Some(s) => s.layers.len(),
            None => self.config.kv_cache_layers(),
        }
    }

    /// The layers held over the residual stream `h` (`[B, L, hidden]`, text only) that follows
    /// what `cache` holds: what a pipeline stage does with what the rank before sent.
    pub fn forward_layers<C: LayerCache>(&self, h: &Array, cache: &mut [C]) -> Result<Array> {
        self.run_layers(h.clone(), cache, super::StepInputs::default(), None, None)
    }

    /// The final norm over the residual stream after the last layer.
    pub fn final_norm(&self, h: &Array) -> Result<Array> {
        self.norm.forward(h)
    }
}
