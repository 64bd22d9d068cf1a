//! Per-layer key/value cache for one sequence batch: `[batch, kv_heads, capacity, head_dim]`
//! buffers that grow in steps (not per token), written in place, read up to `offset`.

use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use crate::model::error::Result;

/// Buffers grow by this many positions at a time (as mlx-lm's `KVCache.step`).
const STEP: i32 = 256;

#[derive(Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Positions written so far: the RoPE offset of the next token.
    offset: i32,
}

impl KvCache {
    pub fn new() -> KvCache {
        KvCache::default()
    }

    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Appends `keys`/`values` (`[B, H, L, D]`) and returns everything cached so far.
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let new = keys.dim(2);
        let needed = self.offset + new;
        let capacity = self.keys.as_ref().map_or(0, |k| k.dim(2));
        if needed > capacity {
            let grow = (new + STEP - 1) / STEP * STEP;
            self.keys = Some(grow_buffer(self.keys.take(), keys, self.offset, grow)?);
            self.values = Some(grow_buffer(self.values.take(), values, self.offset, grow)?);
        }
        let (Some(k), Some(v)) = (self.keys.as_mut(), self.values.as_mut()) else {
            unreachable!("buffers allocated above");
        };
        let range = self.offset..needed;
        k.try_index_mut((.., .., range.clone(), ..), keys)?;
        v.try_index_mut((.., .., range, ..), values)?;
        self.offset = needed;
        Ok((k.try_index((.., .., ..needed, ..))?, v.try_index((.., .., ..needed, ..))?))
    }

    /// Bytes held by the buffers (allocated capacity, not just the used part).
    pub fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.nbytes()) + self.values.as_ref().map_or(0, |v| v.nbytes())
    }
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
