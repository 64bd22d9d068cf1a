//! Which waiting request goes next: the highest priority first (autocomplete before an agent's
//! long prompt), raised by how long a request has waited so that nothing starves, then the one
//! that came first.

use std::time::Duration;

/// A request's priority rises by one for every this long it waits.
pub const AGEING: Duration = Duration::from_secs(5);

/// The priority given to fill-in-the-middle (autocomplete) requests unless they ask otherwise.
pub const INTERACTIVE: i32 = 10;

/// `priority` after waiting `waited`.
pub fn effective(priority: i32, waited: Duration) -> i64 {
    i64::from(priority) + (waited.as_secs_f64() / AGEING.as_secs_f64()) as i64
}

/// The indices of `(priority, waited)` in the order they should be admitted.
pub fn order(waiting: impl IntoIterator<Item = (i32, Duration)>) -> Vec<usize> {
    let mut keyed: Vec<(i64, usize)> =
        waiting.into_iter().enumerate().map(|(i, (p, w))| (effective(p, w), i)).collect();
    keyed.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn priority_then_arrival_and_waiting_raises_priority() {
        assert_eq!(order([]), Vec::<usize>::new());
        assert_eq!(order([(0, secs(0)), (0, secs(0))]), vec![0, 1], "arrival order among equals");
        assert_eq!(order([(0, secs(1)), (INTERACTIVE, secs(0))]), vec![1, 0], "the interactive lane first");
        // An agent that waited long enough goes before a fresh interactive request.
        assert_eq!(order([(0, secs(60)), (INTERACTIVE, secs(0))]), vec![0, 1]);
        assert_eq!(effective(-5, secs(26)), 0);
        assert_eq!(order([(0, secs(0)), (INTERACTIVE, secs(0)), (0, secs(0))]), vec![1, 0, 2]);
    }
}
