//! One request inside the engine: its [`Continuation`] (sampling, detokenization, stops), its
//! event stream, and where it is in its life (waiting, prefilling, running).

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::metrics::RecentRequest;
use super::request::{Event, Finish, FinishReason, Request, RequestId, Timings, Usage};
use crate::generate::{Continuation, ContinuationSpec, Ended};
use crate::model::KvCache;
use crate::tokenizer::Tokenizer;

/// A request's KV reservation: what its sequence needs up to `tokens` positions (its prompt and
/// the next `EngineConfig::kv_reserve_ahead` tokens of output, grown as it generates), less what a shared
/// segment holds for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub bytes: usize,
    /// Positions the reservation covers.
    pub tokens: usize,
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
    /// Times it was parked for memory while running.
    pub parked: usize,
    /// Its proposer of drafted tokens, while it runs in an engine that drafts.
    pub drafter: Option<super::speculative::RowDrafter>,
    /// Told when it is first admitted (`RequestStream::started`); dropped unsent when it ends
    /// before.
    pub started: Option<tokio::sync::oneshot::Sender<()>>,
    /// Its images' features once encoded (by the prompt's image order), while it prefills them.
    pub image_features: Vec<Option<crate::model::vision::VisionFeatures>>,
    /// Tokens of the caller's prompt (a parked row resumes with its output as part of its prompt).
    prompt_len: usize,
    /// Its whole sequence may take this many positions (prompt and most tokens).
    max_len: usize,
    /// Output tokens its reservation covers ahead of what it has generated.
    reserve_ahead: usize,
    arrived: Instant,
    admitted: Option<Instant>,
    joined: Option<Instant>,
    first_token: Option<Instant>,
}

impl Sequence {
    pub fn new(
        id: RequestId,
        mut request: Request,
        events: UnboundedSender<Event>,
        info: &super::config::ModelInfo,
        reserve_ahead: usize,
    ) -> Sequence {
        // Output ends at the context window, or where the KV budget would be full (a request
        // asking for a billion tokens is served as far as memory goes, then ends with `length`).
        let room = info.context_length.min(info.kv_capacity_tokens.max(request.prompt_ids.len() + 1));
        let max_tokens = request.max_tokens.min(room - request.prompt_ids.len());
        let footprint = info.kv_footprint;
        // Drafts are proposed from text alone; a row with images decodes plainly.
        request.speculative &= request.images.is_none();
        let images = request.images.as_ref().map_or(0, |i| i.images.len());
        let max_len = request.prompt_ids.len() + max_tokens;
        let reserve_ahead = reserve_ahead.max(1);
        let reserved = max_len.min(request.prompt_ids.len() + reserve_ahead);
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
            kv: Reservation { bytes: footprint.bytes(reserved), tokens: reserved, held: false, shared_prefix: 0 },
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
            started: None,
            image_features: (0..images).map(|_| None).collect(),
            parked: 0,
            drafter: None,
            prompt_len: request.prompt_ids.len(),
            max_len,
            reserve_ahead,
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

    /// [`Self::tokens`] as the prefix cache keys them (see `Request::cache_key`).
    pub fn cache_tokens(&self) -> std::borrow::Cow<'_, [u32]> {
        super::request::with_image_keys(self.tokens(), self.request.images.as_deref())
    }

    /// Token `index`'s M-RoPE positions (time, row, column).
    pub fn rope_position(&self, index: usize) -> [i32; 3] {
        match &self.request.images {
            Some(images) => images.position(index),
            None => [index as i32; 3],
        }
    }

    /// The caller dropped its stream.
    pub fn is_abandoned(&self) -> bool {
        self.events.is_closed()
    }

    /// Positions its reservation must cover before the next decode step: the cache then holds
    /// every token so far, the next one fed included; `None` while it covers them already.
    pub fn kv_shortfall(&self) -> Option<usize> {
        let needed = self.tokens().len();
        (needed > self.kv.tokens).then(|| self.max_len.min(needed - 1 + self.reserve_ahead).max(needed))
    }

    /// Tokens it may draft for the next step: as many as its reservation holds past what it
    /// has, and fewer than it may still generate.
    pub fn draft_room(&self) -> usize {
        let len = self.tokens().len();
        self.kv.tokens.saturating_sub(len).min(self.max_len.saturating_sub(len + 1))
    }

    /// Whether it has started (been admitted once): such a request is never refused for waiting.
    pub fn has_started(&self) -> bool {
        self.admitted.is_some()
    }

    /// A running row set aside for memory waits again, to resume where it stopped: what it has
    /// generated becomes part of the prompt it prefills (restored from the prefix cache, where
    /// its keys and values were stored), and its sampling, stops and grammar go on as they were.
    pub fn park_for_memory(&mut self, footprint: crate::model::KvFootprint) {
        self.request.prompt_ids = self.tokens().to_vec();
        self.prefilled = 0;
        self.prefill = None;
        let tokens = self.max_len.min(self.request.prompt_ids.len() + self.reserve_ahead);
        self.kv = Reservation { bytes: footprint.bytes(tokens), tokens, held: false, shared_prefix: 0 };
        self.parked += 1;
    }

    /// The first admission counts (a prefill pre-empted and resumed is admitted again).
    pub fn mark_admitted(&mut self) {
        self.admitted.get_or_insert_with(Instant::now);
        if let Some(started) = self.started.take() {
            let _ = started.send(());
        }
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
        // The stream's `started` wakes with this finish as the reason.
        self.started = None;
        let now = Instant::now();
        let admitted = self.admitted.unwrap_or(now);
        let timings = Timings {
            queue: admitted.duration_since(self.arrived),
            restore: self.restore_time,
            prefill: self.joined.unwrap_or(now).duration_since(admitted),
            prefill_chunks: self.prefill_chunks,
            time_to_first_token: self.first_token.map(|t| t.duration_since(self.arrived)).unwrap_or_default(),
            decode: self.first_token.map(|t| now.duration_since(t)).unwrap_or_default(),
            draft_tokens: self.drafter.as_ref().map_or(0, |d| d.drafted),
            draft_accepted: self.drafter.as_ref().map_or(0, |d| d.accepted),
        };
        let usage = Usage {
            prompt_tokens: self.prompt_len,
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
                FinishReason::Overloaded => "overloaded",
                FinishReason::Unavailable => "unavailable",
            },
            cache_miss: self.cache_miss.take(),
        });
        self.send(Event::Finish(Finish { reason, stop, error, usage, timings }));
    }
}
