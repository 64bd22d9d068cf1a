//! Per-layer key/value cache for one sequence batch: `[batch, kv_heads, capacity, head_dim]`
//! buffers that grow in steps (not per token), written in place, read up to `offset`.

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

    /// Allocated bytes (capacity, not just the used part).
    pub fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Array::nbytes) + self.values.as_ref().map_or(0, Array::nbytes)
    }
}

/// The key/value cache of one sequence (batch of 1), for one layer.
#[derive(Default)]
pub struct KvCache {
    buffers: Buffers,
    /// Positions written so far: the RoPE offset of the next token.
    offset: i32,
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
        Ok(KvCache { buffers: Buffers { keys: Some(tail(keys)?), values: Some(tail(values)?) }, offset: len })
    }

    /// A cache over `buffers` whose first `offset` columns are written.
    pub(crate) fn from_buffers(buffers: Buffers, offset: i32) -> KvCache {
        KvCache { buffers, offset }
    }

    pub(crate) fn buffers(&self) -> &Buffers {
        &self.buffers
    }

    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Forgets everything after the first `len` tokens (the columns are written over later).
    pub fn truncate(&mut self, len: i32) {
        self.offset = self.offset.min(len.max(0));
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
        self.buffers.nbytes()
    }
}

impl LayerCache for KvCache {
    fn positions(&self) -> Result<Positions> {
        Ok(Positions::Scalar(self.offset))
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
