//! The engine's KV memory, with one owner: the budget admitted requests reserve against, the
//! prefix cache (RAM and disk tiers, and the kept buffers of the last sequence that left the
//! batch alone), and the shared segment (a prompt start several rows share, held once). The
//! scheduler reaches it through a few calls: whether a request fits, admit (reserve and restore),
//! the blocks a prefill chunk or a decode step completed, the rows that leave, release, and the
//! figures for the metrics. (vLLM's `KVCacheManager` is the model of this seam.)

pub mod prefix_cache;
mod shared;

use std::collections::VecDeque;
use std::time::Instant;

use prefix_cache::{model_identity, CacheStats, Divergence, PrefixCache, BLOCK_TOKENS, SNAPSHOT_TOKENS};
use shared::SharedPrefix;

use super::batch::Batch;
use super::config::{EngineConfig, ModelInfo};
use super::metrics::CacheMiss;
use super::remote::StepBatch::{Prefill, Running};
use super::remote::StoreOp;
use super::request::{FinishReason, Request};
use super::sequence::Sequence;
use crate::model::cache::SharedKv;
use crate::model::{BatchKvCache, KvCache, KvFootprint, KvFormat, LoadedModel};
use crate::tokenizer::Tokenizer;

pub(crate) struct KvManager {
    /// Bytes admitted requests may reserve (prompt and most tokens each); the prefix cache lives
    /// inside it and gives way to them.
    budget: usize,
    reserved: usize,
    footprint: KvFootprint,
    /// Cache layers of the model.
    layers: usize,
    /// The model has recurrent layers (their state is kept at snapshots only).
    recurrent: bool,
    /// Whether rows can attend to a shared segment (not in latent attention, whose layers
    /// attend through their own masks).
    segments: bool,
    /// Keys and values of sequences seen before (`None`: turned off).
    prefix: Option<PrefixCache>,
    /// A prompt start the rows that begin with it share, held once (`shared`).
    shared: Option<SharedPrefix>,
    /// How the caches it restores store keys and values.
    format: KvFormat,
    /// The prefix cache's stores not yet told to the other ranks of a cluster (`None`: the
    /// model is not split).
    mirror: Option<Vec<StoreOp>>,
}

/// The rows an admission may look at and change: a shared segment made for a request is taken
/// up by the rows that hold its tokens.
pub(crate) struct Rows<'a> {
    pub group: &'a mut Batch,
    pub running: &'a mut Batch,
    pub waiting: &'a VecDeque<Sequence>,
}

/// What the metrics show of the KV memory.
pub(crate) struct KvReport {
    pub reserved: usize,
    pub shared_bytes: usize,
    pub prefix: Option<CacheStats>,
}

impl KvManager {
    pub fn new(model: &LoadedModel, config: &EngineConfig, info: &ModelInfo) -> KvManager {
        let t = &model.transformer;
        let layers = t.cache_count();
        let prefix_budget = config.prefix_cache_bytes.min(info.kv_budget_bytes);
        let prefix = prefix_cache_for(model, info.context_length, config, prefix_budget);
        KvManager {
            budget: info.kv_budget_bytes,
            reserved: 0,
            footprint: info.kv_footprint,
            layers,
            recurrent: t.config.hybrid.is_some(),
            segments: t.config.mla.is_none(),
            prefix,
            shared: None,
            format: config.kv_format,
            mirror: None,
        }
    }

    /// The model is split across a cluster: the prefix cache's stores are kept for the other
    /// ranks to do to theirs, and rows share no segment (the other ranks would need it too).
    pub fn mirror_to_other_ranks(&mut self) {
        self.mirror = Some(Vec::new());
        self.segments = false;
    }

    /// The stores since the last call, for the other ranks.
    pub fn take_stores(&mut self) -> Vec<StoreOp> {
        self.mirror.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// `seq`'s prompt restored again, at most `limit` tokens of it (another rank of the cluster
    /// holds no more): its caches and how many tokens they hold.
    pub fn restore_within(&mut self, seq: &mut Sequence, limit: usize) -> (Vec<KvCache>, usize) {
        let (layers, format) = (self.layers, self.format);
        let empty = || (0..layers).map(|_| KvCache::with_format(format)).collect::<Vec<_>>();
        let Some(prefix) = self.prefix.as_mut().filter(|_| limit > 0) else {
            seq.cached_tokens = 0;
            return (empty(), 0);
        };
        match prefix.restore(&seq.request.cache_key(), limit, layers) {
            Ok(restored) => {
                seq.cached_tokens = restored.tokens;
                (restored.caches, restored.tokens)
            }
            Err(e) => {
                tracing::warn!("prefix cache: restore failed, prefilling everything: {e}");
                seq.cached_tokens = 0;
                (empty(), 0)
            }
        }
    }

    /// Whether `seq`'s reservation fits beside those held (an engine with nothing admitted,
    /// `busy == 0`, takes any one request, whatever its size).
    pub fn fits(&self, seq: &Sequence, busy: usize) -> bool {
        let reservation = if seq.kv.held { 0 } else { seq.kv.bytes };
        self.reserved + reservation <= self.budget || busy == 0
    }

    /// Takes a request in: holds its reservation, and gives it its caches: a set-aside prefill's
    /// own, or what the prefix cache holds of its prompt (after the shared segment, when it takes
    /// it). Returns them with how many prompt tokens they hold.
    pub fn admit(&mut self, seq: &mut Sequence, rows: Rows<'_>, tokenizer: &Tokenizer) -> (Vec<KvCache>, usize) {
        if !seq.kv.held {
            self.reserved += seq.kv.bytes;
            seq.kv.held = true;
        }
        match seq.prefill.take() {
            Some(resumed) => resumed,
            None => self.restore(seq, rows, tokenizer),
        }
    }

    fn restore(&mut self, seq: &mut Sequence, mut rows: Rows<'_>, tokenizer: &Tokenizer) -> (Vec<KvCache>, usize) {
        let (layers, format) = (self.layers, self.format);
        let empty = || (0..layers).map(|_| KvCache::with_format(format)).collect::<Vec<_>>();
        let Some(prefix) = self.prefix.as_mut() else { return (empty(), 0) };
        // Admitted requests come first: the cache gives up what they reserved.
        prefix.shrink_to(self.budget.saturating_sub(self.reserved));
        // The last prompt token is computed (its logits give the first token): at most the rest
        // is restored.
        let limit = seq.request.prompt_ids.len() - 1;
        let began = Instant::now();
        let shared = self.shared_start(seq, limit, &mut rows);
        let Some(prefix) = self.prefix.as_mut() else { return (empty(), 0) };
        let prompt = seq.request.cache_key();
        let restored = if shared > 0 {
            prefix.restore_after(&prompt, limit, layers, shared)
        } else {
            prefix.restore(&prompt, limit, layers)
        };
        seq.restore_time = began.elapsed();
        match restored {
            Ok(restored) => {
                // The engine's own prefills (`warm`) are not requests, and a parked row's resume
                // is not a new prompt: neither is in the hit figures.
                if seq.parked == 0 {
                    if !seq.warm {
                        prefix.count(restored.tokens);
                    }
                    seq.cached_tokens = restored.tokens;
                }
                seq.cache_miss = restored.divergence.and_then(|d| explain_miss(d, &seq.request, tokenizer));
                if let Some(miss) = &seq.cache_miss {
                    tracing::debug!(
                        "request {}: prefix cache reused {} tokens; a cached sequence went on differently at token {} (message {:?}): ...{:?} | {:?}...",
                        seq.id, miss.position, miss.position, miss.message, miss.before, miss.after
                    );
                }
                if shared > 0 {
                    self.reserve_after_shared(seq, shared);
                }
                (restored.caches, restored.tokens)
            }
            Err(e) => {
                tracing::warn!("prefix cache: restore failed, prefilling everything: {e}");
                (empty(), 0)
            }
        }
    }

    /// Whether `seq` shares a start of at least a block with a request `members` holds that is
    /// still prefilling it: it waits until those blocks are in the prefix cache, then reuses them
    /// instead of computing (and holding) the same keys and values twice (agents sharing a
    /// system prompt). (Not for a model with recurrent layers: their state is kept every
    /// SNAPSHOT_TOKENS only, so the member's blocks would rarely let the request resume.)
    pub fn waits_for_a_member<'a>(&self, seq: &Sequence, mut members: impl Iterator<Item = &'a Sequence>) -> bool {
        self.prefix.is_some()
            && !self.recurrent
            && members.any(|member| {
                let (theirs, ours) = (member.request.cache_key(), seq.request.cache_key());
                let shared = theirs.iter().zip(ours.iter()).take_while(|(a, b)| a == b).count();
                shared >= BLOCK_TOKENS && member.prefilled < shared / BLOCK_TOKENS * BLOCK_TOKENS
            })
    }

    /// The whole blocks a prefill forward of `n` tokens completed go to the prefix cache at once,
    /// for requests that share them; a model with recurrent layers keeps their state where a row
    /// reached its `snapshot_at`.
    pub fn prefilled(&mut self, group: &Batch, n: usize) {
        let Some(prefix) = self.prefix.as_mut() else { return };
        for (row, seq) in group.seqs.iter().enumerate() {
            let key = seq.request.cache_key();
            if self.recurrent && seq.request.snapshot_at == Some(seq.prefilled) {
                let tokens = &key[..seq.prefilled];
                if let Err(e) = prefix.store_row(tokens, &group.cache, row, true) {
                    tracing::warn!("prefix cache: cannot keep a state at the system prompt's end: {e}");
                }
                told(
                    &mut self.mirror,
                    StoreOp::Store { batch: Prefill, id: seq.id, len: seq.prefilled, snapshot: true },
                );
            }
            let whole = seq.prefilled / BLOCK_TOKENS * BLOCK_TOKENS;
            if whole > (seq.prefilled - n) / BLOCK_TOKENS * BLOCK_TOKENS {
                // A recurrent layer's state is kept every SNAPSHOT_TOKENS (chunks end there).
                let snapshot = seq.prefilled == whole && whole.is_multiple_of(SNAPSHOT_TOKENS);
                let tokens = &key[..whole];
                if let Err(e) = prefix.store_row(tokens, &group.cache, row, snapshot) {
                    tracing::warn!("prefix cache: cannot store a prefilled block: {e}");
                }
                told(&mut self.mirror, StoreOp::Store { batch: Prefill, id: seq.id, len: whole, snapshot });
            }
        }
    }

    /// The prompts of the group's rows `done` (prefilled, first token sampled) go to the prefix
    /// cache. A lone request that ended at its first token (a turn boundary's prefill) while
    /// nothing runs has its buffers kept whole, as the running batch's last row's are.
    pub fn prompts_done(&mut self, group: &Batch, done: &[usize], running_empty: bool) {
        let Some(prefix) = self.prefix.as_mut() else { return };
        for &row in done {
            let seq = &group.seqs[row];
            let key = seq.request.cache_key();
            if let Err(e) = prefix.store_row(&key[..seq.prefilled], &group.cache, row, true) {
                tracing::warn!("prefix cache: cannot store a prompt: {e}");
            }
            told(&mut self.mirror, StoreOp::Store { batch: Prefill, id: seq.id, len: seq.prefilled, snapshot: true });
        }
        if let ([row], 1, true) = (done, group.len(), running_empty) {
            let seq = &group.seqs[*row];
            if matches!(seq.finished, Some(FinishReason::Stop | FinishReason::Length)) {
                let caches: Option<Vec<_>> = group.cache.iter().map(BatchKvCache::only_row).collect();
                if let Some(caches) = caches {
                    prefix.keep_hot(&seq.request.cache_key()[..seq.prefilled], caches);
                    told(&mut self.mirror, StoreOp::KeepHot { batch: Prefill, id: seq.id, len: seq.prefilled });
                }
            }
        }
    }

    /// The blocks a decode step completed go to the prefix cache now: a windowed layer will have
    /// dropped their keys by the time the sequence leaves.
    pub fn decoded(&mut self, running: &Batch, advanced: &[usize]) {
        let Some(prefix) = self.prefix.as_mut() else { return };
        let lengths = running.lengths();
        for (row, seq) in running.seqs.iter().enumerate() {
            let Some(len) = lengths.get(row).map(|&l| l.max(0) as usize) else { continue };
            // A step that kept several tokens (drafts accepted) may have crossed a block's end.
            let before = len.saturating_sub(advanced.get(row).copied().unwrap_or(1));
            let len = len - len % BLOCK_TOKENS;
            let whole = len > before && len > 0 && len <= seq.tokens().len();
            if !whole || seq.finished == Some(FinishReason::Error) {
                continue;
            }
            let snapshot = len.is_multiple_of(SNAPSHOT_TOKENS);
            if let Err(e) = prefix.store_row(&seq.cache_tokens()[..len], &running.cache, row, snapshot) {
                tracing::warn!("prefix cache: cannot store a generated block: {e}");
            }
            told(&mut self.mirror, StoreOp::Store { batch: Running, id: seq.id, len, snapshot });
        }
    }

    /// The sequences of the running rows not in `keep` go to the prefix cache (what the next turn
    /// of a conversation starts with), unless their state is in doubt (a failed step). The
    /// batch's only row, leaving it empty, has its buffers kept whole for the conversation's
    /// next turn (the batch lets go of them right after).
    pub fn leaving(&mut self, running: &Batch, keep: &[usize]) {
        let Some(prefix) = self.prefix.as_mut() else { return };
        let lengths = running.lengths();
        for (row, seq) in running.seqs.iter().enumerate() {
            if keep.contains(&row) || seq.finished == Some(FinishReason::Error) {
                continue;
            }
            let Some(&len) = lengths.get(row) else { continue };
            let tokens = seq.cache_tokens();
            let len = (len.max(0) as usize).min(tokens.len());
            if let Err(e) = prefix.store_row(&tokens[..len], &running.cache, row, true) {
                tracing::warn!("prefix cache: cannot store a finished sequence: {e}");
            }
            told(&mut self.mirror, StoreOp::Store { batch: Running, id: seq.id, len, snapshot: true });
            if keep.is_empty() && running.len() == 1 {
                let caches: Option<Vec<_>> = running.cache.iter().map(BatchKvCache::only_row).collect();
                if let Some(caches) = caches {
                    prefix.keep_hot(&tokens[..len], caches);
                    told(&mut self.mirror, StoreOp::KeepHot { batch: Running, id: seq.id, len });
                }
            }
        }
    }

    /// A running row's reservation grows to cover `tokens` positions, when the budget has room
    /// (the prefix cache gives way) or `force` (the only row left, which its own reservation
    /// bounds: its length was capped at what the budget holds). False: park a row first.
    pub fn grow(&mut self, seq: &mut Sequence, tokens: usize, force: bool) -> bool {
        let added = self.footprint.bytes(tokens).saturating_sub(self.footprint.bytes(seq.kv.tokens));
        if self.reserved + added > self.budget && !force {
            return false;
        }
        self.reserved += added;
        seq.kv.bytes += added;
        seq.kv.tokens = tokens;
        if let Some(prefix) = self.prefix.as_mut() {
            prefix.shrink_to(self.budget.saturating_sub(self.reserved));
        }
        true
    }

    /// The footprint reservations are computed with.
    pub fn footprint(&self) -> KvFootprint {
        self.footprint
    }

    /// Gives back a finished or abandoned sequence's reservation.
    pub fn release(&mut self, seq: &Sequence) {
        if seq.kv.held {
            self.reserved -= seq.kv.bytes;
        }
    }

    /// Key/value bytes admitted rows are owed and do not hold yet (their reservations less what
    /// their buffers and the shared segment hold): what their decode steps will still allocate.
    pub fn pending_growth(&self, group: &Batch, running: &Batch) -> usize {
        let held: usize = group.cache.iter().chain(&running.cache).map(BatchKvCache::nbytes).sum();
        self.reserved.saturating_sub(held + self.shared_segment_bytes())
    }

    /// The prefix cache's RAM tier gives up `bytes` (or all it holds) for a step that needs
    /// them; returns what it gave.
    pub fn give_way(&mut self, bytes: usize) -> usize {
        let Some(prefix) = self.prefix.as_mut() else { return 0 };
        let held = prefix.stats().bytes;
        prefix.shrink_to(held.saturating_sub(bytes));
        held - prefix.stats().bytes
    }

    /// The shared segment's layers, when there is one.
    pub fn shared_layers(&self) -> Option<&[SharedKv]> {
        self.shared.as_ref().map(|s| s.layers.as_slice())
    }

    /// How many leading tokens of `tokens` the kept buffers hold (`None`: no prefix cache).
    pub fn hot_shares(&self, tokens: &[u32]) -> Option<usize> {
        self.prefix.as_ref().map(|p| p.hot_shares(tokens))
    }

    pub fn clear_prefix_cache(&mut self) {
        if let Some(prefix) = self.prefix.as_mut() {
            prefix.clear();
            told(&mut self.mirror, StoreOp::Clear);
        }
    }

    pub fn report(&self) -> KvReport {
        KvReport {
            reserved: self.reserved,
            shared_bytes: self.shared_segment_bytes(),
            prefix: self.prefix.as_ref().map(PrefixCache::stats),
        }
    }

    /// Everything was cancelled: nothing is reserved, no segment is shared.
    pub fn shut_down(&mut self) {
        self.shared = None;
        self.reserved = 0;
    }
}

/// The prefix cache of `model` (the layers this process holds) serving `context_length`
/// tokens, at most `budget` bytes in RAM and the disk tier `config` names; `None` when off.
pub fn prefix_cache_for(
    model: &LoadedModel,
    context_length: usize,
    config: &EngineConfig,
    budget: usize,
) -> Option<PrefixCache> {
    let t = &model.transformer;
    let disk = config.prefix_cache_disk.as_ref().map(|(dir, bytes)| (dir.as_path(), *bytes));
    (budget > 0).then(|| {
        PrefixCache::new(
            model_identity(model, context_length, config.kv_format),
            budget,
            disk,
            &model.path.display().to_string(),
            t.cache_windows(),
            (0..t.cache_count()).map(|i| t.config.is_recurrent(t.first_layer() + i)).collect(),
            config.kv_format,
        )
    })
}

/// Keeps a store for the other ranks of a cluster (a free function: the prefix cache is
/// borrowed beside it).
fn told(mirror: &mut Option<Vec<StoreOp>>, op: StoreOp) {
    if let Some(ops) = mirror.as_mut() {
        ops.push(op);
    }
}

/// Tokens of text shown on each side of a cache miss.
const MISS_CONTEXT: usize = 12;

/// Why a request reused less than a cached sequence offered: told when the cached text picks
/// up again right after the divergence (the same conversation, edited), not for every prompt
/// that merely starts like another one.
fn explain_miss(d: Divergence, request: &Request, tokenizer: &Tokenizer) -> Option<CacheMiss> {
    let prompt = &request.prompt_ids;
    if !d.resumes || d.position + 1 >= prompt.len() {
        return None;
    }
    let text = |ids: &[u32]| tokenizer.decode(ids, false).unwrap_or_default();
    let chars_before = text(&prompt[..d.position]).chars().count();
    let message = request.prompt_parts.iter().rposition(|&start| start <= chars_before);
    Some(CacheMiss {
        position: d.position,
        cached_through: d.cached_through,
        message,
        before: text(&prompt[d.position.saturating_sub(MISS_CONTEXT)..d.position]),
        after: text(&prompt[d.position..(d.position + MISS_CONTEXT).min(prompt.len())]),
    })
}
