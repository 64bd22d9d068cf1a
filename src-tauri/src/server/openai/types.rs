//! The shapes of what the OpenAI-compatible endpoints answer, as the handlers build them; the
//! OpenAPI description (`server::openapi`) is generated from these and from the request types.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens reused from the prefix cache instead of being processed again.
    pub cached_tokens: usize,
}

impl From<crate::engine::Usage> for Usage {
    fn from(u: crate::engine::Usage) -> Usage {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: u.cached_tokens },
        }
    }
}

/// Where a request's time went, with llama.cpp's field names where they fit (`prompt_*` is the
/// prefill of the tokens not taken from the prefix cache, `predicted_*` the generation).
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct Timings {
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_per_token_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_token_ms: f64,
    pub predicted_per_second: f64,
    /// Prompt tokens taken from the prefix cache.
    pub cache_n: usize,
    /// Waiting before the prefill started.
    pub queue_ms: f64,
    /// Restoring the cached start (part of `prompt_ms`).
    pub restore_ms: f64,
    /// Arrival to the first token.
    pub ttft_ms: f64,
    pub prefill_chunks: usize,
    /// Tokens drafted for speculative decoding, and how many the model accepted.
    pub draft_n: usize,
    pub draft_n_accepted: usize,
}

impl From<&crate::engine::Finish> for Timings {
    fn from(f: &crate::engine::Finish) -> Timings {
        let (u, t) = (&f.usage, &f.timings);
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let per = |n: usize, ms: f64| if n > 0 { (ms / n as f64, n as f64 / ms * 1e3) } else { (0.0, 0.0) };
        let prompt_n = u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens);
        let (prompt_per_token_ms, prompt_per_second) = per(prompt_n, ms(t.prefill));
        let (predicted_per_token_ms, predicted_per_second) = per(u.completion_tokens, ms(t.decode));
        Timings {
            prompt_n,
            prompt_ms: ms(t.prefill),
            prompt_per_token_ms,
            prompt_per_second,
            predicted_n: u.completion_tokens,
            predicted_ms: ms(t.decode),
            predicted_per_token_ms,
            predicted_per_second,
            cache_n: u.cached_tokens,
            queue_ms: ms(t.queue),
            restore_ms: ms(t.restore),
            ttft_ms: ms(t.time_to_first_token),
            prefill_chunks: t.prefill_chunks,
            draft_n: t.draft_tokens,
            draft_n_accepted: t.draft_accepted,
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Model {
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// FastMLX's: `chat`, `embedding` or `reranker` (what the model serves).
    pub kind: &'static str,
    /// FastMLX's: whether it reads images (`image_url` parts and the like).
    pub vision: bool,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    pub data: Vec<Model>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// Null when the answer is only tool calls.
    pub content: Option<String>,
    /// What a reasoning model thought (`<think>`), apart from the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    /// Always `chat.completion`.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub timings: Timings,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A tool call as it streams: the first fragment has `id`, `type` and the name.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCallDelta,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// One `data:` event of a streamed chat completion. With `stream_options.include_usage` the
/// last one has no choices and carries the usage.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// On the chunk that finishes the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// Logprobs of a text completion, in the legacy format.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    /// Null in streamed chunks until the last.
    pub finish_reason: Option<&'static str>,
}

/// A text completion, or one streamed chunk of one (same shape; `usage` only where known).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Completion {
    pub id: String,
    /// Always `text_completion`.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// On the last chunk, and in a whole answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or `error` (with a 503) when a model cannot serve: its cluster lost a machine, or is
    /// forming (again).
    pub status: &'static str,
    /// The loaded models, most recently used first.
    pub loaded: Vec<String>,
    /// What is wrong, naming the machine lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
