//! A prompt start that several requests in the engine begin with (agents with one long system
//! prompt) is held once: one [`SharedKv`] segment per layer that their rows, in the prefill
//! group and in the running batch, attend to, instead of a copy in every row (16 agents on a
//! 4,300-token system prompt: 16 x 190 MB of f32 keys and values on SmolLM2, and every step
//! reading all of them).
//!
//! - Made when a request is admitted whose prompt shares at least [`MIN_SHARED`] tokens with
//!   another request in the engine (prefilling, running or waiting), and the prefix cache holds
//!   them: those tokens, in whole blocks, copied once from the cache. Rows already holding them
//!   drop their own copy; the request, and every later one that starts the same way, takes the
//!   segment without a copy and restores only what follows it.
//! - One segment at a time; it goes when no row uses it. A request set aside in the middle of
//!   its prefill takes a copy of its whole sequence with it.
//! - Reservations follow the memory: a row that uses the segment reserves only its own part,
//!   and the segment is reserved once while it exists.

use std::sync::atomic::{AtomicU64, Ordering};

use super::prefix_cache::{PrefixCache, BLOCK_TOKENS};
use super::{KvManager, Rows};
use crate::engine::batch::Batch;
use crate::engine::sequence::Sequence;
use crate::model::cache::SharedKv;

/// Tokens two prompts must share for a segment: below that a copy per row costs little.
pub(super) const MIN_SHARED: usize = 4 * BLOCK_TOKENS;

pub(super) struct SharedPrefix {
    pub tokens: Vec<u32>,
    pub layers: Vec<SharedKv>,
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn common_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl KvManager {
    /// How many leading tokens of `seq`'s prompt (at most `limit`) the shared segment holds
    /// for it, making the segment when its prompt starts like another request's: 0 when it
    /// does not take one.
    pub(super) fn shared_start(&mut self, seq: &Sequence, limit: usize, rows: &mut Rows<'_>) -> usize {
        let prompt = seq.request.cache_key();
        let prompt = prompt.as_ref();
        if seq.warm || !self.segments {
            return 0;
        }
        if let Some(shared) = &self.shared {
            let n = shared.tokens.len();
            return if n <= limit && prompt.starts_with(&shared.tokens) { n } else { 0 };
        }
        // Not the engine's own turn-boundary prefill: that is this conversation's earlier turn,
        // whose kept buffers the request takes over instead.
        let others = rows
            .group
            .seqs
            .iter()
            .chain(rows.waiting)
            .filter(|s| !s.warm)
            .map(|s| s.request.cache_key())
            .chain(rows.running.seqs.iter().filter(|s| !s.warm).map(Sequence::cache_tokens));
        let common = others.map(|o| common_len(&o, prompt)).max().unwrap_or(0);
        let len = common.min(limit) / BLOCK_TOKENS * BLOCK_TOKENS;
        if len < MIN_SHARED {
            return 0;
        }
        let Some(prefix) = self.prefix.as_mut() else { return 0 };
        let layers = match prefix.segment(prompt, len, self.layers) {
            Ok(Some(layers)) => layers,
            Ok(None) => return 0,
            Err(e) => {
                tracing::warn!("prefix cache: cannot make a shared segment: {e}");
                return 0;
            }
        };
        let id = next_id();
        let layers = layers.into_iter().map(|(keys, values)| SharedKv { id, keys, values }).collect();
        self.shared = Some(SharedPrefix { tokens: prompt[..len].to_vec(), layers });
        self.reserved += self.shared_segment_bytes();
        tracing::debug!("request {}: {len} prompt tokens held once for the requests that share them", seq.id);
        self.share_existing_rows(rows);
        len
    }

    /// Rows of the group and of the running batch that hold the shared segment's tokens drop
    /// their copy of them and use the segment.
    fn share_existing_rows(&mut self, rows: &mut Rows<'_>) {
        let Some(shared) = &self.shared else { return };
        let n = shared.tokens.len();
        let starts = |tokens: &[u32]| tokens.len() >= n && tokens[..n] == shared.tokens[..];
        let group: Vec<usize> = (0..rows.group.len())
            .filter(|&r| {
                let s = &rows.group.seqs[r];
                !s.warm && !rows.group.is_after_shared(r) && s.prefilled >= n && starts(&s.request.cache_key())
            })
            .collect();
        let lengths = rows.running.lengths();
        let running: Vec<usize> = (0..rows.running.len())
            .filter(|&r| {
                let s = &rows.running.seqs[r];
                !s.warm && !rows.running.is_after_shared(r) && lengths[r] as usize >= n && starts(&s.cache_tokens())
            })
            .collect();
        // Windowed layers hold their window either way: only the full layers are spared.
        let saved = self.footprint.full_layers_bytes(n);
        let mut released = 0;
        for (batch, which) in [(&mut *rows.group, group), (&mut *rows.running, running)] {
            if which.is_empty() {
                continue;
            }
            // All layers or none: a failure leaves the rows with their own copies.
            let converted: Result<Vec<_>, _> = batch
                .cache
                .iter()
                .zip(&shared.layers)
                .map(|(layer, segment)| {
                    let mut layer = layer.clone();
                    layer.share_rows(segment, &which).map(|()| layer)
                })
                .collect();
            match converted {
                Ok(layers) => {
                    batch.cache = layers;
                    if let Err(e) = batch.settle_cache() {
                        tracing::warn!("cannot rebuild the rows that share a prompt start: {e}");
                    }
                    for &r in &which {
                        let seq = &mut batch.seqs[r];
                        let saved = saved.min(seq.kv.bytes);
                        seq.kv.bytes -= saved;
                        released += saved;
                        seq.kv.shared_prefix = n;
                    }
                }
                Err(e) => tracing::warn!("cannot share a prompt start between rows: {e}"),
            }
        }
        self.reserved -= released;
    }

    /// A request that takes the segment reserves only what follows it.
    pub(super) fn reserve_after_shared(&mut self, seq: &mut Sequence, tokens: usize) {
        let saved = self.footprint.full_layers_bytes(tokens).min(seq.kv.bytes);
        seq.kv.bytes -= saved;
        self.reserved -= saved;
        seq.kv.shared_prefix = tokens;
    }

    /// A prefill set aside waits with a copy of its whole sequence (shared start included), so it
    /// reserves all of it again.
    pub fn set_aside(&mut self, seq: &mut Sequence) {
        let added = self.footprint.full_layers_bytes(seq.kv.shared_prefix);
        seq.kv.bytes += added;
        self.reserved += added;
        seq.kv.shared_prefix = 0;
    }

    /// The segment goes once no row uses it.
    pub fn drop_unused_shared(&mut self, group: &Batch, running: &Batch) {
        if self.shared.is_some() && !group.uses_shared() && !running.uses_shared() {
            self.reserved -= self.shared_segment_bytes();
            self.shared = None;
            if let Some(Err(e)) = self.prefix.as_mut().map(PrefixCache::release_segment) {
                tracing::warn!("prefix cache: cannot copy the shared segment's blocks: {e}");
            }
        }
    }

    /// The bytes of the segment (counted once, however many rows use it).
    pub(super) fn shared_segment_bytes(&self) -> usize {
        self.shared.as_ref().map_or(0, |s| s.layers.iter().map(SharedKv::nbytes).sum())
    }
}
