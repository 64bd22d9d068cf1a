//! Prefill: waiting prompts are admitted best first (`lanes`), take what the prefix cache holds
//! of them, and are prefilled together as the rows of one batch (`group_cache`, aligned on the
//! right like the running batch), a chunk per forward within the step's time budget (`pacing`).
//! A prompt that is done leaves the group and joins the running batch. A better request that
//! finds the group full takes the place of its lowest-priority member, which waits again with
//! what it has prefilled and resumes there.

use std::sync::atomic::Ordering;
use std::time::Instant;

use mlx_rs::Array;

use super::{explain_miss, Scheduler};
use crate::engine::lanes;
use crate::engine::prefix_cache::BLOCK_TOKENS;
use crate::engine::request::FinishReason;
use crate::engine::sequence::Sequence;
use crate::model::{BatchKvCache, KvCache, ModelError};

/// Prompts prefilled together at most.
pub(super) const GROUP: usize = 8;

/// Row `row` of a batch cache as a cache of its own (a copy).
fn take_row(batch: &[BatchKvCache], row: usize) -> Result<Vec<KvCache>, ModelError> {
    batch
        .iter()
        .map(|layer| {
            let mut cache = KvCache::new();
            if let Some((k, v)) = layer.row_contents(row)? {
                cache.update(&k, &v)?;
            }
            Ok(cache)
        })
        .collect()
}

/// Adds `row` (one cache per layer) as the last row of `batch`, which holds `rows` rows. On a
/// failure the layers that took the row give it back, so the batch stays as it was.
fn push_row(batch: &mut [BatchKvCache], row: &[KvCache], rows: usize) -> Result<(), ModelError> {
    for (layer, cache) in batch.iter_mut().zip(row) {
        if let Err(e) = layer.push_row(cache) {
            let keep: Vec<usize> = (0..rows).collect();
            for layer in batch.iter_mut().filter(|c| c.rows() > rows) {
                let _ = layer.retain(&keep);
            }
            return Err(e);
        }
    }
    Ok(())
}

impl Scheduler {
    /// Prompt tokens a member still has to prefill (its last token is its first decode input).
    fn remaining(seq: &Sequence) -> usize {
        seq.request.prompt_ids.len() - 1 - seq.prefilled
    }

    /// Advances the prompts being prefilled by what the step's time budget allows; returns
    /// the tokens processed.
    pub(super) fn prefill_step(&mut self) -> usize {
        let mut budget = self.pacing.budget(!self.running.is_empty());
        let mut processed = 0;
        loop {
            self.fill_group();
            self.join_finished_members();
            if self.group.is_empty() || budget == 0 {
                break;
            }
            let rows = self.group.len();
            let shortest = self.group.iter().map(Self::remaining).min().expect("non-empty");
            // Every row adds the same number of tokens (the rows stay aligned on the right).
            let n = (budget / rows).max(1).min(shortest);
            let ids: Vec<u32> = self
                .group
                .iter()
                .flat_map(|s| s.request.prompt_ids[s.prefilled..s.prefilled + n].iter().copied())
                .collect();
            let ids = Array::from_slice(&ids, &[rows as i32, n as i32]);
            let began = Instant::now();
            let result = self.model.transformer.forward_hidden(&ids, &mut self.group_cache).and_then(|h| Ok(h.eval()?));
            self.pacing.record_prefill(rows * n, began.elapsed());
            if let Err(e) = result {
                // The group's state is unknown: its requests fail, the engine serves on.
                tracing::error!("prefill failed: {e}");
                for mut seq in std::mem::take(&mut self.group) {
                    seq.finish(FinishReason::Error, None, Some(format!("prefill failed: {e}")));
                    self.release(&seq);
                }
                self.group_cache.iter_mut().for_each(|c| *c = BatchKvCache::new());
                break;
            }
            for seq in &mut self.group {
                seq.prefilled += n;
                seq.prefill_chunks += 1;
            }
            budget = budget.saturating_sub(rows * n);
            processed += rows * n;
            self.metrics.prompt_tokens_total += (rows * n) as u64;
            self.store_whole_blocks(n);
        }
        processed
    }

    /// The whole blocks a forward of `n` tokens completed go to the prefix cache at once, for
    /// requests that share them.
    fn store_whole_blocks(&mut self, n: usize) {
        let Some(prefix) = self.prefix.as_mut() else { return };
        for (row, seq) in self.group.iter().enumerate() {
            let whole = seq.prefilled / BLOCK_TOKENS * BLOCK_TOKENS;
            if whole > (seq.prefilled - n) / BLOCK_TOKENS * BLOCK_TOKENS {
                if let Err(e) = prefix.store_row(&seq.request.prompt_ids[..whole], &self.group_cache, row) {
                    tracing::warn!("prefix cache: cannot store a prefilled block: {e}");
                }
            }
        }
    }

    /// Whether `seq` can be admitted now: a batch slot, and its KV reservation within budget
    /// (an engine with nothing running always takes one request, whatever its size).
    fn fits(&self, seq: &Sequence) -> bool {
        let reservation = if seq.reserved { 0 } else { seq.reserved_bytes };
        let busy = self.running.len() + self.group.len();
        busy < self.config.max_batch && (self.reserved_bytes + reservation <= self.info.kv_budget_bytes || busy == 0)
    }

    /// Whether `seq` shares a start of at least a block with a member still prefilling it: it
    /// waits until those blocks are in the prefix cache, then reuses them instead of computing
    /// (and holding) the same keys and values twice (agents sharing a system prompt).
    fn follows_a_member(&self, seq: &Sequence) -> bool {
        self.prefix.is_some()
            && self.group.iter().any(|member| {
                let shared =
                    member.request.prompt_ids.iter().zip(&seq.request.prompt_ids).take_while(|(a, b)| a == b).count();
                shared >= BLOCK_TOKENS && member.prefilled < shared / BLOCK_TOKENS * BLOCK_TOKENS
            })
    }

    /// The best waiting request that may start now (one sharing a prompt being prefilled waits).
    fn best_waiting(&self) -> Option<usize> {
        let order = lanes::order(self.waiting.iter().map(|s| (s.request.priority, s.waited())));
        order.into_iter().find(|&i| !self.follows_a_member(&self.waiting[i]))
    }

    /// Admits waiting requests into the group while it has room, best first; a better request
    /// that finds it full takes the lowest-priority member's place.
    fn fill_group(&mut self) {
        while let Some(i) = self.best_waiting() {
            if self.group.len() >= GROUP {
                let candidate = lanes::effective(self.waiting[i].request.priority, self.waiting[i].waited());
                // The lowest (aged) priority, the newest among equals.
                let lowest = (0..self.group.len()).min_by_key(|&r| {
                    let s = &self.group[r];
                    (lanes::effective(s.request.priority, s.waited()), s.waited())
                });
                let Some(lowest) = lowest else { break };
                let lowest_priority =
                    lanes::effective(self.group[lowest].request.priority, self.group[lowest].waited());
                if candidate <= lowest_priority || !self.park(lowest) {
                    break;
                }
                continue;
            }
            if !self.fits(&self.waiting[i]) {
                break;
            }
            let seq = self.waiting.remove(i).expect("checked");
            self.queued.fetch_sub(1, Ordering::SeqCst);
            self.admit(seq);
        }
    }

    /// Group member `row` waits again, holding its partial cache and its reservation.
    fn park(&mut self, row: usize) -> bool {
        let caches = match take_row(&self.group_cache, row) {
            Ok(caches) => caches,
            Err(e) => {
                tracing::warn!("cannot set a prefill aside: {e}");
                return false;
            }
        };
        let mut seq = self.group.remove(row);
        tracing::debug!("request {} waits: a better request takes its place in the prefill", seq.id);
        seq.prefill = Some((caches, seq.prefilled));
        self.drop_group_row(row);
        self.waiting.push_back(seq);
        self.queued.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Takes a request in: reserves its KV, restores its prompt's cached start (or resumes a
    /// set-aside prefill) and makes it a row of the group.
    fn admit(&mut self, mut seq: Sequence) {
        if !seq.reserved {
            self.reserved_bytes += seq.reserved_bytes;
            seq.reserved = true;
        }
        seq.mark_admitted();
        let (caches, done) = match seq.prefill.take() {
            Some(resumed) => resumed,
            None => self.restore(&mut seq),
        };
        seq.prefilled = done;
        if Self::remaining(&seq) == 0 {
            // All cached (the same prompt again), or a one-token prompt: straight to the batch.
            self.join_batch(seq, caches);
            return;
        }
        if let Err(e) = push_row(&mut self.group_cache, &caches, self.group.len()) {
            tracing::error!("cannot add a row to the prefill: {e}");
            seq.finish(FinishReason::Error, None, Some(format!("internal error: {e}")));
            self.release(&seq);
            return;
        }
        self.group.push(seq);
    }

    /// A new request's caches, with what the prefix cache holds of its prompt.
    fn restore(&mut self, seq: &mut Sequence) -> (Vec<KvCache>, usize) {
        let empty = || (0..self.cache.len()).map(|_| KvCache::new()).collect::<Vec<_>>();
        let Some(prefix) = self.prefix.as_mut() else { return (empty(), 0) };
        // Admitted requests come first: the cache gives up what they reserved.
        prefix.shrink_to(self.info.kv_budget_bytes.saturating_sub(self.reserved_bytes));
        // The last prompt token is the first decode input, so at most the rest is restored.
        let prompt = &seq.request.prompt_ids;
        let began = Instant::now();
        let restored = prefix.restore(prompt, prompt.len() - 1, self.cache.len());
        seq.restore_time = began.elapsed();
        match restored {
            Ok(restored) => {
                seq.cached_tokens = restored.tokens;
                seq.cache_miss = restored.divergence.and_then(|d| explain_miss(d, &seq.request, &self.model.tokenizer));
                if let Some(miss) = &seq.cache_miss {
                    tracing::debug!(
                        "request {}: prefix cache reused {} tokens; a cached sequence went on differently at token {} (message {:?}): ...{:?} | {:?}...",
                        seq.id, miss.position, miss.position, miss.message, miss.before, miss.after
                    );
                }
                (restored.caches, restored.tokens)
            }
            Err(e) => {
                tracing::warn!("prefix cache: restore failed, prefilling everything: {e}");
                (empty(), 0)
            }
        }
    }

    /// Removes row `row` from the group's cache.
    fn drop_group_row(&mut self, row: usize) {
        let keep: Vec<usize> = (0..self.group.len() + 1).filter(|&r| r != row).collect();
        for layer in &mut self.group_cache {
            if let Err(e) = layer.retain(&keep) {
                tracing::error!("cannot shrink the prefill: {e}");
            }
        }
    }

    /// Members whose prompt is prefilled join the running batch.
    fn join_finished_members(&mut self) {
        while let Some(row) = self.group.iter().position(|s| Self::remaining(s) == 0) {
            let caches = take_row(&self.group_cache, row);
            let seq = self.group.remove(row);
            self.drop_group_row(row);
            match caches {
                Ok(caches) => self.join_batch(seq, caches),
                Err(e) => {
                    let mut seq = seq;
                    seq.finish(FinishReason::Error, None, Some(format!("internal error: {e}")));
                    self.release(&seq);
                }
            }
        }
    }

    /// A prefilled sequence becomes the running batch's last row (its prompt to the prefix
    /// cache first).
    fn join_batch(&mut self, mut seq: Sequence, cache: Vec<KvCache>) {
        if let Some(prefix) = self.prefix.as_mut() {
            if let Err(e) = prefix.store_prefill(&seq.request.prompt_ids[..seq.prefilled], &cache) {
                tracing::warn!("prefix cache: cannot store a prompt: {e}");
            }
        }
        if let Err(e) = push_row(&mut self.cache, &cache, self.running.len()) {
            tracing::error!("cannot add a row to the batch: {e}");
            seq.finish(FinishReason::Error, None, Some(format!("internal error: {e}")));
            self.release(&seq);
            return;
        }
        seq.mark_joined();
        self.running.push(seq);
    }

    /// Group members whose caller went away leave the group.
    pub(super) fn reap_abandoned_members(&mut self) {
        while let Some(row) = self.group.iter().position(Sequence::is_abandoned) {
            let mut seq = self.group.remove(row);
            self.drop_group_row(row);
            seq.finish(FinishReason::Cancelled, None, None);
            self.release(&seq);
        }
    }
}
