//! The chat core every dialect shares: the common request form (OpenAI's chat shape, which
//! Ollama's, Anthropic's and the Responses API's requests are translated into), its validation,
//! rendering and tokenization, the raw-prompt path, and the answer as it streams — text,
//! reasoning and tool calls, read in the model's own format (`format`) — with one rule for how a
//! generation ends. The dialects (`server::openai`, `anthropic`, `ollama`, `responses`) only
//! translate requests in and render answers out; none of them imports another.

pub mod answer;
mod fetch_images;
pub mod fim;
pub mod format;
pub mod images;
mod messages;
pub mod model;
mod named_arguments;
pub mod outcome;
pub mod params;
pub mod piece;
pub mod prompt;
pub mod raw;
mod start;
pub mod stream;
pub mod structured;

pub use format::FormatCache;
pub use model::{serve, ChatModel};
pub use params::{CommonParams, StopParam, StreamOptions};
pub use piece::{Piece, ToolCall};
pub use prompt::{render, ChatRequest, RenderedChat};
pub use start::{call_id, start, with_fetched_images, StartedChat};
