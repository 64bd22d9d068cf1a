//! A worker's half of a served model (`fastmlx serve --cluster`): rank 0's engine batches,
//! admits and ends requests; a worker holds its layers' keys and values for the same rows and
//! follows what each step's description says (`engine::remote`). It keeps two batches, as the
//! engine does (the running rows and the prompts being prefilled), each row's columns in the
//! engine's order, and the caches of rows that left a batch without ending (a prompt set aside,
//! a row about to join the running batch) until they join one again.

use std::collections::HashMap;

use mlx_rs::Array;

use crate::engine::remote::{RemoteStep, StepBatch};
use crate::engine::RequestId;
use crate::model::{BatchKvCache, KvCache, KvFormat, LayerCache, Transformer};

/// A step's rows and what became of rows since the last, as the workers receive it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRows {
    pub batch: StepBatch,
    pub rows: Vec<RequestId>,
    pub lengths: Vec<i32>,
    pub ended: Vec<RequestId>,
    pub kept: Option<(i32, Vec<i32>)>,
    pub verifying: bool,
}

impl StepRows {
    /// The integers after the header: row ids, their lengths, the rows ended, the rows kept.
    pub fn encode(step: &RemoteStep) -> Vec<i64> {
        let kept = step.kept.map_or(&[][..], |(_, k)| k);
        let mut out = Vec::with_capacity(2 * step.rows.len() + step.ended.len() + kept.len());
        out.extend(step.rows.iter().map(|&id| id as i64));
        out.extend(step.lengths.iter().map(|&l| l as i64));
        out.extend(step.ended.iter().map(|&id| id as i64));
        out.extend(kept.iter().map(|&k| k as i64));
        out
    }

    /// How many integers follow `header` (see `pipeline::HEADER_LEN`).
    pub fn size(header: &[i32]) -> usize {
        2 * header[1].max(0) as usize + header[5].max(0) as usize + header[6].max(0) as usize
    }

    pub fn decode(header: &[i32], data: &[i64]) -> Result<StepRows, String> {
        if data.len() != Self::size(header) {
            return Err(format!("a step's rows came as {} integers, not {}", data.len(), Self::size(header)));
        }
        let (rows, ended, kept) = (header[1] as usize, header[5] as usize, header[6] as usize);
        let batch = match header[4] {
            0 => StepBatch::Running,
            1 => StepBatch::Prefill,
            other => return Err(format!("a step names an unknown batch ({other})")),
        };
        let (ids, rest) = data.split_at(rows);
        let (lengths, rest) = rest.split_at(rows);
        let (ended_ids, kept_rows) = rest.split_at(ended);
        Ok(StepRows {
            batch,
            rows: ids.iter().map(|&id| id as RequestId).collect(),
            lengths: lengths.iter().map(|&l| l as i32).collect(),
            ended: ended_ids.iter().map(|&id| id as RequestId).collect(),
            kept: (kept > 0).then(|| (header[7], kept_rows.iter().map(|&k| k as i32).collect())),
            verifying: header[8] != 0,
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

/// A worker's caches of the engine's rows.
pub struct EngineStage {
    format: KvFormat,
    running: StageBatch,
    prefill: StageBatch,
    /// Rows out of both batches that have not ended.
    loose: HashMap<RequestId, Vec<KvCache>>,
}

impl EngineStage {
    pub fn new(model: &Transformer, format: KvFormat) -> EngineStage {
        let layers = model.cache_count();
        EngineStage {
            format,
            running: StageBatch::new(layers, format),
            prefill: StageBatch::new(layers, format),
            loose: HashMap::new(),
        }
    }

    /// Brings the caches in step with the engine's, then runs this rank's layers over `h`.
    pub fn forward(&mut self, model: &Transformer, step: &StepRows, h: &Array) -> Result<Array, String> {
        self.catch_up(step)?;
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

    /// Replays on this rank's caches what the engine did to its own since the last step.
    fn catch_up(&mut self, step: &StepRows) -> Result<(), String> {
        // The verify step's rejected positions go first: `kept` is by the running rows as they
        // were then.
        if let Some((width, kept)) = &step.kept {
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
        for &id in &step.ended {
            self.loose.remove(&id);
            for batch in [&mut self.running, &mut self.prefill] {
                if let Some(row) = batch.position(id) {
                    let keep: Vec<usize> = (0..batch.ids.len()).filter(|&r| r != row).collect();
                    batch.retain(&keep)?;
                }
            }
        }
        let (batch, other) = match step.batch {
            StepBatch::Running => (&mut self.running, &mut self.prefill),
            StepBatch::Prefill => (&mut self.prefill, &mut self.running),
        };
        // Rows that left this batch without ending wait, with their caches, to join one again.
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
        let step = RemoteStep {
            batch: StepBatch::Prefill,
            rows: &[7, 9, 12],
            lengths: &[0, 16, 3],
            ended: &[4],
            kept: Some((3, &[1, 3, 2])),
            verifying: true,
        };
        let header = [4, 3, 5, 0, 1, 1, 3, 3, 1];
        let data = StepRows::encode(&step);
        assert_eq!(data.len(), StepRows::size(&header));
        let rows = StepRows::decode(&header, &data).unwrap();
        assert_eq!(
            rows,
            StepRows {
                batch: StepBatch::Prefill,
                rows: vec![7, 9, 12],
                lengths: vec![0, 16, 3],
                ended: vec![4],
                kept: Some((3, vec![1, 3, 2])),
                verifying: true,
            }
        );
        assert!(StepRows::decode(&header, &data[1..]).is_err());
    }
}
