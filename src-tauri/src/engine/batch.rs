//! Rows of sequences and their keys and values, one [`BatchKvCache`] per cache layer, row `i`
//! of every layer holding `seqs[i]`: the running batch, and the prefill group (prompts prefilled
//! together, aligned on the right like the batch, before they join it).

use super::sequence::Sequence;
use crate::model::{BatchKvCache, KvCache, KvFormat, LayerCache, ModelError};

pub(crate) struct Batch {
    pub seqs: Vec<Sequence>,
    pub cache: Vec<BatchKvCache>,
}

impl Batch {
    /// An empty batch of a model with `layers` cache layers, storing keys and values in `format`.
    pub fn new(layers: usize, format: KvFormat) -> Batch {
        Batch { seqs: Vec::new(), cache: (0..layers).map(|_| BatchKvCache::with_format(format)).collect() }
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Each row's tokens in its caches (those a windowed layer dropped included).
    pub fn lengths(&self) -> Vec<i32> {
        self.cache.first().map(BatchKvCache::lengths).unwrap_or_default()
    }

    /// Whether any row attends to a shared segment.
    pub fn uses_shared(&self) -> bool {
        self.cache.first().is_some_and(|layer| layer.shared().is_some())
    }

    /// Whether row `row` attends to the shared segment before its own keys.
    pub fn is_after_shared(&self, row: usize) -> bool {
        self.cache.first().is_some_and(|layer| layer.is_after_shared(row))
    }

    /// Every layer emptied (its rows' state is unknown after a failure).
    pub fn clear_cache(&mut self) {
        self.cache.iter_mut().for_each(|c| *c = BatchKvCache::with_format(c.format()));
    }

    /// Row `row` as a cache of its own (shared when it is the only row, else a copy).
    pub fn row_caches(&self, row: usize) -> Result<Vec<KvCache>, ModelError> {
        BatchKvCache::row_of(&self.cache, row)
    }

    /// Adds rows to every layer (`add` is given each layer in turn) after the batch's rows; on a
    /// failure the layers that took them give them back, so the batch stays as it was.
    pub fn add_rows(
        &mut self,
        mut add: impl FnMut(usize, &mut BatchKvCache) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let rows = self.seqs.len();
        for (i, layer) in self.cache.iter_mut().enumerate() {
            if let Err(e) = add(i, layer) {
                let keep: Vec<usize> = (0..rows).collect();
                for layer in self.cache.iter_mut().filter(|c| c.rows() > rows) {
                    let _ = layer.retain(&keep);
                }
                return Err(e);
            }
        }
        self.settle_cache()
    }

    /// Evaluates the caches' relayouts now (see [`BatchKvCache::settle`]).
    pub fn settle_cache(&self) -> Result<(), ModelError> {
        BatchKvCache::settle(&self.cache)
    }

    /// Keeps the caches' rows at `keep` (the sequences are the caller's to keep in step); the
    /// last error, if a layer could not.
    pub fn retain_cache(&mut self, keep: &[usize]) -> Result<(), ModelError> {
        let mut failed = Ok(());
        for layer in &mut self.cache {
            if let Err(e) = layer.retain(keep) {
                failed = Err(e);
            }
        }
        if let Err(e) = self.settle_cache() {
            failed = Err(e);
        }
        failed
    }

    /// Takes row `row` out: its sequence, and its columns from every layer.
    pub fn remove(&mut self, row: usize) -> Sequence {
        let keep: Vec<usize> = (0..self.seqs.len()).filter(|&r| r != row).collect();
        if let Err(e) = self.retain_cache(&keep) {
            tracing::error!("cannot take a row out of a batch: {e}");
        }
        self.seqs.remove(row)
    }
}
