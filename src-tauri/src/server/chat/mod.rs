//! The chat core every dialect shares: the common request form (OpenAI's chat shape, which
//! Ollama's, Anthropic's and the Responses API's requests are translated into), its validation,
//! rendering and tokenization, the raw-prompt path, and the answer as it streams — text,
//! reasoning and tool calls — with one rule for how a generation ends. The dialects
//! (`server::openai`, `anthropic`, `ollama`, `responses`) only translate requests in and render
//! answers out; none of them imports another.

pub mod answer;
mod call_grammar;
pub mod fim;
mod gemma4_calls;
pub mod harmony;
mod named_arguments;
pub mod outcome;
pub mod params;
pub mod prompt;
mod pythonic_calls;
pub mod raw;
mod reasoning;
pub mod structured;
pub mod tool_calls;

pub use params::{CommonParams, StopParam, StreamOptions};
pub use prompt::{call_id, render, start, ChatRequest, RenderedChat, StartedChat};
