//! How much prefill one engine step may do: a time budget, not a token budget. While rows are
//! decoding, every step's prefill is sized so that their inter-token latency stays near a set
//! multiple of its unloaded value (the decode step alone), from the speeds this model shows on
//! this machine (moving averages); when nothing decodes, prefill runs at full width.

use std::time::Duration;

/// Weight of the newest measurement in the moving averages.
const ALPHA: f64 = 0.2;
/// Fewest prompt tokens a step prefills while rows decode, so a long prompt always advances.
pub const MIN_CHUNK: usize = 16;

#[derive(Debug, Clone)]
pub struct Pacing {
    /// Target inter-token latency as a multiple of the unloaded one (0: no time budget, only
    /// the token budget `max_chunk`).
    factor: f64,
    max_chunk: usize,
    decode_secs: Option<f64>,
    prefill_tokens_per_sec: Option<f64>,
}

fn average(old: Option<f64>, new: f64) -> Option<f64> {
    Some(old.map_or(new, |o| o + ALPHA * (new - o)))
}

impl Pacing {
    pub fn new(factor: f64, max_chunk: usize) -> Pacing {
        Pacing { factor, max_chunk: max_chunk.max(1), decode_secs: None, prefill_tokens_per_sec: None }
    }

    /// A decode step (one token for every running row) took `took`.
    pub fn record_decode(&mut self, took: Duration) {
        self.decode_secs = average(self.decode_secs, took.as_secs_f64());
    }

    /// A prefill forward of `tokens` prompt tokens took `took`.
    pub fn record_prefill(&mut self, tokens: usize, took: Duration) {
        if tokens > 0 && took > Duration::ZERO {
            self.prefill_tokens_per_sec = average(self.prefill_tokens_per_sec, tokens as f64 / took.as_secs_f64());
        }
    }

    /// Prompt tokens this step may prefill.
    pub fn budget(&self, decoding: bool) -> usize {
        if !decoding || self.factor <= 0.0 {
            return self.max_chunk;
        }
        let (Some(decode), Some(rate)) = (self.decode_secs, self.prefill_tokens_per_sec) else {
            // Nothing measured yet: a small step first, so the first measurement is cheap.
            return MIN_CHUNK.min(self.max_chunk);
        };
        // The step may take `factor` decode steps in all: the decode itself, the rest prefill.
        let spare = (self.factor - 1.0).max(0.0) * decode;
        ((spare * rate) as usize).clamp(MIN_CHUNK.min(self.max_chunk), self.max_chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_width_when_nothing_decodes_and_a_time_budget_when_rows_do() {
        let mut p = Pacing::new(2.0, 512);
        assert_eq!(p.budget(false), 512);
        assert_eq!(p.budget(true), MIN_CHUNK, "nothing measured yet");
        // Decode steps of 50 ms, prefill at 1,000 tokens/s: 50 ms of prefill is 50 tokens.
        for _ in 0..50 {
            p.record_decode(Duration::from_millis(50));
            p.record_prefill(100, Duration::from_millis(100));
        }
        assert!((48..=52).contains(&p.budget(true)), "{}", p.budget(true));
        // A looser bound allows more; a faster prefill too; never past the token budget.
        assert!((145..=155).contains(&Pacing { factor: 4.0, ..p.clone() }.budget(true)));
        let mut fast = p.clone();
        for _ in 0..50 {
            fast.record_prefill(1000, Duration::from_millis(100));
        }
        assert!((495..=500).contains(&fast.budget(true)), "50 ms of spare at 10,000 tokens/s");
        assert_eq!(Pacing { factor: 100.0, ..p.clone() }.budget(true), 512);
        // Slow prefill (long context): never below the floor, so a prompt always advances.
        let mut slow = p.clone();
        for _ in 0..50 {
            slow.record_prefill(10, Duration::from_secs(1));
        }
        assert_eq!(slow.budget(true), MIN_CHUNK);
        // Turned off: the token budget alone.
        assert_eq!(Pacing { factor: 0.0, ..p }.budget(true), 512);
    }
}
