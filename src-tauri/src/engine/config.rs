//! How an engine is configured, and what it tells callers about its model: shared by the
//! handle (which builds requests against it) and the scheduler (which enforces it).

use std::sync::Arc;

use super::request::RequestId;

/// Test hook: called for every generated token of every request (`id`, tokens so far); an
/// `Err` fails that request as an internal error would.
pub type FaultInjector = Arc<dyn Fn(RequestId, usize) -> Result<(), String> + Send + Sync>;

#[derive(Clone)]
pub struct EngineConfig {
    /// Rows decoded together at most.
    pub max_batch: usize,
    /// Requests waiting at most; more get [`SubmitError::Busy`] at once.
    pub max_queue: usize,
    /// Most prompt tokens prefilled per step (the width when nothing is decoding).
    pub prefill_chunk: usize,
    /// While rows decode, each step's prefill is sized to keep their inter-token latency near
    /// this multiple of its unloaded value (0: the token budget alone).
    pub itl_budget: f64,
    /// Cap on the context window (prompt + output), below the model's own.
    pub max_context: Option<usize>,
    /// Bytes of KV cache admitted requests may reserve (prompt + max tokens each);
    /// `None`: derived from the machine's memory and the model's size.
    pub kv_budget_bytes: Option<usize>,
    pub fault_injector: Option<FaultInjector>,
    /// Bytes the whole process may hold (`None`: `mlx::default_ceiling`). Prefill steps narrow
    /// to fit under it and the KV budget is derived from it (`engine::memory`).
    pub memory_ceiling: Option<usize>,
    /// A request not started after this long gets `FinishReason::Overloaded` (503 with
    /// `Retry-After`) instead of waiting on (`None`: it waits).
    pub max_queue_wait: Option<std::time::Duration>,
    /// Output tokens a request reserves KV memory for ahead of what it has generated: requests
    /// are admitted on this horizon, not on their whole `max_tokens`, and reserve more as they
    /// go; when the budget has no more, the lowest-priority running row is parked
    /// (`scheduler::park`) and resumes later with the same output.
    pub kv_reserve_ahead: usize,
    /// Most bytes the prefix cache may hold (0: no prefix cache). It lives inside the KV budget
    /// and gives way to admitted requests.
    pub prefix_cache_bytes: usize,
    /// The prefix cache's disk tier: its folder and most bytes (`None`: RAM only).
    pub prefix_cache_disk: Option<(std::path::PathBuf, u64)>,
    /// Speculative decoding: how rows draft tokens that a step checks together.
    pub speculative: super::speculative::SpeculativeConfig,
    /// How the model's keys and values are stored: at full precision, or quantized (8 or 4
    /// bits) from a position on (`model::cache::KvFormat`). A draft model's and an MTP head's
    /// stay at full precision (they are small).
    pub kv_format: crate::model::KvFormat,
}

/// While streams decode, a long prompt's prefill is paced so that their inter-token latency stays
/// near 4x its unloaded value: measured with 8 streams decoding while a 2k-token prompt arrives,
/// their ITL p95 568 ms instead of 2-3 s, for that prompt's first token 9.0 s instead of 5-7 s;
/// bursts of short prompts are not paced (docs/benchmarks.md). 0 turns it off.
pub const DEFAULT_ITL_BUDGET: f64 = 4.0;

/// How long a request may wait to start before it is answered 503: long enough for a burst of
/// agents to be served in turn, short enough that a client retries rather than hangs.
pub const DEFAULT_MAX_QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Enough output for most chat answers and tool calls to finish on their first reservation;
/// short enough that a request asking for a huge `max_tokens` does not shut others out.
pub const DEFAULT_KV_RESERVE_AHEAD: usize = 1024;

/// The prefix cache's default cap; the KV budget bounds it further.
pub const DEFAULT_PREFIX_CACHE_BYTES: usize = 4 << 30;

impl EngineConfig {
    /// The context window served of a model whose own is `model_max` tokens.
    pub fn context_length(&self, model_max: usize) -> usize {
        self.max_context.map_or(model_max, |c| c.min(model_max))
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch: 32,
            max_queue: 256,
            prefill_chunk: 512,
            itl_budget: DEFAULT_ITL_BUDGET,
            max_context: None,
            kv_budget_bytes: None,
            fault_injector: None,
            memory_ceiling: None,
            max_queue_wait: Some(DEFAULT_MAX_QUEUE_WAIT),
            kv_reserve_ahead: DEFAULT_KV_RESERVE_AHEAD,
            prefix_cache_bytes: DEFAULT_PREFIX_CACHE_BYTES,
            prefix_cache_disk: None,
            speculative: Default::default(),
            kv_format: crate::model::KvFormat::FULL,
        }
    }
}

/// What callers need to know about the loaded model to build valid requests.
#[derive(Clone)]
pub struct ModelInfo {
    pub name: String,
    /// The model's tokenizer and chat template, for callers that tokenize themselves.
    pub tokenizer: Arc<crate::tokenizer::Tokenizer>,
    pub chat_template: Option<Arc<crate::tokenizer::ChatTemplate>>,
    pub context_length: usize,
    pub vocab_size: usize,
    /// Decoder layers this process runs (a pipeline stage's, where split).
    pub layers: usize,
    /// Key/value bytes per token in all layers...
    pub kv_bytes_per_token: usize,
    /// ...and what a sequence really takes (windowed layers hold a bounded number of tokens).
    pub kv_footprint: crate::model::KvFootprint,
    pub kv_budget_bytes: usize,
    /// The longest sequence (prompt and output) the KV budget holds: a request asking for more
    /// output is served up to it and ends with `length`, as at the end of the context.
    pub kv_capacity_tokens: usize,
    /// Bytes the weights take in memory.
    pub weights_bytes: usize,
    /// The process's memory ceiling the engine keeps under.
    pub memory_ceiling: usize,
    /// The draft model proposing tokens for it (`--draft-model`), if one is loaded.
    pub draft_model: Option<String>,
    /// Whether its own multi-token-prediction head drafts (`mtp`, or `auto` without a draft model).
    pub mtp_head: bool,
    /// How it reads images, for a model that sees (`None`: text only).
    pub vision: Option<Arc<crate::model::vision::ImageProcessor>>,
}
