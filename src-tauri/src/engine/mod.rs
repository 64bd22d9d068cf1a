//! The continuous-batching engine: one thread owns the model and all MLX state and serves every
//! caller at once. Requests join and leave the running batch at every step; each step decodes
//! one token for every running row, then advances waiting prompts by a bounded prefill chunk.
//! Callers (HTTP API, chat window, CLI) submit through an [`EngineHandle`] and read a stream of
//! [`Event`]s; the engine never waits on them, and a dropped stream cancels its request.

mod handle;
mod memory;
mod metrics;
mod request;
mod scheduler;
mod sequence;

pub use handle::{EngineConfig, EngineHandle, FaultInjector, ModelInfo, RequestStream, SubmitError};
pub use memory::total_memory_bytes;
pub use metrics::{Metrics, RecentRequest, RECENT_REQUESTS};
pub use request::{Event, Finish, FinishReason, Request, RequestId, Timings, TokenLogprob, Usage};
