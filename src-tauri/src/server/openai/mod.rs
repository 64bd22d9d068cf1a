//! OpenAI's API: models, chat completions, completions, embeddings (`server::embeddings`), rendered from the chat core
//! (`server::chat`), where validation and tokenization happen before anything reaches the
//! engine's queue.

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod models;
pub mod types;

use crate::engine::FinishReason;

/// OpenAI's name for how a generation ended.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        // Never sent: such a generation ends as an error (`chat::outcome::failure`).
        FinishReason::Cancelled | FinishReason::Error | FinishReason::Overloaded | FinishReason::Unavailable => "error",
    }
}

/// A response type as the JSON of one SSE event.
pub fn to_json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("response types serialize")
}
