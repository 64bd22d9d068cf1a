//! Per-layer key/value cache for one sequence batch: `[batch, kv_heads, capacity, head_dim]`
//! buffers that grow in steps (not per token), written in place, read up to `offset`.
//!
//! A layer with an attention window (Gemma's and gpt-oss's local layers) needs only its last
//! `window` keys: once a step's worth of older columns piles up, the cache copies what it
//! still needs into smaller buffers and remembers how many tokens it dropped (`start`), so a
//! long sequence costs such a layer a bounded amount of memory (mlx-lm's `RotatingKVCache`
//! does the same by writing in a ring).

use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use crate::model::cache::{LayerCache, Positions};
use crate::model::error::Result;
use crate::model::layers::AttentionMask;

/// Buffers grow by this many positions at a time (as mlx-lm's `KVCache.step`).
const STEP: i32 = 256;

/// Columns to allocate for `used` columns: the next multiple of [`STEP`] above it, so at least
/// one step can be written in place.
pub(crate) fn spare_capacity(used: i32) -> i32 {
    (used / STEP + 1) * STEP
}

/// A windowed layer keeps at least this many of its latest tokens: at least one prefix-cache
/// block (64 tokens), so the block a step completes is still held when it is stored.
const WINDOW_FLOOR: i32 = 64;

/// Tokens a layer with attention window `window` keeps before new ones are written.
pub(crate) fn window_keep(window: usize) -> i32 {
    (window.min(i32::MAX as usize) as i32).max(WINDOW_FLOOR)
}

/// The leading columns of `used` that a layer with attention window `window` drops before the
/// next write: 0 until a whole step of them is no longer needed (one copy per step of tokens).
pub(crate) fn window_drop(used: i32, window: usize) -> i32 {
    let droppable = used - window_keep(window);
    if droppable >= STEP {
        droppable
    } else {
        0
    }
}

/// The most columns a windowed layer's buffers hold between two drops (before a prefill
/// chunk's new tokens): what it keeps, a step of columns it no longer needs, and spare room.
pub fn window_columns(window: usize) -> usize {
    (window_keep(window) + 2 * STEP) as usize
}

/// What one sequence's key/value caches take, by its length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvFootprint {
    /// Bytes per token in the layers that keep every token...
    pub full_per_token: usize,
    /// ...and in windowed layers, which hold at most `windowed_tokens` columns...
    pub windowed_per_token: usize,
    pub windowed_tokens: usize,
    /// ...and the recurrent layers' state, whatever the length (linear-attention hybrids).
    pub state_bytes: usize,
}

impl KvFootprint {
    /// Bytes for a sequence of `tokens` tokens.
    pub fn bytes(&self, tokens: usize) -> usize {
        let state = if tokens > 0 { self.state_bytes } else { 0 };
        self.full_per_token * tokens + self.windowed_per_token * tokens.min(self.windowed_tokens) + state
    }
}

/// Key and value buffers `[B, H, capacity, D]` that grow in steps of [`STEP`] columns.
#[derive(Default, Clone)]
pub(crate) struct Buffers {
    pub keys: Option<Array>,
    pub values: Option<Array>,
}

impl Buffers {
    /// Writes `keys`/`values` (`[B, H, L, D]`) at columns `at..at + L`, growing the buffers if
    /// needed, and returns columns `..at + L`.
    pub fn write(&mut self, at: i32, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let new = keys.dim(2);
        let needed = at + new;
        let capacity = self.keys.as_ref().map_or(0, |k| k.dim(2));
        if needed > capacity {
            let grow = spare_capacity(needed) - at;
            self.keys = Some(grow_buffer(self.keys.take(), keys, at, grow)?);
            self.values = Some(grow_buffer(self.values.take(), values, at, grow)?);
        }
        let (Some(k), Some(v)) = (self.keys.as_mut(), self.values.as_mut()) else {
            unreachable!("buffers allocated above");
        };
        k.try_index_mut((.., .., at..needed, ..), keys)?;
        v.try_index_mut((.., .., at..needed, ..), values)?;
        Ok((k.try_index((.., .., ..needed, ..))?, v.try_index((.., .., ..needed, ..))?))
    }

    /// Columns `..len` of both buffers (`None` while empty).
    pub fn prefix(&self, len: i32) -> Result<Option<(Array, Array)>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if len > 0 => {
                Ok(Some((k.try_index((.., .., ..len, ..))?, v.try_index((.., .., ..len, ..))?)))
            }
            _ => Ok(None),
        }
    }

    /// Keeps only columns `from..used`, copied into new buffers (with room for a step more),
    /// so that the old, larger ones are freed.
    pub fn drop_front(&mut self, from: i32, used: i32) -> Result<()> {
        let kept = used - from;
        let capacity = spare_capacity(kept + STEP - 1);
        let copy = |b: &Option<Array>| -> Result<Option<Array>> {
            let Some(b) = b else { return Ok(None) };
            let s = b.shape();
            let tail = zeros_dtype(&[s[0], s[1], capacity - kept, s[3]], b.dtype())?;
            Ok(Some(concatenate(&[b.try_index((.., .., from..used, ..))?, tail], 2)?))
        };
        let (keys, values) = (copy(&self.keys)?, copy(&self.values)?);
        mlx_rs::transforms::eval(keys.iter().chain(values.iter()))?;
        (self.keys, self.values) = (keys, values);
        Ok(())
    }

    /// Allocated bytes (capacity, not just the used part).
    pub fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Array::nbytes) + self.values.as_ref().map_or(0, Array::nbytes)
    }
}

/// The key/value cache of one sequence (batch of 1), for one layer.
#[derive(Default)]
pub struct KvCache {
    buffers: Buffers,
    /// Columns written so far.
    offset: i32,
    /// Tokens before the first column (dropped by a windowed layer): `start + offset` is the
    /// RoPE position of the next token.
    start: i32,
    /// A recurrent layer's state (it keeps no keys: `offset` counts its tokens).
    states: Vec<Array>,
}

impl KvCache {
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// A cache holding `keys`/`values` (`[1, H, L, D]`, built by one concatenation of
    /// `pieces`), with room for at least `room_for` tokens in all before it has to grow.
    pub fn from_pieces(keys: &[Array], values: &[Array], room_for: i32) -> Result<KvCache> {
        let (Some(first), true) = (keys.first(), keys.len() == values.len()) else { return Ok(KvCache::new()) };
        let len: i32 = keys.iter().map(|k| k.dim(2)).sum();
        let capacity = spare_capacity(len.max(room_for));
        let s = first.shape();
        let tail = |a: &[Array]| -> Result<Array> {
            let pad = zeros_dtype(&[s[0], s[1], capacity - len, s[3]], first.dtype())?;
            Ok(concatenate(&a.iter().cloned().chain([pad]).collect::<Vec<_>>(), 2)?)
        };
        let buffers = Buffers { keys: Some(tail(keys)?), values: Some(tail(values)?) };
        Ok(KvCache { buffers, offset: len, start: 0, states: Vec::new() })
    }

    /// A cache over `buffers` whose first `offset` columns are written.
    pub(crate) fn from_buffers(buffers: Buffers, offset: i32) -> KvCache {
        KvCache { buffers, offset, start: 0, states: Vec::new() }
    }

    /// A recurrent layer's cache: `len` tokens summed up in `states`.
    pub fn recurrent(states: Vec<Array>, len: i32) -> KvCache {
        KvCache { offset: len, states, ..KvCache::default() }
    }

    pub fn states(&self) -> &[Array] {
        &self.states
    }

    /// The same cache, its first column at position `start` (the tokens before it dropped).
    pub fn starting_at(mut self, start: i32) -> KvCache {
        self.start = start.max(0);
        self
    }

    pub(crate) fn buffers(&self) -> &Buffers {
        &self.buffers
    }

    /// Columns held.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Tokens before the first column held.
    pub fn start(&self) -> i32 {
        self.start
    }

    /// Tokens of the sequence (held or dropped): the position of the next one.
    pub fn len(&self) -> i32 {
        self.start + self.offset
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the sequence can go on from its first `len` tokens: they are all held, or (in
    /// a layer with attention window `window`) the last `window` of them are. A recurrent
    /// state sums up all its tokens: it goes on only from where it is.
    pub fn resumes_at(&self, len: i32, window: Option<usize>) -> bool {
        if !self.states.is_empty() {
            return len == self.len();
        }
        let needed_from = window.map_or(0, |w| len.saturating_sub(w.min(i32::MAX as usize) as i32).max(0));
        len <= self.len() && self.start <= needed_from
    }

    /// Forgets everything after the first `len` tokens (the columns are written over later);
    /// check [`Self::resumes_at`] first.
    pub fn truncate(&mut self, len: i32) {
        self.offset = self.offset.min((len - self.start).max(0));
    }

    /// In a layer with attention window `window`: keeps only the columns a windowed layer
    /// keeps (a cache built whole, read back from the prefix cache's disk tier).
    pub fn keep_window(&mut self, window: usize) -> Result<()> {
        let drop = self.offset - window_keep(window);
        if drop > 0 {
            self.buffers.drop_front(drop, self.offset)?;
            self.offset -= drop;
            self.start += drop;
        }
        Ok(())
    }

    /// In a layer with attention window `window`: drops the columns no longer needed, when a
    /// step of them has piled up (see [`window_drop`]).
    pub fn drop_outside(&mut self, window: usize) -> Result<()> {
        let drop = window_drop(self.offset, window);
        if drop > 0 {
            self.buffers.drop_front(drop, self.offset)?;
            self.offset -= drop;
            self.start += drop;
        }
        Ok(())
    }

    /// Appends `keys`/`values` (`[B, H, L, D]`) and returns everything cached so far.
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let out = self.buffers.write(self.offset, keys, values)?;
        self.offset += keys.dim(2);
        Ok(out)
    }

    /// The cached keys and values, `[1, H, offset, D]` each (`None` while empty).
    pub fn contents(&self) -> Result<Option<(Array, Array)>> {
        self.buffers.prefix(self.offset)
    }

    pub fn nbytes(&self) -> usize {
        self.buffers.nbytes() + self.states.iter().map(Array::nbytes).sum::<usize>()
    }
}

impl LayerCache for KvCache {
    fn positions(&self) -> Result<Positions> {
        Ok(Positions::Scalar(self.len()))
    }

    fn mask(&self, new_tokens: i32, window: Option<usize>) -> Result<AttentionMask> {
        match window {
            Some(window) if self.offset + new_tokens > window as i32 => {
                Ok(AttentionMask::Explicit(window_mask(new_tokens, self.offset, window as i32)?))
            }
            _ if new_tokens == 1 => Ok(AttentionMask::None),
            _ => Ok(AttentionMask::Causal),
        }
    }

    fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        KvCache::update(self, keys, values)
    }

    fn drop_outside(&mut self, window: usize) -> Result<()> {
        KvCache::drop_outside(self, window)
    }

    fn states(&self) -> &[Array] {
        &self.states
    }

    fn set_states(&mut self, states: Vec<Array>) {
        self.states = states;
    }

    fn advance(&mut self, n: i32) {
        self.offset += n;
    }
}

/// `[len, offset + len]` booleans: query `i` (at position `offset + i`) may see key `j` when
/// `j <= offset + i` and `offset + i - j < window`.
fn window_mask(len: i32, offset: i32, window: i32) -> Result<Array> {
    use mlx_rs::ops::{ge, logical_and, lt, subtract};
    let queries = Array::from_iter(offset..offset + len, &[len, 1]);
    let keys = Array::from_iter(0..offset + len, &[1, offset + len]);
    let distance = subtract(&queries, &keys)?;
    Ok(logical_and(ge(&distance, Array::from_int(0))?, lt(&distance, Array::from_int(window))?)?)
}

/// A buffer with `grow` more positions than `used`, keeping the first `used` of `old`.
fn grow_buffer(old: Option<Array>, like: &Array, used: i32, grow: i32) -> Result<Array> {
    let shape = like.shape();
    let fresh = zeros_dtype(&[shape[0], shape[1], grow, shape[3]], like.dtype())?;
    Ok(match old {
        Some(old) => concatenate(&[old.try_index((.., .., ..used, ..))?, fresh], 2)?,
        None => fresh,
    })
}
