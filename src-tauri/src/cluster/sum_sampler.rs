//! Rank 0 of a model shared out by tensors: which steps have their sums timed apart from the
//! layers ([`SumClock`]), and what those steps measured. A timed step evaluates twice per sum,
//! so only one step in a while is timed: of each kind of step, the first, then one at most
//! every [`EVERY`]. Decode steps and prompt steps are timed apart: their sums differ by the
//! width of the step, and after an idle gap the next step is nearly always a prompt's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::SumClock;

/// The least time between two timed steps of a kind.
pub const EVERY: Duration = Duration::from_secs(2);

/// The kinds of step timed apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Several positions per row: prompt chunks, and speculative decoding's verify steps.
    Prompt,
    /// One position per row.
    Decode,
}

impl StepKind {
    /// The kind of a step of `positions` per row.
    pub fn of(positions: usize) -> StepKind {
        if positions == 1 {
            StepKind::Decode
        } else {
            StepKind::Prompt
        }
    }
}

/// What the timed steps of a kind measured, summed over them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TimedSums {
    pub steps: u64,
    /// Time in the sums: the transfers, and any rank still computing its share.
    pub sums: Duration,
    /// The same steps' whole time on rank 0 (longer than an untimed step's: two evaluations
    /// per sum instead of one for the step).
    pub total: Duration,
}

impl TimedSums {
    /// Milliseconds per timed step: in the sums, and in all.
    pub fn per_step_ms(&self) -> (f64, f64) {
        let n = self.steps.max(1) as f64;
        (self.sums.as_secs_f64() * 1e3 / n, self.total.as_secs_f64() * 1e3 / n)
    }
}

/// The timed steps of one kind.
struct Sampled {
    last: Option<Instant>,
    timed: TimedSums,
}

/// Arms the model's clock for the steps to time, one kind of step apart from the other.
pub struct SumSampler {
    clock: Arc<SumClock>,
    /// [prompt steps, decode steps]
    kinds: [Sampled; 2],
    /// The kind of the step the clock is armed for.
    armed: Option<StepKind>,
}

impl SumSampler {
    pub fn new(clock: Arc<SumClock>) -> SumSampler {
        let sampled = || Sampled { last: None, timed: TimedSums::default() };
        SumSampler { clock, kinds: [sampled(), sampled()], armed: None }
    }

    fn of(&mut self, kind: StepKind) -> &mut Sampled {
        &mut self.kinds[kind as usize]
    }

    /// What the timed steps of `kind` measured.
    pub fn timed(&self, kind: StepKind) -> TimedSums {
        self.kinds[kind as usize].timed
    }

    /// Before a step of `kind`: arms the clock where a timed step of that kind is due.
    pub fn start(&mut self, kind: StepKind) {
        if self.of(kind).last.is_none_or(|t| t.elapsed() >= EVERY) {
            self.clock.arm();
            self.armed = Some(kind);
        }
    }

    /// After the step `start` came before, which took `total` in all (a failed step too: the
    /// clock is disarmed either way): what its sums took, where it was timed and counted.
    pub fn finish(&mut self, total: Duration, ok: bool) -> Option<Duration> {
        let kind = self.armed.take()?;
        let (sums, count) = self.clock.disarm();
        let sampled = self.of(kind);
        sampled.last = Some(Instant::now());
        if !ok || count == 0 {
            return None;
        }
        sampled.timed.steps += 1;
        sampled.timed.sums += sums;
        sampled.timed.total += total;
        Some(sums)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::distributed::Group;

    #[test]
    fn each_kind_has_its_first_step_timed_then_one_every_interval() {
        let group = Group::alone();
        let clock = Arc::new(SumClock::default());
        let mut sampler = SumSampler::new(clock.clone());
        let x = mlx_rs::Array::from_slice(&[1.0f32, 2.0], &[2]);
        let ms = Duration::from_millis;
        let step = |sampler: &mut SumSampler, kind, sums: usize, ok| {
            sampler.start(kind);
            for _ in 0..sums {
                clock.sum(&group, x.clone()).unwrap().eval().unwrap();
            }
            sampler.finish(ms(5), ok)
        };
        assert!(step(&mut sampler, StepKind::Decode, 2, true).is_some(), "the first decode step");
        assert!(step(&mut sampler, StepKind::Prompt, 2, true).is_some(), "the first prompt step");
        assert_eq!(step(&mut sampler, StepKind::Decode, 2, true), None, "within the interval");
        let decode = sampler.timed(StepKind::Decode);
        assert_eq!((decode.steps, decode.total), (1, ms(5)));
        assert!(decode.sums <= decode.total);
        // Past the interval: due again, but a failed step, or one that ran no sum while
        // armed (it failed before its first), is not counted.
        sampler.of(StepKind::Decode).last = Some(Instant::now().checked_sub(EVERY).expect("up for 2 s"));
        assert_eq!(step(&mut sampler, StepKind::Decode, 2, false), None);
        sampler.of(StepKind::Decode).last = None;
        assert_eq!(step(&mut sampler, StepKind::Decode, 0, true), None);
        assert_eq!(sampler.timed(StepKind::Decode).steps, 1);
        assert_eq!(sampler.timed(StepKind::Prompt).steps, 1);
        assert_eq!(StepKind::of(1), StepKind::Decode);
        assert_eq!(StepKind::of(3), StepKind::Prompt);
    }
}
