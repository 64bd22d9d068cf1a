//! Whether a model fits this machine, under the memory ceiling the server enforces.
//!
//! A local model's shape is known (its `config.json` or GGUF header): the memory governor's
//! planner says how much context four requests get at once, and the badge follows from that. A
//! model found on the Hub is known only by its size: its weights plus a fifth for the KV cache
//! and MLX's buffers, against the same ceiling. The CLI's search, `fastmlx inspect` and the
//! dashboard's Models and Discover pages all show these.

use std::path::Path;

use super::HubShape;
use crate::engine::memory::{plan, serving_plan, Fit, ServingPlan, PLAN_ROWS};
use crate::model::{LoadOptions, ModelConfig, ModelSummary};

/// The weights as they sit in GPU memory (about their size on the Hub), plus a fifth for the KV
/// cache and MLX's buffers. (On a CPU FastMLX expands quantized weights to f32 when they fit;
/// the estimate is for the product's target, Apple Silicon.)
pub fn memory_needed(storage_bytes: u64) -> u64 {
    storage_bytes / 5 * 6 + plan::PROCESS_BASELINE
}

/// A model known only by the memory it needs: "fits" within four fifths of the ceiling, "tight"
/// up to the ceiling, else "too big".
pub fn fit(needed: u64, ceiling: u64) -> &'static str {
    if needed <= ceiling / 5 * 4 {
        Fit::Fits.as_str()
    } else if needed <= ceiling {
        Fit::Tight.as_str()
    } else {
        Fit::TooBig.as_str()
    }
}

/// The plan for the model at `path` under `ceiling`, for [`PLAN_ROWS`] requests at once on an
/// engine batching `max_batch` rows; `None` when its shape cannot be read.
pub fn plan_for(
    path: &Path,
    summary: &ModelSummary,
    options: &LoadOptions,
    ceiling: u64,
    max_batch: usize,
) -> Option<ServingPlan> {
    let config = crate::model::read_config(path).ok()?;
    Some(plan_from(&config, super::estimated_weights_bytes(summary, options), ceiling, max_batch))
}

/// What a Hub search result would take and serve here.
pub struct HubEstimate {
    /// Its weights plus a fifth, when the Hub reports their size.
    pub needed: Option<u64>,
    /// The planner's answer, when its config is known too.
    pub plan: Option<ServingPlan>,
    /// The plan's badge, else the size's.
    pub fit: Option<&'static str>,
}

/// [`HubEstimate`] for a result whose weights take `storage_bytes` on the Hub (about what they
/// take loaded, on Apple Silicon) and whose config is `shape`'s.
pub fn hub_estimate(
    storage_bytes: Option<u64>,
    shape: Option<&HubShape>,
    ceiling: u64,
    max_batch: usize,
) -> HubEstimate {
    let needed = storage_bytes.map(memory_needed);
    let config = shape.and_then(|s| s.config.as_ref().ok());
    let plan = config.zip(storage_bytes).map(|(c, weights)| plan_from(c, weights, ceiling, max_batch));
    let fit = plan.as_ref().map(|p| p.fit.as_str()).or(needed.map(|n| fit(n, ceiling)));
    HubEstimate { needed, plan, fit }
}

/// The plan for a model of shape `config` whose weights take `weights` bytes once loaded.
pub(crate) fn plan_from(config: &ModelConfig, weights: u64, ceiling: u64, max_batch: usize) -> ServingPlan {
    serving_plan(config, weights, ceiling, kv_element_bytes(), crate::mlx::gpu_available(), PLAN_ROWS, max_batch)
}

/// Bytes of one key or value element: they are kept in the compute dtype, f32 on a CPU, the
/// model's 16 bits on Metal.
pub(crate) fn kv_element_bytes() -> usize {
    if crate::mlx::gpu_available() {
        2
    } else {
        4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_badge_follows_the_ceiling() {
        let ceiling = 10 << 30;
        assert_eq!(fit(4 << 30, ceiling), "fits");
        assert_eq!(fit(9 << 30, ceiling), "tight");
        assert_eq!(fit(11 << 30, ceiling), "too big");
    }
}
