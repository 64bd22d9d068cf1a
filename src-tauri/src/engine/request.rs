//! What callers send to the engine and what they get back.

use std::sync::Arc;
use std::time::Duration;

use crate::constrain::Grammar;
use crate::sampling::SamplingParams;

pub type RequestId = u64;

/// One generation request, already tokenized.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    /// At most this many tokens are generated (and never past the context window).
    pub max_tokens: usize,
    /// Generation ends when one of these strings appears; it is not emitted.
    pub stop: Vec<String>,
    /// Token ids that end generation besides the model's EOS ids.
    pub stop_token_ids: Vec<u32>,
    /// Keep going past EOS tokens (benchmarks).
    pub ignore_eos: bool,
    /// Higher runs first among waiting requests; equal priorities run in arrival order.
    pub priority: i32,
    /// Report each token's log-probability and this many top alternatives (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// The output must match this grammar (constrained decoding).
    pub grammar: Option<Arc<Grammar>>,
    /// Special tokens that appear in the output text (tool-call markers); others never do.
    pub special_text_tokens: Vec<u32>,
    /// Where each part of the prompt starts in its text, in characters (the caller's parts: a
    /// chat's messages; empty for raw prompts), so that a prefix-cache miss can say which part
    /// it fell in. Read only on a miss: characters, not tokens, because the caller finds them
    /// with one pass over its text, while token offsets would cost every prompt's tokenization
    /// half again (measured on a 47k-token prompt: 154 ms with offsets, 104 ms without).
    pub prompt_parts: Vec<usize>,
    /// A prompt position (tokens) where a model with recurrent layers keeps its state on the
    /// way, besides every `SNAPSHOT_TOKENS`: the end of the system prompt, where another
    /// conversation with the same instructions and tools diverges. Ignored by other models.
    pub snapshot_at: Option<usize>,
    /// What the chat template puts between an answer and the next message (ChatML:
    /// `<|im_end|>`, `\n`, `<|im_start|>`, `user`). Once the answer is done and the engine has
    /// nothing else to do, it prefills them after the answer, so the conversation's next turn
    /// finds them in the prefix cache (empty: not a chat, or no such tokens).
    pub turn_boundary: Vec<u32>,
    /// Whether its rows may draft tokens (speculative decoding, when the engine does): its
    /// output is the same either way; off, it is never slowed by verifying drafts.
    pub speculative: bool,
    /// The prompt's images (their tokens are in `prompt_ids`), for a model that sees: the
    /// engine encodes them as part of prefill. Prepared by the model's `ImageProcessor`.
    pub images: Option<Arc<crate::model::vision::PromptImages>>,
}

impl Request {
    pub fn new(prompt_ids: Vec<u32>, max_tokens: usize) -> Request {
        Request {
            prompt_ids,
            params: SamplingParams::default(),
            max_tokens,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            priority: 0,
            logprobs: None,
            grammar: None,
            special_text_tokens: Vec::new(),
            prompt_parts: Vec::new(),
            snapshot_at: None,
            turn_boundary: Vec::new(),
            speculative: true,
            images: None,
        }
    }

    /// What the prefix cache knows the prompt by: its tokens, each image's drawn from the image's
    /// hash (two screenshots of the same size have the same tokens, not the same keys).
    pub fn cache_key(&self) -> std::borrow::Cow<'_, [u32]> {
        with_image_keys(&self.prompt_ids, self.images.as_deref())
    }
}

/// `tokens` (a prompt, or a prompt and what followed it) with the images' tokens replaced by
/// their keys.
pub(crate) fn with_image_keys<'a>(
    tokens: &'a [u32],
    images: Option<&crate::model::vision::PromptImages>,
) -> std::borrow::Cow<'a, [u32]> {
    match images {
        None => std::borrow::Cow::Borrowed(tokens),
        Some(images) => {
            let keyed = images.key_ids.len().min(tokens.len());
            let mut key = images.key_ids[..keyed].to_vec();
            key.extend_from_slice(&tokens[keyed..]);
            std::borrow::Cow::Owned(key)
        }
    }
}

pub use crate::generate::TokenLogprob;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS token, a stop token or a stop string.
    Stop,
    /// `max_tokens` reached, or the context window is full.
    Length,
    /// The caller went away (dropped its stream) or the engine shut down.
    Cancelled,
    /// Something failed for this request; the others carry on.
    Error,
    /// It waited longer than the queue allows (`max_queue_wait`) and never started: the server
    /// is too busy, or the memory ceiling too tight, for it now. Nothing was generated.
    Overloaded,
    /// A machine of the model's cluster was lost: it cannot go on now (the cluster forms again
    /// by itself; a retry later is served).
    Unavailable,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache (not prefilled).
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Waiting before prefill started.
    pub queue: Duration,
    /// Restoring the prompt's cached start from the prefix cache (part of `prefill`).
    pub restore: Duration,
    /// Prefill (prompt processing, restore included) until the sequence joined the batch.
    pub prefill: Duration,
    /// Prefill forwards the prompt took (more for long prompts, pre-empted or paced ones).
    pub prefill_chunks: usize,
    /// From arrival to the first generated token.
    pub time_to_first_token: Duration,
    /// From the first generated token to the end.
    pub decode: Duration,
    /// Tokens drafted for it (speculative decoding), and how many of them the model accepted.
    pub draft_tokens: usize,
    pub draft_accepted: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    /// The stop string that ended generation, if one did.
    pub stop: Option<String>,
    /// What went wrong, for `FinishReason::Error`.
    pub error: Option<String>,
    pub usage: Usage,
    pub timings: Timings,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One generated token and the text that became final with it (often all of its text;
    /// empty while a stop string or a character is still incomplete).
    Delta { text: String, token: u32, logprob: Option<TokenLogprob> },
    /// Always the last event, exactly once per request.
    Finish(Finish),
}
