//! The prefix cache: keys and values of sequences already computed, kept in fixed-size token
//! blocks, so a prompt that starts the way an earlier one did (an agent's next turn, a second
//! conversation with the same system prompt, another request running now) prefills only what
//! is new.
//!
//! - Blocks are keyed by a hash chain over the model's identity and every token up to the end
//!   of the block (`key`), held in a tree with LRU eviction (`store`).
//! - What is stored: each prompt's blocks as soon as they are prefilled (so a concurrent request
//!   reuses them), and every request's whole sequence — prompt and answer — when it leaves the
//!   batch, finished or cancelled (a failed step's state is never stored).
//! - A block holds one `[1, H, n, D]` copy of the keys and values of each layer: a copy, not a
//!   view, so a cached block never keeps a request's (much larger) buffers alive. A restore
//!   copies them once into the request's own cache (the dense batch buffers need them
//!   contiguous), sized for the whole prompt; a windowed layer gets only its window.
//! - A block is stored with every layer or not at all: windowed layers drop old keys as a
//!   sequence grows, so the engine stores each block as soon as a step completes it. A recurrent
//!   layer's entry is a snapshot of its state at the block's end, or a placeholder (hybrids
//!   resume only at a snapshot: `find_resumable`).
//! - The identity covers everything that changes the numbers: the weight files (size and
//!   modification time), the configuration, the compute dtype, the weights' in-memory form and
//!   the KV format (a quantized block never serves a full-precision engine, or the reverse).
//! - Blocks are kept in the form the row held them in: quantized (2-4x smaller, in RAM and on
//!   disk) once the row's keys and values were; a restore into a row due to be quantized
//!   quantizes those that were not yet (each column on its own: the same numbers).
//!   Tokens are the key, so a changed chat template or tokenizer cannot give a wrong state.

mod block_file;
mod disk;
mod key;
mod store;

use std::path::{Path, PathBuf};

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use block_file::{BlockFile, Tensor};
use disk::DiskTier;
pub use disk::{list_folders, DiskFolder, DiskStats};
use key::chain;
pub use key::{model_identity, BlockKey};
pub use store::Divergence;
use store::{BlockStore, Found, Payload};

use crate::model::cache::{spare_capacity, window_keep, Buffers};
use crate::model::{BatchKvCache, KvCache, KvFormat, KvTensor};

/// Tokens per block: small enough that little is lost where prompts diverge, large enough that a
/// 30k-token prompt is a few hundred lookups.
pub const BLOCK_TOKENS: usize = 64;

/// A model with recurrent layers keeps their state every this many tokens of a sequence (and
/// where a prompt or a sequence ends): a snapshot of Qwen3-Next-80B's is ~75 MB, so a
/// 30k-token prompt keeps seven, not one per block.
pub const SNAPSHOT_TOKENS: usize = 4096;

type Result<T> = std::result::Result<T, crate::model::ModelError>;

/// A block's keys and values in every layer.
struct LayerBlocks {
    /// Per layer cache: the block's keys and values, `[1, H, n, D]` (quantized or not); a
    /// recurrent layer's state at the block's end (convolution inputs, matrices) when
    /// `snapshot`, else nothing (an empty placeholder).
    layers: Vec<(KvTensor, KvTensor)>,
    /// Views of the segment the batch shares (`segment`), whose bytes the engine reserves: 0
    /// here while it lives.
    in_segment: bool,
    snapshot: bool,
}

impl Payload for LayerBlocks {
    fn bytes(&self) -> usize {
        if self.in_segment {
            return 0;
        }
        self.layers.iter().map(|(k, v)| k.nbytes() + v.nbytes()).sum()
    }

    fn covered_by_longer(&self) -> bool {
        !self.snapshot
    }

    fn resumable_at_end(&self) -> bool {
        self.snapshot
    }
}

/// A prompt's cached start, restored into a fresh per-layer cache.
pub struct Restored {
    /// Tokens restored (0: nothing cached).
    pub tokens: usize,
    pub caches: Vec<KvCache>,
    /// Where the prompt left a cached sequence that went on differently.
    pub divergence: Option<Divergence>,
}

/// Counters for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Requests that reused at least one token, and those that reused none.
    pub hits: u64,
    pub misses: u64,
    pub tokens_reused: u64,
    /// The RAM tier.
    pub bytes: usize,
    pub blocks: usize,
    pub evictions: u64,
    pub disk: DiskStats,
}

/// Where the disk tier lives, when there is one: `FASTMLX_CACHE_DIR`, else the platform cache
/// folder (`~/Library/Caches/FastMLX` on macOS, `~/.cache/FastMLX` on Linux), `prefix/` in it.
pub fn default_disk_dir() -> Option<PathBuf> {
    let base = std::env::var_os("FASTMLX_CACHE_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| directories::ProjectDirs::from("", "", "FastMLX").map(|d| d.cache_dir().to_path_buf()))?;
    Some(base.join("prefix"))
}

/// The last sequence that left a batch alone, its buffers kept as they were (no copy): the next
/// turn of that conversation takes them over instead of copying its blocks back.
struct Hot {
    tokens: Vec<u32>,
    caches: Vec<KvCache>,
}

impl Hot {
    fn bytes(&self) -> usize {
        self.caches.iter().map(KvCache::nbytes).sum()
    }
}

pub struct PrefixCache {
    store: BlockStore<LayerBlocks>,
    /// The blocks that are views of the batch's shared segment (`segment`).
    segment_blocks: Vec<BlockKey>,
    hot: Option<Hot>,
    /// Per layer cache: its attention window (`None`: it sees the whole sequence)...
    windows: Vec<Option<usize>>,
    /// ...and whether it keeps a recurrent state (linear-attention hybrids), which a lookup
    /// can resume only at a block end where a snapshot of it was stored.
    recurrent: Vec<bool>,
    /// Most bytes held (the scheduler lowers what it may use when requests need the room).
    budget: usize,
    disk: Option<DiskTier>,
    /// How the engine's caches store keys and values (restores are made in it).
    format: KvFormat,
    hits: u64,
    misses: u64,
    tokens_reused: u64,
}

impl PrefixCache {
    /// A cache of at most `budget` bytes in RAM, and `disk` (folder and bytes) when given, for
    /// a model whose layer caches have attention windows `windows` and keep recurrent states
    /// where `recurrent` says, and store keys and values in `format`.
    pub fn new(
        identity: BlockKey,
        budget: usize,
        disk: Option<(&Path, u64)>,
        model: &str,
        windows: Vec<Option<usize>>,
        recurrent: Vec<bool>,
        format: KvFormat,
    ) -> PrefixCache {
        let disk = disk.and_then(|(dir, bytes)| DiskTier::open(dir, identity, bytes, model, recurrent.clone()));
        PrefixCache {
            store: BlockStore::new(identity, BLOCK_TOKENS),
            segment_blocks: Vec::new(),
            hot: None,
            windows,
            recurrent,
            budget,
            disk,
            format,
            hits: 0,
            misses: 0,
            tokens_reused: 0,
        }
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits,
            misses: self.misses,
            tokens_reused: self.tokens_reused,
            bytes: self.bytes(),
            blocks: self.store.block_count(),
            evictions: self.store.evictions,
            disk: self.disk.as_ref().map(DiskTier::stats).unwrap_or_default(),
        }
    }

    pub fn bytes(&self) -> usize {
        self.store.bytes() + self.hot.as_ref().map_or(0, Hot::bytes)
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Evicts until at most `bytes` are held (never more than the budget): the kept sequence's
    /// buffers first (its blocks stay), then blocks, least recently used first.
    pub fn shrink_to(&mut self, bytes: usize) {
        let bytes = bytes.min(self.budget);
        if self.bytes() > bytes {
            self.hot = None;
        }
        self.store.shrink_to(bytes);
    }

    /// Keeps the buffers of a sequence that left the batch alone (its blocks are stored too):
    /// `caches` share them with nothing once the batch lets go.
    pub fn keep_hot(&mut self, tokens: &[u32], caches: Vec<KvCache>) {
        let hot = Hot { tokens: tokens.to_vec(), caches };
        let room = self.budget.saturating_sub(self.store.bytes());
        self.hot = (hot.bytes() <= room && hot.caches.iter().all(|c| c.len() as usize == tokens.len())).then_some(hot);
    }

    /// How many leading tokens of `tokens` the kept buffers hold (0 when none are kept).
    pub fn hot_shares(&self, tokens: &[u32]) -> usize {
        self.hot.as_ref().map_or(0, |h| h.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count())
    }

    /// Empties both tiers.
    pub fn clear(&mut self) {
        self.hot = None;
        self.store.clear();
        if let Some(disk) = self.disk.as_mut() {
            disk.clear();
        }
    }

    /// Brings the blocks of `prompt[..limit]` that are on disk but not in RAM into RAM: the
    /// whole blocks along the prompt, then the candidates for the block where it diverges.
    fn pull_from_disk(&mut self, prompt: &[u32], limit: usize) {
        self.pull_from_disk_after(self.store.root(), &prompt[..limit.min(prompt.len())]);
    }

    /// [`Self::pull_from_disk`] for `tokens` that follow block `parent`. A model with recurrent
    /// layers also takes, at every block along the way, the partial blocks with a snapshot that
    /// `tokens` go through (where an earlier prompt or sequence ended): a lookup resumes only
    /// at such a block, even where the prompt goes on along a longer sequence's whole blocks.
    fn pull_from_disk_after(&mut self, parent: BlockKey, tokens: &[u32]) {
        let recurrent = self.recurrent.contains(&true);
        let Some(disk) = self.disk.as_mut() else { return };
        let mut parent = parent;
        let mut matched = 0;
        for chunk in tokens.chunks_exact(BLOCK_TOKENS) {
            if recurrent {
                for (key, block_tokens) in disk.children(&parent) {
                    let passed = block_tokens.len() < BLOCK_TOKENS && tokens[matched..].starts_with(&block_tokens);
                    let wanted =
                        passed && disk.has_snapshot(&key) && !self.store.get(&key).is_some_and(|b| b.2.snapshot);
                    let Some(payload) = wanted.then(|| disk.read(&key)).flatten().as_ref().and_then(payload_of) else {
                        continue;
                    };
                    if self.store.contains(&key) {
                        self.store.replace_payload(&key, payload);
                    } else {
                        self.store.insert_block(parent, block_tokens, payload);
                    }
                }
            }
            let key = chain(&parent, chunk);
            // A block in RAM without the snapshot its file keeps (stored again by a prefill
            // after RAM let the snapshot go) takes the file's.
            let snapshot_on_disk = disk.has_snapshot(&key) && self.store.get(&key).is_some_and(|(_, _, p)| !p.snapshot);
            if snapshot_on_disk {
                if let Some(payload) = disk.read(&key).as_ref().and_then(payload_of) {
                    self.store.replace_payload(&key, payload);
                }
            } else if !self.store.contains(&key) {
                let Some(block) = disk.contains(&key).then(|| disk.read(&key)).flatten() else { break };
                let Some(payload) = payload_of(&block) else { break };
                self.store.insert_block(parent, block.tokens, payload);
            }
            parent = key;
            matched += BLOCK_TOKENS;
        }
        let rest = &tokens[matched..];
        for (key, block_tokens) in disk.children(&parent) {
            let shares = block_tokens.first().is_some_and(|t| rest.first() == Some(t));
            // In RAM already, unless without the snapshot its file keeps (hybrids).
            let lacks_snapshot =
                recurrent && disk.has_snapshot(&key) && self.store.get(&key).is_some_and(|b| !b.2.snapshot);
            if shares && (!self.store.contains(&key) || lacks_snapshot) {
                if let Some(payload) = disk.read(&key).as_ref().and_then(payload_of) {
                    if self.store.contains(&key) {
                        self.store.replace_payload(&key, payload);
                    } else {
                        self.store.insert_block(parent, block_tokens, payload);
                    }
                }
            }
        }
        self.store.shrink_to(self.budget);
    }

    /// A prompt whose start is on disk only (the first request after a restart, or after RAM
    /// evicted it): its blocks are read straight into the request's new caches, one copy from
    /// the page cache, instead of into the RAM tier and copied again from there (page faults
    /// on fresh memory make each copy of a long prompt's keys and values cost ~0.1 s here).
    /// `None` when the RAM tier or the kept buffers hold its first block, or nothing is on disk.
    /// (A model with recurrent layers resumes at a snapshot, and quantized blocks are read whole:
    /// their blocks go through the RAM tier.)
    fn restore_from_disk(&mut self, prompt: &[u32], limit: usize, layers: usize) -> Result<Option<Restored>> {
        if self.recurrent.contains(&true) || self.format.quant.is_some() {
            return Ok(None);
        }
        let tokens = &prompt[..limit.min(prompt.len())];
        let root = self.store.root();
        let Some(first) = tokens.chunks_exact(BLOCK_TOKENS).next().map(|chunk| chain(&root, chunk)) else {
            return Ok(None);
        };
        let in_ram = self.store.contains(&first) || self.hot_shares(tokens) >= BLOCK_TOKENS;
        let Some(disk) = self.disk.as_mut().filter(|d| !in_ram && d.contains(&first)) else { return Ok(None) };
        // Whole blocks by key, then the stored block that shares most of the rest (mid-block
        // reuse, as the RAM tier's lookup does).
        let (mut plan, mut parent, mut matched) = (Vec::new(), root, 0);
        for chunk in tokens.chunks_exact(BLOCK_TOKENS) {
            let key = chain(&parent, chunk);
            if !disk.contains(&key) {
                break;
            }
            plan.push((key, BLOCK_TOKENS));
            (parent, matched) = (key, matched + BLOCK_TOKENS);
        }
        let rest = &tokens[matched..];
        let mut divergence = None;
        let best = disk
            .children(&parent)
            .into_iter()
            .map(|(key, cached)| (cached.iter().zip(rest).take_while(|(a, b)| a == b).count(), cached, key));
        if let Some((common, cached, key)) = best.max_by_key(|(common, cached, _)| (*common, usize::MAX - cached.len()))
        {
            if common > 0 {
                plan.push((key, common));
            }
            if common < cached.len() && common < rest.len() {
                let resumes = store::resumes(&cached[common..], &rest[common..]);
                divergence =
                    Some(Divergence { position: matched + common, cached_through: matched + cached.len(), resumes });
            }
        }
        let Some(shapes) = disk.layer_shapes(&first).filter(|s| s.len() == 2 * layers) else { return Ok(None) };
        let total: usize = plan.iter().map(|(_, n)| n).sum();
        let capacity = spare_capacity(total.max(prompt.len()) as i32);
        let mut buffers = shapes
            .iter()
            .map(|&(dtype, heads, dim)| mlx_rs::ops::zeros_dtype(&[1, heads, capacity, dim], dtype))
            .collect::<std::result::Result<Vec<Array>, _>>()?;
        mlx_rs::transforms::eval(&buffers)?;
        let mut column = 0;
        {
            let Some(mut dest) = buffers
                .iter_mut()
                .map(|b| Some((b.dtype(), crate::mlx::exclusive_bytes(b)?)))
                .collect::<Option<Vec<_>>>()
            else {
                return Ok(None);
            };
            for (key, used) in &plan {
                if !disk.read_into(key, &mut dest, capacity as usize, column, *used) {
                    divergence = None;
                    break;
                }
                column += used;
            }
        }
        if column == 0 {
            return Ok(None);
        }
        let mut buffers = buffers.into_iter();
        let caches = (0..layers)
            .map(|layer| {
                let (keys, values) = (buffers.next(), buffers.next());
                let (keys, values) = (keys.map(KvTensor::Dense), values.map(KvTensor::Dense));
                let buffers = Buffers { keys, values, quant: None };
                let mut cache = KvCache::from_buffers(buffers, column as i32, self.format);
                if let Some(w) = self.window(layer) {
                    cache.keep_window(w)?;
                }
                Ok(cache)
            })
            .collect::<Result<_>>()?;
        Ok(Some(Restored { tokens: column, caches, divergence }))
    }

    fn window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }

    fn is_recurrent(&self, layer: usize) -> bool {
        self.recurrent.get(layer).copied().unwrap_or(false)
    }

    /// The cached start of `prompt`, at most `limit` tokens, in new caches for `layers` layers
    /// (not counted in the hit figures: a request's lookup is, by `count`).
    pub fn restore(&mut self, prompt: &[u32], limit: usize, layers: usize) -> Result<Restored> {
        if let Some(restored) = self.restore_from_disk(prompt, limit, layers)? {
            return Ok(restored);
        }
        self.pull_from_disk(prompt, limit);
        // A model with recurrent layers resumes only where their state was kept.
        let found = if self.recurrent.contains(&true) {
            self.store.find_resumable(prompt, limit)
        } else {
            self.store.find(prompt, limit)
        };
        let format = self.format;
        let mut caches: Vec<KvCache> = (0..layers).map(|_| KvCache::with_format(format)).collect();
        let found = fit_format(found, format);
        let (tokens, divergence) = (found.tokens, found.divergence);
        let shared = self
            .hot
            .as_ref()
            .map_or(0, |h| h.tokens.iter().zip(&prompt[..limit.min(prompt.len())]).take_while(|(a, b)| a == b).count());
        let windows = &self.windows;
        let resumes = |hot: &Hot, at: usize| {
            hot.caches.len() == layers
                && hot
                    .caches
                    .iter()
                    .enumerate()
                    .all(|(l, c)| c.resumes_at(at as i32, windows.get(l).copied().flatten()))
        };
        // Quantized buffers serve only a prompt past the start (see `fit_format`).
        let in_format =
            |hot: &Hot| format.due(shared as i32).is_some() || hot.caches.iter().all(|c| c.buffers().quant.is_none());
        let usable =
            self.hot.as_ref().is_some_and(|hot| shared >= tokens.max(1) && resumes(hot, shared) && in_format(hot));
        match self.hot.take() {
            Some(mut hot) if usable => {
                // The conversation's own buffers, cut back to what the prompt shares: no copy.
                let tokens = shared;
                hot.caches.iter_mut().for_each(|c| c.truncate(tokens as i32));
                return Ok(Restored { tokens, caches: hot.caches, divergence });
            }
            hot => self.hot = hot,
        }
        if tokens > 0 {
            caches = gather(&found.blocks, layers, prompt.len(), &self.windows, &self.recurrent, format)?;
        }
        Ok(Restored { tokens, caches, divergence })
    }

    /// The first `len` tokens of `prompt` (whole blocks) as one `[1, H, len, D]` copy per layer
    /// (a segment rows share), when the cache holds all of them. The cached blocks become views
    /// of it, so those keys and values are in memory once, for the cache and the batch, until
    /// `release_segment`.
    /// In the format `len` tokens are due (see [`KvFormat`]), or quantized when the blocks are.
    pub fn segment(&mut self, prompt: &[u32], len: usize, layers: usize) -> Result<Option<Vec<(KvTensor, KvTensor)>>> {
        self.release_segment()?;
        // Hybrids share no segment (their state is per row): nothing to read from disk for one.
        if self.recurrent.contains(&true) {
            return Ok(None);
        }
        self.pull_from_disk(prompt, len);
        let found = fit_format(self.store.find(prompt, len), self.format);
        let whole = found.blocks.iter().all(|(_, n)| *n == BLOCK_TOKENS);
        if found.tokens < len
            || !whole
            || found.blocks.first().is_some_and(|(b, _)| b.layers.len() != layers)
            || self.recurrent.contains(&true)
        {
            return Ok(None);
        }
        // Exactly `len` columns, contiguous: attention reads it as `[H, len, D]` every step.
        let mut out = Vec::with_capacity(layers);
        for layer in 0..layers {
            let (keys, values) = pieces(&found.blocks, 0, layer)?;
            let quant = self.format.due(len as i32).or_else(|| keys.iter().find_map(KvTensor::quant));
            let joined = |pieces: &[KvTensor]| -> Result<KvTensor> {
                let pieces = pieces.iter().map(|p| p.in_format(quant)).collect::<Result<Vec<_>>>()?;
                KvTensor::concatenate(&pieces, 2)
            };
            out.push((joined(&keys)?, joined(&values)?));
        }
        mlx_rs::transforms::eval(out.iter().flat_map(|(k, v)| k.parts().into_iter().chain(v.parts())))?;
        let keys = found.keys;
        for (i, key) in keys.iter().enumerate() {
            let columns = (i * BLOCK_TOKENS) as i32..((i + 1) * BLOCK_TOKENS) as i32;
            let views = out
                .iter()
                .map(|(k, v)| {
                    let view = |t: &KvTensor| t.map(|a| Ok(a.try_index((.., .., columns.clone(), ..))?));
                    Ok((view(k)?, view(v)?))
                })
                .collect::<Result<Vec<_>>>()?;
            self.store.replace_payload(key, LayerBlocks { layers: views, in_segment: true, snapshot: false });
        }
        self.segment_blocks = keys;
        Ok(Some(out))
    }

    /// The batch let go of its shared segment: the blocks that were views of it become copies
    /// of their own (a view would keep the whole segment in memory) and count again.
    pub fn release_segment(&mut self) -> Result<()> {
        for key in std::mem::take(&mut self.segment_blocks) {
            let Some((_, _, payload)) = self.store.get(&key) else { continue };
            let snapshot = payload.snapshot;
            let own = |t: &KvTensor| t.map(|a| Ok(a.contiguous()?));
            let layers = payload.layers.iter().map(|(k, v)| Ok((own(k)?, own(v)?))).collect::<Result<Vec<_>>>()?;
            mlx_rs::transforms::eval(layers.iter().flat_map(|(k, v)| k.parts().into_iter().chain(v.parts())))?;
            self.store.replace_payload(&key, LayerBlocks { layers, in_segment: false, snapshot });
        }
        self.store.shrink_to(self.budget);
        Ok(())
    }

    /// What the cache holds of `prompt[skip..limit]`, for a request whose first `skip` tokens
    /// (whole blocks) are in a shared segment: new caches for the tokens after them, and how
    /// many tokens of the prompt are covered in all (at least `skip`). Looked up (and read from
    /// disk) after the segment only: its own blocks are not needed.
    pub fn restore_after(&mut self, prompt: &[u32], limit: usize, layers: usize, skip: usize) -> Result<Restored> {
        let limit = limit.min(prompt.len());
        let format = self.format;
        let empty = || (0..layers).map(|_| KvCache::with_format(format)).collect::<Vec<_>>();
        if !skip.is_multiple_of(BLOCK_TOKENS) || skip >= limit {
            return Ok(Restored { tokens: skip.min(limit), caches: empty(), divergence: None });
        }
        let parent = prompt[..skip].chunks_exact(BLOCK_TOKENS).fold(self.store.root(), |p, chunk| chain(&p, chunk));
        let rest = &prompt[skip..limit];
        self.pull_from_disk_after(parent, rest);
        let found = self.store.find_from(parent, rest);
        // The segment is past the start or held at full precision (see `segment`): the blocks after
        // it are too, or they are not used.
        let found = match format.due(skip as i32) {
            Some(_) => found,
            None => fit_format(found, KvFormat { start: format.start - skip as i32, ..format }),
        };
        let caches = if found.tokens > 0 {
            gather(&found.blocks, layers, prompt.len() - skip, &self.windows, &self.recurrent, format)?
        } else {
            empty()
        };
        let divergence = found.divergence.map(|d| Divergence {
            position: d.position + skip,
            cached_through: d.cached_through + skip,
            resumes: d.resumes,
        });
        Ok(Restored { tokens: skip + found.tokens, caches, divergence })
    }

    /// Counts a request's lookup that reused `tokens` (0: a miss) in the hit figures.
    pub fn count(&mut self, tokens: usize) {
        if tokens > 0 {
            self.hits += 1;
            self.tokens_reused += tokens as u64;
        } else {
            self.misses += 1;
        }
    }

    /// Stores the blocks of `tokens`, the sequence of batch row `row` (those a windowed layer
    /// no longer holds are stored only if they already were). With `snapshot`, the block that
    /// ends where the row is keeps its recurrent layers' state (models with recurrent layers:
    /// their other blocks keep none, and a lookup resumes only where one was kept).
    pub fn store_row(&mut self, tokens: &[u32], batch: &[BatchKvCache], row: usize, snapshot: bool) -> Result<()> {
        let mut sources = Vec::with_capacity(batch.len());
        for (l, layer) in batch.iter().enumerate() {
            if self.is_recurrent(l) {
                sources.push(Source::State(layer.row_states(row)?));
                continue;
            }
            let segments = layer.row_segments(row)?;
            if segments.is_empty() {
                return Ok(());
            }
            sources.push(Source::Kv(segments, layer.row_start(row).max(0) as usize));
        }
        let len = batch.first().and_then(|c| c.lengths().get(row).copied()).unwrap_or(0).max(0) as usize;
        self.store_from(tokens, &sources, len, snapshot)
    }

    /// `sources`: per layer, `[1, H, n, D]` keys and values that follow one another from a
    /// position on, up to at least `tokens`' end, or a recurrent state after `len` tokens.
    fn store_from(&mut self, tokens: &[u32], sources: &[Source], len: usize, snapshot: bool) -> Result<()> {
        let held = sources
            .iter()
            .filter_map(|s| match s {
                Source::Kv(segments, start) => {
                    Some(start + segments.iter().map(|(k, _)| k.dim(2) as usize).sum::<usize>())
                }
                Source::State(_) => None,
            })
            .min()
            .unwrap_or(len);
        let tokens = &tokens[..tokens.len().min(held)];
        let recurrent = sources.iter().any(|s| matches!(s, Source::State(_)));
        let snapshot_at = (recurrent && snapshot && tokens.len() == len && len > 0).then_some(len);
        let mut fresh: Vec<KvTensor> = Vec::new();
        let make = |start: usize, end: usize, fresh: &mut Vec<KvTensor>| -> Result<Option<LayerBlocks>> {
            let snap = snapshot_at == Some(end);
            let mut layers = Vec::with_capacity(sources.len());
            for source in sources {
                let pair = match source {
                    Source::Kv(_, from) if *from > start => return Ok(None),
                    Source::Kv(segments, from) => span(segments, (start - from) as i32, (end - from) as i32)?,
                    // One or two state arrays (short convolutions keep one).
                    Source::State(states) if snap && matches!(states.len(), 1 | 2) => {
                        let second = states.get(1).map_or(Ok(placeholder()), |s| s.contiguous())?;
                        (KvTensor::Dense(states[0].contiguous()?), KvTensor::Dense(second))
                    }
                    Source::State(_) if snap => return Ok(None),
                    Source::State(_) => (KvTensor::Dense(placeholder()), KvTensor::Dense(placeholder())),
                };
                fresh.extend([pair.0.clone(), pair.1.clone()]);
                layers.push(pair);
            }
            Ok(Some(LayerBlocks { layers, in_segment: false, snapshot: snap }))
        };
        let mut added = self.store.insert(tokens, |start, end| make(start, end, &mut fresh))?;
        // A block stored earlier without the snapshot this one ends with takes it now.
        if let Some(end) = snapshot_at {
            let key = tokens.chunks(BLOCK_TOKENS).fold(self.store.root(), |parent, chunk| chain(&parent, chunk));
            let start = (end - 1) / BLOCK_TOKENS * BLOCK_TOKENS;
            if self.store.get(&key).is_some_and(|(_, _, p)| !p.snapshot) {
                if let Some(payload) = make(start, end, &mut fresh)? {
                    self.store.replace_payload(&key, payload);
                    added.push(key);
                }
            }
        }
        // Materialised now, so that the blocks stop referring to the request's buffers.
        if !fresh.is_empty() {
            mlx_rs::transforms::eval(fresh.iter().flat_map(KvTensor::parts))?;
        }
        // Written through to disk (by the disk tier's thread), so a restart finds them.
        if let Some(disk) = self.disk.as_mut() {
            for key in &added {
                let Some((parent, tokens, payload)) = self.store.get(key) else { continue };
                let tensors = |t: &KvTensor| t.parts().into_iter().map(Tensor::from_array).collect::<Option<Vec<_>>>();
                let layers: Option<Vec<_>> =
                    payload.layers.iter().map(|(k, v)| Some((tensors(k)?, tensors(v)?))).collect();
                let quant = payload.layers.iter().find_map(|(k, _)| k.quant());
                if let Some(layers) = layers {
                    let snapshot = payload.snapshot;
                    disk.write(*key, BlockFile { parent: *parent, tokens: tokens.to_vec(), layers, snapshot, quant });
                }
            }
        }
        self.store.shrink_to(self.budget);
        Ok(())
    }
}

/// `found` cut to what a request in `format` may use: a hit shorter than the start (whose prefill
/// goes on at full precision) takes only the blocks held at full precision, since a cold prefill
/// would have those keys and values unrounded; past the start, every block serves (those at full
/// precision are quantized as they are restored: the same numbers as converting them in place).
fn fit_format(mut found: Found<'_, LayerBlocks>, format: KvFormat) -> Found<'_, LayerBlocks> {
    if format.quant.is_none() || found.tokens >= format.start.max(0) as usize {
        return found;
    }
    let dense = |b: &LayerBlocks| b.layers.iter().all(|(k, v)| k.quant().is_none() && v.quant().is_none());
    let usable = found.blocks.iter().take_while(|(b, _)| dense(b)).count();
    if usable < found.blocks.len() {
        found.blocks.truncate(usable);
        found.keys.truncate(usable);
        found.tokens = found.blocks.iter().map(|(_, n)| n).sum();
        found.divergence = None;
    }
    found
}

/// What a row gives a block, per layer: keys and values (its segments, from a position on), or
/// a recurrent layer's state where the row is.
enum Source {
    Kv(Vec<(KvTensor, KvTensor)>, usize),
    State(Vec<Array>),
}

/// What a recurrent layer's entry holds in a block without a snapshot (and a short convolution's
/// missing second state).
fn placeholder() -> Array {
    Array::from_slice(&[0f32], &[1])
}

/// Columns `start..end` of segments that follow one another, as one contiguous copy.
fn span(segments: &[(KvTensor, KvTensor)], start: i32, end: i32) -> Result<(KvTensor, KvTensor)> {
    let (mut keys, mut values, mut at) = (Vec::new(), Vec::new(), 0);
    for (k, v) in segments {
        let (from, to) = ((start - at).max(0), (end - at).min(k.dim(2)));
        if from < to {
            keys.push(k.map(|a| Ok(a.try_index((.., .., from..to, ..))?))?);
            values.push(v.map(|a| Ok(a.try_index((.., .., from..to, ..))?))?);
        }
        at += k.dim(2);
    }
    // A row's segments are in one format (the batch's) unless the shared one is not: then the
    // block takes the row's own.
    let quant = keys.last().and_then(KvTensor::quant);
    let one = |parts: Vec<KvTensor>| -> Result<KvTensor> {
        let mut parts = parts.iter().map(|p| p.in_format(quant)).collect::<Result<Vec<_>>>()?;
        Ok(if parts.len() == 1 {
            parts.pop().expect("one").map(|a| Ok(a.contiguous()?))?
        } else {
            KvTensor::concatenate(&parts, 2)?
        })
    };
    Ok((one(keys)?, one(values)?))
}

/// Found blocks in new caches for `layers` layers: one copy, with room for `room_for`
/// positions (the rest of a prompt) so that its prefill writes in place; a layer with a window
/// (`windows`) gets only the tokens it keeps, a recurrent one (`recurrent`) the last block's
/// snapshot of its state.
fn gather(
    blocks: &[(&LayerBlocks, usize)],
    layers: usize,
    room_for: usize,
    windows: &[Option<usize>],
    recurrent: &[bool],
    format: KvFormat,
) -> Result<Vec<KvCache>> {
    let total: usize = blocks.iter().map(|(_, n)| n).sum();
    let mut caches = Vec::with_capacity(layers);
    for layer in 0..layers {
        if recurrent.get(layer).copied().unwrap_or(false) {
            let (conv, state) = blocks.last().map(|(b, _)| b.layers[layer].clone()).unzip();
            let dense = |t: KvTensor| t.dense().ok();
            // A placeholder (one dimension) stands for a layer's missing second state.
            let states =
                conv.and_then(dense).into_iter().chain(state.and_then(dense).filter(|s| s.ndim() > 1)).collect();
            caches.push(KvCache::recurrent(states, total as i32));
            continue;
        }
        let cache = match windows.get(layer).copied().flatten() {
            Some(w) => {
                let skip = total.saturating_sub(window_keep(w) as usize);
                let (keys, values) = pieces(blocks, skip, layer)?;
                KvCache::from_pieces(&keys, &values, 0, format)?.starting_at(skip as i32)
            }
            None => {
                let (keys, values) = pieces(blocks, 0, layer)?;
                KvCache::from_pieces(&keys, &values, room_for as i32, format)?
            }
        };
        caches.push(cache);
    }
    let held: Vec<KvTensor> =
        caches.iter().flat_map(|c| c.contents().ok().flatten().map(|(k, v)| [k, v])).flatten().collect();
    mlx_rs::transforms::eval(held.iter().flat_map(KvTensor::parts))?;
    Ok(caches)
}

/// Layer `layer`'s keys and values of positions `skip..` of found blocks, as views.
fn pieces(blocks: &[(&LayerBlocks, usize)], skip: usize, layer: usize) -> Result<(Vec<KvTensor>, Vec<KvTensor>)> {
    let (mut keys, mut values, mut at) = (Vec::new(), Vec::new(), 0);
    for (block, n) in blocks {
        let (k, v) = &block.layers[layer];
        let (from, to) = (skip.saturating_sub(at) as i32, *n as i32);
        at += n;
        if from >= to {
            continue;
        }
        let whole = from == 0 && k.dim(2) == to;
        let cut = |t: &KvTensor| t.map(|a| Ok(a.try_index((.., .., from..to, ..))?));
        keys.push(if whole { k.clone() } else { cut(k)? });
        values.push(if whole { v.clone() } else { cut(v)? });
    }
    Ok((keys, values))
}

/// A block read from disk as arrays.
fn payload_of(block: &BlockFile) -> Option<LayerBlocks> {
    let tensor = |parts: &[Tensor]| -> Option<KvTensor> {
        match (parts, block.quant) {
            ([one], _) => Some(KvTensor::Dense(one.to_array())),
            ([packed, scales, biases], Some(quant)) => Some(KvTensor::Quantized {
                packed: packed.to_array(),
                scales: scales.to_array(),
                biases: biases.to_array(),
                quant,
            }),
            _ => None,
        }
    };
    let layers: Vec<(KvTensor, KvTensor)> =
        block.layers.iter().map(|(k, v)| Some((tensor(k)?, tensor(v)?))).collect::<Option<_>>()?;
    // The arrays copy the bytes when evaluated; do it now, while the bytes are alive.
    mlx_rs::transforms::eval(layers.iter().flat_map(|(k, v)| k.parts().into_iter().chain(v.parts()))).ok()?;
    Some(LayerBlocks { layers, in_segment: false, snapshot: block.snapshot })
}
