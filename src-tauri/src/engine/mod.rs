//! The continuous-batching engine: one thread owns the model and all MLX state and serves every
//! caller at once. Requests join and leave the running batch at every step; each step decodes
//! one token for every running row, then advances waiting prompts by a bounded prefill chunk.
//! Callers (HTTP API, chat window, CLI) submit through an [`EngineHandle`] and read a stream of
//! [`Event`]s; the engine never waits on them, and a dropped stream cancels its request.

mod batch;
mod config;
pub mod embed;
mod handle;
pub mod kv;
pub mod lanes;
pub mod memory;
mod metrics;
mod pacing;
pub mod remote;
mod request;
mod scheduler;
mod sequence;
pub mod speculative;
pub mod turns;
mod vision;

pub use config::{
    EngineConfig, FaultInjector, ModelInfo, DEFAULT_ITL_BUDGET, DEFAULT_KV_RESERVE_AHEAD, DEFAULT_MAX_QUEUE_WAIT,
    DEFAULT_PREFIX_CACHE_BYTES,
};
pub use handle::{DraftLoader, EngineHandle, RequestStream, SubmitError};
pub use metrics::{CacheMiss, Histogram, Metrics, RecentRequest, LATENCY_BUCKETS, RECENT_REQUESTS};
pub use request::{Event, Finish, FinishReason, Request, RequestId, Timings, TokenLogprob, Usage};
