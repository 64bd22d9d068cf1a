//! Key and value buffers `[batch, kv_heads, capacity, head_dim]` that grow in steps (not per
//! token), written in place, read up to what is used; and how far a layer with an attention
//! window (Gemma's and gpt-oss's local layers) may drop its oldest columns: once a step's worth
//! of them piles up, what is still needed is copied into smaller buffers, so a long sequence
//! costs such a layer a bounded amount of memory (mlx-lm's `RotatingKVCache` does the same by
//! writing in a ring).

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use super::kv_tensor::{KvQuant, KvTensor};
use crate::model::error::{ModelError, Result};

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

/// Key and value buffers `[B, H, capacity, D]` that grow in steps of [`STEP`] columns, at full
/// precision or quantized ([`KvTensor`]).
#[derive(Default, Clone)]
pub(crate) struct Buffers {
    pub keys: Option<KvTensor>,
    pub values: Option<KvTensor>,
    /// How new keys and values are stored (`None`: as they come).
    pub quant: Option<KvQuant>,
}

impl Buffers {
    pub fn new(quant: Option<KvQuant>) -> Buffers {
        Buffers { keys: None, values: None, quant }
    }

    /// Writes `keys`/`values` (`[B, H, L, D]`, full precision) at columns `at..at + L`, stored in
    /// the buffers' format, growing them if needed, and returns columns `..at + L`.
    pub fn write(&mut self, at: i32, keys: &Array, values: &Array) -> Result<(KvTensor, KvTensor)> {
        let (keys, values) = (KvTensor::new(keys, self.quant)?, KvTensor::new(values, self.quant)?);
        self.write_stored(at, &keys, &values)
    }

    /// As [`Self::write`], for keys and values already in the buffers' format.
    pub fn write_stored(&mut self, at: i32, keys: &KvTensor, values: &KvTensor) -> Result<(KvTensor, KvTensor)> {
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
        k.write_columns(at, keys)?;
        v.write_columns(at, values)?;
        let used = |t: &KvTensor| t.map(|a| Ok(a.try_index((.., .., ..needed, ..))?));
        Ok((used(k)?, used(v)?))
    }

    /// Quantizes what the buffers hold and everything written after (mlx-lm's `to_quantized`:
    /// the whole buffers, each column on its own, so where it happens changes no column).
    pub fn quantize(&mut self, quant: KvQuant) -> Result<()> {
        let convert = |t: &Option<KvTensor>| -> Result<Option<KvTensor>> {
            match t {
                Some(KvTensor::Dense(a)) => Ok(Some(KvTensor::new(a, Some(quant))?)),
                Some(t) if t.quant() == Some(quant) => Ok(Some(t.clone())),
                Some(_) => Err(ModelError::Mlx("keys and values quantized twice, in two formats".into())),
                None => Ok(None),
            }
        };
        (self.keys, self.values) = (convert(&self.keys)?, convert(&self.values)?);
        self.quant = Some(quant);
        Ok(())
    }

    /// Columns `..len` of both buffers (`None` while empty).
    pub fn prefix(&self, len: i32) -> Result<Option<(KvTensor, KvTensor)>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if len > 0 => {
                let cut = |t: &KvTensor| t.map(|a| Ok(a.try_index((.., .., ..len, ..))?));
                Ok(Some((cut(k)?, cut(v)?)))
            }
            _ => Ok(None),
        }
    }

    /// Keeps only columns `from..used`, copied into new buffers (with room for a step more),
    /// so that the old, larger ones are freed.
    pub fn drop_front(&mut self, from: i32, used: i32) -> Result<()> {
        let kept = used - from;
        let capacity = spare_capacity(kept + STEP - 1);
        let copy = |b: &Option<KvTensor>| -> Result<Option<KvTensor>> {
            let Some(b) = b else { return Ok(None) };
            Ok(Some(copy_into_new(b, from..used, capacity)?))
        };
        let (keys, values) = (copy(&self.keys)?, copy(&self.values)?);
        let arrays: Vec<&Array> = keys.iter().chain(values.iter()).flat_map(KvTensor::parts).collect();
        mlx_rs::transforms::eval(arrays)?;
        (self.keys, self.values) = (keys, values);
        Ok(())
    }

    /// Allocated bytes (capacity, not just the used part).
    pub fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, KvTensor::nbytes) + self.values.as_ref().map_or(0, KvTensor::nbytes)
    }
}

/// A buffer with `grow` more positions than `used`, keeping the first `used` of `old`.
fn grow_buffer(old: Option<KvTensor>, like: &KvTensor, used: i32, grow: i32) -> Result<KvTensor> {
    match old {
        Some(old) => copy_into_new(&old, 0..used, used + grow),
        None => KvTensor::zeros(like, like.dim(0), like.dim(1), grow),
    }
}

/// A new `[B, H, capacity, D]` buffer starting with columns `columns` of `old`. Written into
/// zeros in place (MLX gives the zeros' buffer to the update), so a copy costs one new buffer,
/// not a zero tail and a concatenation besides.
fn copy_into_new(old: &KvTensor, columns: std::ops::Range<i32>, capacity: i32) -> Result<KvTensor> {
    let mut out = KvTensor::zeros(old, old.dim(0), old.dim(1), capacity)?;
    out.write_columns(0, &old.map(|a| Ok(a.try_index((.., .., columns.clone(), ..))?))?)?;
    Ok(out)
}
