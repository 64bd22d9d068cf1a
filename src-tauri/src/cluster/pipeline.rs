//! Pipeline parallel across the ranks of a cluster: rank 0 holds the ends (embeddings, final
//! norm, output head) and the first layers; each rank runs its layers on the residual stream the
//! rank before sent and passes it on, and the last rank sends it back to rank 0, around MLX's
//! ring (each rank talks only to its neighbours, as MLX's ring backend allows).
//!
//! Each step starts with a header from rank 0 (what to do, the batch and length, the dtype)
//! passed rank to rank ahead of the hidden states, so a worker knows what to receive; a worker
//! keeps one cache per layer it holds, in step with rank 0's.

use std::time::{Duration, Instant};

use mlx_rs::{Array, Dtype};

use super::watchdog::Watchdog;
use crate::mlx::distributed::Group;
use crate::model::{KvCache, KvFormat, Transformer};

/// What a step asks of the workers.
const FORWARD: i32 = 1;
/// Start a new sequence: empty caches.
const RESET: i32 = 2;
/// Rank 0 is done: the workers return.
const STOP: i32 = 3;
/// kind, batch, length, dtype.
const HEADER_LEN: usize = 4;

/// What rank 0 measured of its steps.
#[derive(Debug, Clone, Default)]
pub struct PipelineStats {
    pub steps: u64,
    /// Token positions sent through (batch x length, summed over steps).
    pub tokens: u64,
    /// Bytes sent over each hop (headers included).
    pub bytes_per_hop: u64,
    /// Time rank 0 waited for the other ranks (their layers and every hop back to it).
    pub waited: Duration,
    /// Time of the whole steps on rank 0 (its own layers, sends and the wait).
    pub total: Duration,
}

/// One rank's end of the pipeline.
pub struct Pipeline<'g> {
    group: &'g Group,
    watchdog: Watchdog,
    hidden: i32,
    pub stats: PipelineStats,
}

fn dtype_code(d: Dtype) -> Result<i32, String> {
    match d {
        Dtype::Float32 => Ok(0),
        Dtype::Float16 => Ok(1),
        Dtype::Bfloat16 => Ok(2),
        other => Err(format!("hidden states in {other:?} cannot be pipelined")),
    }
}

fn code_dtype(code: i32) -> Result<Dtype, String> {
    match code {
        0 => Ok(Dtype::Float32),
        1 => Ok(Dtype::Float16),
        2 => Ok(Dtype::Bfloat16),
        other => Err(format!("a rank sent an unknown dtype code {other}")),
    }
}

fn eval(a: Array) -> Result<Array, String> {
    a.eval().map_err(|e| e.to_string())?;
    Ok(a)
}

fn model_err(e: crate::model::ModelError) -> String {
    e.to_string()
}

impl<'g> Pipeline<'g> {
    pub fn new(group: &'g Group, watchdog: Watchdog, hidden: usize) -> Pipeline<'g> {
        Pipeline { group, watchdog, hidden: hidden as i32, stats: PipelineStats::default() }
    }

    fn right(&self) -> usize {
        (self.group.rank() + 1) % self.group.size()
    }

    fn left(&self) -> usize {
        (self.group.rank() + self.group.size() - 1) % self.group.size()
    }

    fn send(&self, x: &Array) -> Result<(), String> {
        let to = self.right();
        let _w = self.watchdog.waiting(format!("sending to rank {to}"));
        eval(self.group.send(x, to)?).map(|_| ())
    }

    fn recv(&self, shape: &[i32], dtype: Dtype) -> Result<Array, String> {
        let from = self.left();
        let _w = self.watchdog.waiting(format!("waiting for rank {from}"));
        eval(self.group.recv(shape, dtype, from)?)
    }

    fn send_header(&self, kind: i32, batch: i32, len: i32, dtype: i32) -> Result<(), String> {
        self.send(&Array::from_slice(&[kind, batch, len, dtype], &[HEADER_LEN as i32]))
    }

    /// Rank 0: the final hidden states (after the final norm) of token ids `[B, L]` through
    /// every rank's layers; `cache` holds rank 0's layers' caches.
    pub fn forward(&mut self, model: &Transformer, ids: &Array, cache: &mut [KvCache]) -> Result<Array, String> {
        let started = Instant::now();
        let (batch, len) = (ids.dim(0), ids.dim(1));
        let h = model.embed_tokens(ids).and_then(|h| model.forward_layers(&h, cache)).map_err(model_err)?;
        self.send_header(FORWARD, batch, len, dtype_code(h.dtype())?)?;
        // Rank 0's layers run as the send is evaluated.
        self.send(&h)?;
        let sent = Instant::now();
        let back = self.recv(&[batch, len, self.hidden], h.dtype())?;
        self.stats.waited += sent.elapsed();
        self.stats.total += started.elapsed();
        self.stats.steps += 1;
        self.stats.tokens += (batch * len) as u64;
        self.stats.bytes_per_hop += (HEADER_LEN * 4) as u64 + h.nbytes() as u64;
        model.final_norm(&back).map_err(model_err)
    }

    /// Rank 0: the workers start a new sequence (empty caches).
    pub fn reset(&mut self) -> Result<(), String> {
        self.send_header(RESET, 0, 0, 0)
    }

    /// Rank 0: the workers return from [`Self::serve_stage`].
    pub fn stop(&mut self) -> Result<(), String> {
        self.send_header(STOP, 0, 0, 0)
    }

    /// The other ranks: run this rank's layers on each step rank 0 starts, until it stops.
    pub fn serve_stage(&mut self, model: &Transformer, format: KvFormat) -> Result<(), String> {
        let mut cache = model.new_cache_in(format);
        // The last rank sends back to rank 0, which needs no header.
        let passes_on = self.right() != 0;
        loop {
            let header = self.recv(&[HEADER_LEN as i32], Dtype::Int32)?;
            let &[kind, batch, len, code] = header.as_slice::<i32>() else {
                return Err("a short step header".into());
            };
            match kind {
                STOP => {
                    if passes_on {
                        self.send_header(STOP, 0, 0, 0)?;
                    }
                    return Ok(());
                }
                RESET => {
                    cache = model.new_cache_in(format);
                    if passes_on {
                        self.send_header(RESET, 0, 0, 0)?;
                    }
                }
                FORWARD => {
                    let dtype = code_dtype(code)?;
                    if passes_on {
                        self.send_header(FORWARD, batch, len, code)?;
                    }
                    let h = self.recv(&[batch, len, self.hidden], dtype)?;
                    let out = model.forward_layers(&h, &mut cache).map_err(model_err)?;
                    if out.dtype() != dtype {
                        return Err(format!(
                            "the residual stream changed dtype in this rank's layers ({:?})",
                            out.dtype()
                        ));
                    }
                    self.send(&out)?;
                }
                other => return Err(format!("rank {} sent an unknown step ({other})", self.left())),
            }
        }
    }
}
