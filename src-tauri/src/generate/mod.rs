//! Generating text for one prompt, token by token: chunked prefill, then decode with sampling,
//! EOS and stop strings, streaming the text as it becomes stable. The batching engine will run
//! many of these at once; this single-stream path serves the CLI and the reference tests.

use std::time::{Duration, Instant};

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

mod continuation;

pub use continuation::{Continuation, ContinuationError, ContinuationSpec, Ended, Produced, TokenLogprob};

use crate::mlx;
use crate::model::{KvCache, KvFormat, LoadedModel, ModelError};
use crate::sampling::SamplingParams;
use crate::tokenizer::TokenizerError;

/// Prompt tokens run through the model per forward pass during prefill (as mlx-lm's
/// `prefill_step_size`): bounds the activation memory of long prompts.
pub const PREFILL_CHUNK: usize = 2048;

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Keep going past EOS tokens (benchmarks, reference comparisons).
    pub ignore_eos: bool,
    /// How keys and values are stored (`KvFormat::FULL`: at full precision).
    pub kv_format: KvFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS token or a stop string.
    Stop,
    /// `max_tokens` reached (or the context window is full).
    Length,
}

#[derive(Debug, Clone, Default)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    pub peak_memory: usize,
    /// Bytes the key/value caches hold at the end (their buffers, spare room included).
    pub kv_bytes: usize,
}

impl GenerationStats {
    pub fn prompt_tokens_per_sec(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    /// Decode throughput, counting the tokens after the first (which prefill produced).
    pub fn generation_tokens_per_sec(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish: FinishReason,
    pub stats: GenerationStats,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {tokens} tokens; this model's context window is {limit}")]
    PromptTooLong { tokens: usize, limit: usize },
    #[error("token id {0} is outside the model's vocabulary")]
    BadToken(u32),
    #[error("invalid sampling parameters: {0}")]
    InvalidParams(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Continuation(#[from] ContinuationError),
}

impl From<mlx_rs::error::Exception> for GenerateError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        GenerateError::Model(e.into())
    }
}

/// Final hidden states (after the final norm) for token ids `[B, L]` that follow what the
/// caches hold: the model's own forward, or a cluster's pipeline of stages.
pub type Forward<'a> = dyn FnMut(&Array, &mut [KvCache]) -> Result<Array, ModelError> + 'a;

/// Runs `request` to completion, calling `on_text` with each piece of stable text.
pub fn generate(
    model: &LoadedModel,
    request: &GenerateRequest,
    on_text: impl FnMut(&str),
) -> Result<Generation, GenerateError> {
    generate_with(model, request, &mut |ids, cache| model.transformer.forward_hidden(ids, cache), on_text)
}

/// [`generate`] through `forward` (the caches are the ones `model` holds layers for).
pub fn generate_with(
    model: &LoadedModel,
    request: &GenerateRequest,
    forward: &mut Forward,
    mut on_text: impl FnMut(&str),
) -> Result<Generation, GenerateError> {
    let transformer = &model.transformer;
    let prompt = &request.prompt_ids;
    let limit = transformer.config.max_position_embeddings;
    request.params.validate().map_err(|e| GenerateError::InvalidParams(e.to_string()))?;
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if prompt.len() >= limit {
        return Err(GenerateError::PromptTooLong { tokens: prompt.len(), limit });
    }
    let vocab = transformer.config.vocab_size as u32;
    if let Some(&bad) = prompt.iter().find(|&&t| t >= vocab) {
        return Err(GenerateError::BadToken(bad));
    }
    mlx::reset_peak_memory();
    let mut stats = GenerationStats { prompt_tokens: prompt.len(), ..Default::default() };
    let mut cache = transformer.new_cache_in(request.kv_format);

    // Prefill all but the last prompt token; the last one runs as the first decode step. A
    // chunk also ends where keys and values are quantized from (see `KvFormat`).
    let started = Instant::now();
    let (head, last) = prompt.split_at(prompt.len() - 1);
    let mut done = 0;
    while done < head.len() {
        let n = request.kv_format.chunk_before_start(done as i32, PREFILL_CHUNK.min(head.len() - done));
        let hidden = forward(&token_array(&head[done..done + n]), cache.as_mut_slice())?;
        hidden.eval()?;
        done += n;
    }
    let mut logits = next_logits(model, forward, last[0], &mut cache)?;
    stats.prefill_time = started.elapsed();

    let decode_started = Instant::now();
    let max_tokens = request.max_tokens.min(limit - prompt.len());
    let spec = ContinuationSpec {
        params: request.params.clone(),
        max_tokens,
        stop: request.stop.clone(),
        ignore_eos: request.ignore_eos,
        ..Default::default()
    };
    let mut continuation = Continuation::new(prompt, spec);
    let mut tokens = Vec::new();
    let mut text = String::new();
    let finish = loop {
        let produced = continuation.push_logits(&mut logits, &model.tokenizer)?;
        tokens.push(produced.token);
        if !produced.text.is_empty() {
            on_text(&produced.text);
            text.push_str(&produced.text);
        }
        match produced.ended {
            Some(Ended::Stop { .. }) => break FinishReason::Stop,
            Some(Ended::Length) => break FinishReason::Length,
            None => logits = next_logits(model, forward, produced.token, &mut cache)?,
        }
    };
    stats.generated_tokens = tokens.len();
    stats.decode_time = decode_started.elapsed();
    stats.peak_memory = mlx::memory_stats().peak;
    stats.kv_bytes = cache.iter().map(KvCache::nbytes).sum();
    Ok(Generation { tokens, text, finish, stats })
}

fn token_array(ids: &[u32]) -> Array {
    Array::from_slice(ids, &[1, ids.len() as i32])
}

/// Runs one token through the model and returns the logits of the next one, on the host.
fn next_logits(
    model: &LoadedModel,
    forward: &mut Forward,
    token: u32,
    cache: &mut [KvCache],
) -> Result<Vec<f32>, GenerateError> {
    let logits = model.transformer.logits(&forward(&token_array(&[token]), cache)?)?;
    let last = logits.try_index((0, -1))?.as_dtype(Dtype::Float32)?;
    last.eval()?;
    Ok(last.as_slice::<f32>().to_vec())
}
