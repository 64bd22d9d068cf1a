//! Engine metrics: cheap counters updated every step and published on a watch channel (the
//! UI's live graphs and the metrics endpoint read them).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A finished request, for the dashboard's "recent requests".
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RecentRequest {
    pub request_id: u64,
    /// Unix time in milliseconds.
    pub finished_ms: u64,
    pub queue_ms: f64,
    /// Prefix-cache restore (part of the prefill).
    pub restore_ms: f64,
    /// From admission until it joined the batch (restore and prefill chunks).
    pub prefill_ms: f64,
    pub ttft_ms: f64,
    /// From the first token to the end.
    pub decode_ms: f64,
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Generated tokens per second after the first one.
    pub tokens_per_sec: f64,
    /// `stop`, `length`, `cancelled` or `error`.
    pub reason: &'static str,
    /// Why it reused less of the prefix cache than it could have, when it did.
    pub cache_miss: Option<CacheMiss>,
}

/// A prompt that left a cached sequence part-way: where, and what the text there says (the
/// classic cause is a date line or an injected reminder early in an agent's system prompt).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CacheMiss {
    /// Prompt tokens reused, i.e. the token where the prompt went its own way.
    pub position: usize,
    /// How far the cached sequence it left went.
    pub cached_through: usize,
    /// The part of the prompt (0-based; a chat's message) the divergence falls in, when the
    /// caller told its parts (`Request::prompt_parts`).
    pub message: Option<usize>,
    /// The prompt's text just before and just after the divergence.
    pub before: String,
    pub after: String,
}

/// Upper bounds (seconds) of the latency histograms' buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// A latency histogram over [`LATENCY_BUCKETS`] (per-bucket counts; the last slot is +Inf).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Histogram {
    pub counts: [u64; LATENCY_BUCKETS.len() + 1],
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn observe(&mut self, seconds: f64) {
        let bucket = LATENCY_BUCKETS.iter().position(|&le| seconds <= le).unwrap_or(LATENCY_BUCKETS.len());
        self.counts[bucket] += 1;
        self.sum += seconds;
        self.count += 1;
    }
}

/// How many finished requests [`Metrics::recent`] keeps.
pub const RECENT_REQUESTS: usize = 50;

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Metrics {
    pub model: String,
    /// Engine steps so far.
    pub step: u64,
    /// Rows in the running batch.
    pub running: usize,
    /// Requests waiting to start (including the one being prefilled).
    pub queued: usize,
    /// Rows decoded in the last step.
    pub batch_size: usize,
    /// Over the last couple of seconds.
    pub prefill_tokens_per_sec: f64,
    pub decode_tokens_per_sec: f64,
    /// Tokens held in the batch's KV cache, and its allocated bytes.
    pub kv_tokens: usize,
    pub kv_bytes: usize,
    /// Of those, the prompt start held once for the rows that share it.
    pub kv_shared_bytes: usize,
    /// The most `kv_bytes` has been since the model was loaded.
    pub kv_peak_bytes: usize,
    /// Bytes reserved for admitted requests, and the budget they must fit in.
    pub kv_reserved_bytes: usize,
    pub kv_budget_bytes: usize,
    pub mlx_active_bytes: usize,
    pub mlx_peak_bytes: usize,
    pub mlx_cache_bytes: usize,
    /// The process's memory ceiling, what it holds now, and how the governor's predictions of
    /// each step's memory compared with MLX's peak counter.
    pub memory_ceiling_bytes: usize,
    pub memory_held_bytes: usize,
    pub memory: super::memory::Calibration,
    /// Requests answered 503, by reason: they waited past `max_queue_wait`, or not one of
    /// their prompt's tokens fitted under the memory ceiling for `MEMORY_PATIENCE`.
    pub refused_waited_total: u64,
    pub refused_memory_total: u64,
    /// Running rows parked (to the prefix cache, resumed later) when the KV budget had no room
    /// for their next tokens.
    pub parked_total: u64,
    pub requests_total: u64,
    pub finished_total: u64,
    pub cancelled_total: u64,
    pub errors_total: u64,
    pub prompt_tokens_total: u64,
    pub generated_tokens_total: u64,
    /// Images run through the vision tower (not those taken from the cache of encoded images).
    pub images_encoded_total: u64,
    /// Speculative decoding: tokens drafted, and those the model accepted; verify steps run.
    pub draft_tokens_total: u64,
    pub draft_accepted_total: u64,
    pub verify_steps_total: u64,
    /// The prefix cache: requests that reused a cached start and those that did not, tokens
    /// reused, bytes and blocks held, blocks evicted.
    pub prefix_cache_hits: u64,
    pub prefix_cache_misses: u64,
    pub prefix_cache_tokens_reused: u64,
    pub prefix_cache_bytes: usize,
    /// Bytes held by the cache of encoded images.
    pub encoded_images_bytes: usize,
    pub prefix_cache_blocks: usize,
    pub prefix_cache_evictions: u64,
    /// Its disk tier: bytes and blocks on disk, blocks read back, writes skipped (queue full),
    /// and whether it is on (it turns itself off when it cannot write).
    pub prefix_cache_disk_bytes: u64,
    pub prefix_cache_disk_blocks: usize,
    pub prefix_cache_disk_hits: u64,
    pub prefix_cache_disk_write_skips: u64,
    pub prefix_cache_disk_enabled: bool,
    /// Where the time of finished requests went: waiting, prefill (restore included), the
    /// first token, decoding.
    pub queue_seconds: Histogram,
    pub prefill_seconds: Histogram,
    pub ttft_seconds: Histogram,
    pub decode_seconds: Histogram,
    /// The last finished requests, newest first.
    pub recent: VecDeque<RecentRequest>,
}

/// Token rates over a sliding window.
#[derive(Debug, Default)]
pub(crate) struct RateWindow {
    samples: VecDeque<(Instant, usize, usize)>,
}

const WINDOW: Duration = Duration::from_secs(2);

impl RateWindow {
    pub fn record(&mut self, now: Instant, prefill_tokens: usize, decode_tokens: usize) {
        self.samples.push_back((now, prefill_tokens, decode_tokens));
        while self.samples.front().is_some_and(|(t, _, _)| now.duration_since(*t) > WINDOW) {
            self.samples.pop_front();
        }
    }

    /// (prefill, decode) tokens per second over the window.
    pub fn rates(&self, now: Instant) -> (f64, f64) {
        let Some((first, _, _)) = self.samples.front() else { return (0.0, 0.0) };
        let span = now.duration_since(*first).max(Duration::from_millis(250)).as_secs_f64();
        let (p, d) = self.samples.iter().fold((0, 0), |(p, d), (_, a, b)| (p + a, d + b));
        (p as f64 / span, d as f64 / span)
    }
}
