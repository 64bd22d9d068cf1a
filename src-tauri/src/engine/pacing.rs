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
    /// Tokens of context at which a prompt token's attention costs as much as its linear layers:
    /// a token at depth `d` costs `1 + d / depth_scale` units of work.
    depth_scale: f64,
    decode_secs: Option<f64>,
    /// Units of work (see `work`) a second.
    prefill_rate: Option<f64>,
}

fn average(old: Option<f64>, new: f64) -> Option<f64> {
    Some(old.map_or(new, |o| o + ALPHA * (new - o)))
}

/// The context at which attention's multiply-adds per prompt token (two per query element and
/// key: scores and values) equal its layer's linear ones: `linear_macs / (2 * q_dim)`.
pub fn depth_scale(linear_macs_per_token: usize, q_dim: usize) -> f64 {
    (linear_macs_per_token as f64 / (2 * q_dim.max(1)) as f64).max(1.0)
}

impl Pacing {
    pub fn new(factor: f64, max_chunk: usize, depth_scale: f64) -> Pacing {
        Pacing { factor, max_chunk: max_chunk.max(1), depth_scale, decode_secs: None, prefill_rate: None }
    }

    /// The work of prefilling `n` more tokens of each prompt, those prompts having `depths`
    /// tokens cached: each token attends over its depth (the chunk's middle, on average).
    pub fn work(&self, n: usize, depths: &[usize]) -> f64 {
        let n = n as f64;
        depths.iter().map(|&d| n * (1.0 + (d as f64 + n / 2.0) / self.depth_scale)).sum()
    }

    /// A decode step (one token for every running row) took `took`.
    pub fn record_decode(&mut self, took: Duration) {
        self.decode_secs = average(self.decode_secs, took.as_secs_f64());
    }

    /// A prefill forward of `work` units (`work`) took `took`.
    pub fn record_prefill(&mut self, work: f64, took: Duration) {
        if work > 0.0 && took > Duration::ZERO {
            self.prefill_rate = average(self.prefill_rate, work / took.as_secs_f64());
        }
    }

    /// Prompt tokens (all prompts together) this step may prefill for prompts with `depths`
    /// tokens cached, the longest needing `longest` tokens of prefill in all. Short prompts
    /// (none needing more than a token budget: a burst of chats) keep the token budget, so
    /// they do not wait behind decode steps; a long one, while rows decode, gets the time the
    /// budget leaves, sized from the speed at its depth.
    pub fn budget(&self, decoding: bool, depths: &[usize], longest: usize) -> usize {
        let rows = depths.len().max(1);
        if !decoding || self.factor <= 0.0 || longest <= self.max_chunk {
            return self.max_chunk;
        }
        let floor = MIN_CHUNK.min(self.max_chunk);
        let (Some(decode), Some(rate)) = (self.decode_secs, self.prefill_rate) else {
            // Nothing measured yet: a small step first, so the first measurement is cheap.
            return floor;
        };
        // The step may take `factor` decode steps in all: the decode itself, the rest prefill.
        let capacity = (self.factor - 1.0).max(0.0) * decode * rate;
        // The most tokens per prompt whose work fits (work grows with n).
        let (mut low, mut high) = (0, self.max_chunk / rows);
        while low < high {
            let mid = (low + high).div_ceil(2);
            if self.work(mid, depths) <= capacity {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        (low * rows).clamp(floor, self.max_chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_width_when_nothing_decodes_and_a_time_budget_when_rows_do() {
        // Work independent of depth (a huge depth scale): the plain time budget.
        let mut p = Pacing::new(2.0, 512, 1e12);
        let long = 10_000;
        assert_eq!(p.budget(false, &[0], long), 512);
        assert_eq!(p.budget(true, &[0], long), MIN_CHUNK, "nothing measured yet");
        // Decode steps of 50 ms, prefill at 1,000 tokens/s: 50 ms of prefill is 50 tokens.
        for _ in 0..50 {
            p.record_decode(Duration::from_millis(50));
            p.record_prefill(p.work(100, &[0]), Duration::from_millis(100));
        }
        assert!((48..=52).contains(&p.budget(true, &[0], long)), "{}", p.budget(true, &[0], long));
        // A looser bound allows more; a faster prefill too; never past the token budget.
        assert!((145..=155).contains(&Pacing { factor: 4.0, ..p.clone() }.budget(true, &[0], long)));
        let mut fast = p.clone();
        for _ in 0..50 {
            fast.record_prefill(1000.0, Duration::from_millis(100));
        }
        assert!((495..=500).contains(&fast.budget(true, &[0], long)), "50 ms of spare at 10,000 tokens/s");
        assert_eq!(Pacing { factor: 100.0, ..p.clone() }.budget(true, &[0], long), 512);
        // Slow prefill: never below the floor, so a prompt always advances.
        let mut slow = p.clone();
        for _ in 0..50 {
            slow.record_prefill(10.0, Duration::from_secs(1));
        }
        assert_eq!(slow.budget(true, &[0], long), MIN_CHUNK);
        // Turned off: the token budget alone.
        assert_eq!(Pacing { factor: 0.0, ..p.clone() }.budget(true, &[0], long), 512);
        // Short prompts keep the token budget; with a long one among them, the time budget.
        assert_eq!(p.budget(true, &[0, 0, 0, 0], 512), 512);
        assert_eq!(p.budget(true, &[0, 0, 0, 0], 513), 48, "4 x 12 tokens: 50 ms");
    }

    #[test]
    fn a_deeper_prompt_gets_fewer_tokens_for_the_same_time() {
        // A token at depth 1,000 costs twice one at depth 0.
        let mut p = Pacing::new(3.0, 4096, 1000.0);
        for _ in 0..50 {
            p.record_decode(Duration::from_millis(100));
        }
        // Measured at a shallow depth: 200 tokens (work 220) in 100 ms.
        for _ in 0..50 {
            p.record_prefill(p.work(200, &[0]), Duration::from_millis(100));
        }
        // 200 ms of spare: ~400 tokens at depth 0 (work 480 fits 440? no: fewer), far fewer deep.
        let shallow = p.budget(true, &[0], 100_000);
        let deep = p.budget(true, &[4000], 100_000);
        assert!((300..=400).contains(&shallow), "{shallow}");
        assert!((70..=90).contains(&deep), "{deep}: the same 200 ms at five times the cost per token");
        // What it predicts is what the time budget allows.
        let secs = |n: usize, d: usize| p.work(n, &[d]) / p.prefill_rate.unwrap();
        assert!(secs(shallow, 0) <= 0.2 + 1e-9 && secs(shallow + 1, 0) > 0.2);
        assert!(secs(deep, 4000) <= 0.2 + 1e-9 && secs(deep + 1, 4000) > 0.2);
    }
}
