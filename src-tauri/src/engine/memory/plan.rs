//! What a model can serve on this machine before it is loaded: from its shape (the cost
//! model), its weights and the memory ceiling, how much context each of a few requests can
//! hold at once. The same arithmetic the engine does at load ([`super::kv_budget`]), so what
//! the Models page and `fastmlx inspect` say is what the server then enforces.

use serde::Serialize;

use super::{kv_budget, largest_fitting, CostModel};
use crate::model::ModelConfig;

/// What the process holds besides its models (MLX's runtime, OpenBLAS, the HTTP server):
/// `fastmlx serve` held 254 MiB resident after unloading SmolLM2 (Linux, debug build).
pub const PROCESS_BASELINE: u64 = 256 << 20;

/// Requests at once the plan is made for.
pub const PLAN_ROWS: usize = 4;

/// Context per request at which a model fits comfortably, and below which it is of little use.
const COMFORTABLE_CONTEXT: usize = 8192;
const USABLE_CONTEXT: usize = 2048;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Fit {
    #[serde(rename = "fits")]
    Fits,
    #[serde(rename = "tight")]
    Tight,
    #[serde(rename = "too big")]
    TooBig,
}

impl Fit {
    pub fn as_str(self) -> &'static str {
        match self {
            Fit::Fits => "fits",
            Fit::Tight => "tight",
            Fit::TooBig => "too big",
        }
    }

    /// From the context `rows` requests get each, against what the model takes (`max`).
    fn of(context: usize, max: usize) -> Fit {
        if context >= COMFORTABLE_CONTEXT.min(max) {
            Fit::Fits
        } else if context >= USABLE_CONTEXT.min(max) {
            Fit::Tight
        } else {
            Fit::TooBig
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServingPlan {
    pub ceiling_bytes: u64,
    pub weights_bytes: u64,
    /// Keys and values a token of context adds (all layers; windowed layers stop growing at
    /// their window, recurrent states are fixed).
    pub kv_bytes_per_token: u64,
    /// The KV budget the engine gets at that context.
    pub kv_budget_bytes: u64,
    pub rows: usize,
    /// Tokens of context each of `rows` requests can hold at once (at most the model's own).
    pub context_tokens: usize,
    pub max_context: usize,
    pub fit: Fit,
    /// Tokens of context each request can hold with keys and values quantized to 8 and to 4 bits
    /// (`--kv-bits`; `None` where the model's heads cannot be).
    pub context_tokens_kv8: Option<usize>,
    pub context_tokens_kv4: Option<usize>,
}

/// The plan for a model of shape `config` whose weights take `weights` bytes once loaded,
/// under `ceiling`, for `rows` requests at once, on an engine batching up to `max_batch` rows.
/// `act_bytes`: the bytes of one key or value element (the compute dtype).
pub fn serving_plan(
    config: &ModelConfig,
    weights: u64,
    ceiling: u64,
    act_bytes: usize,
    gpu: bool,
    rows: usize,
    max_batch: usize,
) -> ServingPlan {
    let full = CostModel::new(config, act_bytes, gpu);
    let max = config.max_position_embeddings.max(1);
    let plan = |cost: &CostModel| plan_with(cost, max, weights, ceiling, rows, max_batch);
    let (low, budget) = plan(&full);
    let quantized = |bits: i32| Some(plan(&full.clone().with_kv_quant(Some(config.kv_quant_for(bits)?))).0);
    ServingPlan {
        ceiling_bytes: ceiling,
        weights_bytes: weights,
        kv_bytes_per_token: full.kv_per_token() as u64,
        kv_budget_bytes: budget,
        rows,
        context_tokens: low,
        max_context: max,
        fit: Fit::of(low, max),
        context_tokens_kv8: quantized(8),
        context_tokens_kv4: quantized(4),
    }
}

/// The largest context each of `rows` requests gets under `ceiling` with `cost`'s keys and
/// values, and the KV budget at that context.
fn plan_with(cost: &CostModel, max: usize, weights: u64, ceiling: u64, rows: usize, max_batch: usize) -> (usize, u64) {
    let budget_at = |context: usize| {
        let budget =
            kv_budget(ceiling as usize, weights as usize, PROCESS_BASELINE as usize, cost, max_batch, context, None);
        // Fewer rows than asked for run at once under this ceiling: none of the plan's context.
        if budget.max_rows < rows.min(max_batch) {
            0
        } else {
            budget.bytes
        }
    };
    let fits = |context: usize| {
        let held = weights + PROCESS_BASELINE + crate::mlx::cache_limit_for(ceiling);
        held < ceiling && rows * cost.request_bytes_at(context) <= budget_at(context)
    };
    // The largest context that fits (more context never needs less memory).
    let low = largest_fitting(0, max, fits);
    (low, if low > 0 { budget_at(low) as u64 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::synthetic;
    use crate::model::config::Arch;

    fn config(arch: Arch) -> ModelConfig {
        let dir = tempfile::tempdir().unwrap();
        synthetic::write_tiny_model(dir.path(), arch, 1, None).unwrap();
        crate::model::read_config(dir.path()).unwrap()
    }

    #[test]
    fn more_memory_serves_more_context_up_to_the_models_own() {
        // A long context of its own, so that memory is what limits it.
        let c = ModelConfig { max_position_embeddings: 1 << 20, ..config(Arch::Llama) };
        let plan = |ceiling: u64| serving_plan(&c, 1 << 20, ceiling, 4, false, PLAN_ROWS, 8);
        let (small, large, huge) = (plan(300 << 20), plan(600 << 20), plan(64 << 30));
        assert!(small.context_tokens < large.context_tokens, "{small:?} {large:?}");
        assert_eq!(huge.context_tokens, c.max_position_embeddings);
        // What the plan grants is what the budget at that context holds.
        assert!(large.rows as u64 * large.kv_bytes_per_token * large.context_tokens as u64 <= large.kv_budget_bytes);
        assert_eq!(huge.fit, Fit::Fits);
        // Quantized keys and values hold more context in the same memory: 8-bit f32 ones take 3.2x
        // fewer bytes (a scale and a bias per 32 elements), less what does not shrink (the step's
        // score matrix, which grows with the context too); 4-bit more again.
        let (kv8, kv4) = (large.context_tokens_kv8.unwrap(), large.context_tokens_kv4.unwrap());
        assert!(kv8 >= 2 * large.context_tokens && kv4 > kv8, "{large:?}");
    }

    #[test]
    fn weights_over_the_ceiling_serve_nothing() {
        let c = config(Arch::Llama);
        let plan = serving_plan(&c, 2 << 30, 1 << 30, 4, false, PLAN_ROWS, 8);
        assert_eq!((plan.context_tokens, plan.fit, plan.kv_budget_bytes), (0, Fit::TooBig, 0));
    }
}
