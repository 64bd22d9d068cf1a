//! The key/value cache of one sequence (batch of 1), for one layer: the prefill of a request
//! before it joins the batch, what the prefix cache restores into, and the single-stream
//! generator's cache. A windowed layer counts the tokens it dropped (`start`).

use mlx_rs::Array;

use super::buffers::{spare_capacity, window_drop, window_keep, Buffers};
use super::kv_tensor::{KvFormat, KvTensor};
use super::{AttentionMask, LayerCache, Positions};
use crate::model::error::Result;

/// The key/value cache of one sequence (batch of 1), for one layer.
#[derive(Default, Clone)]
pub struct KvCache {
    buffers: Buffers,
    /// Columns written so far.
    offset: i32,
    /// Tokens before the first column (dropped by a windowed layer): `start + offset` is the
    /// RoPE position of the next token.
    start: i32,
    /// A recurrent layer's state (it keeps no keys: `offset` counts its tokens).
    states: Vec<Array>,
    /// How keys and values are stored (the buffers say which format they are in now).
    format: KvFormat,
}

impl KvCache {
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// An empty cache that stores keys and values in `format`.
    pub fn with_format(format: KvFormat) -> KvCache {
        KvCache { format, ..KvCache::default() }
    }

    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// A cache in `format` holding `keys`/`values` (`[1, H, L, D]`, built by one concatenation
    /// of `pieces`), quantized when it is due to be or a piece already is (a row of a batch
    /// that its longest row made quantize early stays so), with room for at least `room_for`
    /// tokens in all before it has to grow.
    pub fn from_pieces(keys: &[KvTensor], values: &[KvTensor], room_for: i32, format: KvFormat) -> Result<KvCache> {
        let (Some(first), true) = (keys.first(), keys.len() == values.len()) else {
            return Ok(KvCache::with_format(format));
        };
        let len: i32 = keys.iter().map(|k| k.dim(2)).sum();
        let quant = format.due(len).or_else(|| keys.iter().find_map(KvTensor::quant));
        let capacity = spare_capacity(len.max(room_for));
        let tail = |pieces: &[KvTensor]| -> Result<KvTensor> {
            let mut all = pieces.iter().map(|p| p.in_format(quant)).collect::<Result<Vec<_>>>()?;
            all.push(KvTensor::zeros(&all[0], first.dim(0), first.dim(1), capacity - len)?);
            KvTensor::concatenate(&all, 2)
        };
        let buffers = Buffers { keys: Some(tail(keys)?), values: Some(tail(values)?), quant };
        Ok(KvCache { buffers, offset: len, start: 0, states: Vec::new(), format })
    }

    /// A cache in `format` over `buffers` whose first `offset` columns are written.
    pub(crate) fn from_buffers(buffers: Buffers, offset: i32, format: KvFormat) -> KvCache {
        KvCache { buffers, offset, start: 0, states: Vec::new(), format }
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

    /// Appends `keys`/`values` (`[B, H, L, D]`) and returns everything cached so far. A cache
    /// due to be quantized (see [`KvFormat`]) converts first: the forward reads it quantized.
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(KvTensor, KvTensor)> {
        if let (Some(quant), None) = (self.format.due(self.len()), self.buffers.quant) {
            self.buffers.quantize(quant)?;
        }
        let out = self.buffers.write(self.offset, keys, values)?;
        self.offset += keys.dim(2);
        Ok(out)
    }

    /// The cached keys and values, `[1, H, offset, D]` each (`None` while empty).
    pub fn contents(&self) -> Result<Option<(KvTensor, KvTensor)>> {
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

    fn update(&mut self, keys: &Array, values: &Array) -> Result<(KvTensor, KvTensor)> {
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
