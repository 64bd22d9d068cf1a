//! A worker's half of a served model (`fastmlx serve --cluster`): rank 0's engine batches,
//! admits and ends requests; a worker holds its layers' keys and values for the same rows and
//! follows what each step's description says (`engine::remote`). It keeps two batches, as the
//! engine does (the running rows and the prompts being prefilled), each row's columns in the
//! engine's order, and the caches of rows that left a batch without ending (a prompt set aside,
//! a row about to join the running batch) until they join one again.

use std::collections::HashMap;

use mlx_rs::Array;

use crate::engine::kv::prefix_cache::PrefixCache;
use crate::engine::remote::{Pending, RemoteStep, StepBatch, StoreOp};
use crate::engine::RequestId;
use crate::model::{BatchKvCache, KvCache, KvFormat, LayerCache, Transformer};

/// A step's rows and what changed on rank 0 since the last message, as the workers receive it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRows {
    pub batch: StepBatch,
    pub rows: Vec<RequestId>,
    pub lengths: Vec<i32>,
    /// `[rows, positions]` token ids, flattened.
    pub tokens: Vec<u32>,
    pub verifying: bool,
    pub pending: Pending,
}

/// Integers per prefix-cache store on the wire: kind, row id, tokens, batch and snapshot.
const STORE_WORDS: usize = 4;

/// The header's fields after kind, rows, length and dtype (see `pipeline::HEADER_LEN`): which
/// batch, rows ended, rows kept (0 or the batch), the verify step's width, whether this step
/// verifies, prefix-cache stores.
pub const HEADER_TAIL: usize = 6;

impl StepRows {
    /// The header's tail and the integers that follow it: row ids, their lengths, the step's
    /// token ids, the rows ended, the rows kept, the stores.
    pub fn encode(step: &RemoteStep) -> ([i32; HEADER_TAIL], Vec<i64>) {
        let p = step.pending;
        let kept = p.kept.as_ref().map_or(&[][..], |(_, k)| k);
        let mut out = Vec::with_capacity(2 * step.rows.len() + step.tokens.len() + p.ended.len() + kept.len());
        out.extend(step.rows.iter().map(|&id| id as i64));
        out.extend(step.lengths.iter().map(|&l| l as i64));
        out.extend(step.tokens.iter().map(|&t| t as i64));
        out.extend(p.ended.iter().map(|&id| id as i64));
        out.extend(kept.iter().map(|&k| k as i64));
        for op in &p.stores {
            out.extend(match *op {
                StoreOp::Store { batch, id, len, snapshot } => {
                    [1, id as i64, len as i64, batch as i64 + 2 * snapshot as i64]
                }
                StoreOp::KeepHot { batch, id, len } => [2, id as i64, len as i64, batch as i64],
                StoreOp::Clear => [3, 0, 0, 0],
            });
        }
        let tail = [
            step.batch as i32,
            p.ended.len() as i32,
            kept.len() as i32,
            p.kept.as_ref().map_or(0, |(w, _)| *w),
            step.verifying as i32,
            p.stores.len() as i32,
        ];
        (tail, out)
    }

    /// How many integers follow `header` (kind, rows, length, dtype, then the tail).
    pub fn size(header: &[i32]) -> usize {
        let n = |i: usize| header[i].max(0) as usize;
        2 * n(1) + n(1) * n(2) + n(5) + n(6) + STORE_WORDS * n(9)
    }

    pub fn decode(header: &[i32], data: &[i64]) -> Result<StepRows, String> {
        if data.len() != Self::size(header) {
            return Err(format!("a step's rows came as {} integers, not {}", data.len(), Self::size(header)));
        }
        let n = |i: usize| header[i].max(0) as usize;
        let batch = match header[4] {
            0 => StepBatch::Running,
            1 => StepBatch::Prefill,
            other => return Err(format!("a step names an unknown batch ({other})")),
        };
        let (ids, rest) = data.split_at(n(1));
        let (lengths, rest) = rest.split_at(n(1));
        let (tokens, rest) = rest.split_at(n(1) * n(2));
        let (ended, rest) = rest.split_at(n(5));
        let (kept, stores) = rest.split_at(n(6));
        let batch_of = |code: i64| if code & 1 == 0 { StepBatch::Running } else { StepBatch::Prefill };
        let stores = stores
            .chunks(STORE_WORDS)
            .map(|w| match w[0] {
                1 => Ok(StoreOp::Store {
                    batch: batch_of(w[3]),
                    id: w[1] as RequestId,
                    len: w[2] as usize,
                    snapshot: w[3] & 2 != 0,
                }),
                2 => Ok(StoreOp::KeepHot { batch: batch_of(w[3]), id: w[1] as RequestId, len: w[2] as usize }),
                3 => Ok(StoreOp::Clear),
                other => Err(format!("an unknown prefix-cache store ({other})")),
            })
            .collect::<Result<_, String>>()?;
        Ok(StepRows {
            batch,
            rows: ids.iter().map(|&id| id as RequestId).collect(),
            lengths: lengths.iter().map(|&l| l as i32).collect(),
            tokens: tokens.iter().map(|&t| t as u32).collect(),
            verifying: header[8] != 0,
            pending: Pending {
                kept: (n(6) > 0).then(|| (header[7], kept.iter().map(|&k| k as i32).collect())),
                stores,
                ended: ended.iter().map(|&id| id as RequestId).collect(),
            },
        })
    }
}

/// Rows, in the engine's order, and this rank's layers' caches of them.
struct StageBatch {
    ids: Vec<RequestId>,
    cache: Vec<BatchKvCache>,
}

impl StageBatch {
    fn new(layers: usize, format: KvFormat) -> StageBatch {
        StageBatch { ids: Vec::new(), cache: (0..layers).map(|_| BatchKvCache::with_format(format)).collect() }
    }

    fn position(&self, id: RequestId) -> Option<usize> {
        self.ids.iter().position(|&r| r == id)
    }

    /// Keeps the rows at `keep` (in order).
    fn retain(&mut self, keep: &[usize]) -> Result<(), String> {
        for layer in &mut self.cache {
            layer.retain(keep).map_err(|e| e.to_string())?;
        }
        BatchKvCache::settle(&self.cache).map_err(|e| e.to_string())?;
        self.ids = keep.iter().map(|&r| self.ids[r]).collect();
        Ok(())
    }

    /// Takes row `id` out with its caches.
    fn take(&mut self, id: RequestId) -> Result<Option<Vec<KvCache>>, String> {
        let Some(row) = self.position(id) else { return Ok(None) };
        let caches = BatchKvCache::row_of(&self.cache, row).map_err(|e| e.to_string())?;
        let keep: Vec<usize> = (0..self.ids.len()).filter(|&r| r != row).collect();
        self.retain(&keep)?;
        Ok(Some(caches))
    }
}

/// A worker's caches of the engine's rows, and its prefix cache of its layers.
pub struct EngineStage {
    format: KvFormat,
    running: StageBatch,
    prefill: StageBatch,
    /// Rows out of both batches that have not ended (a set-aside prompt, a row about to join
    /// the running batch, a prompt start restored for a row's first step).
    loose: HashMap<RequestId, Vec<KvCache>>,
    /// Each live row's tokens in its caches (the prefix cache keys blocks by them).
    tokens: HashMap<RequestId, Vec<u32>>,
    prefix: Option<PrefixCache>,
}

impl EngineStage {
    pub fn new(model: &Transformer, format: KvFormat, prefix: Option<PrefixCache>) -> EngineStage {
        let layers = model.cache_count();
        EngineStage {
            format,
            running: StageBatch::new(layers, format),
            prefill: StageBatch::new(layers, format),
            loose: HashMap::new(),
            tokens: HashMap::new(),
            prefix,
        }
    }

    /// Brings the caches in step with the engine's, then runs this rank's layers over `h`.
    pub fn forward(&mut self, model: &Transformer, step: &StepRows, h: &Array) -> Result<Array, String> {
        self.catch_up(&step.pending)?;
        self.reconcile(step)?;
        let width = h.dim(1) as usize;
        for (r, (&id, &length)) in step.rows.iter().zip(&step.lengths).enumerate() {
            let tokens = self.tokens.entry(id).or_default();
            // Positions a verify step did not keep are written over.
            tokens.truncate(length.max(0) as usize);
            tokens.extend_from_slice(&step.tokens[r * width..(r + 1) * width]);
        }
        let batch = match step.batch {
            StepBatch::Running => &mut self.running,
            StepBatch::Prefill => &mut self.prefill,
        };
        if step.verifying {
            batch.cache.iter_mut().for_each(BatchKvCache::set_verifying);
        }
        let out = model.forward_layers(h, &mut batch.cache).map_err(|e| e.to_string())?;
        // Recurrent states too: left lazy they would hold the step's inputs.
        let states = batch.cache.iter().flat_map(|c| c.states().iter());
        mlx_rs::transforms::eval(std::iter::once(&out).chain(states)).map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Rank 0 restored the first `lengths[0]` of `tokens` of row `rows[0]` from its prefix
    /// cache: this rank restores what its own holds of them, at most that, and keeps it for the
    /// row's first step; returns how many tokens it holds.
    pub fn probe(&mut self, step: &StepRows) -> Result<usize, String> {
        self.catch_up(&step.pending)?;
        let (&id, &limit) = step.rows.first().zip(step.lengths.first()).ok_or("a probe names no row")?;
        let layers = self.running.cache.len();
        let empty = || (0..layers).map(|_| KvCache::with_format(self.format)).collect::<Vec<_>>();
        let limit = (limit.max(0) as usize).min(step.tokens.len());
        let (caches, held) = match self.prefix.as_mut().filter(|_| limit > 0) {
            Some(prefix) => match prefix.restore(&step.tokens, limit, layers) {
                Ok(restored) => (restored.caches, restored.tokens),
                Err(e) => {
                    tracing::warn!("prefix cache: restore failed: {e}");
                    (empty(), 0)
                }
            },
            None => (empty(), 0),
        };
        self.loose.insert(id, caches);
        self.tokens.insert(id, step.tokens[..held].to_vec());
        Ok(held)
    }

    /// Replays what rank 0 did since the workers last heard: the rejected drafts taken back,
    /// the prefix cache's stores, the rows that ended.
    fn catch_up(&mut self, pending: &Pending) -> Result<(), String> {
        // `kept` is by the running rows as they were at the verify step.
        if let Some((width, kept)) = &pending.kept {
            if kept.len() != self.running.ids.len() {
                return Err(out_of_step(format!(
                    "{} rows kept drafts, {} rows run here",
                    kept.len(),
                    self.running.ids.len()
                )));
            }
            for layer in &mut self.running.cache {
                layer.keep_verified(*width, kept).map_err(|e| e.to_string())?;
            }
        }
        for op in &pending.stores {
            self.store(op);
        }
        for &id in &pending.ended {
            self.loose.remove(&id);
            self.tokens.remove(&id);
            for batch in [&mut self.running, &mut self.prefill] {
                if let Some(row) = batch.position(id) {
                    let keep: Vec<usize> = (0..batch.ids.len()).filter(|&r| r != row).collect();
                    batch.retain(&keep)?;
                }
            }
        }
        Ok(())
    }

    /// One of rank 0's prefix-cache stores, on this rank's layers. One that cannot be done
    /// here only means fewer hits: a probe finds what every rank holds.
    fn store(&mut self, op: &StoreOp) {
        let Some(prefix) = self.prefix.as_mut() else { return };
        let (batch, id, len) = match *op {
            StoreOp::Clear => return prefix.clear(),
            StoreOp::Store { batch, id, len, .. } | StoreOp::KeepHot { batch, id, len } => (batch, id, len),
        };
        let batch = match batch {
            StepBatch::Running => &self.running,
            StepBatch::Prefill => &self.prefill,
        };
        let (Some(row), Some(tokens)) = (batch.position(id), self.tokens.get(&id).filter(|t| t.len() >= len)) else {
            tracing::warn!("prefix cache: request {id}'s {len} tokens are not here to store");
            return;
        };
        let stored = match *op {
            StoreOp::Store { snapshot, .. } => prefix.store_row(&tokens[..len], &batch.cache, row, snapshot),
            _ => {
                let caches: Option<Vec<KvCache>> = batch.cache.iter().map(BatchKvCache::only_row).collect();
                caches.into_iter().for_each(|c| prefix.keep_hot(&tokens[..len], c));
                Ok(())
            }
        };
        if let Err(e) = stored {
            tracing::warn!("prefix cache: cannot store request {id}'s blocks: {e}");
        }
    }

    /// The step's batch holds the step's rows, in its order: rows that left it without ending
    /// are set aside, rows that joined come from where they were (or start empty).
    fn reconcile(&mut self, step: &StepRows) -> Result<(), String> {
        let (batch, other) = match step.batch {
            StepBatch::Running => (&mut self.running, &mut self.prefill),
            StepBatch::Prefill => (&mut self.prefill, &mut self.running),
        };
        let leaving: Vec<RequestId> = batch.ids.iter().copied().filter(|id| !step.rows.contains(id)).collect();
        for id in leaving {
            if let Some(caches) = batch.take(id)? {
                self.loose.insert(id, caches);
            }
        }
        // The engine adds rows after those it keeps, in order.
        let kept = batch.ids.len();
        if step.rows.get(..kept) != Some(&batch.ids[..]) {
            return Err(out_of_step(format!(
                "the rows {:?} run here in another order than {:?}",
                batch.ids, step.rows
            )));
        }
        let mut joining = Vec::new();
        for (&id, &length) in step.rows[kept..].iter().zip(&step.lengths[kept..]) {
            let caches = match self.loose.remove(&id) {
                Some(caches) => caches,
                None => match other.take(id)? {
                    Some(caches) => caches,
                    None if length == 0 => (0..batch.cache.len()).map(|_| KvCache::with_format(self.format)).collect(),
                    None => return Err(out_of_step(format!("request {id} holds {length} tokens here it never ran"))),
                },
            };
            joining.push(caches);
        }
        if !joining.is_empty() {
            for (i, layer) in batch.cache.iter_mut().enumerate() {
                let rows: Vec<&KvCache> = joining.iter().map(|caches| &caches[i]).collect();
                layer.push_rows(&rows).map_err(|e| e.to_string())?;
            }
            BatchKvCache::settle(&batch.cache).map_err(|e| e.to_string())?;
            batch.ids.extend_from_slice(&step.rows[kept..]);
        }
        if let Some(first) = batch.cache.first() {
            let lengths = first.lengths();
            if lengths != step.lengths {
                return Err(out_of_step(format!(
                    "rows {:?} hold {lengths:?} tokens here, {:?} on rank 0",
                    step.rows, step.lengths
                )));
            }
        }
        Ok(())
    }
}

fn out_of_step(what: String) -> String {
    format!("this rank is out of step with rank 0's engine: {what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_rows_go_through_the_wire_unchanged() {
        let pending = Pending {
            kept: Some((3, vec![1, 3, 2])),
            stores: vec![
                StoreOp::Store { batch: StepBatch::Running, id: 9, len: 64, snapshot: true },
                StoreOp::KeepHot { batch: StepBatch::Prefill, id: 7, len: 5 },
                StoreOp::Clear,
            ],
            ended: vec![4],
        };
        let step = RemoteStep {
            batch: StepBatch::Prefill,
            rows: &[7, 9, 12],
            lengths: &[0, 16, 3],
            tokens: &[1, 2, 3, 4, 5, 6],
            verifying: true,
            pending: &pending,
            began: std::time::Instant::now(),
        };
        let (tail, data) = StepRows::encode(&step);
        let mut header = vec![4, 3, 2, 0];
        header.extend(tail);
        assert_eq!(data.len(), StepRows::size(&header));
        let rows = StepRows::decode(&header, &data).unwrap();
        let want = StepRows {
            batch: StepBatch::Prefill,
            rows: vec![7, 9, 12],
            lengths: vec![0, 16, 3],
            tokens: vec![1, 2, 3, 4, 5, 6],
            verifying: true,
            pending,
        };
        assert_eq!(rows, want);
        assert!(StepRows::decode(&header, &data[1..]).is_err());
    }
}
