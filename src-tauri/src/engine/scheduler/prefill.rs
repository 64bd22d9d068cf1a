//! Prefill: waiting prompts are admitted best first (`lanes`), take what the KV manager restores
//! of them, and are prefilled together as the rows of one batch (`group`, aligned on the right
//! like the running batch), a chunk per forward within the step's time budget (`pacing`). A
//! prompt's last chunk also gives its first token (as mlx-lm's `generate_step` does), so it joins
//! the running batch with its first token out. Members that finish together join in one copy, or
//! none when the running batch is empty (it takes the group's buffers). A better request that
//! finds the group full takes the place of its lowest-priority member, which waits again with
//! what it has prefilled and resumes there.

use std::sync::atomic::Ordering;
use std::time::Instant;

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

use super::Scheduler;
use crate::engine::kv::prefix_cache::SNAPSHOT_TOKENS;
use crate::engine::kv::Rows;
use crate::engine::lanes;
use crate::engine::request::FinishReason;
use crate::engine::sequence::Sequence;
use crate::model::{KvCache, LayerCache, ModelError};

/// Prompts prefilled together at most: 16, as many as arrive together when a team points its
/// agents at one server (c=16 short chats: TTFT p95 4.7 s with 16 against 5.3 s with 8, and more output).
pub(super) const GROUP: usize = 16;

/// How long a lone prompt waits for memory (nothing decoding, so nothing of this engine's will
/// free) before it is refused: another model's engine may be in a long step.
const MEMORY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

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
            let members = &self.group.seqs;
            let depths: Vec<usize> = members.iter().map(|s| s.prefilled).collect();
            // A prompt is short by the prefill it needs in all, not by what it has left (the
            // tail of a long one is paced like the rest of it).
            let longest = members.iter().map(|s| s.request.prompt_ids.len() - s.cached_tokens).max().unwrap_or(0);
            let left = *budget.get_or_insert_with(|| self.pacing.budget(decoding, &depths, longest));
            if left == 0 {
                break;
            }
            let rows = members.len();
            let shortest = members.iter().map(Self::remaining).min().expect("non-empty");
            // Every row adds the same number of tokens (the rows stay aligned on the right);
            // a model with recurrent layers stops where a row reaches a snapshot point.
            let n = (left / rows).max(1).min(shortest);
            let n = match self.model.transformer.config.hybrid {
                Some(_) => {
                    let to_snapshot = members.iter().map(|s| {
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
            // A chunk ends where the deepest row reaches the position keys and values are quantized
            // from: which format a token reads depends on its position only (see `KvFormat`).
            let deepest = members.iter().map(|s| s.prefilled).max().unwrap_or(0);
            let n = self.config.kv_format.chunk_before_start(deepest as i32, n);
            // Images whose tokens see each other are prefilled whole (past a quantization start
            // if need be); members whose images interlock wait their turn.
            let Some(n) = self.whole_image_chunk(n, shortest) else {
                self.group_cap = (self.group.len() - 1).max(1);
                if self.group.len() > 1 && self.park(self.group.len() - 1) {
                    continue;
                }
                break;
            };
            // Under the memory ceiling: the chunk narrows until its predicted peak fits.
            let wanted = n;
            let Some((n, predicted)) = self.fit_in_memory(n) else {
                if decoding || !self.make_room_for_prefill() {
                    self.memory_wait = true;
                    break;
                }
                continue;
            };
            if n == wanted {
                self.group_cap = (self.group_cap * 2).min(GROUP);
            }
            let members = &self.group.seqs;
            let ids: Vec<u32> = members
                .iter()
                .flat_map(|s| s.request.prompt_ids[s.prefilled..s.prefilled + n].iter().copied())
                .collect();
            let ids = Array::from_slice(&ids, &[rows as i32, n as i32]);
            let began = Instant::now();
            let in_flight = self.memory.begin_step(predicted);
            let result = self.forward_group(&ids, n);
            self.memory.end_step();
            drop(in_flight);
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
                    for mut seq in std::mem::take(&mut self.group.seqs) {
                        seq.finish(FinishReason::Error, None, Some(format!("prefill failed: {e}")));
                        self.release(&seq);
                    }
                    self.group.clear_cache();
                    break;
                }
            };
            let fault = self.config.fault_injector.clone();
            for seq in &mut self.group.seqs {
                let last_chunk = Self::remaining(seq) == n;
                seq.prefilled += n;
                seq.prefill_chunks += 1;
                if let Some(mut logits) = last_chunk.then(|| first_logits.next()).flatten() {
                    // Its first token; a request that ends there leaves with the others.
                    seq.on_logits(&mut logits, &self.model.tokenizer, fault.as_ref());
                    self.metrics.generated_tokens_total += 1;
                }
            }
            self.feed_head_prompts(n);
            self.drop_prefilled_images();
            budget = Some(left.saturating_sub(rows * n));
            processed += rows * n;
            self.metrics.prompt_tokens_total += (rows * n) as u64;
            self.kv.prefilled(&self.group, n);
        }
        processed
    }

    /// The most of `n` tokens per member whose predicted peak fits under the memory ceiling,
    /// with its prediction: the prefix cache's RAM tier gives way first, then the chunk
    /// narrows; `None` when not a token fits (the step waits for memory to free).
    fn fit_in_memory(&mut self, n: usize) -> Option<(usize, usize)> {
        let rows = self.group.len();
        let buffers = crate::engine::memory::buffers_of(&self.group.cache);
        let shared = self.kv.shared_layers().and_then(|s| s.first()).map_or(0, |s| s.len().max(0) as usize);
        let cost = |memory: &crate::engine::memory::Governor, n: usize| {
            memory.cost().prefill_bytes(rows, n, &buffers, shared, rows)
        };
        let pending = self.kv.pending_growth(&self.group, &self.running);
        let mut headroom = self.memory.headroom(pending);
        // Images the chunk meets are encoded first, in a step of their own: the chunk fits when
        // both do.
        let need = |s: &Self, n: usize| cost(&s.memory, n).max(s.encode_bytes(n));
        // What nothing uses gives way first: MLX's buffer cache and the encoded images, then the
        // prefix cache's RAM tier.
        if need(self, n) > headroom && (crate::mlx::memory_stats().cache > 0 || self.encoded.bytes() > 0) {
            self.encoded.clear();
            crate::mlx::give_back();
            headroom = self.memory.headroom(pending);
        }
        if need(self, n) > headroom && self.kv.give_way(need(self, n) - headroom) > 0 {
            crate::mlx::give_back();
            headroom = self.memory.headroom(pending);
        }
        let mut fitted = self.memory.prefill_tokens(rows, &buffers, shared, n, headroom);
        if self.encode_bytes(fitted) > headroom {
            // The chunk stops before the image until its encoding fits.
            fitted = fitted.min(self.tokens_before_encoding(fitted));
        }
        if fitted < n {
            // Narrowed: still not inside an image whose tokens see each other.
            fitted = self.chunk_before_images(fitted);
        }
        if fitted < n {
            tracing::debug!(
                "prefill: {rows} rows narrowed from {n} to {fitted} tokens to stay under the memory ceiling \
                 ({} MB of headroom)",
                headroom >> 20
            );
        }
        (fitted > 0).then(|| (fitted, cost(&self.memory, fitted)))
    }

    /// Nothing decodes and not one token of the group's prefill fits under the ceiling: the group
    /// halves (its newest members wait again, with what they prefilled); a lone member that
    /// still does not fit for [`MEMORY_PATIENCE`] is refused with the figures. False when the
    /// step should wait instead.
    fn make_room_for_prefill(&mut self) -> bool {
        if self.group.len() > 1 {
            self.group_cap = (self.group.len() / 2).max(1);
            while self.group.len() > self.group_cap {
                let newest = (0..self.group.len()).min_by_key(|&r| self.group.seqs[r].waited()).expect("non-empty");
                if !self.park(newest) {
                    return false;
                }
            }
            return true;
        }
        let since = *self.memory_wait_since.get_or_insert_with(Instant::now);
        if since.elapsed() < MEMORY_PATIENCE {
            return false;
        }
        self.memory_wait_since = None;
        let needed = self.memory.cost().prefill_bytes(1, 1, &[], 0, 1);
        let why = format!(
            "not one prompt token fits under the memory ceiling ({} MB) now: the process holds {} MB and a step needs {} MB more; retry later",
            self.memory.ceiling() >> 20,
            crate::engine::memory::Governor::held_now() >> 20,
            needed.div_ceil(1 << 20)
        );
        for mut seq in std::mem::take(&mut self.group.seqs) {
            seq.finish(FinishReason::Overloaded, None, Some(why.clone()));
            self.metrics.refused_memory_total += 1;
            self.release(&seq);
        }
        self.group.clear_cache();
        true
    }

    /// Prefills the next `n` tokens of every member (`ids`, `[rows, n]`); returns the logits of
    /// the last position of each member whose prompt this chunk ends, in group order.
    fn forward_group(&mut self, ids: &Array, n: usize) -> Result<Vec<Vec<f32>>, ModelError> {
        let extras = self.group_extras(n)?;
        let step = crate::model::transformer::StepInputs {
            images: extras.as_ref().and_then(|e| e.images.as_ref()),
            positions: extras.as_ref().and_then(|e| e.positions.as_ref()),
        };
        let hidden = self.forward_hidden(crate::engine::remote::StepBatch::Prefill, ids, step)?;
        // The MTP head feeds on the chunk's hidden states once the tokens after them are known.
        self.step_hidden = self.mtp.is_some().then(|| hidden.clone());
        let ending: Vec<i32> =
            (0..self.group.len()).filter(|&r| Self::remaining(&self.group.seqs[r]) == n).map(|r| r as i32).collect();
        // Recurrent states too: left lazy they would hold the chunk's whole inputs.
        let states = || self.group.cache.iter().flat_map(|c| c.states().iter());
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

    /// Whether `seq` can be admitted now, beside `pending` rows admitted but not yet in the
    /// group: a batch slot, and its KV reservation within budget (the first row always gets in).
    fn fits(&self, seq: &Sequence, pending: usize) -> bool {
        let busy = self.running.len() + self.group.len() + pending;
        busy < self.config.max_batch && self.kv.fits(seq, busy)
    }

    /// The best waiting request that may start now (one sharing a prompt being prefilled, by the
    /// group or by a request `admitted` with it, waits for its blocks).
    fn best_waiting(&self, admitted: &[(Sequence, Vec<KvCache>)]) -> Option<usize> {
        let order = lanes::order(self.waiting.iter().map(|s| (s.request.priority, s.waited())));
        order.into_iter().find(|&i| {
            let members = self.group.seqs.iter().chain(admitted.iter().map(|(s, _)| s));
            !self.kv.waits_for_a_member(&self.waiting[i], members)
        })
    }

    /// Admits waiting requests into the group while it has room, best first; a better request
    /// that finds it full takes the lowest-priority member's place. Requests admitted together
    /// join the group's cache in one copy.
    fn fill_group(&mut self) {
        let mut admitted: Vec<(Sequence, Vec<KvCache>)> = Vec::new();
        while let Some(i) = self.best_waiting(&admitted) {
            if self.group.len() + admitted.len() >= self.group_cap {
                self.add_to_group(std::mem::take(&mut admitted));
                let candidate = lanes::effective(self.waiting[i].request.priority, self.waiting[i].waited());
                // The lowest (aged) priority, the newest among equals.
                let members = &self.group.seqs;
                let lowest = (0..members.len()).min_by_key(|&r| {
                    let s = &members[r];
                    (lanes::effective(s.request.priority, s.waited()), s.waited())
                });
                let Some(lowest) = lowest else { break };
                let lowest_priority = lanes::effective(members[lowest].request.priority, members[lowest].waited());
                if candidate <= lowest_priority || !self.park(lowest) {
                    break;
                }
                continue;
            }
            if !self.fits(&self.waiting[i], admitted.len()) {
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
        let shared = self.kv.shared_layers().filter(|_| admitted.iter().any(|(s, _)| s.kv.shared_prefix > 0));
        let added = self.group.add_rows(|i, layer| {
            if let Some(shared) = shared {
                layer.set_shared(&shared[i])?;
            }
            layer.push_rows_with(
                &admitted.iter().map(|(s, caches)| (&caches[i], s.kv.shared_prefix > 0)).collect::<Vec<_>>(),
            )
        });
        for (mut seq, _) in admitted {
            if let Err(e) = &added {
                tracing::error!("cannot add rows to the prefill: {e}");
                seq.finish(FinishReason::Error, None, Some(format!("internal error: {e}")));
                self.release(&seq);
                continue;
            }
            self.group.seqs.push(seq);
        }
    }

    /// Group member `row` waits again, holding its partial cache and its reservation.
    fn park(&mut self, row: usize) -> bool {
        let caches = match self.group.row_caches(row) {
            Ok(caches) => caches,
            Err(e) => {
                tracing::warn!("cannot set a prefill aside: {e}");
                return false;
            }
        };
        let mut seq = self.group.remove(row);
        tracing::debug!("request {} waits: a better request takes its place in the prefill", seq.id);
        // It takes a copy of its whole sequence, shared start included.
        self.kv.set_aside(&mut seq);
        seq.prefill = Some((caches, seq.prefilled));
        self.waiting.push_back(seq);
        self.queued.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Takes a request in: the KV manager reserves its memory and gives it its caches (what the
    /// prefix cache holds of its prompt, or a set-aside prefill's own); returns it with its
    /// caches, to join the group.
    pub(super) fn admit(&mut self, mut seq: Sequence) -> (Sequence, Vec<KvCache>) {
        seq.mark_admitted();
        let resumed = seq.prefill.is_some();
        let rows = Rows { group: &mut self.group, running: &mut self.running, waiting: &self.waiting };
        let (mut caches, mut done) = self.kv.admit(&mut seq, rows, &self.model.tokenizer);
        if let Some(remote) = self.remote.as_mut().filter(|_| !resumed && done > 0) {
            // Every rank of the cluster resumes the prompt at the same token: the fewest any
            // holds (their prefix caches see the same stores, but may have let go of more).
            loop {
                remote.stored(self.kv.take_stores());
                let held = remote.probe(seq.id, &seq.request.cache_key()[..done]);
                if held == done {
                    break;
                }
                (caches, done) = self.kv.restore_within(&mut seq, held);
            }
        }
        seq.prefilled = done;
        // A restore leaves at least the last prompt token to compute (its logits give the first
        // token), and a set-aside member still had tokens to prefill.
        debug_assert!(Self::remaining(&seq) > 0, "admitted with nothing to prefill");
        (seq, caches)
    }

    /// Members whose prompt is prefilled (and first token sampled) leave the group: their
    /// prompts go to the prefix cache, and those still going join the running batch together.
    fn join_finished_members(&mut self) {
        let done: Vec<usize> = (0..self.group.len()).filter(|&r| Self::remaining(&self.group.seqs[r]) == 0).collect();
        if done.is_empty() {
            return;
        }
        self.kv.prompts_done(&self.group, &done, self.running.is_empty());
        let joining: Vec<usize> = done.iter().copied().filter(|&r| self.group.seqs[r].finished.is_none()).collect();
        let group_cache = &self.group.cache;
        let added = self.running.add_rows(|i, layer| layer.push_rows_of(&group_cache[i], &joining));
        let keep: Vec<usize> = (0..self.group.len()).filter(|r| !done.contains(r)).collect();
        let mut members: Vec<Option<Sequence>> = std::mem::take(&mut self.group.seqs).into_iter().map(Some).collect();
        if let Err(e) = self.group.retain_cache(&keep) {
            tracing::error!("cannot shrink the prefill: {e}");
        }
        self.group.seqs = keep.iter().map(|&r| members[r].take().expect("each member once")).collect();
        for mut seq in done.into_iter().filter_map(|r| members[r].take()) {
            match (&added, seq.finished) {
                (Ok(()), None) => {
                    seq.mark_joined();
                    self.running.seqs.push(seq);
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

    /// After a chunk of `n` prompt tokens per member (and the first token of those it ended):
    /// the model's hidden states over the chunk, beside the tokens that follow each position,
    /// feed the MTP head.
    fn feed_head_prompts(&mut self, n: usize) {
        let (Some(mtp), Some(hidden)) = (self.mtp.as_mut(), self.step_hidden.take()) else { return };
        for (row, seq) in self.group.seqs.iter().enumerate() {
            if seq.finished.is_some() || !seq.request.speculative {
                continue;
            }
            let start = seq.prefilled - n;
            let next = &seq.tokens()[start + 1..start + 1 + n];
            mtp.feed(&self.model.transformer, seq.id, start, next, &hidden, row);
        }
    }

    /// Group members whose caller went away leave the group.
    pub(super) fn reap_abandoned_members(&mut self) {
        while let Some(row) = self.group.seqs.iter().position(Sequence::is_abandoned) {
            let mut seq = self.group.remove(row);
            seq.finish(FinishReason::Cancelled, None, None);
            self.release(&seq);
        }
    }
}
