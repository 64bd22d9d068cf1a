//! The decode step with drafted tokens (`speculative`): each row feeds its next input and its
//! draft, one forward pass gives logits at every position of every row, and each row samples
//! position by position as a plain step would, keeping the drafted tokens while they are what
//! it samples. Rows that keep fewer columns than others are realigned (`keep_verified`), so
//! rejected positions leave nothing in the caches; the prefix cache then stores only what was
//! kept. Recurrent layers keep their state after each position of the step and take each
//! row's after its last kept token.

use std::time::Instant;

use mlx_rs::Array;

use super::Scheduler;
use crate::engine::memory;
use crate::engine::request::FinishReason;
use crate::engine::speculative::{verify_row, Mode, RowDrafter, Want, AUTO_MOST_ROWS, STEP_POSITIONS};

impl Scheduler {
    /// Each running row's draft for this step, or `None` when the step decodes plainly (no
    /// row has one, drafting is off or does not pay at this batch size).
    pub(super) fn drafts(&mut self) -> Option<Vec<Vec<u32>>> {
        let spec = self.config.speculative;
        if spec.mode == Mode::Off || spec.draft_tokens == 0 {
            return None;
        }
        let rows = self.running.len();
        let forced = matches!(spec.mode, Mode::Ngram | Mode::Draft | Mode::Mtp);
        if !self.payoff.may_draft(rows, forced) {
            return None;
        }
        // Every row computes as many positions as the longest draft needs (shorter ones are
        // padded): the step's positions, and the memory free under the ceiling, bound how long
        // a draft may be.
        let buffers = memory::buffers_of(&self.running.cache);
        let most = STEP_POSITIONS / rows;
        let longest = self.memory.verify_width(rows, &buffers, self.shared_len(), most).saturating_sub(1);
        if longest == 0 {
            return None;
        }
        let by_model = self.draft.is_some() && spec.mode != Mode::Ngram;
        let mut drafts = Vec::with_capacity(rows);
        let mut want = Vec::new();
        for seq in &mut self.running.seqs {
            if !seq.request.speculative {
                drafts.push(Vec::new());
                continue;
            }
            let room = seq.draft_room().min(longest);
            let mut drafter = seq.drafter.take().unwrap_or_else(|| RowDrafter::new(spec.draft_tokens));
            if by_model {
                want.push((drafts.len(), drafter.length(room)));
                drafts.push(Vec::new());
            } else if let Some(mtp) = self.mtp.as_mut() {
                // The head exists only where it drafts (`mtp`, or `auto` without a draft model).
                drafts.push(mtp.propose(&self.model.transformer, seq.id, drafter.length(room)));
            } else {
                drafts.push(drafter.propose(seq.tokens(), room));
            }
            seq.drafter = Some(drafter);
        }
        if let Some(draft) = self.draft.as_mut().filter(|_| by_model) {
            let seqs = &self.running.seqs;
            let asked: Vec<Want> =
                want.iter().map(|&(row, most)| Want { id: seqs[row].id, tokens: seqs[row].tokens(), most }).collect();
            for ((row, _), proposal) in want.iter().zip(draft.propose(&asked, &self.memory)) {
                drafts[*row] = proposal;
            }
        }
        if drafts.iter().any(|d| !d.is_empty()) {
            return Some(drafts);
        }
        // Nothing to check: the draft model's proposal (if any) is taken back whole.
        if let Some(draft) = self.draft.as_mut() {
            draft.verified(&[]);
        }
        None
    }

    /// One forward over each row's next input and draft; returns the tokens emitted.
    /// `began`: when drafting for this step began (its proposals' cost counts).
    pub(super) fn verify_step(&mut self, drafts: Vec<Vec<u32>>, began: Instant) -> usize {
        let rows = self.running.len();
        let width = 1 + drafts.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(rows * width);
        for (seq, draft) in self.running.seqs.iter().zip(&drafts) {
            ids.push(seq.next_input);
            ids.extend_from_slice(draft);
            // Shorter drafts are padded; those columns are never kept.
            ids.extend(std::iter::repeat_n(seq.next_input, width - 1 - draft.len()));
        }
        let mut logits = match self.forward_positions(&ids, rows, width) {
            Ok(logits) => logits,
            Err(message) => {
                self.fail_running(&message);
                if let Some(draft) = self.draft.as_mut() {
                    draft.reset();
                }
                return 0;
            }
        };
        let vocab = logits.len() / (rows * width);
        let fault = self.config.fault_injector.clone();
        let mut kept = Vec::with_capacity(rows);
        let mut accepted = Vec::with_capacity(rows);
        let mut going = Vec::with_capacity(rows);
        let mut emitted = 0;
        for (row, draft) in drafts.iter().enumerate() {
            let seq = &mut self.running.seqs[row];
            let (used, alive) = verify_row(draft, |i| {
                let at = (row * width + i) * vocab;
                let alive = seq.on_logits(&mut logits[at..at + vocab], &self.model.tokenizer, fault.as_ref());
                (seq.next_input, alive)
            });
            accepted.push((seq.id, used - 1));
            if !draft.is_empty() {
                let accepted = used - 1;
                if let Some(d) = seq.drafter.as_mut() {
                    d.record(draft.len(), accepted);
                }
                self.metrics.draft_tokens_total += draft.len() as u64;
                self.metrics.draft_accepted_total += accepted as u64;
            }
            kept.push(used as i32);
            emitted += used;
            if alive {
                going.push(row);
            }
        }
        for layer in &mut self.running.cache {
            if let Err(e) = layer.keep_verified(width as i32, &kept) {
                self.fail_running(&format!("cannot take back rejected drafts: {e}"));
                return 0;
            }
        }
        if let Some(remote) = self.remote.as_mut() {
            remote.kept(width as i32, &kept);
        }
        if let Some(draft) = self.draft.as_mut() {
            draft.verified(&accepted);
        }
        self.metrics.verify_steps_total += 1;
        self.metrics.generated_tokens_total += emitted as u64;
        let advanced: Vec<usize> = kept.iter().map(|&k| k as usize).collect();
        self.feed_head(&advanced);
        self.kv.decoded(&self.running, &advanced);
        if going.len() < rows {
            self.retain_rows(&going);
        }
        self.payoff.record(rows, emitted, began.elapsed(), true);
        emitted
    }

    /// After a step whose row `r` kept `used[r]` positions (its tokens sampled): the model's
    /// hidden states there, beside the tokens that follow each, feed the MTP head (rows that
    /// ended or opted out are left; they leave the batch).
    pub(super) fn feed_head(&mut self, used: &[usize]) {
        let (Some(mtp), Some(hidden)) = (self.mtp.as_mut(), self.step_hidden.take()) else { return };
        // Where no row may draft (`auto` beyond its batch size) the head is not fed: a row's
        // head cache starts afresh when it drafts again.
        if self.config.speculative.mode == Mode::Auto && used.len() > AUTO_MOST_ROWS {
            return;
        }
        for (row, (seq, &u)) in self.running.seqs.iter().zip(used).enumerate() {
            if seq.finished.is_some() || !seq.request.speculative || u == 0 {
                continue;
            }
            let tokens = seq.tokens();
            // The step's first position held the token before the `u` it emitted.
            let start = tokens.len() - u - 1;
            mtp.feed(&self.model.transformer, seq.id, start, &tokens[start + 1..], &hidden, row);
        }
    }

    /// The batch forward pass over `width` positions per row: logits `[rows * width * vocab]`
    /// on the host.
    fn forward_positions(&mut self, ids: &[u32], rows: usize, width: usize) -> Result<Vec<f32>, String> {
        let ids = Array::from_slice(ids, &[rows as i32, width as i32]);
        let buffers = memory::buffers_of(&self.running.cache);
        let predicted = self.memory.cost().verify_bytes(rows, width, &buffers, self.shared_len());
        self.running.cache.iter_mut().for_each(crate::model::BatchKvCache::set_verifying);
        if let Some(remote) = self.remote.as_mut() {
            remote.verifying();
        }
        self.forward_running(&ids, predicted)
    }

    /// After a failed step the batch's state is unknown: every row ends, the engine serves on.
    pub(super) fn fail_running(&mut self, message: &str) {
        tracing::error!("decode step failed: {message}");
        for seq in &mut self.running.seqs {
            seq.finish(FinishReason::Error, None, Some(format!("internal error: {message}")));
        }
        self.retain_rows(&[]);
    }
}
