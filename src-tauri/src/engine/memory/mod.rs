//! The memory governor: one ceiling for everything the process holds, and the cost model that
//! says what each step will need. Before a prefill forward it narrows the chunk until the
//! step's predicted peak fits under the ceiling (the prefix cache's RAM tier gives way first);
//! after each forward it compares the prediction with MLX's own peak counter, and the error is
//! published. Idle, it gives MLX's buffer cache back to the system. (The KV budget admission
//! reserves against is derived from the same ceiling: `kv_budget`.)

pub mod cost;
pub mod plan;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use cost::{buffers_of, Buffer, CostModel, StepShape};
pub use plan::{serving_plan, Fit, ServingPlan, PLAN_ROWS};

use crate::mlx;

/// Predicted transient bytes of the steps engines are running now, process-wide: two loaded
/// models' engines must not both spend the same headroom.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// After this long idle an engine empties MLX's buffer cache, so resident memory falls back
/// near its level before the burst.
pub const GIVE_BACK_AFTER: Duration = Duration::from_secs(3);

/// How well predictions held, as `/metrics` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Calibration {
    /// The last measured step: predicted and measured transient bytes (MLX's peak counter,
    /// reset before the step, less what was held before it).
    pub predicted_bytes: usize,
    pub measured_bytes: usize,
    /// The largest measured / predicted ratio seen (above 1: an underestimate).
    pub worst_ratio: f64,
    /// The most bytes a step measured over its prediction (0: none did). Beside the ratio because
    /// MLX's peak counter is process-wide: a few kilobytes another thread allocated during a small
    /// step move the ratio, while a buffer the cost model missed shows as its own size.
    pub worst_excess_bytes: usize,
    pub steps: u64,
    /// Prefill chunks narrowed to fit, and steps that waited for memory.
    pub narrowed: u64,
    pub deferred: u64,
}

pub struct Governor {
    /// Bytes the whole process may hold.
    ceiling: usize,
    cost: CostModel,
    calibration: Calibration,
    /// The step being measured: its prediction and MLX's active bytes before it.
    measuring: Option<(usize, usize)>,
    idle_since: Option<Instant>,
    given_back: bool,
}

/// Releases a step's share of [`IN_FLIGHT`] when it ends, however it ends.
pub struct InFlight(usize);

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(self.0, Ordering::SeqCst);
    }
}

impl Governor {
    pub fn new(ceiling: usize, cost: CostModel) -> Governor {
        Governor {
            ceiling,
            cost,
            calibration: Calibration::default(),
            measuring: None,
            idle_since: None,
            given_back: true,
        }
    }

    pub fn ceiling(&self) -> usize {
        self.ceiling
    }

    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    pub fn calibration(&self) -> Calibration {
        self.calibration
    }

    /// What the process holds now: the system's count, or MLX's when it is larger (pages MLX
    /// allocated are not all resident yet).
    pub fn held_now() -> usize {
        let stats = mlx::memory_stats();
        let resident = mlx::process_resident_bytes().unwrap_or(0) as usize;
        resident.max(stats.active + stats.cache)
    }

    /// Bytes a step may still allocate: the ceiling less what is held, the KV growth admitted
    /// rows are owed (`pending_kv`), and the other engines' steps under way.
    pub fn headroom(&self, pending_kv: usize) -> usize {
        let others = IN_FLIGHT.load(Ordering::SeqCst);
        // A margin stays free for what the process allocates outside the predicted steps meanwhile
        // (requests, tokenizers, the HTTP server, a step's small buffers the cost model misses):
        // steps narrowed to fill the headroom exactly crossed the ceiling by 0.3-1.5 MB of those
        // in the storm test.
        let margin = (self.ceiling / 64).max(MARGIN_FLOOR).min(self.ceiling / 4);
        let usable = self.ceiling - margin;
        usable.saturating_sub(Self::held_now() + pending_kv + others)
    }

    /// The most tokens per row (at most `wanted`) a prefill of `rows` prompts into `buffers`
    /// (and a shared segment of `shared`) may take within `headroom`; 0 when not even one fits.
    pub fn prefill_tokens(
        &mut self,
        rows: usize,
        buffers: &[Buffer],
        shared: usize,
        wanted: usize,
        headroom: usize,
    ) -> usize {
        let fits = |n: usize| self.cost.prefill_bytes(rows, n, buffers, shared, rows) <= headroom;
        if fits(wanted) {
            return wanted;
        }
        let low = largest_fitting(0, wanted, fits);
        if low == 0 {
            self.calibration.deferred += 1;
        } else {
            self.calibration.narrowed += 1;
        }
        low
    }

    /// The most positions per row (at most `most`) a verify step of `rows` rows into `buffers`
    /// may check within what is free under the ceiling now; 1 (no drafts) when not even two fit:
    /// drafting is never worth crossing the ceiling.
    pub fn verify_width(&self, rows: usize, buffers: &[Buffer], shared: usize, most: usize) -> usize {
        let headroom = self.headroom(0);
        let fits = |w: usize| self.cost.verify_bytes(rows, w, buffers, shared) <= headroom;
        largest_fitting(1, most.max(1), fits)
    }

    /// A forward predicted to need `predicted` bytes starts: MLX's peak counter is reset and
    /// the prediction is held against the other engines until the returned guard drops.
    pub fn begin_step(&mut self, predicted: usize) -> InFlight {
        mlx::reset_peak_memory();
        self.measuring = Some((predicted, mlx::memory_stats().active));
        self.idle_since = None;
        self.given_back = false;
        IN_FLIGHT.fetch_add(predicted, Ordering::SeqCst);
        InFlight(predicted)
    }

    /// The forward begun last has been evaluated: its measured transient against the prediction.
    pub fn end_step(&mut self) {
        let Some((predicted, before)) = self.measuring.take() else { return };
        let measured = mlx::memory_stats().peak.saturating_sub(before);
        let c = &mut self.calibration;
        c.predicted_bytes = predicted;
        c.measured_bytes = measured;
        c.steps += 1;
        if predicted > 0 {
            c.worst_ratio = c.worst_ratio.max(measured as f64 / predicted as f64);
        }
        c.worst_excess_bytes = c.worst_excess_bytes.max(measured.saturating_sub(predicted));
    }

    /// Called while the engine has nothing to do: once idle for [`GIVE_BACK_AFTER`], MLX's
    /// buffer cache goes back to the system.
    pub fn idle(&mut self) {
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        if !self.given_back && since.elapsed() >= GIVE_BACK_AFTER {
            mlx::give_back();
            self.given_back = true;
        }
    }
}

/// A forward outside the measured steps (a draft model's) is predicted to need `predicted`
/// bytes: held against the other engines' steps until the guard drops.
pub fn hold(predicted: usize) -> InFlight {
    IN_FLIGHT.fetch_add(predicted, Ordering::SeqCst);
    InFlight(predicted)
}

/// The KV budget under a ceiling, and the rows a decode step may run under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvBudget {
    pub bytes: usize,
    /// At most the configured batch; fewer when the ceiling cannot hold a step of key/value
    /// columns for each row (a batch's buffers grow for every row at once).
    pub max_rows: usize,
}

/// The cost model of `model`'s steps with keys and values stored in `kv`.
pub fn cost_model_of(model: &crate::model::Transformer, kv: crate::model::KvFormat) -> CostModel {
    let act_bytes = if model.dtype == mlx_rs::Dtype::Float32 { 4 } else { 2 };
    CostModel::new(&model.config, act_bytes, mlx::gpu_available()).with_kv_quant(kv.quant.filter(|_| kv.start == 0))
}

/// The tokens of keys and values a cluster rank's part of `model` (a pipeline stage's layers,
/// or its share of every layer's heads) has room for: the KV budget its machine's `ceiling`
/// leaves beside what the process holds now, over that part's own bytes per token (counted
/// unquantized: a bound).
pub fn stage_kv_capacity(
    model: &crate::model::Transformer,
    config: &crate::engine::EngineConfig,
    ceiling: usize,
) -> usize {
    let context = config.context_length(model.config.max_position_embeddings);
    let cost = cost_model_of(model, config.kv_format);
    let budget = kv_budget(ceiling, Governor::held_now(), 0, &cost, config.max_batch, context, None);
    budget.bytes / model.kv_bytes_per_token().max(1)
}

/// The KV budget under a ceiling: what the ceiling leaves after the weights, what the process
/// held before the model (`baseline`), MLX's buffer cache, and the steps the engine must always
/// be able to run: a decode step of the whole batch (its growth scales with the rows and the KV
/// it holds) and a small prefill chunk at full context. The batch is capped at the rows whose
/// buffers' growth the budget can hold, so that a tight ceiling runs fewer rows instead of
/// reserving for rows it could never hold. `wanted` caps the budget.
pub fn kv_budget(
    ceiling: usize,
    weights: usize,
    baseline: usize,
    cost: &CostModel,
    max_batch: usize,
    context: usize,
    wanted: Option<usize>,
) -> KvBudget {
    const FLOOR: usize = 32 << 20;
    let cache = mlx::cache_limit_for(ceiling as u64) as usize;
    let at = context.saturating_sub(MIN_PREFILL);
    let buffers =
        vec![Buffer { width: at, capacity: at, quant: cost.kv_quant(), converting: None }; cost.layer_count()];
    let prefill = cost.prefill_bytes(1, MIN_PREFILL, &buffers, 0, 1);
    // The decode reserve grows by budget / layers: solve budget + budget / layers = what is left.
    let layers = cost.kv_layers().max(1);
    let left = |rows: usize| {
        let fixed = weights + baseline + cache + prefill.max(cost.decode_reserve(rows, context, 0));
        ceiling.saturating_sub(fixed) / (layers + 1) * layers
    };
    // More rows leave less: the most rows whose step of growth fits in the budget they leave.
    let fits = |rows: usize| rows * cost.growth_per_row() <= left(rows).max(FLOOR);
    let low = largest_fitting(1, max_batch.max(1), fits);
    let left = left(low);
    // A configured budget is kept when the ceiling allows it (tests set tiny ones).
    let bytes = match wanted {
        Some(w) => w.min(left.max(FLOOR)),
        None => left.max(FLOOR),
    };
    KvBudget { bytes, max_rows: low }
}

/// The largest `n` in `low..=high` for which `fits(n)` holds, `fits` holding up to some point and
/// not past it (more memory never fits where less did not); `low` when none above it does.
fn largest_fitting(mut low: usize, mut high: usize, fits: impl Fn(usize) -> bool) -> usize {
    while low < high {
        let mid = (low + high).div_ceil(2);
        if fits(mid) {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    low
}

/// What [`Governor::headroom`] keeps free of the ceiling at least (a 64th of it above 1 GiB).
const MARGIN_FLOOR: usize = 16 << 20;

/// The smallest prefill chunk the KV budget leaves room for at any depth.
pub const MIN_PREFILL: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::synthetic;
    use crate::model::config::Arch;

    #[test]
    fn a_cluster_rank_counts_the_keys_and_values_of_its_own_part() {
        let dir = tempfile::tempdir().unwrap();
        // Local (windowed) and global layers, keys and values quantized from token 8.
        synthetic::write_tiny_model(dir.path(), Arch::Gemma3, 1, None).unwrap();
        let config = crate::model::read_config(dir.path()).unwrap();
        let quant = crate::model::KvQuant { bits: 8, group_size: 32 };
        let whole = config.kv_footprint_in(4, crate::model::KvFormat { quant: Some(quant), start: 8 });
        assert_eq!(whole.scaled(3, 3), whole);
        let half = whole.scaled(1, 2);
        assert_eq!(
            (2 * half.full_per_token, 2 * half.windowed_per_token),
            (whole.full_per_token, whole.windowed_per_token)
        );
        let (q, hq) = (whole.quantized.unwrap(), half.quantized.unwrap());
        assert!(q.full_per_token - 2 * hq.full_per_token <= 1 && hq.from == q.from);
        assert_eq!((half.windowed_tokens, half.state_bytes), (whole.windowed_tokens, whole.state_bytes));
        // Half the bytes per token hold about twice the tokens.
        let budget = 1 << 20;
        assert!(half.tokens_within(budget) >= 2 * whole.tokens_within(budget) - 16);
    }

    #[test]
    fn verify_steps_narrow_to_what_is_free_under_the_ceiling() {
        let dir = tempfile::tempdir().unwrap();
        synthetic::write_tiny_model(dir.path(), Arch::Qwen3Next, 1, None).unwrap();
        let config = crate::model::read_config(dir.path()).unwrap();
        let buffers = vec![Buffer { width: 100, capacity: 256, ..Default::default() }; config.kv_cache_layers()];
        let cost = || CostModel::new(&config, 4, false);
        // Far above what the process holds: every width fits.
        assert_eq!(Governor::new(64 << 30, cost()).verify_width(4, &buffers, 0, 9), 9);
        // Below what it holds already: no drafting.
        assert_eq!(Governor::new(1 << 20, cost()).verify_width(4, &buffers, 0, 9), 1);
        // Raising the ceiling from what is held, the first that lets a step draft at all lets
        // it check fewer positions than the most: it narrows to what fits.
        let mut ceiling = Governor::held_now();
        let (governor, width) = loop {
            ceiling += 64 << 10;
            let governor = Governor::new(ceiling, cost());
            let width = governor.verify_width(4, &buffers, 0, 9);
            if width > 1 {
                break (governor, width);
            }
        };
        assert!(width < 9, "{width}");
        assert!(cost().verify_bytes(4, width, &buffers, 0) <= governor.headroom(0) + (64 << 10));
    }
}
