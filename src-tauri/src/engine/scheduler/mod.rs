//! The engine thread's loop. Each step: take new requests, drop abandoned ones, decode one
//! token for every running row, then prefill waiting prompts together within the step's time
//! budget (`prefill`): they join the batch once prefilled.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use mlx_rs::{Array, Dtype};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

mod park;
mod prefill;
mod verify;
mod vision;
mod warm;

use super::batch::Batch;
use super::config::{EngineConfig, ModelInfo};
use super::kv::KvManager;
use super::memory::{self, Governor};
use super::metrics::{Metrics, RateWindow, RECENT_REQUESTS};
use super::pacing::{self, Pacing};
use super::remote::{RemoteLink, StepBatch};
use super::request::{Event, FinishReason, Request, RequestId};
use super::sequence::Sequence;
use super::speculative::{DraftModel, Mode, MtpDrafter};
use super::turns::device_turns;
use crate::mlx;
use crate::model::{BatchKvCache, LayerCache, LoadedModel};

/// How often an idle engine republishes its metrics.
const IDLE_REFRESH: std::time::Duration = std::time::Duration::from_millis(500);
/// How long an engine stays idle before it prefills a finished answer's turn boundary: a
/// client that sends its next turn at once (a script, an agent's quick tool) finds the engine
/// free instead of in that prefill; one that takes longer (a person, a build, a test run)
/// finds the boundary prefilled.
const WARM_AFTER: std::time::Duration = std::time::Duration::from_millis(150);

pub(crate) enum Command {
    Submit {
        id: RequestId,
        request: Box<Request>,
        events: UnboundedSender<Event>,
        started: tokio::sync::oneshot::Sender<()>,
    },
    ClearPrefixCache,
    Shutdown,
}

pub(crate) struct Scheduler {
    model: LoadedModel,
    config: EngineConfig,
    info: ModelInfo,
    /// Waiting requests, in arrival order (admission picks by priority: `lanes`).
    waiting: VecDeque<Sequence>,
    /// Requests being prefilled together (`prefill`).
    group: Batch,
    /// The rows decoding.
    running: Batch,
    /// The KV memory: budget and reservations, prefix cache, shared segment.
    kv: KvManager,
    /// The last finished chat answer's turn boundary, prefilled when idle (`warm`).
    warm: warm::NextTurn,
    /// How much prefill a step may do while rows decode.
    pacing: Pacing,
    /// The memory ceiling: what each step may allocate, and how well that was predicted.
    memory: Governor,
    /// Prompts prefilled together at most now (`prefill::GROUP`, less while memory is short).
    group_cap: usize,
    /// The last step's prefill waited for memory; since when a lone prompt has.
    memory_wait: bool,
    memory_wait_since: Option<Instant>,
    queued: Arc<AtomicUsize>,
    metrics_tx: watch::Sender<Metrics>,
    metrics: Metrics,
    rates: RateWindow,
    /// Whether drafting pays, per batch size, measured as steps run.
    payoff: super::speculative::Payoff,
    /// The draft model proposing tokens (`--draft-model`), with its own batch of rows.
    draft: Option<DraftModel>,
    /// The model's multi-token-prediction head proposing tokens, where the checkpoint ships one.
    mtp: Option<MtpDrafter>,
    /// The last forward's hidden states `[rows, positions, hidden]`, kept for the head to feed on.
    step_hidden: Option<Array>,
    /// Images encoded lately, by content hash (a model that sees).
    encoded: super::vision::EncodedImages,
    /// The other ranks' layers, when the model is split across a cluster's machines.
    remote: Option<RemoteLink>,
}

impl Scheduler {
    pub fn new(
        model: LoadedModel,
        draft: Option<DraftModel>,
        config: EngineConfig,
        metrics_tx: watch::Sender<Metrics>,
        queued: Arc<AtomicUsize>,
        remote: Option<RemoteLink>,
    ) -> Scheduler {
        let t = &model.transformer;
        let context_length = config.context_length(t.config.max_position_embeddings);
        let ceiling = config.memory_ceiling.unwrap_or_else(|| mlx::default_ceiling() as usize);
        let cost = memory::cost_model_of(t, config.kv_format);
        // What the process holds with this model loaded (other models, the weights, the rest),
        // measured: the KV budget is what the ceiling leaves of it.
        let held = Governor::held_now().max(model.weights_bytes);
        let mut budget =
            memory::kv_budget(ceiling, held, 0, &cost, config.max_batch, context_length, config.kv_budget_bytes);
        if budget.max_rows < config.max_batch {
            tracing::info!(
                "{}: at most {} rows at once under the memory ceiling ({} MiB)",
                model.name,
                budget.max_rows,
                ceiling >> 20
            );
        }
        let mut config = config;
        config.max_batch = budget.max_rows;
        // The head drafts where the checkpoint ships one, unless a draft model or another mode does.
        let mtp_wanted = match config.speculative.mode {
            Mode::Mtp => true,
            Mode::Auto => draft.is_none(),
            _ => false,
        };
        let model_mtp = (mtp_wanted && model.transformer.mtp.is_some()).then(MtpDrafter::default);
        // A drafting row holds the draft model's (or the head's) keys and values for its tokens too.
        let theirs = match (&draft, &model_mtp) {
            (Some(d), _) => d.kv_bytes_per_token(),
            (None, Some(_)) => t.mtp_kv_bytes_per_token(),
            (None, None) => 0,
        };
        let own = t.kv_bytes_per_token().max(1);
        let kv_footprint = t.kv_footprint_in(config.kv_format);
        // Split across machines: no more tokens than the other ranks have room for, counted as
        // admission counts them (a sequence's footprint, its windowed layers bounded), with the
        // drafts' keys and values, which are all here, beside them.
        if let Some(tokens) = remote.as_ref().and_then(RemoteLink::kv_capacity_tokens) {
            let capped = kv_footprint.bytes(tokens) as u128 * (own + theirs) as u128 / own as u128;
            if capped < budget.bytes as u128 {
                tracing::info!("{}: KV held to {tokens} tokens by the other ranks' room", model.name);
                budget.bytes = capped as usize;
            }
        }
        let kv_budget = (budget.bytes as u128 * own as u128 / (own + theirs) as u128) as usize;
        let info = ModelInfo {
            name: model.name.clone(),
            tokenizer: model.tokenizer.clone(),
            chat_template: model.chat_template.clone(),
            context_length,
            vocab_size: t.config.vocab_size,
            layers: t.held_layers(),
            kv_bytes_per_token: t.kv_bytes_per_token(),
            kv_footprint,
            kv_budget_bytes: kv_budget,
            kv_capacity_tokens: kv_footprint.tokens_within(kv_budget),
            weights_bytes: model.weights_bytes + draft.as_ref().map_or(0, DraftModel::weights_bytes),
            memory_ceiling: ceiling,
            draft_model: draft.as_ref().map(|d| d.name().to_string()),
            mtp_head: model_mtp.is_some(),
            vision: model.vision.as_ref().map(|v| v.processor.clone()),
        };
        tracing::info!(
            "{}: memory ceiling {} MB, {} MB held with the model loaded, KV budget {} MB ({} tokens)",
            info.name,
            ceiling >> 20,
            held >> 20,
            kv_budget >> 20,
            info.kv_capacity_tokens
        );
        let layers = t.cache_count();
        let kv_format = config.kv_format;
        let c = &t.config;
        let q_dim = c.num_heads * c.head_dim;
        let linear_macs = c.active_linear_macs() as usize;
        let pacing = Pacing::new(config.itl_budget, config.prefill_chunk, pacing::depth_scale(linear_macs, q_dim));
        let mut kv = KvManager::new(&model, &config, &info);
        if remote.is_some() {
            kv.mirror_to_other_ranks();
        }
        let memory = Governor::new(ceiling, cost);
        let metrics = Metrics { model: info.name.clone(), kv_budget_bytes: info.kv_budget_bytes, ..Default::default() };
        Scheduler {
            model,
            config,
            info,
            waiting: VecDeque::new(),
            group: Batch::new(layers, kv_format),
            running: Batch::new(layers, kv_format),
            kv,
            warm: warm::NextTurn::default(),
            pacing,
            memory,
            group_cap: prefill::GROUP,
            memory_wait: false,
            memory_wait_since: None,
            queued,
            metrics_tx,
            metrics,
            rates: RateWindow::default(),
            payoff: Default::default(),
            mtp: model_mtp,
            step_hidden: None,
            draft,
            encoded: Default::default(),
            remote,
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
                self.memory.idle();
                let wait = if self.warm.is_pending() { WARM_AFTER } else { IDLE_REFRESH };
                let command = match inbox.recv_timeout(wait) {
                    Err(RecvTimeoutError::Timeout) if self.start_next_turn() => break,
                    command => command,
                };
                match command {
                    Ok(command) => {
                        if !self.handle(command) {
                            return self.shut_down();
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        if let Some(remote) = self.remote.as_mut() {
                            remote.keep_alive();
                        }
                    }
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
            // A step may send nothing for a while (requests waiting for memory).
            if let Some(remote) = self.remote.as_mut() {
                remote.keep_alive();
            }
            self.step();
        }
    }

    /// Returns false on shutdown.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Submit { id, request, events, started } => {
                self.metrics.requests_total += 1;
                let mut seq = Sequence::new(id, *request, events, &self.info, self.config.kv_reserve_ahead);
                seq.started = Some(started);
                // In arrival order; admission picks by priority (`lanes`).
                self.waiting.push_back(seq);
                true
            }
            Command::ClearPrefixCache => {
                self.kv.clear_prefix_cache();
                self.publish_metrics(0, 0);
                true
            }
            Command::Shutdown => false,
        }
    }

    pub(crate) fn step(&mut self) {
        // The device's turn: an encoder batch (embeddings) runs between steps, never beside one.
        let turn = device_turns().chat_step();
        self.memory_wait = false;
        self.reap_abandoned();
        let decoded = if self.running.is_empty() {
            0
        } else {
            let began = Instant::now();
            let rows = self.decode_step();
            self.pacing.record_decode(began.elapsed());
            device_turns().record_decode(began.elapsed());
            rows
        };
        let prefilled = self.prefill_step();
        if prefilled > 0 {
            self.memory_wait_since = None;
        }
        self.kv.drop_unused_shared(&self.group, &self.running);
        drop(turn);
        if self.memory_wait && decoded == 0 {
            // Nothing can run until memory frees (another engine's step): not a busy loop.
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        self.metrics.step += 1;
        self.publish_metrics(prefilled, decoded);
    }

    /// Requests whose caller went away are dropped wherever they are.
    fn reap_abandoned(&mut self) {
        self.refuse_overdue();
        let (gone, kept): (Vec<Sequence>, Vec<Sequence>) = self.waiting.drain(..).partition(Sequence::is_abandoned);
        self.waiting = kept.into();
        self.queued.fetch_sub(gone.len(), Ordering::SeqCst);
        for mut seq in gone {
            // A pre-empted prefill waits holding its reservation and its partial cache.
            if seq.kv.held {
                seq.finish(FinishReason::Cancelled, None, None);
                self.release(&seq);
            } else {
                self.count_end(None);
            }
        }
        self.reap_abandoned_members();
        let keep: Vec<usize> = (0..self.running.len()).filter(|&i| !self.running.seqs[i].is_abandoned()).collect();
        if keep.len() < self.running.len() {
            self.retain_rows(&keep);
        }
    }

    /// Requests that waited past `max_queue_wait` without starting are refused (503 with
    /// `Retry-After`), saying why they could not start.
    fn refuse_overdue(&mut self) {
        let Some(limit) = self.config.max_queue_wait else { return };
        // Never one that has started (a parked row resumes, whatever it waits).
        let overdue = |s: &Sequence| !s.has_started() && !s.warm && s.waited() > limit;
        if !self.waiting.iter().any(overdue) {
            return;
        }
        let (late, kept): (Vec<Sequence>, Vec<Sequence>) = self.waiting.drain(..).partition(overdue);
        self.waiting = kept.into();
        self.queued.fetch_sub(late.len(), Ordering::SeqCst);
        let why = format!(
            "the request waited {} s without starting (the limit is {} s): {} requests are running and {} waiting, \
             with {} of {} MB of KV memory reserved under the memory ceiling; retry later",
            limit.as_secs(),
            limit.as_secs(),
            self.running.len() + self.group.len(),
            self.waiting.len(),
            self.kv.report().reserved >> 20,
            self.info.kv_budget_bytes >> 20,
        );
        for mut seq in late {
            seq.finish(FinishReason::Overloaded, None, Some(why.clone()));
            self.metrics.refused_waited_total += 1;
            self.release(&seq);
        }
    }

    /// Decodes one token for every running row, more where drafted tokens are accepted
    /// (`verify`); returns how many rows it decoded.
    fn decode_step(&mut self) -> usize {
        self.reserve_for_decode();
        let rows = self.running.len();
        if rows == 0 {
            return 0;
        }
        // Drafting's own work (a draft model's forwards) counts against what it gains.
        let drafting = Instant::now();
        if let Some(drafts) = self.drafts() {
            self.verify_step(drafts, drafting);
            return rows;
        }
        let began = Instant::now();
        let inputs: Vec<u32> = self.running.seqs.iter().map(|s| s.next_input).collect();
        let logits = match self.forward_batch(&inputs) {
            Ok(logits) => logits,
            Err(message) => {
                self.fail_running(&message);
                return 0;
            }
        };
        let vocab = logits.len() / rows;
        let mut keep = Vec::with_capacity(rows);
        let fault = self.config.fault_injector.clone();
        let mut logits = logits;
        for (i, row) in logits.chunks_mut(vocab).enumerate() {
            let seq = &mut self.running.seqs[i];
            if seq.on_logits(row, &self.model.tokenizer, fault.as_ref()) {
                keep.push(i);
            }
        }
        self.metrics.generated_tokens_total += rows as u64;
        let advanced = vec![1; rows];
        self.feed_head(&advanced);
        self.kv.decoded(&self.running, &advanced);
        if keep.len() < rows {
            self.retain_rows(&keep);
        }
        self.payoff.record(rows, rows, began.elapsed(), false);
        rows
    }

    /// The batch forward pass for one token per row: logits `[rows * vocab]` on the host.
    fn forward_batch(&mut self, inputs: &[u32]) -> Result<Vec<f32>, String> {
        let ids = Array::from_slice(inputs, &[inputs.len() as i32, 1]);
        let buffers = memory::buffers_of(&self.running.cache);
        let predicted = self.memory.cost().decode_bytes(inputs.len(), &buffers, self.shared_len());
        self.forward_running(&ids, predicted)
    }

    /// One forward of the running batch over `ids` (`[rows, positions]`), predicted to need
    /// `predicted` bytes: logits of every position, on the host.
    fn forward_running(&mut self, ids: &Array, predicted: usize) -> Result<Vec<f32>, String> {
        let _in_flight = self.memory.begin_step(predicted);
        let positions = self.running_positions(ids.dim(1) as usize);
        let step = crate::model::transformer::StepInputs { images: None, positions: positions.as_ref() };
        let hidden = self.forward_hidden(StepBatch::Running, ids, step).map_err(|e| e.to_string())?;
        let t = &self.model.transformer;
        let logits = t.logits(&hidden).and_then(|l| Ok(l.as_dtype(Dtype::Float32)?)).map_err(|e| e.to_string())?;
        // The head feeds on the step's hidden states once its tokens are sampled.
        self.step_hidden = self.mtp.is_some().then_some(hidden);
        // Recurrent states too: left lazy they would hold the step's inputs.
        let states = self.running.cache.iter().flat_map(|c| c.states().iter());
        mlx_rs::transforms::eval(std::iter::once(&logits).chain(states)).map_err(|e| e.to_string())?;
        self.memory.end_step();
        Ok(logits.as_slice::<f32>().to_vec())
    }

    /// Hidden states after the final norm of `ids` following what batch `which` holds: on this
    /// process alone, or through the other ranks when the model is split across a cluster
    /// (they hear first what the prefix cache stored since they last heard).
    fn forward_hidden(
        &mut self,
        which: StepBatch,
        ids: &Array,
        step: crate::model::transformer::StepInputs,
    ) -> Result<Array, crate::model::ModelError> {
        let batch = match which {
            StepBatch::Running => &mut self.running,
            StepBatch::Prefill => &mut self.group,
        };
        match self.remote.as_mut() {
            // A split model sees no images (they are dropped when it is split).
            Some(link) => {
                link.stored(self.kv.take_stores());
                link.forward(&self.model.transformer, which, batch, ids)
            }
            None => self.model.transformer.forward_hidden_with(ids, &mut batch.cache, step),
        }
    }

    /// Positions of the shared segment the running rows attend to (0: none).
    fn shared_len(&self) -> usize {
        self.kv.shared_layers().and_then(|s| s.first()).map_or(0, |s| s.len().max(0) as usize)
    }

    /// Keeps the running rows at `keep`; the others (finished or abandoned) leave the batch.
    fn retain_rows(&mut self, keep: &[usize]) {
        self.kv.leaving(&self.running, keep);
        for (row, seq) in self.running.seqs.iter().enumerate() {
            if !keep.contains(&row) {
                self.warm.answer_ended(seq);
            }
        }
        let mut kept = Vec::with_capacity(keep.len());
        let mut old: Vec<Option<Sequence>> = self.running.seqs.drain(..).map(Some).collect();
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
        self.running.seqs = kept;
        if let Err(e) = self.running.retain_cache(keep) {
            tracing::error!("cannot shrink the batch: {e}");
            for mut seq in std::mem::take(&mut self.running.seqs) {
                seq.finish(FinishReason::Error, None, Some(format!("internal error: {e}")));
                self.release(&seq);
            }
            self.running.clear_cache();
        }
    }

    /// Gives back a finished or abandoned sequence's reservation and counts how it ended.
    fn release(&mut self, seq: &Sequence) {
        self.kv.release(seq);
        if let Some(remote) = self.remote.as_mut() {
            remote.ended(seq.id);
        }
        if let Some(mtp) = self.mtp.as_mut() {
            mtp.forget(seq.id);
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
        let kv = self.kv.report();
        let m = &mut self.metrics;
        m.running = self.running.len();
        // The engine's own turn-boundary prefill is not a request waiting for an answer.
        m.queued = self.waiting.len() + self.group.seqs.iter().filter(|s| !s.warm).count();
        m.batch_size = decoded;
        m.encoded_images_bytes = self.encoded.bytes();
        m.prefill_tokens_per_sec = prefill_rate;
        m.decode_tokens_per_sec = decode_rate;
        m.kv_tokens = self.running.cache.iter().map(BatchKvCache::held_tokens).max().unwrap_or(0);
        m.kv_bytes = self.running.cache.iter().chain(&self.group.cache).map(BatchKvCache::nbytes).sum::<usize>()
            + kv.shared_bytes
            + self.draft.as_ref().map_or(0, DraftModel::nbytes)
            + self.mtp.as_ref().map_or(0, MtpDrafter::nbytes);
        m.kv_shared_bytes = kv.shared_bytes;
        m.kv_peak_bytes = m.kv_peak_bytes.max(m.kv_bytes);
        m.kv_reserved_bytes = kv.reserved;
        if let Some(stats) = kv.prefix {
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
        m.memory_ceiling_bytes = self.memory.ceiling();
        m.memory_held_bytes = Governor::held_now();
        m.memory = self.memory.calibration();
        self.metrics_tx.send_replace(self.metrics.clone());
    }

    /// Cancels everything, frees the batch and MLX's cached buffers.
    fn shut_down(mut self) {
        let waiting: Vec<Sequence> = self.waiting.drain(..).collect();
        let group = std::mem::take(&mut self.group.seqs);
        for mut seq in waiting.into_iter().chain(group).chain(std::mem::take(&mut self.running.seqs)) {
            seq.finish(FinishReason::Cancelled, None, None);
            self.count_end(Some(FinishReason::Cancelled));
        }
        self.queued.store(0, Ordering::SeqCst);
        self.running.cache.clear();
        self.group.cache.clear();
        self.draft = None;
        self.mtp = None;
        self.kv.shut_down();
        self.publish_metrics(0, 0);
        if let Some(remote) = self.remote.as_mut() {
            remote.stop();
        }
        drop(self.model);
        let _ = mlx_rs::memory::clear_cache();
    }
}
