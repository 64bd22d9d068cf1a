//! The key/value cache of a running batch, one per layer: `[B, H, capacity, D]` buffers in
//! which each row's tokens end at the same column (`idx`) and start after that row's left
//! padding. Rows join with their own prefilled [`KvCache`] and leave when they finish; the
//! padding all remaining rows share is trimmed away. (mlx-lm's `BatchKVCache` is the model.)

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use crate::model::cache::{LayerCache, Positions};
use crate::model::error::Result;
use crate::model::kv_cache::{Buffers, KvCache};
use crate::model::layers::AttentionMask;

#[derive(Default)]
pub struct BatchKvCache {
    buffers: Buffers,
    /// Columns written so far; every row's next token goes to column `idx`.
    idx: i32,
    /// Per row: the columns before its first token.
    left_padding: Vec<i32>,
}

impl BatchKvCache {
    pub fn new() -> BatchKvCache {
        BatchKvCache::default()
    }

    pub fn rows(&self) -> usize {
        self.left_padding.len()
    }

    /// Tokens cached for each row.
    pub fn lengths(&self) -> Vec<i32> {
        self.left_padding.iter().map(|p| self.idx - p).collect()
    }

    /// Columns in use (longest row plus padding); the attention work per step.
    pub fn width(&self) -> i32 {
        self.idx
    }

    pub fn nbytes(&self) -> usize {
        self.buffers.nbytes()
    }

    /// Row `row`'s keys and values, `[1, H, length, D]` each (`None` while it holds nothing).
    pub fn row_contents(&self, row: usize) -> Result<Option<(Array, Array)>> {
        let (Some(k), Some(v)) = (&self.buffers.keys, &self.buffers.values) else { return Ok(None) };
        let (r, pad) = (row as i32, self.left_padding[row]);
        if pad >= self.idx {
            return Ok(None);
        }
        Ok(Some((k.try_index((r..r + 1, .., pad..self.idx, ..))?, v.try_index((r..r + 1, .., pad..self.idx, ..))?)))
    }

    /// Adds a sequence (its prefilled single-row cache, possibly empty) as the last row.
    pub fn push_row(&mut self, row: &KvCache) -> Result<()> {
        let contents = row.contents()?;
        let n = row.offset();
        let rows = self.rows() as i32;
        let (batch_k, batch_v) = self.buffers.prefix(self.idx)?.unzip();
        let Some((row_k, row_v)) = contents else {
            // An empty row (a one-token prompt): all padding so far.
            if let (Some(k), Some(v)) = (batch_k, batch_v) {
                self.buffers.keys = Some(concatenate(&[k.clone(), zeros_like_rows(&k, 1, self.idx)?], 0)?);
                self.buffers.values = Some(concatenate(&[v.clone(), zeros_like_rows(&v, 1, self.idx)?], 0)?);
            }
            self.left_padding.push(self.idx);
            return Ok(());
        };
        if n > self.idx {
            // The new row is longer than every row so far: pad the batch on the left.
            let extra = n - self.idx;
            for p in &mut self.left_padding {
                *p += extra;
            }
            self.idx = n;
        }
        let pad_left = |a: Array, rows: i32, to: i32| -> Result<Array> {
            let have = a.dim(2);
            if have == to {
                return Ok(a);
            }
            Ok(concatenate(&[zeros_like_rows(&a, rows, to - have)?, a], 2)?)
        };
        let row_k = pad_left(row_k, 1, self.idx)?;
        let row_v = pad_left(row_v, 1, self.idx)?;
        let (k, v) = match (batch_k, batch_v) {
            (Some(k), Some(v)) => (pad_left(k, rows, self.idx)?, pad_left(v, rows, self.idx)?),
            // Rows that hold nothing yet (one-token prompts): zeros of the row's shape.
            _ if rows > 0 => (zeros_like_rows(&row_k, rows, self.idx)?, zeros_like_rows(&row_v, rows, self.idx)?),
            _ => {
                self.buffers.keys = Some(row_k);
                self.buffers.values = Some(row_v);
                self.left_padding.push(self.idx - n);
                return Ok(());
            }
        };
        self.buffers.keys = Some(concatenate(&[k, row_k], 0)?);
        self.buffers.values = Some(concatenate(&[v, row_v], 0)?);
        self.left_padding.push(self.idx - n);
        Ok(())
    }

    /// Keeps the rows at `keep` (in that order) and trims the padding they all share.
    pub fn retain(&mut self, keep: &[usize]) -> Result<()> {
        if keep.is_empty() {
            *self = BatchKvCache::new();
            return Ok(());
        }
        let padding: Vec<i32> = keep.iter().map(|&r| self.left_padding[r]).collect();
        let trim = padding.iter().copied().min().unwrap_or(0);
        if let (Some(k), Some(v)) = (&self.buffers.keys, &self.buffers.values) {
            let index = Array::from_slice(&keep.iter().map(|&r| r as i32).collect::<Vec<_>>(), &[keep.len() as i32]);
            let (k, v) = (k.take_axis(&index, 0)?, v.take_axis(&index, 0)?);
            let (k, v) = if trim > 0 {
                (k.try_index((.., .., trim..self.idx, ..))?, v.try_index((.., .., trim..self.idx, ..))?)
            } else {
                (k, v)
            };
            self.buffers.keys = Some(k);
            self.buffers.values = Some(v);
        }
        self.idx -= trim;
        self.left_padding = padding.into_iter().map(|p| p - trim).collect();
        Ok(())
    }
}

/// Zeros shaped like `like` but with `rows` rows and `len` columns.
fn zeros_like_rows(like: &Array, rows: i32, len: i32) -> Result<Array> {
    let s = like.shape();
    Ok(zeros_dtype(&[rows, s[1], len, s[3]], like.dtype())?)
}

impl LayerCache for BatchKvCache {
    fn positions(&self) -> Result<Positions> {
        let offsets: Vec<i32> = self.lengths();
        let max = offsets.iter().copied().max().unwrap_or(0);
        if self.left_padding.iter().all(|&p| p == self.left_padding[0]) {
            return Ok(Positions::Scalar(max));
        }
        Ok(Positions::Rows { offsets: Array::from_slice(&offsets, &[offsets.len() as i32]), max })
    }

    /// Row `b`'s query `i` (column `idx + i`) may see column `j` when the row has a token there
    /// (`j >= left_padding[b]`), it is not in the future, and it is inside the window.
    fn mask(&self, new_tokens: i32, window: Option<usize>) -> Result<AttentionMask> {
        let no_padding = self.left_padding.iter().all(|&p| p == 0);
        let within_window = window.is_none_or(|w| self.idx + new_tokens <= w as i32);
        if no_padding && within_window {
            return Ok(if new_tokens == 1 { AttentionMask::None } else { AttentionMask::Causal });
        }
        let width = self.idx + new_tokens;
        let mut allowed = Vec::with_capacity(self.rows() * (new_tokens * width) as usize);
        for &pad in &self.left_padding {
            for i in 0..new_tokens {
                let column = self.idx + i;
                for j in 0..width {
                    let in_window = window.is_none_or(|w| column - j < w as i32);
                    allowed.push(j >= pad && j <= column && in_window);
                }
            }
        }
        let mask = Array::from_slice(&allowed, &[self.rows() as i32, 1, new_tokens, width]);
        Ok(AttentionMask::Explicit(mask))
    }

    fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let out = self.buffers.write(self.idx, keys, values)?;
        self.idx += keys.dim(2);
        Ok(out)
    }
}
