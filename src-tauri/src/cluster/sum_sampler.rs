//! Rank 0 of a model shared out by tensors: which steps have their sums timed apart from the
//! layers ([`SumClock`]), and what those steps measured. A timed step evaluates twice per sum,
//! so only one step in a while is timed: the first, then one at most every [`EVERY`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::SumClock;

/// The least time between two timed steps.
pub const EVERY: Duration = Duration::from_secs(2);

/// What the timed steps measured, summed over them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TimedSums {
    pub steps: u64,
    /// Time in the sums: the transfers, and any rank still computing its share.
    pub sums: Duration,
    /// The same steps' whole time on rank 0.
    pub total: Duration,
}

impl TimedSums {
    /// Milliseconds per timed step: in the sums, and in all.
    pub fn per_step_ms(&self) -> (f64, f64) {
        let n = self.steps.max(1) as f64;
        (self.sums.as_secs_f64() * 1e3 / n, self.total.as_secs_f64() * 1e3 / n)
    }
}

pub struct SumSampler {
    clock: Arc<SumClock>,
    last: Option<Instant>,
    armed: bool,
    pub timed: TimedSums,
}

impl SumSampler {
    pub fn new(clock: Arc<SumClock>) -> SumSampler {
        SumSampler { clock, last: None, armed: false, timed: TimedSums::default() }
    }

    /// Before a step: arms the clock where a timed step is due.
    pub fn start(&mut self) {
        if self.last.is_none_or(|t| t.elapsed() >= EVERY) {
            self.clock.arm();
            self.armed = true;
        }
    }

    /// After the step `start` came before, which took `total` in all (a failed step too: the
    /// clock is disarmed either way): what its sums took, where it was timed.
    pub fn finish(&mut self, total: Duration, ok: bool) -> Option<Duration> {
        if !std::mem::take(&mut self.armed) {
            return None;
        }
        let (sums, count) = self.clock.disarm();
        self.last = Some(Instant::now());
        if !ok || count == 0 {
            return None;
        }
        self.timed.steps += 1;
        self.timed.sums += sums;
        self.timed.total += total;
        Some(sums)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_step_is_timed_then_one_every_interval_and_a_step_without_sums_counts_none() {
        let clock = Arc::new(SumClock::default());
        let mut sampler = SumSampler::new(clock.clone());
        sampler.start();
        // No sum ran while armed (a step that failed before its first sum, say): not counted.
        assert_eq!(sampler.finish(Duration::from_millis(5), true), None);
        assert_eq!(sampler.timed.steps, 0);
        // Within the interval of the last armed step: not armed again.
        sampler.start();
        assert_eq!(sampler.finish(Duration::from_millis(5), true), None);
        assert!(!sampler.armed);
        sampler.last = Some(Instant::now() - EVERY);
        sampler.start();
        assert!(sampler.armed);
        assert_eq!(sampler.finish(Duration::from_millis(5), false), None, "a failed step is not counted");
        assert_eq!(sampler.timed, TimedSums::default());
    }
}
