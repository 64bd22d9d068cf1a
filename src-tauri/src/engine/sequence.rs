//! One request inside the engine: its sampler, detokenizer and stop matcher, and where it is
//! in its life (waiting, prefilling, running).

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::request::{Event, Finish, FinishReason, Request, RequestId, Timings, TokenLogprob, Usage};
use crate::model::KvCache;
use crate::sampling::{top_logprobs, Sampler, StopMatch, StopMatcher};
use crate::tokenizer::{StreamDecoder, Tokenizer};

pub(crate) struct Sequence {
    pub id: RequestId,
    pub request: Request,
    events: UnboundedSender<Event>,
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopMatcher,
    /// Prompt and output, for the repetition penalty.
    history: Vec<u32>,
    pub generated: usize,
    /// Tokens allowed (`max_tokens` capped by the context window).
    pub max_tokens: usize,
    /// KV bytes reserved for this request while it is admitted.
    pub reserved_bytes: usize,
    /// During prefill: the sequence's own cache and how many prompt tokens it holds.
    pub prefill: Option<(Vec<KvCache>, usize)>,
    /// The token the next decode step feeds for this row.
    pub next_input: u32,
    /// How it ended, once it has.
    pub finished: Option<FinishReason>,
    arrived: Instant,
    admitted: Option<Instant>,
    joined: Option<Instant>,
    first_token: Option<Instant>,
}

/// What a sampled token did to the sequence.
pub(crate) enum Step {
    Continue,
    Finished,
}

impl Sequence {
    pub fn new(id: RequestId, request: Request, events: UnboundedSender<Event>, context_length: usize, kv_bytes_per_token: usize) -> Sequence {
        let max_tokens = request.max_tokens.min(context_length - request.prompt_ids.len());
        Sequence {
            id,
            sampler: Sampler::new(request.params.clone()),
            decoder: StreamDecoder::new(true),
            stops: StopMatcher::new(request.stop.clone()),
            history: request.prompt_ids.clone(),
            generated: 0,
            max_tokens,
            reserved_bytes: (request.prompt_ids.len() + max_tokens) * kv_bytes_per_token,
            prefill: None,
            next_input: *request.prompt_ids.last().expect("validated non-empty"),
            request,
            events,
            finished: None,
            arrived: Instant::now(),
            admitted: None,
            joined: None,
            first_token: None,
        }
    }

    /// The caller dropped its stream.
    pub fn is_abandoned(&self) -> bool {
        self.events.is_closed()
    }

    pub fn prompt_len(&self) -> usize {
        self.request.prompt_ids.len()
    }

    pub fn mark_admitted(&mut self) {
        self.admitted = Some(Instant::now());
    }

    pub fn mark_joined(&mut self) {
        self.joined = Some(Instant::now());
    }

    /// Takes this step's logits row, samples, and emits what became final.
    pub fn on_logits(&mut self, logits: &mut [f32], tokenizer: &Tokenizer, fault: Option<&super::FaultInjector>) -> Step {
        let recent_from = self.history.len().saturating_sub(self.request.params.repetition_context);
        let sampled = self.sampler.sample(logits, &self.history[recent_from..]);
        let top = self.request.logprobs.filter(|&n| n > 0).map(|n| top_logprobs(logits, n));
        let token = sampled.token;
        self.generated += 1;
        self.history.push(token);
        self.next_input = token;
        self.first_token.get_or_insert_with(Instant::now);
        if let Some(Err(message)) = fault.map(|f| f(self.id, self.generated)) {
            self.finish(FinishReason::Error, None, Some(message));
            return Step::Finished;
        }
        let logprob = self.request.logprobs.map(|_| TokenLogprob { token, logprob: sampled.logprob, top: top.unwrap_or_default() });

        let is_stop_token = !self.request.ignore_eos && (tokenizer.is_eos(token) || self.request.stop_token_ids.contains(&token));
        if is_stop_token {
            let text = self.release_held_text(tokenizer);
            self.send(Event::Delta { text, token: Some(token), logprob });
            self.finish(FinishReason::Stop, None, None);
            return Step::Finished;
        }
        let piece = match self.decoder.push(tokenizer, token) {
            Ok(piece) => piece.unwrap_or_default(),
            Err(e) => {
                self.finish(FinishReason::Error, None, Some(e.to_string()));
                return Step::Finished;
            }
        };
        match self.stops.push(&piece) {
            StopMatch::Continue(text) => self.send(Event::Delta { text, token: Some(token), logprob }),
            StopMatch::Stopped { text, stop } => {
                self.send(Event::Delta { text, token: Some(token), logprob });
                self.finish(FinishReason::Stop, Some(stop), None);
                return Step::Finished;
            }
        }
        if self.generated >= self.max_tokens {
            let text = self.release_held_text(tokenizer);
            if !text.is_empty() {
                // Text held back for a stop string that never came; no new token with it.
                self.send(Event::Delta { text, token: None, logprob: None });
            }
            self.finish(FinishReason::Length, None, None);
            return Step::Finished;
        }
        Step::Continue
    }

    /// Text still held by the detokenizer and the stop matcher, at the end of generation.
    fn release_held_text(&mut self, tokenizer: &Tokenizer) -> String {
        let tail = self.decoder.flush(tokenizer).ok().flatten().unwrap_or_default();
        match self.stops.push(&tail) {
            StopMatch::Continue(text) => text + &self.stops.finish(),
            StopMatch::Stopped { text, .. } => text,
        }
    }

    fn send(&self, event: Event) {
        // A closed stream means the caller left; the next step reaps the sequence.
        let _ = self.events.send(event);
    }

    /// Sends the one finish event.
    pub fn finish(&mut self, reason: FinishReason, stop: Option<String>, error: Option<String>) {
        if self.finished.is_some() {
            return;
        }
        self.finished = Some(reason);
        let now = Instant::now();
        let admitted = self.admitted.unwrap_or(now);
        let timings = Timings {
            queue: admitted.duration_since(self.arrived),
            prefill: self.joined.unwrap_or(now).duration_since(admitted),
            time_to_first_token: self.first_token.map(|t| t.duration_since(self.arrived)).unwrap_or_default(),
            decode: self.first_token.map(|t| now.duration_since(t)).unwrap_or_default(),
        };
        let usage = Usage { prompt_tokens: self.prompt_len(), completion_tokens: self.generated };
        self.send(Event::Finish(Finish { reason, stop, error, usage, timings }));
    }
}
