//! The key/value cache of a running batch, one per layer: `[B, H, capacity, D]` buffers in
//! which each row's tokens end at the same column (`idx`) and start after that row's left
//! padding. Rows join with their own prefilled [`KvCache`] (or straight from another batch)
//! and leave when they finish; the padding all remaining rows share is trimmed away.
//! (mlx-lm's `BatchKVCache` is the model.)
//!
//! Copies are what a long shared prompt makes expensive (190 MB of f32 keys and values at 4k
//! tokens of SmolLM2), so: a batch with no rows adopts a lone row's buffers or a whole batch
//! as they are; rows that join together are copied once, in one build of the new buffers; and
//! every build leaves spare columns so the next steps write in place.

use mlx_rs::ops::indexing::{TryIndexMutOp, TryIndexOp};
use mlx_rs::ops::zeros_dtype;
use mlx_rs::Array;

use crate::model::cache::{LayerCache, Positions};
use crate::model::error::Result;
use crate::model::kv_cache::{spare_capacity, Buffers, KvCache};
use crate::model::layers::AttentionMask;

#[derive(Default, Clone)]
pub struct BatchKvCache {
    buffers: Buffers,
    /// Columns written so far; every row's next token goes to column `idx`.
    idx: i32,
    /// Per row: the columns before its first token.
    left_padding: Vec<i32>,
}

/// Rows to add to a batch: keys and values `[rows, H, width, D]` aligned on the right, and each
/// row's left padding within them (`None`: rows that hold nothing yet).
struct Part {
    contents: Option<(Array, Array)>,
    padding: Vec<i32>,
    width: i32,
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

    /// The batch's only row as a cache of its own, sharing the buffers (no copy); `None` when
    /// it has another number of rows or the row does not start at column 0.
    pub fn only_row(&self) -> Option<KvCache> {
        (self.rows() == 1 && self.left_padding[0] == 0).then(|| KvCache::from_buffers(self.buffers.clone(), self.idx))
    }

    /// Adds a sequence (its prefilled single-row cache, possibly empty) as the last row.
    pub fn push_row(&mut self, row: &KvCache) -> Result<()> {
        self.push_rows(&[row])
    }

    /// Adds sequences (their single-row caches, possibly empty) as the last rows, in one copy;
    /// a batch with no rows takes a lone row's buffers as they are.
    pub fn push_rows(&mut self, rows: &[&KvCache]) -> Result<()> {
        match rows {
            [] => Ok(()),
            [row] if self.rows() == 0 => {
                *self = BatchKvCache { buffers: row.buffers().clone(), idx: row.offset(), left_padding: vec![0] };
                Ok(())
            }
            _ => {
                let parts = rows
                    .iter()
                    .map(|row| Ok(Part { contents: row.contents()?, padding: vec![0], width: row.offset() }))
                    .collect::<Result<Vec<_>>>()?;
                self.extend(parts)
            }
        }
    }

    /// Adds rows `rows` of `other` (in that order) as the last rows, in one copy; a batch with
    /// no rows that takes all of `other`'s rows in order takes its buffers as they are.
    pub fn push_rows_of(&mut self, other: &BatchKvCache, rows: &[usize]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        if self.rows() == 0 && rows.iter().copied().eq(0..other.rows()) {
            *self = other.clone();
            return Ok(());
        }
        let parts = rows
            .iter()
            .map(|&r| {
                let contents = other.row_contents(r)?;
                let width = other.idx - other.left_padding[r];
                Ok(Part { contents, padding: vec![0], width: width.max(0) })
            })
            .collect::<Result<Vec<_>>>()?;
        self.extend(parts)
    }

    /// Rebuilds the buffers with `parts` as new last rows: every row's tokens end at the longest
    /// part's (or the batch's) last column, with spare columns after it.
    fn extend(&mut self, parts: Vec<Part>) -> Result<()> {
        let current = Part {
            contents: self.buffers.prefix(self.idx)?,
            padding: std::mem::take(&mut self.left_padding),
            width: self.idx,
        };
        let parts: Vec<Part> = std::iter::once(current).chain(parts).collect();
        let idx = parts.iter().map(|p| p.width).max().unwrap_or(0);
        let rows: i32 = parts.iter().map(|p| p.padding.len() as i32).sum();
        let shape = parts.iter().find_map(|p| p.contents.as_ref()).map(|(k, _)| (k.shape().to_vec(), k.dtype()));
        let mut buffers = Buffers::default();
        if let Some((shape, dtype)) = shape {
            let capacity = spare_capacity(idx);
            let mut k = zeros_dtype(&[rows, shape[1], capacity, shape[3]], dtype)?;
            let mut v = zeros_dtype(&[rows, shape[1], capacity, shape[3]], dtype)?;
            let mut row = 0;
            for part in &parts {
                let n = part.padding.len() as i32;
                if let Some((pk, pv)) = &part.contents {
                    let from = idx - part.width;
                    k.try_index_mut((row..row + n, .., from..idx, ..), pk)?;
                    v.try_index_mut((row..row + n, .., from..idx, ..), pv)?;
                }
                row += n;
            }
            buffers = Buffers { keys: Some(k), values: Some(v) };
        }
        self.left_padding = parts.iter().flat_map(|p| p.padding.iter().map(move |pad| pad + idx - p.width)).collect();
        self.buffers = buffers;
        self.idx = idx;
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
        let all_in_order = keep.iter().copied().eq(0..self.rows());
        if let (Some(k), Some(v)) = (&self.buffers.keys, &self.buffers.values) {
            // Trimmed first (a view), so the gather below copies only what stays, spare
            // columns included.
            let (mut k, mut v) = if trim > 0 {
                (k.try_index((.., .., trim.., ..))?, v.try_index((.., .., trim.., ..))?)
            } else {
                (k.clone(), v.clone())
            };
            if !all_in_order {
                let index =
                    Array::from_slice(&keep.iter().map(|&r| r as i32).collect::<Vec<_>>(), &[keep.len() as i32]);
                (k, v) = (k.take_axis(&index, 0)?, v.take_axis(&index, 0)?);
            }
            self.buffers.keys = Some(k);
            self.buffers.values = Some(v);
        }
        self.idx -= trim;
        self.left_padding = padding.into_iter().map(|p| p - trim).collect();
        Ok(())
    }
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
