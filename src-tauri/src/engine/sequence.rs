//! One request inside the engine: its [`Continuation`] (sampling, detokenization, stops), its
//! event stream, and where it is in its life (waiting, prefilling, running).

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::metrics::RecentRequest;
use super::request::{Event, Finish, FinishReason, Request, RequestId, Timings, Usage};
use crate::generate::{Continuation, ContinuationSpec, Ended};
use crate::model::KvCache;
use crate::tokenizer::Tokenizer;

/// A request's KV reservation: what it needs for its whole sequence (prompt and most tokens),
/// less what a shared segment holds for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub bytes: usize,
    /// Whether `bytes` are counted against the budget now (from admission to its end).
    pub held: bool,
    /// Prompt tokens its row takes from the shared segment instead of holding them (0: none).
    pub shared_prefix: usize,
}

pub(crate) struct Sequence {
    pub id: RequestId,
    pub request: Request,
    events: UnboundedSender<Event>,
    continuation: Continuation,
    /// The KV memory it holds while admitted (kept by the KV manager, `kv`).
    pub kv: Reservation,
    /// A prefill set aside (or just restored): its own cache and how many prompt tokens it holds.
    pub prefill: Option<(Vec<KvCache>, usize)>,
    /// Prompt tokens in its cache so far (restored or prefilled).
    pub prefilled: usize,
    /// The token the next decode step feeds for this row: the last one sampled (the first comes
    /// from the prefill).
    pub next_input: u32,
    /// Prompt tokens restored from the prefix cache.
    pub cached_tokens: usize,
    /// Prefill forwards its prompt took (more than one when long or pre-empted).
    pub prefill_chunks: usize,
    /// Time spent restoring its prompt's cached start.
    pub restore_time: std::time::Duration,
    /// Why it reused less of the prefix cache than a cached sequence offered.
    pub cache_miss: Option<super::metrics::CacheMiss>,
    /// How it ended, once it has.
    pub finished: Option<FinishReason>,
    /// The engine's own prefill of a conversation's turn boundary (no caller, not counted).
    pub warm: bool,
    /// Its figures, once it has ended.
    pub record: Option<RecentRequest>,
    arrived: Instant,
    admitted: Option<Instant>,
    joined: Option<Instant>,
    first_token: Option<Instant>,
}

impl Sequence {
    pub fn new(
        id: RequestId,
        request: Request,
        events: UnboundedSender<Event>,
        context_length: usize,
        kv: crate::model::KvFootprint,
    ) -> Sequence {
        let max_tokens = request.max_tokens.min(context_length - request.prompt_ids.len());
        let spec = ContinuationSpec {
            params: request.params.clone(),
            max_tokens,
            stop: request.stop.clone(),
            stop_token_ids: request.stop_token_ids.clone(),
            ignore_eos: request.ignore_eos,
            logprobs: request.logprobs,
            grammar: request.grammar.clone(),
            special_text_tokens: request.special_text_tokens.clone(),
        };
        Sequence {
            id,
            continuation: Continuation::new(&request.prompt_ids, spec),
            kv: Reservation { bytes: kv.bytes(request.prompt_ids.len() + max_tokens), held: false, shared_prefix: 0 },
            prefill: None,
            prefilled: 0,
            next_input: *request.prompt_ids.last().expect("validated non-empty"),
            cached_tokens: 0,
            prefill_chunks: 0,
            restore_time: std::time::Duration::ZERO,
            cache_miss: None,
            finished: None,
            warm: false,
            record: None,
            request,
            events,
            arrived: Instant::now(),
            admitted: None,
            joined: None,
            first_token: None,
        }
    }

    /// The prompt and what was generated so far.
    pub fn tokens(&self) -> &[u32] {
        self.continuation.history()
    }

    /// The caller dropped its stream.
    pub fn is_abandoned(&self) -> bool {
        self.events.is_closed()
    }

    /// The first admission counts (a prefill pre-empted and resumed is admitted again).
    pub fn mark_admitted(&mut self) {
        self.admitted.get_or_insert_with(Instant::now);
    }

    /// Since it arrived.
    pub fn waited(&self) -> std::time::Duration {
        self.arrived.elapsed()
    }

    pub fn mark_joined(&mut self) {
        self.joined = Some(Instant::now());
    }

    /// Takes this step's logits row and emits what became final; true while it goes on.
    pub fn on_logits(
        &mut self,
        logits: &mut [f32],
        tokenizer: &Tokenizer,
        fault: Option<&super::FaultInjector>,
    ) -> bool {
        self.first_token.get_or_insert_with(Instant::now);
        let produced = match self.continuation.push_logits(logits, tokenizer) {
            Ok(produced) => produced,
            Err(e) => {
                self.finish(FinishReason::Error, None, Some(e.to_string()));
                return false;
            }
        };
        self.next_input = produced.token;
        if let Some(Err(message)) = fault.map(|f| f(self.id, self.continuation.generated())) {
            self.finish(FinishReason::Error, None, Some(message));
            return false;
        }
        self.send(Event::Delta { text: produced.text, token: produced.token, logprob: produced.logprob });
        match produced.ended {
            None => true,
            Some(Ended::Stop { stop }) => {
                self.finish(FinishReason::Stop, stop, None);
                false
            }
            Some(Ended::Length) => {
                self.finish(FinishReason::Length, None, None);
                false
            }
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
            restore: self.restore_time,
            prefill: self.joined.unwrap_or(now).duration_since(admitted),
            prefill_chunks: self.prefill_chunks,
            time_to_first_token: self.first_token.map(|t| t.duration_since(self.arrived)).unwrap_or_default(),
            decode: self.first_token.map(|t| now.duration_since(t)).unwrap_or_default(),
        };
        let usage = Usage {
            prompt_tokens: self.request.prompt_ids.len(),
            completion_tokens: self.continuation.generated(),
            cached_tokens: self.cached_tokens,
        };
        let decode_secs = timings.decode.as_secs_f64();
        self.record = Some(RecentRequest {
            request_id: self.id,
            finished_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            queue_ms: timings.queue.as_secs_f64() * 1e3,
            restore_ms: timings.restore.as_secs_f64() * 1e3,
            prefill_ms: timings.prefill.as_secs_f64() * 1e3,
            ttft_ms: timings.time_to_first_token.as_secs_f64() * 1e3,
            decode_ms: timings.decode.as_secs_f64() * 1e3,
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: usage.cached_tokens,
            completion_tokens: usage.completion_tokens,
            tokens_per_sec: if decode_secs > 0.0 {
                usage.completion_tokens.saturating_sub(1) as f64 / decode_secs
            } else {
                0.0
            },
            reason: match reason {
                FinishReason::Stop => "stop",
                FinishReason::Length => "length",
                FinishReason::Cancelled => "cancelled",
                FinishReason::Error => "error",
            },
            cache_miss: self.cache_miss.take(),
        });
        self.send(Event::Finish(Finish { reason, stop, error, usage, timings }));
    }
}
