//! The model's own multi-token-prediction head as a proposer (`--speculative mtp`; `auto` uses
//! it where the checkpoint ships one and no draft model is loaded). The head's cache column for
//! position `i` holds the pair (token `i + 1`, the model's hidden state at `i`): after every
//! forward of the model over a row (a prefill chunk, a decode or verify step), once the tokens
//! that follow its positions are known, the head is fed the pairs of the positions the row kept,
//! so its cache follows the row's. Its output at the last fed position gives the first draft;
//! each draft beside the head's own output gives the next. Those drafting columns are taken back
//! at once (they come from the head's hidden states, not the model's): the verify step's hidden
//! states feed the accepted positions again. One row at a time (the head is one layer; drafting
//! runs where a few rows decode).
//!
//! A row whose positions were not all fed (a prefix-cache hit, a row that resumes) starts its
//! head cache afresh where it is: its drafts see less context, the output is the same (every
//! draft is verified).

use std::collections::HashMap;

use mlx_rs::ops::indexing::{argmax_axis, TryIndexOp};
use mlx_rs::{Array, Dtype};

use crate::engine::request::RequestId;
use crate::model::{KvCache, ModelError, Transformer};

struct Row {
    cache: KvCache,
    /// The head's output at the last fed position (`[1, 1, hidden]`): the first draft's source.
    last: Option<Array>,
}

/// Per request, the head's cache and its last output.
#[derive(Default)]
pub struct MtpDrafter {
    rows: HashMap<RequestId, Row>,
}

impl MtpDrafter {
    /// Request `id`'s positions `start..start + n` and `next`, the `n` tokens that follow them:
    /// the head takes these tokens beside the model's hidden states there, the first `n` of
    /// batch row `row` of a forward's `hidden` (`[rows, positions, hidden]`). On a failure the
    /// request's head cache goes (drafts only ever speed things up; it starts again later).
    pub fn feed(&mut self, model: &Transformer, id: RequestId, start: usize, next: &[u32], hidden: &Array, row: usize) {
        if let Err(e) = self.try_feed(model, id, start, next, hidden, row) {
            tracing::warn!("MTP head: {e}; request {id} drafts without it for now");
            self.forget(id);
        }
    }

    /// Up to `most` greedy drafts for request `id` (none before it was fed, or on a failure).
    pub fn propose(&mut self, model: &Transformer, id: RequestId, most: usize) -> Vec<u32> {
        self.try_propose(model, id, most).unwrap_or_else(|e| {
            tracing::warn!("MTP head: {e}; request {id} drafts without it for now");
            self.forget(id);
            Vec::new()
        })
    }

    fn try_feed(
        &mut self,
        model: &Transformer,
        id: RequestId,
        start: usize,
        next: &[u32],
        hidden: &Array,
        batch_row: usize,
    ) -> Result<(), ModelError> {
        let head = model.mtp.as_ref().ok_or_else(|| ModelError::Mlx("the model has no MTP head".into()))?;
        let row = self.rows.entry(id).or_insert_with(|| Row { cache: KvCache::new(), last: None });
        if row.cache.len() as usize != start {
            // Positions it never saw (a prefix-cache hit, a row resumed): it starts here.
            *row = Row { cache: KvCache::new().starting_at(start as i32), last: None };
        }
        let n = next.len() as i32;
        let ids = Array::from_slice(next, &[1, n]);
        let b = batch_row as i32;
        let hidden = hidden.try_index((b..b + 1, ..n, ..))?;
        let out = head.forward(model, &ids, &hidden, &mut row.cache)?;
        let last = out.try_index((.., n - 1.., ..))?;
        let buffers = row.cache.buffers();
        let held = buffers.keys.iter().chain(buffers.values.iter()).flat_map(|t| t.parts());
        mlx_rs::transforms::eval(std::iter::once(&last).chain(held))?;
        row.last = Some(last);
        Ok(())
    }

    fn try_propose(&mut self, model: &Transformer, id: RequestId, most: usize) -> Result<Vec<u32>, ModelError> {
        let (Some(head), Some(row)) = (model.mtp.as_ref(), self.rows.get_mut(&id)) else { return Ok(Vec::new()) };
        let Some(mut hidden) = row.last.clone() else { return Ok(Vec::new()) };
        if most == 0 {
            return Ok(Vec::new());
        }
        let fed = row.cache.len();
        let greedy = |h: &Array| -> Result<u32, ModelError> {
            let token = argmax_axis(&model.logits(h)?, -1, None)?.as_dtype(Dtype::Uint32)?;
            token.eval()?;
            Ok(token.as_slice::<u32>()[0])
        };
        let mut drafts = vec![greedy(&hidden)?];
        while drafts.len() < most {
            let ids = Array::from_slice(&drafts[drafts.len() - 1..], &[1, 1]);
            hidden = head.forward(model, &ids, &hidden, &mut row.cache)?;
            drafts.push(greedy(&hidden)?);
        }
        // The drafting columns go: the verify step's hidden states feed what it accepts.
        row.cache.truncate(fed);
        let vocab = model.config.vocab_size as u32;
        Ok(drafts.into_iter().take_while(|&t| t < vocab).collect())
    }

    /// Request `id` ended: its head cache goes.
    pub fn forget(&mut self, id: RequestId) {
        self.rows.remove(&id);
    }

    /// Bytes of the rows' head caches.
    pub fn nbytes(&self) -> usize {
        self.rows.values().map(|r| r.cache.nbytes()).sum()
    }
}
