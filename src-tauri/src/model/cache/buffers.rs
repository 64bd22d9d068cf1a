//! Key and value buffers `[batch, kv_heads, capacity, head_dim]` that grow in steps (not per
//! token), written in place, read up to what is used; and how far a layer with an attention
//! window (Gemma's and gpt-oss's local layers) may drop its oldest columns: once a step's worth
//! of them piles up, what is still needed is copied into smaller buffers, so a long sequence
//! costs such a layer a bounded amount of memory (mlx-lm's `RotatingKVCache` does the same by
//! writing in a ring).

use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::zeros_dtype;
use mlx_rs::Array;

use crate::model::error::Result;

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
            Ok(Some(copy_into_new(b, from..used, capacity)?))
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

/// A buffer with `grow` more positions than `used`, keeping the first `used` of `old`.
fn grow_buffer(old: Option<Array>, like: &Array, used: i32, grow: i32) -> Result<Array> {
    match old {
        Some(old) => copy_into_new(&old, 0..used, used + grow),
        None => {
            let shape = like.shape();
            Ok(zeros_dtype(&[shape[0], shape[1], grow, shape[3]], like.dtype())?)
        }
    }
}

/// A new `[B, H, capacity, D]` buffer starting with columns `columns` of `old`. Written into
/// zeros in place (MLX gives the zeros' buffer to the update), so a copy costs one new buffer,
/// not a zero tail and a concatenation besides.
fn copy_into_new(old: &Array, columns: std::ops::Range<i32>, capacity: i32) -> Result<Array> {
    let s = old.shape();
    let kept = columns.end - columns.start;
    let mut out = zeros_dtype(&[s[0], s[1], capacity, s[3]], old.dtype())?;
    out.try_index_mut((.., .., ..kept, ..), old.try_index((.., .., columns, ..))?)?;
    Ok(out)
}
