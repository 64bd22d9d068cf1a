//! Running rows reserve KV memory a horizon ahead of what they have generated (`RESERVE_AHEAD`),
//! not for their whole `max_tokens`: before each decode step a row at the end of its reservation
//! takes more. When the budget has no more, the lowest-priority row (the newest among equals) is
//! parked: its keys and values go to the prefix cache, its reservation is given back, and it waits
//! to resume where it stopped, with the same output (vLLM's preemption by recomputation, made
//! cheap by the prefix cache).

use std::sync::atomic::Ordering;

use super::Scheduler;
use crate::engine::lanes;

impl Scheduler {
    /// Every running row's reservation covers its next decode step, rows parked as needed; the
    /// last row left always gets its own (its length was capped at what the budget holds).
    pub(super) fn reserve_for_decode(&mut self) {
        let mut row = 0;
        while row < self.running.len() {
            let Some(tokens) = self.running.seqs[row].kv_shortfall() else {
                row += 1;
                continue;
            };
            let force = self.running.len() == 1;
            if self.kv.grow(&mut self.running.seqs[row], tokens, force) {
                row += 1;
                continue;
            }
            let victim = self.lowest_priority_row();
            self.park_running(victim);
            // The rows after the victim moved up by one; the row that asked is asked again
            // (unless it was the victim, and the next took its place).
            if victim < row {
                row -= 1;
            }
        }
    }

    /// The running row to give way: the lowest (aged) priority, the newest among equals.
    fn lowest_priority_row(&self) -> usize {
        let seqs = &self.running.seqs;
        (0..seqs.len())
            .min_by_key(|&r| (lanes::effective(seqs[r].request.priority, seqs[r].waited()), seqs[r].waited()))
            .expect("a running row")
    }

    /// Running row `row` leaves the batch for the queue: its sequence is stored in the prefix
    /// cache, its reservation is given back.
    fn park_running(&mut self, row: usize) {
        let keep: Vec<usize> = (0..self.running.len()).filter(|&r| r != row).collect();
        self.kv.leaving(&self.running, &keep);
        let mut seq = self.running.remove(row);
        tracing::debug!(
            "request {} parked after {} tokens: the KV budget has no room for its next ones",
            seq.id,
            seq.tokens().len()
        );
        self.kv.release(&seq);
        seq.park_for_memory(self.kv.footprint());
        self.metrics.parked_total += 1;
        self.waiting.push_back(seq);
        self.queued.fetch_add(1, Ordering::SeqCst);
    }
}
