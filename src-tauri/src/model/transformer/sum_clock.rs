//! The time a step shared out by tensors spends in its sums. A sum is a node of the step's lazy
//! graph, evaluated with the layers around it, so its time cannot be told apart from theirs in
//! an ordinary step. On a step the clock is armed for, each branch's own part is evaluated
//! first, then its sum alone, timed: the transfer and any rank still computing its share. That
//! costs the step its single evaluation (two per sum instead), so the server arms it for a
//! sampled step now and then, not for every step.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx_rs::Array;

use crate::mlx::distributed::Group;
use crate::model::error::{ModelError, Result};

/// What a step's sums took while the clock was armed.
#[derive(Default)]
pub struct SumClock {
    armed: AtomicBool,
    nanos: AtomicU64,
    sums: AtomicU64,
}

impl SumClock {
    /// Times the sums from now until [`SumClock::disarm`].
    pub fn arm(&self) {
        self.nanos.store(0, Ordering::Relaxed);
        self.sums.store(0, Ordering::Relaxed);
        self.armed.store(true, Ordering::Release);
    }

    /// Stops timing: the time of the sums since [`SumClock::arm`], and how many there were.
    pub fn disarm(&self) -> (Duration, u64) {
        self.armed.store(false, Ordering::Release);
        (Duration::from_nanos(self.nanos.load(Ordering::Relaxed)), self.sums.load(Ordering::Relaxed))
    }

    /// `x` summed over `group`'s ranks; timed apart from the work before it when armed.
    pub fn sum(&self, group: &Group, x: Array) -> Result<Array> {
        if !self.armed.load(Ordering::Acquire) {
            return group.all_sum(&x).map_err(ModelError::Mlx);
        }
        x.eval()?;
        let started = Instant::now();
        let summed = group.all_sum(&x).map_err(ModelError::Mlx)?;
        summed.eval()?;
        self.nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.sums.fetch_add(1, Ordering::Relaxed);
        Ok(summed)
    }
}

/// The ranks a model is shared out with, and the clock of its sums.
pub(super) struct TensorShare {
    pub group: Arc<Group>,
    pub clock: Arc<SumClock>,
}

impl TensorShare {
    pub fn sum(&self, x: Array) -> Result<Array> {
        self.clock.sum(&self.group, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_clock_times_each_sum_and_a_disarmed_one_none() {
        let share = TensorShare { group: Arc::new(Group::alone()), clock: Arc::default() };
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
        share.clock.arm();
        let once = share.sum(x.clone()).unwrap();
        let twice = share.sum(once).unwrap();
        let (_, sums) = share.clock.disarm();
        assert_eq!(sums, 2);
        // A group of one sums to the array itself.
        assert_eq!(twice.as_slice::<f32>(), &[1.0, 2.0, 3.0]);
        share.sum(x).unwrap().eval().unwrap();
        assert_eq!(share.clock.disarm().1, 2, "not counted while disarmed");
        share.clock.arm();
        assert_eq!(share.clock.disarm(), (Duration::ZERO, 0), "arming starts afresh");
    }
}
