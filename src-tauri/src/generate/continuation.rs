//! What happens to each new token of one sequence, wherever it runs (the single-stream
//! generator, or a row of the batching engine): sampling with the request's parameters, EOS and
//! stop tokens, streaming detokenization, stop strings, the token limit, logprobs.

use crate::sampling::{top_logprobs, Sampler, SamplingParams, StopMatch, StopMatcher};
use crate::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens at this step, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Why a continuation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// An EOS or stop token (`stop: None`), or the stop string `stop`.
    Stop { stop: Option<String> },
    /// The token limit.
    Length,
}

/// One step's result: the token, the text that became final with it, and whether it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Produced {
    pub token: u32,
    pub text: String,
    pub logprob: Option<TokenLogprob>,
    pub ended: Option<Ended>,
}

/// The per-request settings a continuation follows.
#[derive(Debug, Clone, Default)]
pub struct ContinuationSpec {
    pub params: SamplingParams,
    /// Already capped by the context window.
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// `Some(n)`: report each token's logprob and the `n` most likely alternatives.
    pub logprobs: Option<usize>,
}

pub struct Continuation {
    spec: ContinuationSpec,
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopMatcher,
    /// Prompt and output, for the repetition penalty.
    history: Vec<u32>,
    generated: usize,
}

impl Continuation {
    pub fn new(prompt: &[u32], spec: ContinuationSpec) -> Continuation {
        Continuation {
            sampler: Sampler::new(spec.params.clone()),
            decoder: StreamDecoder::new(true),
            stops: StopMatcher::new(spec.stop.clone()),
            history: prompt.to_vec(),
            generated: 0,
            spec,
        }
    }

    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Chooses the next token from `logits` (modified in place by the penalties) and advances.
    pub fn push_logits(&mut self, logits: &mut [f32], tokenizer: &Tokenizer) -> Result<Produced, TokenizerError> {
        let recent_from = self.history.len().saturating_sub(self.spec.params.repetition_context);
        let sampled = self.sampler.sample(logits, &self.history[recent_from..]);
        let token = sampled.token;
        let logprob = self.spec.logprobs.map(|n| TokenLogprob {
            token,
            logprob: sampled.logprob,
            top: if n > 0 { top_logprobs(logits, n) } else { Vec::new() },
        });
        self.generated += 1;
        self.history.push(token);

        let stop_token = !self.spec.ignore_eos && (tokenizer.is_eos(token) || self.spec.stop_token_ids.contains(&token));
        if stop_token {
            let text = self.release_held_text(tokenizer)?;
            return Ok(Produced { token, text, logprob, ended: Some(Ended::Stop { stop: None }) });
        }
        let piece = self.decoder.push(tokenizer, token)?.unwrap_or_default();
        let (mut text, mut ended) = match self.stops.push(&piece) {
            StopMatch::Continue(text) => (text, None),
            StopMatch::Stopped { text, stop } => (text, Some(Ended::Stop { stop: Some(stop) })),
        };
        if ended.is_none() && self.generated >= self.spec.max_tokens {
            text.push_str(&self.release_held_text(tokenizer)?);
            ended = Some(Ended::Length);
        }
        Ok(Produced { token, text, logprob, ended })
    }

    /// Text still held back (an incomplete character, a possible stop string) at the end. A
    /// stop string completed by this very text still ends it there.
    fn release_held_text(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        let tail = self.decoder.flush(tokenizer)?.unwrap_or_default();
        Ok(match self.stops.push(&tail) {
            StopMatch::Continue(text) => text + &self.stops.finish(),
            StopMatch::Stopped { text, .. } => text,
        })
    }
}
