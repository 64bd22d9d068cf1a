//! What happens to each new token of one sequence, wherever it runs (the single-stream
//! generator, or a row of the batching engine): sampling with the request's parameters, EOS and
//! stop tokens, streaming detokenization, stop strings, the token limit, logprobs.

use std::sync::Arc;

use crate::constrain::{Grammar, TokenConstraint};
use crate::sampling::{top_logprobs, Sampler, SamplingParams, StopMatch, StopMatcher};
use crate::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum ContinuationError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("the output's grammar does not compile for this model: {0}")]
    Grammar(String),
    #[error("no token of this model's vocabulary can continue the constrained output")]
    NoAllowedToken,
}

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
    /// The output must match this grammar (JSON, a JSON Schema).
    pub grammar: Option<Arc<Grammar>>,
    /// Special tokens whose text is part of the output (tool-call markers such as Mistral's
    /// `[TOOL_CALLS]`); other special tokens are not shown.
    pub special_text_tokens: Vec<u32>,
}

pub struct Continuation {
    spec: ContinuationSpec,
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopMatcher,
    /// Built on the first token (it needs the tokenizer's token bytes).
    constraint: Option<TokenConstraint>,
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
            constraint: None,
            history: prompt.to_vec(),
            generated: 0,
            spec,
        }
    }

    /// The prompt and every token generated so far.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Chooses the next token from `logits` (modified in place by the penalties) and advances.
    pub fn push_logits(&mut self, logits: &mut [f32], tokenizer: &Tokenizer) -> Result<Produced, ContinuationError> {
        let recent_from = self.history.len().saturating_sub(self.spec.params.repetition_context);
        let recent = &self.history[recent_from..];
        if let (Some(grammar), None) = (&self.spec.grammar, &self.constraint) {
            let vocabulary = tokenizer.constraint_vocabulary().map_err(ContinuationError::Grammar)?;
            self.constraint = Some(TokenConstraint::new(grammar, vocabulary).map_err(ContinuationError::Grammar)?);
        }
        let sampled = match &mut self.constraint {
            None => self.sampler.sample(logits, recent),
            Some(constraint) => {
                let sampled = self
                    .sampler
                    .sample_constrained(logits, recent, constraint)
                    .ok_or(ContinuationError::NoAllowedToken)?;
                constraint.advance(sampled.token);
                sampled
            }
        };
        let token = sampled.token;
        let logprob = self.spec.logprobs.map(|n| TokenLogprob {
            token,
            logprob: sampled.logprob,
            top: if n > 0 { top_logprobs(logits, n) } else { Vec::new() },
        });
        self.generated += 1;
        self.history.push(token);

        let stop_token =
            !self.spec.ignore_eos && (tokenizer.is_eos(token) || self.spec.stop_token_ids.contains(&token));
        if stop_token {
            let text = self.release_held_text(tokenizer)?;
            return Ok(Produced { token, text, logprob, ended: Some(Ended::Stop { stop: None }) });
        }
        let piece = if self.spec.special_text_tokens.contains(&token) {
            // The decoder skips special tokens: emit what it holds, then the marker itself.
            let held = self.decoder.flush(tokenizer)?.unwrap_or_default();
            self.decoder = StreamDecoder::new(true);
            held + &tokenizer.decode(&[token], false)?
        } else {
            self.decoder.push(tokenizer, token)?.unwrap_or_default()
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::synthetic;

    /// The tiny models' byte-level tokenizer: ids 0-255 are bytes, 256 `<|endoftext|>`,
    /// 257 `<|im_start|>`, 258 `<|im_end|>` (EOS).
    fn tokenizer() -> Tokenizer {
        let inner: tokenizers::Tokenizer = synthetic::tokenizer_json().to_string().parse().unwrap();
        Tokenizer::new(inner, None, Some("<|im_end|>".into()), &[], None)
    }

    /// Logits that make `token` the greedy choice, with `runner_up` second.
    fn logits_for(token: u32, runner_up: u32) -> Vec<f32> {
        let mut logits = vec![0.0; 259];
        logits[token as usize] = 10.0;
        logits[runner_up as usize] = 5.0;
        logits
    }

    fn byte_id(tokenizer: &Tokenizer, c: char) -> u32 {
        tokenizer.encode(&c.to_string(), false, false).unwrap()[0]
    }

    #[test]
    fn special_text_tokens_are_emitted_others_are_not() {
        let t = tokenizer();
        let spec = |special_text_tokens| ContinuationSpec { max_tokens: 10, special_text_tokens, ..Default::default() };
        let run = |spec: ContinuationSpec| {
            let mut c = Continuation::new(&[1], spec);
            [byte_id(&t, 'a'), 257, byte_id(&t, 'b')]
                .iter()
                .map(|&tok| c.push_logits(&mut logits_for(tok, 0), &t).unwrap().text)
                .collect::<String>()
        };
        assert_eq!(run(spec(vec![])), "ab");
        assert_eq!(run(spec(vec![257])), "a<|im_start|>b");
    }

    #[test]
    fn a_grammar_overrides_the_likeliest_token_and_ends_with_eos() {
        let t = tokenizer();
        let grammar = Arc::new(Grammar::from_schema(&serde_json::json!({"enum": [true]})).unwrap());
        let mut c =
            Continuation::new(&[1], ContinuationSpec { max_tokens: 10, grammar: Some(grammar), ..Default::default() });
        let mut text = String::new();
        // The model wants "x" (then "t") every time; the grammar allows only `true`, then EOS.
        for _ in 0..5 {
            let produced = c.push_logits(&mut logits_for(byte_id(&t, 'x'), byte_id(&t, 't')), &t).unwrap();
            text.push_str(&produced.text);
            if produced.ended.is_some() {
                assert_eq!(produced.token, 258, "EOS once the document is complete");
                break;
            }
        }
        assert_eq!(text, "true");
    }
}
