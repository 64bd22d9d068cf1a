//! Pipeline parallel across the ranks of a cluster: rank 0 holds the ends (embeddings, final
//! norm, output head) and the first layers; each rank runs its layers on the residual stream the
//! rank before sent and passes it on, and the last rank sends it back to rank 0, around MLX's
//! ring (each rank talks only to its neighbours, as MLX's ring backend allows).
//!
//! Each step starts with a header from rank 0 (what to do, the batch and length, the dtype)
//! passed rank to rank ahead of the hidden states, so a worker knows what to receive; a worker
//! keeps one cache per layer it holds, in step with rank 0's. An engine's step (`serve
//! --cluster`) also names its rows and what became of the rows since the last step, in a second
//! message of integers (`stage_server`).
//!
//! A model shared out by tensors (`serve --cluster --parallel tensor`) takes the same control
//! path: the step's header and rows go down the ring ahead of it, then every rank embeds the
//! step's tokens and runs its share of every layer, the ranks summing their partial outputs
//! (MLX's `all_sum`) instead of passing the residual stream on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx_rs::{Array, Dtype};

use super::stage_server::{EngineStage, StepRows, HEADER_TAIL};
use super::sum_sampler::{StepKind, SumSampler};
use super::watchdog::Watchdog;
use crate::engine::remote::{ClusterView, LinkHealth, Pending, RemoteLayers, RemoteStep, StepBatch};
use crate::engine::RequestId;
use crate::mlx::distributed::Group;
use crate::model::{KvCache, KvFormat, Transformer};

/// What a step asks of the workers.
const FORWARD: i32 = 1;
/// Start a new sequence: empty caches.
const RESET: i32 = 2;
/// Rank 0 is done: the workers return.
const STOP: i32 = 3;
/// An engine's step: the header says how long the rows' description that follows is.
const STEP: i32 = 4;
/// Rank 0 restored a prompt's start from its prefix cache: each worker restores what it holds
/// of it, and the fewest tokens any holds comes back to rank 0.
const PROBE: i32 = 5;
/// Rank 0 is idle and still there: passed around the ring and back to it, so that every rank
/// hears from the others well within its deadline (a rank silent past it is taken as gone).
const PING: i32 = 6;
/// Rank 0 has been idle a while: each worker passes this on and waits for rank 0's word on its
/// presence connection instead of on MLX's ring, whose wait spins a core (its sockets are
/// polled in a loop) for as long as it lasts. The header's batch field is the park's number.
const PARK: i32 = 7;
/// Idle time after which rank 0 parks the workers.
const PARK_AFTER: Duration = Duration::from_secs(1);
/// kind, batch, length, dtype, then for [`STEP`] and [`PROBE`] the rows' description's sizes
/// (`StepRows`).
const HEADER_LEN: usize = 4 + HEADER_TAIL;

/// Positions a part of a prefill step has at least (fewer cost more in steps than they save).
const PART_POSITIONS: usize = 64;
/// Parts a prefill step is cut into at most: more parts idle the machines less (`(parts + ranks -
/// 1) / (ranks x parts)` of the step's time in turn, for equal stages) but run smaller matrices.
const MOST_PARTS: usize = 4;

/// What rank 0 does next while a prefill step goes down the pipeline in parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartMove {
    /// Send part i (its header, rows and residual stream) to rank 1.
    Send(usize),
    /// Run rank 0's own layers on part i (the first is run before any move).
    Own(usize),
    /// Wait for part i to come back from the ring's last rank.
    Back(usize),
}

/// Rank 0's moves for a prefill step in `parts`, with at most `window` parts out. A worker
/// takes a part whole, runs it and passes it on before it takes the next, so it holds one part
/// at a time: with at most one part out per other rank (the default window), some worker is
/// always free to take one, and no two ranks ever wait to send to each other, however little a
/// link buffers (MLX's sends block until the socket takes them). Every other rank then runs a
/// part while rank 0 runs its layers on the next one.
fn moves_within(parts: usize, window: usize) -> Vec<PartMove> {
    let window = window.max(1);
    let mut moves = Vec::with_capacity(3 * parts);
    let mut back = 0;
    for i in 0..parts {
        moves.push(PartMove::Send(i));
        let last = i + 1 == parts;
        if !last {
            moves.push(PartMove::Own(i + 1));
        }
        while back <= i && (last || i + 1 - back >= window) {
            moves.push(PartMove::Back(back));
            back += 1;
        }
    }
    moves
}

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
pub struct Pipeline {
    group: Arc<Group>,
    watchdog: Watchdog,
    /// Rank 0 serving: broken once a step failed or a wait passed its deadline.
    health: LinkHealth,
    hidden: i32,
    pub stats: PipelineStats,
    /// Rank 0 serving: what `/admin/status` and `/metrics` show of the cluster.
    view: ClusterView,
    /// Rank 0: when the other ranks last answered (a step, a probe or a heartbeat).
    last_heard: Instant,
    /// Rank 0: when its last step went through (the workers are parked a while after).
    last_step: Instant,
    /// Rank 0 serving: the fewest tokens of keys and values any other rank has room for.
    kv_capacity: Option<usize>,
    /// Each rank's place in the host file, which names it in errors (a cluster formed without
    /// a machine renumbers the rest).
    places: Vec<usize>,
    /// Tensor parallel: the sums (`all_sum`) of one step through the model, instead of hops.
    sums: Option<usize>,
    /// Tensor parallel, rank 0: which steps' sums are timed.
    sampler: Option<SumSampler>,
    /// Rank 0 serving: tells the parked workers to wait on the ring again (the park's number).
    waker: Option<Box<dyn Fn(u64) + Send>>,
    /// Rank 0: the workers' park, if they are parked, and the parks so far.
    parked: Option<u64>,
    parks: u64,
    /// The most parts a prefill step goes down in (`FASTMLX_CLUSTER_PARTS`, read once).
    most_parts: usize,
    /// The most parts out at once (`FASTMLX_CLUSTER_WINDOW`, read once; at most one per other
    /// rank, which is the default): 1 runs the others' stages in turn, to measure against.
    window: Option<usize>,
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
    a.eval().map_err(|e| without_source_places(&e.to_string()))?;
    Ok(a)
}

/// MLX's message without the source files and lines it was raised at (`[ring] connection to a
/// peer was lost at /path/array.cpp:352`): what a person reading the error can act on.
fn without_source_places(message: &str) -> String {
    message.split(" at /").next().unwrap_or(message).trim_matches('"').to_string()
}

/// A tensor-parallel step's rows and positions, checked against its description.
fn step_shape(step: &RemoteStep) -> Result<(usize, usize), String> {
    let rows = step.rows.len();
    let positions = step.tokens.len() / rows.max(1);
    if rows == 0 || positions * rows != step.tokens.len() || step.lengths.len() != rows {
        return Err(format!("a step of {} tokens over {rows} rows", step.tokens.len()));
    }
    Ok((rows, positions))
}

fn model_err(e: crate::model::ModelError) -> String {
    e.to_string()
}

impl Pipeline {
    pub fn new(group: Arc<Group>, watchdog: Watchdog, hidden: usize) -> Pipeline {
        Pipeline {
            group,
            watchdog,
            health: LinkHealth::default(),
            hidden: hidden as i32,
            stats: PipelineStats::default(),
            view: ClusterView::default(),
            last_heard: Instant::now(),
            last_step: Instant::now(),
            kv_capacity: None,
            places: Vec::new(),
            sums: None,
            sampler: None,
            waker: None,
            parked: None,
            parks: 0,
            most_parts: std::env::var("FASTMLX_CLUSTER_PARTS").ok().and_then(|v| v.parse().ok()).unwrap_or(MOST_PARTS),
            window: std::env::var("FASTMLX_CLUSTER_WINDOW").ok().and_then(|v| v.parse().ok()),
        }
    }

    /// Every rank holds its share of every layer of `model` (tensor parallel), whose sums rank 0
    /// times now and then.
    pub fn sharing_layers(mut self, model: &Transformer) -> Pipeline {
        self.sums = Some(model.sums_per_step());
        self.sampler = model.sum_clock().filter(|_| self.group.rank() == 0).map(SumSampler::new);
        self
    }

    /// The ranks are named by these places in the host file (rank order).
    pub fn with_places(mut self, places: Vec<usize>) -> Pipeline {
        self.places = places;
        self
    }

    /// How `rank` of the group is named: its place in the host file.
    fn name(&self, rank: usize) -> usize {
        super::roster::place_of(&self.places, rank)
    }

    /// Rank 0 serving: the other ranks have room for `tokens` of keys and values at most.
    pub fn with_kv_capacity(mut self, tokens: usize) -> Pipeline {
        self.kv_capacity = Some(tokens);
        self
    }

    /// Rank 0 serving: the workers are parked while it is idle, and `wake` tells them a step
    /// follows (without it, they wait on the ring throughout).
    pub fn with_waker(mut self, wake: impl Fn(u64) + Send + 'static) -> Pipeline {
        self.waker = Some(Box::new(wake));
        self
    }

    /// Rank 0, before it uses the ring: not once a rank is lost (MLX's ring is not to be waited
    /// on again); parked workers woken first.
    fn ready(&mut self) -> Result<(), String> {
        if let Some(why) = self.health.fault() {
            return Err(why);
        }
        if let (Some(park), Some(wake)) = (self.parked.take(), &self.waker) {
            wake(park);
        }
        Ok(())
    }

    /// Rank 0 serving: its steps are counted in `view` too.
    pub fn with_view(mut self, view: ClusterView) -> Pipeline {
        self.view = view;
        self
    }

    fn right(&self) -> usize {
        (self.group.rank() + 1) % self.group.size()
    }

    fn left(&self) -> usize {
        (self.group.rank() + self.group.size() - 1) % self.group.size()
    }

    fn send(&self, x: &Array) -> Result<(), String> {
        let to = self.right();
        let what = format!("sending to rank {}", self.name(to));
        let _w = self.watchdog.waiting(what.clone());
        self.group.send(x, to).and_then(eval).map(|_| ()).map_err(|e| format!("{what}: {e}"))
    }

    fn recv(&self, shape: &[i32], dtype: Dtype) -> Result<Array, String> {
        let from = self.left();
        let what = self.waiting_for(from);
        let _w = self.watchdog.waiting(what.clone());
        self.group.recv(shape, dtype, from).and_then(eval).map_err(|e| format!("{what}: {e}"))
    }

    /// What a wait on `from` says if it fails. Rank 0 of three or more hears only from the ring's
    /// last rank, whose silence may be any other rank's loss: it says so rather than blame it.
    fn waiting_for(&self, from: usize) -> String {
        let size = self.group.size();
        if self.group.rank() != 0 || size < 3 {
            return format!("waiting for rank {}", self.name(from));
        }
        let others: Vec<String> = (1..size).map(|r| self.name(r).to_string()).collect();
        format!(
            "waiting for rank {}, the ring's last: one of ranks {} is lost or stalled",
            self.name(from),
            others.join(", ")
        )
    }

    /// Rank 0 serving: what tells the engine, its streams and `/health` that a rank is lost
    /// (a failed step, or the watchdog's deadline on a wait that may never return).
    pub fn health(&self) -> LinkHealth {
        self.health.clone()
    }

    fn send_header(&self, kind: i32, batch: i32, len: i32, dtype: i32) -> Result<(), String> {
        let mut header = [0; HEADER_LEN];
        header[..4].copy_from_slice(&[kind, batch, len, dtype]);
        self.send(&Array::from_slice(&header, &[HEADER_LEN as i32]))
    }

    /// Rank 0: the final hidden states (after the final norm) of token ids `[B, L]` through
    /// every rank's layers; `cache` holds rank 0's layers' caches.
    pub fn forward(&mut self, model: &Transformer, ids: &Array, cache: &mut [KvCache]) -> Result<Array, String> {
        let started = Instant::now();
        let (batch, len) = (ids.dim(0), ids.dim(1));
        let h = model.embed_tokens(ids).and_then(|h| model.forward_layers(&h, cache)).map_err(model_err)?;
        self.send_header(FORWARD, batch, len, dtype_code(h.dtype())?)?;
        let back = self.round_trip(&h, started, 0)?;
        model.final_norm(&back).map_err(model_err)
    }

    /// What a rank waits on while it sums a step's outputs with the others.
    fn summing_with(&self) -> String {
        let others: Vec<String> =
            (0..self.group.size()).filter(|&r| r != self.group.rank()).map(|r| self.name(r).to_string()).collect();
        format!("summing a step's outputs with rank {}", others.join(", "))
    }

    /// Rank 0, its header sent: sends the residual stream `h` on and waits for it to come back
    /// through every rank's layers. `extra`: bytes sent ahead besides the header.
    fn round_trip(&mut self, h: &Array, started: Instant, extra: usize) -> Result<Array, String> {
        // Rank 0's layers run as the send is evaluated.
        self.send(h)?;
        let sent = Instant::now();
        let back = self.recv(&[h.dim(0), h.dim(1), self.hidden], h.dtype())?;
        let bytes = (HEADER_LEN * 4 + extra) as u64 + h.nbytes() as u64;
        self.record((h.dim(0) * h.dim(1)) as u64, bytes, sent.elapsed(), started.elapsed());
        Ok(back)
    }

    /// One step's costs: its token positions, the bytes over each hop, the wait for the other
    /// ranks and the whole step.
    fn record(&mut self, tokens: u64, bytes: u64, waited: Duration, total: Duration) {
        self.stats.waited += waited;
        self.stats.total += total;
        self.stats.steps += 1;
        self.stats.tokens += tokens;
        self.stats.bytes_per_hop += bytes;
        self.view.record_step(tokens, bytes, waited, total);
        (self.last_heard, self.last_step) = (Instant::now(), Instant::now());
    }

    /// Rank 0's engine: one step of its batch through the other ranks' layers (see
    /// `stage_server` for what the workers do with the rows' description); `own` runs rank 0's.
    pub fn forward_step(
        &mut self,
        step: &RemoteStep,
        own: &mut dyn FnMut() -> Result<Array, String>,
    ) -> Result<Array, String> {
        self.ready()?;
        let stepped = match self.sums {
            Some(sums) => {
                let (rows, positions) = step_shape(step)?;
                self.shared_step(step, own, (rows, positions), sums)
            }
            // Rank 0's own graph is built before anything is sent: an error there is its own.
            None => {
                let h = own()?;
                self.send_step(step, &h)
            }
        };
        stepped.map_err(|e| self.lost(e))
    }

    /// A wait on the ring failed with `error`: the link fails, and the step's requests end
    /// with its reason, the machine gone named where the roster knows it (not MLX's words alone,
    /// which name no machine).
    fn lost(&self, error: String) -> String {
        self.health.fail(format!("the cluster lost a rank: {error}"));
        self.health.fault().unwrap_or(error)
    }

    /// Rank 0's engine: into how many parts a prefill step of `width` positions goes down the
    /// pipeline (`FASTMLX_CLUSTER_PARTS` caps it: 1 sends every step whole, to measure against).
    pub fn parts_for(&self, width: usize) -> usize {
        match self.sums {
            Some(_) => 1,
            None => (width / PART_POSITIONS).clamp(1, self.most_parts.max(1)),
        }
    }

    /// Rank 0's engine: the parts of one prefill step, in order; `own(i)` runs rank 0's layers
    /// on part `i`. Up to one part per other rank is out at once ([`moves_within`]): rank 0 runs
    /// its layers on the next part while every other rank runs one of the parts before.
    pub fn forward_parts(
        &mut self,
        steps: &[RemoteStep],
        own: &mut dyn FnMut(usize) -> Result<Array, String>,
    ) -> Result<Vec<Array>, String> {
        self.ready()?;
        // Rank 0's own graph of the first part is built before anything is sent.
        let first = own(0)?;
        self.send_parts(steps, own, first).map_err(|e| self.lost(e))
    }

    fn send_parts(
        &mut self,
        steps: &[RemoteStep],
        own: &mut dyn FnMut(usize) -> Result<Array, String>,
        first: Array,
    ) -> Result<Vec<Array>, String> {
        let mut outs = Vec::with_capacity(steps.len());
        let mut mark = steps.first().map_or_else(Instant::now, |s| s.began);
        // Each part's rank-0 output, kept until it is sent; what went out: (shape, bytes).
        let mut ready = vec![Some(first)];
        let mut out: Vec<(i32, i32, Dtype, u64)> = Vec::with_capacity(steps.len());
        // A send waits while rank 1 runs the part before: a wait for the others too.
        let mut sending = Duration::ZERO;
        let most_out = self.group.size().saturating_sub(1).max(1);
        let window = self.window.map_or(most_out, |w| w.clamp(1, most_out));
        for step in moves_within(steps.len(), window) {
            match step {
                PartMove::Own(i) => ready.push(Some(eval(own(i)?)?)),
                PartMove::Send(i) => {
                    // Rank 0's own layers run first, so that the send's time is the wait alone.
                    let h = eval(ready[i].take().ok_or("a part sent twice")?)?;
                    let started = Instant::now();
                    let data = self.send_described(STEP, h.dim(0), h.dim(1), dtype_code(h.dtype())?, &steps[i])?;
                    self.send(&h)?;
                    sending += started.elapsed();
                    let bytes = (HEADER_LEN * 4 + data * 8) as u64 + h.nbytes() as u64;
                    out.push((h.dim(0), h.dim(1), h.dtype(), bytes));
                }
                PartMove::Back(i) => {
                    let (rows, positions, dtype, bytes) = out[i];
                    let waiting = Instant::now();
                    let back = self.recv(&[rows, positions, self.hidden], dtype)?;
                    // Each part's time runs from the end of the one before: they add up to the step's.
                    let waited = waiting.elapsed() + std::mem::take(&mut sending);
                    self.record((rows * positions) as u64, bytes, waited, mark.elapsed());
                    mark = Instant::now();
                    outs.push(back);
                }
            }
        }
        Ok(outs)
    }

    /// Tensor parallel: the step's rows go down the ring, then rank 0 runs its share of every
    /// layer while the others run theirs, the sums waited for under the deadline.
    fn shared_step(
        &mut self,
        step: &RemoteStep,
        own: &mut dyn FnMut() -> Result<Array, String>,
        (rows, positions): (usize, usize),
        sums: usize,
    ) -> Result<Array, String> {
        let data = self.send_described(STEP, rows as i32, positions as i32, 0, step)?;
        let sent = Instant::now();
        let kind = StepKind::of(positions);
        if let Some(sampler) = self.sampler.as_mut() {
            sampler.start(kind);
        }
        let h = {
            // MLX's sum does not say which rank it lost; the roster names it once rank 0 starts again.
            let what = self.summing_with();
            let _w = self.watchdog.waiting(what.clone());
            own().map_err(|e| without_source_places(&e)).and_then(eval).map_err(|e| format!("{what}: {e}"))
        };
        if let Some(sampler) = self.sampler.as_mut() {
            let total = step.began.elapsed();
            if let Some(sums) = sampler.finish(total, h.is_ok()) {
                self.view.record_timed_sums(kind == StepKind::Decode, sums, total);
            }
        }
        let h = h?;
        // A ring's sum sends 2 (n - 1) / n of the array from each rank.
        let n = self.group.size() as u64;
        let summed = sums as u64 * h.nbytes() as u64 * 2 * (n - 1) / n.max(1);
        let bytes = (HEADER_LEN * 4 + data * 8) as u64 + summed;
        self.record((rows * positions) as u64, bytes, sent.elapsed(), step.began.elapsed());
        Ok(h)
    }

    fn send_step(&mut self, step: &RemoteStep, h: &Array) -> Result<Array, String> {
        let rows = step.rows.len();
        if rows != h.dim(0) as usize || step.lengths.len() != rows {
            return Err(format!("a step of {} rows with {rows} rows named", h.dim(0)));
        }
        let data = self.send_described(STEP, h.dim(0), h.dim(1), dtype_code(h.dtype())?, step)?;
        self.round_trip(h, step.began, data * 8)
    }

    /// Sends a header and the rows' description that follows it; returns its integers.
    fn send_described(&self, kind: i32, rows: i32, len: i32, dtype: i32, step: &RemoteStep) -> Result<usize, String> {
        let (tail, data) = StepRows::encode(step);
        let mut header = [0; HEADER_LEN];
        header[..4].copy_from_slice(&[kind, rows, len, dtype]);
        header[4..].copy_from_slice(&tail);
        self.send(&Array::from_slice(&header, &[HEADER_LEN as i32]))?;
        self.send(&Array::from_slice(&data, &[data.len() as i32]))?;
        Ok(data.len())
    }

    /// Rank 0's engine: how many of `tokens` (request `id`'s prompt start, restored here) every
    /// worker restored from its own prefix cache (each keeps it for the row's first step).
    pub fn probe(&mut self, pending: &Pending, id: RequestId, tokens: &[u32]) -> Result<usize, String> {
        self.ready()?;
        let asked = || -> Result<usize, String> {
            let step = RemoteStep {
                batch: StepBatch::Prefill,
                rows: &[id],
                lengths: &[tokens.len() as i32],
                tokens,
                verifying: false,
                pending,
                began: Instant::now(),
            };
            self.send_described(PROBE, 1, tokens.len() as i32, 0, &step)?;
            let held = self.recv(&[1], Dtype::Int64)?;
            Ok(held.as_slice::<i64>()[0].max(0) as usize)
        };
        asked().map_err(|e| self.lost(e))
    }

    /// Rank 0, idle: a heartbeat around the ring once a quarter of the deadline (at most 5 s)
    /// has passed without a word from the others; a rank that does not pass it on is lost.
    pub fn keep_alive(&mut self) {
        if self.health.fault().is_some() {
            return;
        }
        // The heartbeat, parked workers woken for it: every rank hears from the others within
        // its deadline, parked or not, and a ring broken while idle is found while idle.
        let every = (self.watchdog.timeout() / 4).min(Duration::from_secs(5));
        if self.last_heard.elapsed() >= every {
            let ping = |p: &mut Pipeline| -> Result<(), String> {
                p.ready()?;
                p.send_header(PING, 0, 0, 0)?;
                p.recv(&[HEADER_LEN as i32], Dtype::Int32).map(|_| ())
            };
            match ping(self) {
                Ok(()) => self.last_heard = Instant::now(),
                Err(e) => {
                    self.lost(e);
                    return;
                }
            }
        }
        if self.waker.is_some() && self.parked.is_none() && self.last_step.elapsed() >= PARK_AFTER {
            // Numbers within i32 (the header's field), 68 years at one park a second.
            let park = self.parks % i32::MAX as u64 + 1;
            match self.send_header(PARK, park as i32, 0, 0) {
                Ok(()) => (self.parks, self.parked) = (park, Some(park)),
                Err(e) => {
                    self.lost(e);
                }
            }
        }
    }

    /// Rank 0: the workers start a new sequence (empty caches).
    pub fn reset(&mut self) -> Result<(), String> {
        self.ready()?;
        self.send_header(RESET, 0, 0, 0)
    }

    /// Rank 0: the workers return from [`Self::serve_stage`].
    pub fn stop(&mut self) -> Result<(), String> {
        self.ready()?;
        self.send_header(STOP, 0, 0, 0)
    }

    /// The other ranks: run this rank's layers on each step rank 0 starts, until it stops.
    /// An engine's prefix cache on this rank, where the server keeps one, is `prefix`.
    pub fn serve_stage(
        &mut self,
        model: &Transformer,
        format: KvFormat,
        prefix: Option<crate::engine::kv::prefix_cache::PrefixCache>,
    ) -> Result<(), String> {
        let mut cache = model.new_cache_in(format);
        let mut engine = EngineStage::new(model, format, prefix);
        // The last rank sends back to rank 0, which needs no header.
        let passes_on = self.right() != 0;
        loop {
            let header = self.recv(&[HEADER_LEN as i32], Dtype::Int32)?;
            let header: [i32; HEADER_LEN] =
                header.as_slice::<i32>().try_into().map_err(|_| "a short step header".to_string())?;
            let [kind, batch, len, code, ..] = header;
            match kind {
                STOP => {
                    if passes_on {
                        self.send_header(STOP, 0, 0, 0)?;
                    }
                    return Ok(());
                }
                // Passed on, the last rank's back to rank 0.
                PING => self.send_header(PING, 0, 0, 0)?,
                // Passed on (not back to rank 0), then no wait on the ring until rank 0's word.
                PARK => {
                    if passes_on {
                        self.send_header(PARK, batch, 0, 0)?;
                    }
                    // Rank 0 wakes its parked workers for its heartbeat well within the deadline.
                    let within = self.watchdog.timeout();
                    if !super::presence::wait_for_wake(batch as u64, within) {
                        let rank_0 = self.name(0);
                        return Err(format!("rank {rank_0} not heard from for {} s", within.as_secs()));
                    }
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
                    self.send_on(out, dtype)?;
                }
                // Every rank starts together: the step goes on before this rank runs its share.
                STEP if self.sums.is_some() => {
                    if passes_on {
                        self.send(&Array::from_slice(&header, &[HEADER_LEN as i32]))?;
                    }
                    let data = self.recv(&[StepRows::size(&header) as i32], Dtype::Int64)?;
                    if passes_on {
                        self.send(&data)?;
                    }
                    let rows = StepRows::decode(&header, data.as_slice::<i64>())?;
                    // Its share of every layer on the step's tokens, summed with the others'.
                    let ids = Array::from_slice(&rows.tokens, &[batch, len]);
                    let _w = self.watchdog.waiting(self.summing_with());
                    let h = model.embed_tokens(&ids).map_err(model_err)?;
                    engine.forward(model, &rows, &h)?;
                }
                // Taken whole and run before anything is passed on: this rank holds one step at
                // a time, which lets rank 0 keep a part of a prefill step with each rank.
                STEP => {
                    let dtype = code_dtype(code)?;
                    let data = self.recv(&[StepRows::size(&header) as i32], Dtype::Int64)?;
                    let rows = StepRows::decode(&header, data.as_slice::<i64>())?;
                    let h = self.recv(&[batch, len, self.hidden], dtype)?;
                    let out = eval(engine.forward(model, &rows, &h)?)?;
                    if passes_on {
                        self.send(&Array::from_slice(&header, &[HEADER_LEN as i32]))?;
                        self.send(&data)?;
                    }
                    self.send_on(out, dtype)?;
                }
                PROBE => {
                    let data = self.recv(&[StepRows::size(&header) as i32], Dtype::Int64)?;
                    let mut data = data.as_slice::<i64>().to_vec();
                    let rows = StepRows::decode(&header, &data)?;
                    let held = engine.probe(&rows)? as i64;
                    if passes_on {
                        // The next rank restores at most what this one holds.
                        data[1] = held;
                        self.send(&Array::from_slice(&header, &[HEADER_LEN as i32]))?;
                        self.send(&Array::from_slice(&data, &[data.len() as i32]))?;
                    } else {
                        self.send(&Array::from_slice(&[held], &[1]))?;
                    }
                }
                other => return Err(format!("rank {} sent an unknown step ({other})", self.name(self.left()))),
            }
        }
    }

    /// A worker's output goes on to the next rank (rank 0 after the last).
    fn send_on(&self, out: Array, dtype: Dtype) -> Result<(), String> {
        if out.dtype() != dtype {
            return Err(format!("the residual stream changed dtype in this rank's layers ({:?})", out.dtype()));
        }
        self.send(&out)
    }
}

impl RemoteLayers for Pipeline {
    fn forward(&mut self, step: &RemoteStep, own: &mut dyn FnMut() -> Result<Array, String>) -> Result<Array, String> {
        self.forward_step(step, own)
    }

    fn parts_for(&self, width: usize) -> usize {
        Pipeline::parts_for(self, width)
    }

    fn forward_parts(
        &mut self,
        steps: &[RemoteStep],
        own: &mut dyn FnMut(usize) -> Result<Array, String>,
    ) -> Result<Vec<Array>, String> {
        Pipeline::forward_parts(self, steps, own)
    }

    fn probe(&mut self, pending: &Pending, id: RequestId, tokens: &[u32]) -> Result<usize, String> {
        Pipeline::probe(self, pending, id, tokens)
    }

    fn keep_alive(&mut self) {
        Pipeline::keep_alive(self);
    }

    fn stop(&mut self) {
        if self.health.fault().is_none() {
            if let Err(e) = Pipeline::stop(self) {
                tracing::warn!("cannot stop the other ranks: {e}");
            }
        }
    }

    fn health(&self) -> LinkHealth {
        self.health.clone()
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        self.kv_capacity
    }

    fn view(&self) -> ClusterView {
        self.view.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::PartMove::{Back, Own, Send};
    use super::*;
    use std::sync::mpsc::{channel, sync_channel};

    /// The default: one part out per other rank.
    fn part_moves(parts: usize, ranks: usize) -> Vec<PartMove> {
        moves_within(parts, ranks - 1)
    }

    #[test]
    fn two_ranks_keep_one_part_out_and_three_keep_two() {
        assert_eq!(part_moves(1, 2), [Send(0), Back(0)]);
        assert_eq!(part_moves(3, 2), [Send(0), Own(1), Back(0), Send(1), Own(2), Back(1), Send(2), Back(2)]);
        assert_eq!(
            part_moves(4, 3),
            [Send(0), Own(1), Send(1), Own(2), Back(0), Send(2), Own(3), Back(1), Send(3), Back(2), Back(3)]
        );
        // Every part is sent and waited for once, in order, and run by rank 0 before it is sent.
        for (parts, ranks) in [(1, 4), (2, 5), (6, 3), (4, 4)] {
            let moves = part_moves(parts, ranks);
            let of = |kind: fn(&PartMove) -> Option<usize>| moves.iter().filter_map(kind).collect::<Vec<_>>();
            let all: Vec<usize> = (0..parts).collect();
            assert_eq!(of(|m| if let Send(i) = m { Some(*i) } else { None }), all);
            assert_eq!(of(|m| if let Back(i) = m { Some(*i) } else { None }), all);
            assert_eq!(of(|m| if let Own(i) = m { Some(*i) } else { None }), all[1..]);
            let sent = |i: usize| moves.iter().position(|m| *m == Send(i));
            assert!((1..parts).all(|i| moves.iter().position(|m| *m == Own(i)) < sent(i)), "{moves:?}");
            assert_eq!(most_out(&moves), parts.min(ranks - 1), "{moves:?}");
        }
    }

    fn most_out(moves: &[PartMove]) -> usize {
        let (mut out, mut most) = (0usize, 0);
        for m in moves {
            match m {
                Send(_) => out += 1,
                Back(_) => out -= 1,
                Own(_) => {}
            }
            most = most.max(out);
        }
        most
    }

    /// Runs rank 0's `moves` against `ranks - 1` workers on links that buffer nothing (a send
    /// waits for its receive, the worst a socket can do): each worker takes a part's three
    /// messages, then passes them on. Whether every part came back, in order, within 3 s.
    fn completes(moves: Vec<PartMove>, ranks: usize) -> bool {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..ranks).map(|_| sync_channel::<usize>(0)).unzip();
        let mut receivers: Vec<_> = receivers.into_iter().map(Some).collect();
        for rank in 1..ranks {
            let (from, to) = (receivers[rank - 1].take().unwrap(), senders[rank].clone());
            std::thread::spawn(move || {
                while let (Ok(a), Ok(b), Ok(c)) = (from.recv(), from.recv(), from.recv()) {
                    if [a, b, c].iter().any(|&m| to.send(m).is_err()) {
                        return;
                    }
                }
            });
        }
        let (to_ring, from_ring) = (senders[0].clone(), receivers[ranks - 1].take().unwrap());
        let (done, finished) = channel();
        std::thread::spawn(move || {
            for m in moves {
                match m {
                    Send(i) => (0..3).for_each(|_| to_ring.send(i).unwrap()),
                    Back(i) => {
                        let parts = (0..3).map(|_| from_ring.recv().unwrap()).collect::<Vec<_>>();
                        assert_eq!(parts, [i; 3]);
                    }
                    Own(_) => {}
                }
            }
            done.send(()).unwrap();
        });
        finished.recv_timeout(Duration::from_secs(3)).is_ok()
    }

    #[test]
    fn no_two_ranks_wait_on_each_other_however_little_a_link_buffers() {
        for ranks in 2..=5 {
            for parts in [1, 2, 4, 7] {
                assert!(completes(part_moves(parts, ranks), ranks), "{parts} parts on {ranks} ranks");
            }
        }
        // One part more out than there are workers to hold them: the ring locks up.
        assert!(!completes(moves_within(4, 3), 3));
    }
}
