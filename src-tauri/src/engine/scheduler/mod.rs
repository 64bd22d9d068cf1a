//! The engine thread's loop. Each step: take new requests, drop abandoned ones, decode one
//! token for every running row, then prefill waiting prompts together within the step's time
//! budget (`prefill`): they join the batch once prefilled.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use mlx_rs::{Array, Dtype};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;

mod prefill;
mod shared;
mod warm;

use super::config::{EngineConfig, ModelInfo};
use super::metrics::CacheMiss;
use super::metrics::{Metrics, RateWindow, RECENT_REQUESTS};
use super::pacing::{self, Pacing};
use super::prefix_cache::{model_identity, Divergence, PrefixCache, BLOCK_TOKENS, SNAPSHOT_TOKENS};
use super::request::{Event, FinishReason, Request, RequestId};
use super::sequence::Sequence;
use crate::mlx;
use crate::mlx::default_kv_budget;
use crate::model::{BatchKvCache, LayerCache, LoadedModel};

/// How often an idle engine republishes its metrics.
const IDLE_REFRESH: std::time::Duration = std::time::Duration::from_millis(500);
/// How long an engine stays idle before it prefills a finished answer's turn boundary: a
/// client that sends its next turn at once (a script, an agent's quick tool) finds the engine
/// free instead of in that prefill; one that takes longer (a person, a build, a test run)
/// finds the boundary prefilled.
const WARM_AFTER: std::time::Duration = std::time::Duration::from_millis(150);

pub(crate) enum Command {
    Submit { id: RequestId, request: Box<Request>, events: UnboundedSender<Event> },
    ClearPrefixCache,
    Shutdown,
}

pub(crate) struct Scheduler {
    model: LoadedModel,
    config: EngineConfig,
    info: ModelInfo,
    /// Waiting requests, best first.
    waiting: VecDeque<Sequence>,
    /// Requests being prefilled together (`prefill`), and their rows' keys and values.
    group: Vec<Sequence>,
    group_cache: Vec<BatchKvCache>,
    /// Rows of the batch, in cache row order.
    running: Vec<Sequence>,
    cache: Vec<BatchKvCache>,
    /// Keys and values of sequences seen before (`None`: turned off).
    prefix: Option<PrefixCache>,
    /// A prompt start the rows that begin with it share, held once (`shared`).
    shared: Option<shared::SharedPrefix>,
    /// What the last finished chat answer's next turn starts with, to prefill when idle (`warm`).
    next_turn: Option<Vec<u32>>,
    /// The event stream of that prefill, held so that it never reads as abandoned.
    warm_events: Option<UnboundedReceiver<Event>>,
    reserved_bytes: usize,
    /// How much prefill a step may do while rows decode.
    pacing: Pacing,
    queued: Arc<AtomicUsize>,
    metrics_tx: watch::Sender<Metrics>,
    metrics: Metrics,
    rates: RateWindow,
}

impl Scheduler {
    pub fn new(
        model: LoadedModel,
        config: EngineConfig,
        metrics_tx: watch::Sender<Metrics>,
        queued: Arc<AtomicUsize>,
    ) -> Scheduler {
        let t = &model.transformer;
        let info = ModelInfo {
            name: model.name.clone(),
            tokenizer: model.tokenizer.clone(),
            chat_template: model.chat_template.clone(),
            context_length: config
                .max_context
                .map_or(t.config.max_position_embeddings, |c| c.min(t.config.max_position_embeddings)),
            vocab_size: t.config.vocab_size,
            kv_bytes_per_token: t.kv_bytes_per_token(),
            kv_footprint: t.kv_footprint(),
            kv_budget_bytes: config.kv_budget_bytes.unwrap_or_else(|| default_kv_budget(model.weights_bytes)),
            weights_bytes: model.weights_bytes,
        };
        let cache = (0..t.config.kv_cache_layers()).map(|_| BatchKvCache::new()).collect();
        let group_cache = (0..t.config.kv_cache_layers()).map(|_| BatchKvCache::new()).collect();
        let c = &t.config;
        let q_dim = c.num_heads * c.head_dim;
        let linear_macs = c.active_linear_macs() as usize;
        let pacing = Pacing::new(config.itl_budget, config.prefill_chunk, pacing::depth_scale(linear_macs, q_dim));
        let prefix_budget = config.prefix_cache_bytes.min(info.kv_budget_bytes);
        let disk = config.prefix_cache_disk.as_ref().map(|(dir, bytes)| (dir.as_path(), *bytes));
        let prefix = (prefix_budget > 0).then(|| {
            PrefixCache::new(
                model_identity(&model, info.context_length),
                prefix_budget,
                disk,
                &model.path.display().to_string(),
                t.cache_windows(),
                (0..t.config.kv_cache_layers()).map(|i| t.config.is_recurrent(i)).collect(),
            )
        });
        let metrics = Metrics { model: info.name.clone(), kv_budget_bytes: info.kv_budget_bytes, ..Default::default() };
        Scheduler {
            model,
            config,
            info,
            waiting: VecDeque::new(),
            group: Vec::new(),
            group_cache,
            running: Vec::new(),
            cache,
            prefix,
            shared: None,
            next_turn: None,
            warm_events: None,
            reserved_bytes: 0,
            pacing,
            queued,
            metrics_tx,
            metrics,
            rates: RateWindow::default(),
        }
    }

    pub fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    fn is_idle(&self) -> bool {
        self.running.is_empty() && self.group.is_empty() && self.waiting.is_empty()
    }

    pub fn run(mut self, inbox: Receiver<Command>) {
        loop {
            while self.is_idle() {
                // Nothing to do: sleep until a command arrives, waking now and then so that the
                // published rates fall back to zero. A finished answer's turn boundary is
                // prefilled once nothing has come for a moment (`warm`).
                self.publish_metrics(0, 0);
                let command = match inbox.recv_timeout(if self.next_turn.is_some() { WARM_AFTER } else { IDLE_REFRESH })
                {
                    Err(RecvTimeoutError::Timeout) if self.start_next_turn() => break,
                    command => command,
                };
                match command {
                    Ok(command) => {
                        if !self.handle(command) {
                            return self.shut_down();
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return self.shut_down(),
                }
            }
            loop {
                match inbox.try_recv() {
                    Ok(command) => {
                        if !self.handle(command) {
                            return self.shut_down();
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return self.shut_down(),
                }
            }
            self.step();
        }
    }

    /// Returns false on shutdown.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Submit { id, request, events } => {
                self.metrics.requests_total += 1;
                let seq = Sequence::new(id, *request, events, self.info.context_length, self.info.kv_footprint);
                // In arrival order; admission picks by priority (`lanes`).
                self.waiting.push_back(seq);
                true
            }
            Command::ClearPrefixCache => {
                if let Some(prefix) = self.prefix.as_mut() {
                    prefix.clear();
                }
                self.publish_metrics(0, 0);
                true
            }
            Command::Shutdown => false,
        }
    }

    pub(crate) fn step(&mut self) {
        self.reap_abandoned();
        let decoded = if self.running.is_empty() {
            0
        } else {
            let began = Instant::now();
            let rows = self.decode_step();
            self.pacing.record_decode(began.elapsed());
            rows
        };
        let prefilled = self.prefill_step();
        self.drop_unused_shared();
        self.metrics.step += 1;
        self.publish_metrics(prefilled, decoded);
    }

    /// Requests whose caller went away are dropped wherever they are.
    fn reap_abandoned(&mut self) {
        let (gone, kept): (Vec<Sequence>, Vec<Sequence>) = self.waiting.drain(..).partition(Sequence::is_abandoned);
        self.waiting = kept.into();
        self.queued.fetch_sub(gone.len(), Ordering::SeqCst);
        for mut seq in gone {
            // A pre-empted prefill waits holding its reservation and its partial cache.
            if seq.reserved {
                seq.finish(FinishReason::Cancelled, None, None);
                self.release(&seq);
            } else {
                self.count_end(None);
            }
        }
        self.reap_abandoned_members();
        let keep: Vec<usize> = (0..self.running.len()).filter(|&i| !self.running[i].is_abandoned()).collect();
        if keep.len() < self.running.len() {
            self.retain_rows(&keep);
        }
    }

    /// Decodes one token for every running row; returns how many rows it decoded.
    fn decode_step(&mut self) -> usize {
        let rows = self.running.len();
        let inputs: Vec<u32> = self.running.iter().map(|s| s.next_input).collect();
        let logits = match self.forward_batch(&inputs) {
            Ok(logits) => logits,
            Err(message) => {
                // The batch's state is unknown after a failed step: end every row, keep serving.
                tracing::error!("decode step failed: {message}");
                for seq in &mut self.running {
                    seq.finish(FinishReason::Error, None, Some(format!("internal error: {message}")));
                }
                self.retain_rows(&[]);
                return 0;
            }
        };
        let vocab = logits.len() / rows;
        let mut keep = Vec::with_capacity(rows);
        let fault = self.config.fault_injector.clone();
        let mut logits = logits;
        for (i, row) in logits.chunks_mut(vocab).enumerate() {
            let seq = &mut self.running[i];
            if seq.on_logits(row, &self.model.tokenizer, fault.as_ref()) {
                keep.push(i);
            }
        }
        self.metrics.generated_tokens_total += rows as u64;
        self.store_completed_blocks();
        if keep.len() < rows {
            self.retain_rows(&keep);
        }
        rows
    }

    /// The batch forward pass for one token per row: logits `[rows * vocab]` on the host.
    fn forward_batch(&mut self, inputs: &[u32]) -> Result<Vec<f32>, String> {
        let ids = Array::from_slice(inputs, &[inputs.len() as i32, 1]);
        let logits = self.model.transformer.forward(&ids, &mut self.cache).map_err(|e| e.to_string())?;
        let logits = logits.as_dtype(Dtype::Float32).map_err(|e| e.to_string())?;
        // Recurrent states too: left lazy they would hold the step's inputs.
        let states = self.cache.iter().flat_map(|c| c.states().iter());
        mlx_rs::transforms::eval(std::iter::once(&logits).chain(states)).map_err(|e| e.to_string())?;
        Ok(logits.as_slice::<f32>().to_vec())
    }

    /// Keeps the running rows at `keep`; the others (finished or abandoned) leave the batch.
    fn retain_rows(&mut self, keep: &[usize]) {
        self.store_leaving_rows(keep);
        let mut kept = Vec::with_capacity(keep.len());
        let mut old: Vec<Option<Sequence>> = self.running.drain(..).map(Some).collect();
        for &i in keep {
            kept.push(old[i].take().expect("each row kept once"));
        }
        for mut seq in old.into_iter().flatten() {
            // Rows leave finished, or abandoned by their caller (then cancelled here, so that
            // they count, and show in the recent requests, as such).
            if seq.finished.is_none() {
                seq.finish(FinishReason::Cancelled, None, None);
            }
            self.release(&seq);
        }
        self.running = kept;
        let mut failed = None;
        for layer in &mut self.cache {
            if let Err(e) = layer.retain(keep) {
                failed = Some(e.to_string());
            }
        }
        if let Some(message) = failed {
            tracing::error!("cannot shrink the batch: {message}");
            for mut seq in std::mem::take(&mut self.running) {
                seq.finish(FinishReason::Error, None, Some(format!("internal error: {message}")));
                self.release(&seq);
            }
            self.cache.iter_mut().for_each(|c| *c = BatchKvCache::new());
        }
    }

    /// The blocks this step completed go to the prefix cache now: a windowed layer will have
    /// dropped their keys by the time the sequence leaves.
    fn store_completed_blocks(&mut self) {
        let Some(prefix) = self.prefix.as_mut() else { return };
        let lengths = self.cache.first().map(BatchKvCache::lengths).unwrap_or_default();
        for (row, seq) in self.running.iter().enumerate() {
            let Some(len) = lengths.get(row).map(|&l| l.max(0) as usize) else { continue };
            let whole = len > 0 && len % BLOCK_TOKENS == 0 && len <= seq.tokens().len();
            if !whole || seq.finished == Some(FinishReason::Error) {
                continue;
            }
            let snapshot = len % SNAPSHOT_TOKENS == 0;
            if let Err(e) = prefix.store_row(&seq.tokens()[..len], &self.cache, row, snapshot) {
                tracing::warn!("prefix cache: cannot store a generated block: {e}");
            }
        }
    }

    /// The sequences of the rows not in `keep` go to the prefix cache (what the next turn of a
    /// conversation starts with), unless their state is in doubt (a failed step).
    fn store_leaving_rows(&mut self, keep: &[usize]) {
        let Some(prefix) = self.prefix.as_mut() else { return };
        let lengths = self.cache.first().map(BatchKvCache::lengths).unwrap_or_default();
        for (row, seq) in self.running.iter().enumerate() {
            if keep.contains(&row) || seq.finished == Some(FinishReason::Error) {
                continue;
            }
            let Some(&len) = lengths.get(row) else { continue };
            let tokens = seq.tokens();
            let len = (len.max(0) as usize).min(tokens.len());
            if let Err(e) = prefix.store_row(&tokens[..len], &self.cache, row, true) {
                tracing::warn!("prefix cache: cannot store a finished sequence: {e}");
            }
            if let Some(next_turn) = warm::next_turn_start(seq) {
                self.next_turn = Some(next_turn);
            }
            // The batch's only row, leaving it empty: its buffers are kept whole for the
            // conversation's next turn (the batch lets go of them right after).
            if keep.is_empty() && self.running.len() == 1 {
                let caches: Option<Vec<_>> = self.cache.iter().map(BatchKvCache::only_row).collect();
                if let Some(caches) = caches {
                    prefix.keep_hot(&tokens[..len], caches);
                }
            }
        }
    }

    /// Gives back a finished or abandoned sequence's reservation and counts how it ended.
    fn release(&mut self, seq: &Sequence) {
        if seq.reserved {
            self.reserved_bytes -= seq.reserved_bytes;
        }
        if seq.warm {
            return;
        }
        self.count_end(seq.finished);
        if let Some(record) = &seq.record {
            if matches!(seq.finished, Some(FinishReason::Stop | FinishReason::Length)) {
                let m = &mut self.metrics;
                m.queue_seconds.observe(record.queue_ms / 1e3);
                m.prefill_seconds.observe(record.prefill_ms / 1e3);
                m.ttft_seconds.observe(record.ttft_ms / 1e3);
                m.decode_seconds.observe(record.decode_ms / 1e3);
            }
            self.metrics.recent.push_front(record.clone());
            self.metrics.recent.truncate(RECENT_REQUESTS);
        }
    }

    fn count_end(&mut self, reason: Option<FinishReason>) {
        let m = &mut self.metrics;
        m.finished_total += 1;
        match reason {
            None | Some(FinishReason::Cancelled) => m.cancelled_total += 1,
            Some(FinishReason::Error) => m.errors_total += 1,
            Some(_) => {}
        }
    }

    /// `decoded`: rows decoded this step (one token each), i.e. its batch size.
    fn publish_metrics(&mut self, prefilled: usize, decoded: usize) {
        let now = Instant::now();
        self.rates.record(now, prefilled, decoded);
        let (prefill_rate, decode_rate) = self.rates.rates(now);
        let memory = mlx::memory_stats();
        let shared_bytes = self.shared_segment_bytes();
        let m = &mut self.metrics;
        m.running = self.running.len();
        // The engine's own turn-boundary prefill is not a request waiting for an answer.
        m.queued = self.waiting.len() + self.group.iter().filter(|s| !s.warm).count();
        m.batch_size = decoded;
        m.prefill_tokens_per_sec = prefill_rate;
        m.decode_tokens_per_sec = decode_rate;
        m.kv_tokens = self.cache.iter().map(BatchKvCache::held_tokens).max().unwrap_or(0);
        m.kv_bytes = self.cache.iter().chain(&self.group_cache).map(BatchKvCache::nbytes).sum::<usize>() + shared_bytes;
        m.kv_shared_bytes = shared_bytes;
        m.kv_peak_bytes = m.kv_peak_bytes.max(m.kv_bytes);
        m.kv_reserved_bytes = self.reserved_bytes;
        if let Some(stats) = self.prefix.as_ref().map(PrefixCache::stats) {
            m.prefix_cache_hits = stats.hits;
            m.prefix_cache_misses = stats.misses;
            m.prefix_cache_tokens_reused = stats.tokens_reused;
            m.prefix_cache_bytes = stats.bytes;
            m.prefix_cache_blocks = stats.blocks;
            m.prefix_cache_evictions = stats.evictions;
            m.prefix_cache_disk_bytes = stats.disk.bytes;
            m.prefix_cache_disk_blocks = stats.disk.blocks;
            m.prefix_cache_disk_hits = stats.disk.hits;
            m.prefix_cache_disk_write_skips = stats.disk.write_skips;
            m.prefix_cache_disk_enabled = stats.disk.enabled;
        }
        m.mlx_active_bytes = memory.active;
        m.mlx_peak_bytes = memory.peak;
        m.mlx_cache_bytes = memory.cache;
        self.metrics_tx.send_replace(self.metrics.clone());
    }

    /// Cancels everything, frees the batch and MLX's cached buffers.
    fn shut_down(mut self) {
        let waiting: Vec<Sequence> = self.waiting.drain(..).collect();
        let group = std::mem::take(&mut self.group);
        for mut seq in waiting.into_iter().chain(group).chain(std::mem::take(&mut self.running)) {
            seq.finish(FinishReason::Cancelled, None, None);
            self.count_end(Some(FinishReason::Cancelled));
        }
        self.queued.store(0, Ordering::SeqCst);
        self.cache.clear();
        self.group_cache.clear();
        self.shared = None;
        self.reserved_bytes = 0;
        self.publish_metrics(0, 0);
        drop(self.model);
        let _ = mlx_rs::memory::clear_cache();
    }
}

/// Tokens of text shown on each side of a cache miss.
const MISS_CONTEXT: usize = 12;

/// Why a request reused less than a cached sequence offered: told when the cached text picks
/// up again right after the divergence (the same conversation, edited), not for every prompt
/// that merely starts like another one.
fn explain_miss(d: Divergence, request: &Request, tokenizer: &crate::tokenizer::Tokenizer) -> Option<CacheMiss> {
    let prompt = &request.prompt_ids;
    if !d.resumes || d.position + 1 >= prompt.len() {
        return None;
    }
    let text = |ids: &[u32]| tokenizer.decode(ids, false).unwrap_or_default();
    let chars_before = text(&prompt[..d.position]).chars().count();
    let message = request.message_starts.iter().rposition(|&start| start <= chars_before);
    Some(CacheMiss {
        position: d.position,
        cached_through: d.cached_through,
        message,
        before: text(&prompt[d.position.saturating_sub(MISS_CONTEXT)..d.position]),
        after: text(&prompt[d.position..(d.position + MISS_CONTEXT).min(prompt.len())]),
    })
}
