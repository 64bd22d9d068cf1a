//! Prefill: waiting prompts are admitted best first (`lanes`), take what the prefix cache holds
//! of them, and are prefilled together as the rows of one batch (`group_cache`, aligned on the
//! right like the running batch), a chunk per forward within the step's time budget (`pacing`).
//! A prompt's last chunk also gives its first token (as mlx-lm's `generate_step` does), so it
//! joins the running batch with its first token out. Members that finish together join in one
//! copy, or none when the running batch is empty (it takes the group's buffers). A better
//! request that finds the group full takes the place of its lowest-priority member, which
//! waits again with what it has prefilled and resumes there.

use std::sync::atomic::Ordering;
use std::time::Instant;

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

use super::{explain_miss, Scheduler};
use crate::engine::lanes;
use crate::engine::prefix_cache::{BLOCK_TOKENS, SNAPSHOT_TOKENS};
use crate::engine::request::FinishReason;
use crate::engine::sequence::Sequence;
use crate::model::{BatchKvCache, KvCache, LayerCache, ModelError};

/// Prompts prefilled together at most: 16, as many as arrive together when a team points its
/// agents at one server (c=16 short chats: TTFT p95 4.7 s with 16 against 5.3 s with 8, and more output).
pub(super) const GROUP: usize = 16;

/// Row `row` of a batch cache as a cache of its own (shared when it is the only row, else a copy).
fn take_row(batch: &[BatchKvCache], row: usize) -> Result<Vec<KvCache>, ModelError> {
    batch
        .iter()
        .map(|layer| {
            if let Some(only) = layer.only_row() {
                return Ok(only);
            }
            let own = match layer.row_contents(row)? {
                Some((k, v)) => KvCache::from_pieces(&[k], &[v], 0)?,
                None => KvCache::new(),
            };
            layer.row_cache(own, row)
        })
        .collect()
}

/// Adds rows to every layer of `batch`, which holds `rows` rows; on a failure the layers that
/// took them give them back, so the batch stays as it was.
fn add_rows(
    batch: &mut [BatchKvCache],
    rows: usize,
    mut add: impl FnMut(usize, &mut BatchKvCache) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    for (i, layer) in batch.iter_mut().enumerate() {
        if let Err(e) = add(i, layer) {
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
    /// Prompt tokens a member still has to prefill.
    fn remaining(seq: &Sequence) -> usize {
        seq.request.prompt_ids.len() - seq.prefilled
    }

    /// Advances the prompts being prefilled by what the step's time budget allows; returns
    /// the tokens processed.
    pub(super) fn prefill_step(&mut self) -> usize {
        let decoding = !self.running.is_empty();
        // Sized once the group is known (its prompts' depths), then spent chunk by chunk.
        let mut budget: Option<usize> = None;
        let mut processed = 0;
        loop {
            self.join_finished_members();
            self.fill_group();
            if self.group.is_empty() {
                break;
            }
            let depths: Vec<usize> = self.group.iter().map(|s| s.prefilled).collect();
            // A prompt is short by the prefill it needs in all, not by what it has left (the
            // tail of a long one is paced like the rest of it).
            let longest = self.group.iter().map(|s| s.request.prompt_ids.len() - s.cached_tokens).max().unwrap_or(0);
            let left = *budget.get_or_insert_with(|| self.pacing.budget(decoding, &depths, longest));
            if left == 0 {
                break;
            }
            let rows = self.group.len();
            let shortest = self.group.iter().map(Self::remaining).min().expect("non-empty");
            // Every row adds the same number of tokens (the rows stay aligned on the right);
            // a model with recurrent layers stops where a row reaches a snapshot point.
            let n = (left / rows).max(1).min(shortest);
            let n = match self.model.transformer.config.hybrid {
                Some(_) => {
                    let to_snapshot = self.group.iter().map(|s| {
                        let every = SNAPSHOT_TOKENS - s.prefilled % SNAPSHOT_TOKENS;
                        s.request
                            .snapshot_at
                            .filter(|&at| at > s.prefilled)
                            .map_or(every, |at| every.min(at - s.prefilled))
                    });
                    n.min(to_snapshot.min().unwrap_or(n))
                }
                None => n,
            };
            let ids: Vec<u32> = self
                .group
                .iter()
                .flat_map(|s| s.request.prompt_ids[s.prefilled..s.prefilled + n].iter().copied())
                .collect();
            let ids = Array::from_slice(&ids, &[rows as i32, n as i32]);
            let began = Instant::now();
            let result = self.forward_group(&ids, n);
            self.pacing.record_prefill(self.pacing.work(n, &depths), began.elapsed());
            tracing::debug!(
                "prefill: {rows} rows x {n} tokens at depths {depths:?} (budget {left}, decoding {decoding}): {:.0} ms",
                began.elapsed().as_secs_f64() * 1e3
            );
            let mut first_logits = match result {
                Ok(logits) => logits.into_iter(),
                Err(e) => {
                    // The group's state is unknown: its requests fail, the engine serves on.
                    tracing::error!("prefill failed: {e}");
                    for mut seq in std::mem::take(&mut self.group) {
                        seq.finish(FinishReason::Error, None, Some(format!("prefill failed: {e}")));
                        self.release(&seq);
                    }
                    self.group_cache.iter_mut().for_each(|c| *c = BatchKvCache::new());
                    break;
                }
            };
            let fault = self.config.fault_injector.clone();
            for seq in &mut self.group {
                let last_chunk = Self::remaining(seq) == n;
                seq.prefilled += n;
                seq.prefill_chunks += 1;
                if let Some(mut logits) = last_chunk.then(|| first_logits.next()).flatten() {
                    // Its first token; a request that ends there leaves with the others.
                    seq.on_logits(&mut logits, &self.model.tokenizer, fault.as_ref());
                    self.metrics.generated_tokens_total += 1;
                }
            }
            budget = Some(left.saturating_sub(rows * n));
            processed += rows * n;
            self.metrics.prompt_tokens_total += (rows * n) as u64;
            self.store_whole_blocks(n);
        }
        processed
    }

    /// Prefills the next `n` tokens of every member (`ids`, `[rows, n]`); returns the logits of
    /// the last position of each member whose prompt this chunk ends, in group order.
    fn forward_group(&mut self, ids: &Array, n: usize) -> Result<Vec<Vec<f32>>, ModelError> {
        let hidden = self.model.transformer.forward_hidden(ids, &mut self.group_cache)?;
        let ending: Vec<i32> =
            (0..self.group.len()).filter(|&r| Self::remaining(&self.group[r]) == n).map(|r| r as i32).collect();
        // Recurrent states too: left lazy they would hold the chunk's whole inputs.
        let states = || self.group_cache.iter().flat_map(|c| c.states().iter());
        if ending.is_empty() {
            mlx_rs::transforms::eval(std::iter::once(&hidden).chain(states()))?;
            return Ok(Vec::new());
        }
        let rows = Array::from_slice(&ending, &[ending.len() as i32]);
        let last = hidden.take_axis(&rows, 0)?.try_index((.., n as i32 - 1, ..))?;
        let logits = self.model.transformer.logits(&last)?.as_dtype(Dtype::Float32)?;
        mlx_rs::transforms::eval([&hidden, &logits].into_iter().chain(states()))?;
        let vocab = logits.dim(-1) as usize;
        Ok(logits.as_slice::<f32>().chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// The whole blocks a forward of `n` tokens completed go to the prefix cache at once, for
    /// requests that share them; a model with recurrent layers keeps their state where a row
    /// reached its `snapshot_at`.
    fn store_whole_blocks(&mut self, n: usize) {
        let Some(prefix) = self.prefix.as_mut() else { return };
        let recurrent = self.model.transformer.config.hybrid.is_some();
        for (row, seq) in self.group.iter().enumerate() {
            if recurrent && seq.request.snapshot_at == Some(seq.prefilled) {
                let tokens = &seq.request.prompt_ids[..seq.prefilled];
                if let Err(e) = prefix.store_row(tokens, &self.group_cache, row, true) {
                    tracing::warn!("prefix cache: cannot keep a state at the system prompt's end: {e}");
                }
            }
            let whole = seq.prefilled / BLOCK_TOKENS * BLOCK_TOKENS;
            if whole > (seq.prefilled - n) / BLOCK_TOKENS * BLOCK_TOKENS {
                // A recurrent layer's state is kept every SNAPSHOT_TOKENS (chunks end there).
                let snapshot = seq.prefilled == whole && whole.is_multiple_of(SNAPSHOT_TOKENS);
                let tokens = &seq.request.prompt_ids[..whole];
                if let Err(e) = prefix.store_row(tokens, &self.group_cache, row, snapshot) {
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

    /// Whether `seq` shares a start of at least a block with a member (or a request admitted
    /// with it, `admitted`) still prefilling it: it waits until those blocks are in the prefix
    /// cache, then reuses them instead of computing (and holding) the same keys and values
    /// twice (agents sharing a system prompt).
    /// (Not for a model with recurrent layers: their state is kept every SNAPSHOT_TOKENS only,
    /// so the member's blocks would rarely let the request resume.)
    fn follows_a_member(&self, seq: &Sequence, admitted: &[(Sequence, Vec<KvCache>)]) -> bool {
        self.prefix.is_some()
            && self.model.transformer.config.hybrid.is_none()
            && self.group.iter().chain(admitted.iter().map(|(s, _)| s)).any(|member| {
                let shared =
                    member.request.prompt_ids.iter().zip(&seq.request.prompt_ids).take_while(|(a, b)| a == b).count();
                shared >= BLOCK_TOKENS && member.prefilled < shared / BLOCK_TOKENS * BLOCK_TOKENS
            })
    }

    /// The best waiting request that may start now (one sharing a prompt being prefilled waits).
    fn best_waiting(&self, admitted: &[(Sequence, Vec<KvCache>)]) -> Option<usize> {
        let order = lanes::order(self.waiting.iter().map(|s| (s.request.priority, s.waited())));
        order.into_iter().find(|&i| !self.follows_a_member(&self.waiting[i], admitted))
    }

    /// Admits waiting requests into the group while it has room, best first; a better request
    /// that finds it full takes the lowest-priority member's place. Requests admitted together
    /// join the group's cache in one copy.
    fn fill_group(&mut self) {
        let mut admitted: Vec<(Sequence, Vec<KvCache>)> = Vec::new();
        while let Some(i) = self.best_waiting(&admitted) {
            if self.group.len() + admitted.len() >= GROUP {
                self.add_to_group(std::mem::take(&mut admitted));
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
            admitted.push(self.admit(seq));
        }
        self.add_to_group(admitted);
    }

    /// Admitted requests (with their caches) become the group's last rows.
    pub(super) fn add_to_group(&mut self, admitted: Vec<(Sequence, Vec<KvCache>)>) {
        if admitted.is_empty() {
            return;
        }
        let shared = self.shared.as_ref().filter(|_| admitted.iter().any(|(s, _)| s.shared_prefix > 0));
        let added = add_rows(&mut self.group_cache, self.group.len(), |i, layer| {
            if let Some(shared) = shared {
                layer.set_shared(&shared.layers[i])?;
            }
            layer.push_rows_with(
                &admitted.iter().map(|(s, caches)| (&caches[i], s.shared_prefix > 0)).collect::<Vec<_>>(),
            )
        });
        for (mut seq, _) in admitted {
            if let Err(e) = &added {
                tracing::error!("cannot add rows to the prefill: {e}");
                seq.finish(FinishReason::Error, None, Some(format!("internal error: {e}")));
                self.release(&seq);
                continue;
            }
            self.group.push(seq);
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
        // It takes a copy of its whole sequence, shared start included.
        self.reserve_whole(&mut seq);
        seq.prefill = Some((caches, seq.prefilled));
        self.drop_group_row(row);
        self.waiting.push_back(seq);
        self.queued.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Takes a request in: reserves its KV and restores its prompt's cached start (or resumes a
    /// set-aside prefill); returns it with its caches, to join the group.
    pub(super) fn admit(&mut self, mut seq: Sequence) -> (Sequence, Vec<KvCache>) {
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
        // A restore leaves at least the last prompt token to compute (its logits give the first
        // token), and a set-aside member still had tokens to prefill.
        debug_assert!(Self::remaining(&seq) > 0, "admitted with nothing to prefill");
        (seq, caches)
    }

    /// A new request's caches, with what the prefix cache holds of its prompt (after the shared
    /// segment, when it takes it).
    fn restore(&mut self, seq: &mut Sequence) -> (Vec<KvCache>, usize) {
        let layers = self.cache.len();
        let empty = || (0..layers).map(|_| KvCache::new()).collect::<Vec<_>>();
        let Some(prefix) = self.prefix.as_mut() else { return (empty(), 0) };
        // Admitted requests come first: the cache gives up what they reserved.
        prefix.shrink_to(self.info.kv_budget_bytes.saturating_sub(self.reserved_bytes));
        // The last prompt token is computed (its logits give the first token): at most the rest
        // is restored.
        let limit = seq.request.prompt_ids.len() - 1;
        let began = Instant::now();
        let shared = self.shared_start(seq, limit);
        let Some(prefix) = self.prefix.as_mut() else { return (empty(), 0) };
        let prompt = &seq.request.prompt_ids;
        let restored = if shared > 0 {
            prefix.restore_after(prompt, limit, layers, shared)
        } else {
            prefix.restore(prompt, limit, layers)
        };
        seq.restore_time = began.elapsed();
        match restored {
            Ok(restored) => {
                // The engine's own prefills (`warm`) are not requests: not in the hit figures.
                if !seq.warm {
                    prefix.count(restored.tokens);
                }
                seq.cached_tokens = restored.tokens;
                seq.cache_miss = restored.divergence.and_then(|d| explain_miss(d, &seq.request, &self.model.tokenizer));
                if let Some(miss) = &seq.cache_miss {
                    tracing::debug!(
                        "request {}: prefix cache reused {} tokens; a cached sequence went on differently at token {} (message {:?}): ...{:?} | {:?}...",
                        seq.id, miss.position, miss.position, miss.message, miss.before, miss.after
                    );
                }
                if shared > 0 {
                    self.reserve_after_shared(seq, shared);
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

    /// Members whose prompt is prefilled (and first token sampled) leave the group: their
    /// prompts go to the prefix cache, and those still going join the running batch together.
    fn join_finished_members(&mut self) {
        let done: Vec<usize> = (0..self.group.len()).filter(|&r| Self::remaining(&self.group[r]) == 0).collect();
        if done.is_empty() {
            return;
        }
        if let Some(prefix) = self.prefix.as_mut() {
            for &row in &done {
                let seq = &self.group[row];
                let prompt = &seq.request.prompt_ids[..seq.prefilled];
                if let Err(e) = prefix.store_row(prompt, &self.group_cache, row, true) {
                    tracing::warn!("prefix cache: cannot store a prompt: {e}");
                }
            }
        }
        // A lone request that ended at its first token (a turn boundary's prefill): its buffers
        // are kept whole, as the running batch's last row's are when it leaves.
        if let ([row], 1, true, Some(prefix)) =
            (done.as_slice(), self.group.len(), self.running.is_empty(), self.prefix.as_mut())
        {
            let seq = &self.group[*row];
            if matches!(seq.finished, Some(FinishReason::Stop | FinishReason::Length)) {
                let caches: Option<Vec<_>> = self.group_cache.iter().map(BatchKvCache::only_row).collect();
                if let Some(caches) = caches {
                    prefix.keep_hot(&seq.request.prompt_ids[..seq.prefilled], caches);
                }
            }
        }
        let joining: Vec<usize> = done.iter().copied().filter(|&r| self.group[r].finished.is_none()).collect();
        let (group_cache, running) = (&self.group_cache, self.running.len());
        let added = add_rows(&mut self.cache, running, |i, layer| layer.push_rows_of(&group_cache[i], &joining));
        let keep: Vec<usize> = (0..self.group.len()).filter(|r| !done.contains(r)).collect();
        let mut members: Vec<Option<Sequence>> = std::mem::take(&mut self.group).into_iter().map(Some).collect();
        for layer in &mut self.group_cache {
            if let Err(e) = layer.retain(&keep) {
                tracing::error!("cannot shrink the prefill: {e}");
            }
        }
        self.group = keep.iter().map(|&r| members[r].take().expect("each member once")).collect();
        for mut seq in done.into_iter().filter_map(|r| members[r].take()) {
            match (&added, seq.finished) {
                (Ok(()), None) => {
                    seq.mark_joined();
                    self.running.push(seq);
                }
                (Err(e), None) => {
                    tracing::error!("cannot add rows to the batch: {e}");
                    seq.finish(FinishReason::Error, None, Some(format!("internal error: {e}")));
                    self.release(&seq);
                }
                // It ended at its first token.
                (_, Some(_)) => self.release(&seq),
            }
        }
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
