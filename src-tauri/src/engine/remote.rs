//! The rest of the model, on other machines: a cluster's other ranks (`cluster::stage_server`
//! runs them). Split into pipeline stages, the engine runs the first stage (its caches hold its
//! layers only) and hands the residual stream on at each forward; shared out by tensors, every
//! rank runs its share of every layer at once and the ranks sum their partial outputs. Either
//! way, what the other ranks must do to their own caches to stay in step with the engine's
//! rides along with each step.
//!
//! A worker keeps each batch's rows in the engine's order; the engine tells it the step's rows
//! by request id (rows that joined are added, with their own caches if a worker held them
//! elsewhere), the rows that ended anywhere since the last step, and the rejected drafts the
//! last verify step took back. Each row's cached length goes too, so a worker out of step
//! says so instead of computing on the wrong keys.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlx_rs::Array;
use serde::Serialize;
use tokio::sync::watch;

use super::batch::Batch;
use super::request::RequestId;
use crate::model::{ModelError, Transformer};

/// Which of the engine's batches a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepBatch {
    Running = 0,
    Prefill = 1,
}

/// What the engine's prefix cache did that the other ranks do to theirs (each keeps its own
/// layers' blocks under the same keys, so a hit on rank 0 is a hit everywhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    /// Row `id` of `batch`: its first `len` tokens' blocks stored (`snapshot`: with its
    /// recurrent state there).
    Store { batch: StepBatch, id: RequestId, len: usize, snapshot: bool },
    /// Row `id`, alone in `batch`, keeps its buffers whole for its next turn.
    KeepHot { batch: StepBatch, id: RequestId, len: usize },
    /// Everything cached goes.
    Clear,
}

/// What changed on rank 0 since the workers last heard, replayed in this order before anything
/// else: the rejected drafts taken back, the prefix cache's stores, the rows that ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pending {
    /// The last verify step's positions (`width`) and how many each running row kept.
    pub kept: Option<(i32, Vec<i32>)>,
    pub stores: Vec<StoreOp>,
    /// Rows that ended since (their caches go).
    pub ended: Vec<RequestId>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.kept.is_none() && self.stores.is_empty() && self.ended.is_empty()
    }
}

/// One forward as the other ranks see it.
#[derive(Debug, Clone)]
pub struct RemoteStep<'a> {
    pub batch: StepBatch,
    /// The step's rows, in order.
    pub rows: &'a [RequestId],
    /// Tokens each row has cached before the step.
    pub lengths: &'a [i32],
    /// The step's token ids, `[rows, positions]` flattened (the workers' prefix caches key
    /// blocks by them).
    pub tokens: &'a [u32],
    /// This step checks drafted tokens (recurrent layers keep each position's state).
    pub verifying: bool,
    pub pending: &'a Pending,
    /// When rank 0 began the step: its own layers (MLX computes them as their keys and values
    /// are written, before anything is sent) count in the step's time.
    pub began: Instant,
}

/// Whether the other ranks are still there: once a rank is lost (an error, or a wait past its
/// deadline while MLX may never return), the engine's requests end with this reason, new ones
/// are refused with it, and `/health` says it.
#[derive(Clone)]
pub struct LinkHealth {
    fault: Arc<watch::Sender<Option<String>>>,
    witness: Arc<Mutex<Option<Witness>>>,
}

/// Names the machines gone, where something beside the links knows (the cluster's roster).
type Witness = Box<dyn Fn() -> Option<String> + Send>;

/// How long a failure waits for the witness to name who is gone: the links may break a moment
/// before the witness hears of it.
const WITNESS_WAIT: Duration = Duration::from_secs(1);

impl Default for LinkHealth {
    fn default() -> Self {
        LinkHealth { fault: Arc::new(watch::channel(None).0), witness: Arc::default() }
    }
}

impl LinkHealth {
    /// The link is broken, for this reason (the first reason given stays), with the machines
    /// the witness names as gone.
    pub fn fail(&self, why: impl Into<String>) {
        if self.fault().is_some() {
            return;
        }
        let why = why.into();
        // Each machine named once, where the reason named some already.
        let named: Vec<String> = self
            .witnessed()
            .into_iter()
            .flat_map(|n| n.split("; ").filter(|m| !why.contains(m)).map(str::to_string).collect::<Vec<_>>())
            .collect();
        let why = match named.is_empty() {
            true => why,
            false => format!("{why}; {}", named.join("; ")),
        };
        self.fault.send_if_modified(|fault| {
            if fault.is_some() {
                return false;
            }
            tracing::error!("{why}");
            *fault = Some(why);
            true
        });
    }

    /// From now on a failure names the machines `witness` says are gone.
    pub fn set_witness(&self, witness: impl Fn() -> Option<String> + Send + 'static) {
        *self.witness.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(witness));
    }

    /// Who the witness says is gone, waited for up to [`WITNESS_WAIT`].
    fn witnessed(&self) -> Option<String> {
        let witness = self.witness.lock().unwrap_or_else(|e| e.into_inner());
        let witness = witness.as_ref()?;
        let started = Instant::now();
        loop {
            let named = witness();
            if named.is_some() || started.elapsed() >= WITNESS_WAIT {
                return named;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Why the link is broken, if it is.
    pub fn fault(&self) -> Option<String> {
        self.fault.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.fault.subscribe()
    }
}

/// A machine back but held off since its take-in failed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HeldBack {
    pub machine: String,
    /// Until it is tried again by itself.
    pub seconds_left: u64,
}

/// A cluster as people see it (`/admin/status`, `/metrics`, the Server page): its machines, its
/// links as measured when it formed, and what rank 0's steps through the pipeline cost.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ClusterStatus {
    /// MLX's distributed backend (`ring`, `jaccl`).
    pub backend: String,
    /// How the model is split: `pipeline` (each node its layers) or `tensor` (each node its
    /// share of every layer's heads and columns).
    pub parallel: String,
    pub nodes: Vec<ClusterNode>,
    pub links: Vec<ClusterLink>,
    /// The host file's machines this cluster serves without (gone for longer than
    /// `--drop-after` when it formed), named with their addresses.
    pub without: Vec<String>,
    /// Machines it serves without that are back (checked in again), to be taken in.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub back: Vec<String>,
    /// Machines back but held off since their take-in failed: taken in by themselves once
    /// their time is up, or sooner where a person asks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldBack>,
    /// When a machine that is back is taken in: `idle` (once the server has been idle a few
    /// seconds) or `asked` (`POST /admin/cluster/take-back`, the Server page's button).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub take_back: Option<String>,
    /// Steps run through the pipeline.
    pub steps: u64,
    /// Token positions sent through (rows x positions, summed over steps).
    pub tokens: u64,
    /// Bytes sent over each hop, summed over steps (headers, the rows' description, the
    /// residual stream).
    pub bytes_per_hop: u64,
    /// Seconds rank 0 waited for the other ranks (their layers and every hop), summed over steps.
    pub wait_seconds: f64,
    /// Seconds of whole steps on rank 0 (its own layers, the sends, the wait), summed.
    pub step_seconds: f64,
    /// By tensors: the sums of the steps rank 0 timed apart from its layers (one now and then:
    /// timing costs the step its single evaluation), prompt steps and decode steps apart.
    pub sums_timed: SumsTimed,
}

/// The steps whose sums rank 0 timed, by kind.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SumsTimed {
    /// Steps of several positions per row (prompt chunks, speculative verify steps).
    pub prompt: TimedSteps,
    /// Steps of one position per row.
    pub decode: TimedSteps,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TimedSteps {
    pub steps: u64,
    /// Seconds in their sums (the transfers, and any rank still computing its share), summed.
    pub sum_seconds: f64,
    /// Seconds of the same steps in all, summed (a timed step runs longer than others).
    pub step_seconds: f64,
}

/// One machine of a cluster.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClusterNode {
    /// Its rank in the host file (its `--rank`); the pipeline runs in the nodes' order.
    pub rank: usize,
    /// Its address in the host file.
    pub host: String,
    /// The room it told for weights, in bytes.
    pub room_bytes: u64,
    /// The layers it holds, `[first_layer, end_layer)` (tensor parallel: its share of each).
    pub first_layer: usize,
    pub end_layer: usize,
    /// It holds the embeddings, the final norm and the output head (rank 0; every rank by
    /// tensors).
    pub ends: bool,
}

/// One link of the ring, measured when the cluster formed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClusterLink {
    pub from: usize,
    pub to: usize,
    pub round_trip_ms: f64,
    pub megabytes_per_second: f64,
}

/// The cluster's status, shared between rank 0's pipeline (which counts its steps) and whoever
/// shows it.
#[derive(Clone, Default)]
pub struct ClusterView(Arc<Mutex<ClusterStatus>>);

impl ClusterView {
    pub fn new(status: ClusterStatus) -> ClusterView {
        ClusterView(Arc::new(Mutex::new(status)))
    }

    pub fn snapshot(&self) -> ClusterStatus {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// One step's costs, as rank 0 measured them.
    pub fn record_step(&self, tokens: u64, bytes_per_hop: u64, waited: Duration, total: Duration) {
        if let Ok(mut s) = self.0.lock() {
            s.steps += 1;
            s.tokens += tokens;
            s.bytes_per_hop += bytes_per_hop;
            s.wait_seconds += waited.as_secs_f64();
            s.step_seconds += total.as_secs_f64();
        }
    }

    /// A step whose sums were timed (a `decode` step, or a prompt step): `sums` of its `total`.
    pub fn record_timed_sums(&self, decode: bool, sums: Duration, total: Duration) {
        if let Ok(mut s) = self.0.lock() {
            let timed = if decode { &mut s.sums_timed.decode } else { &mut s.sums_timed.prompt };
            timed.steps += 1;
            timed.sum_seconds += sums.as_secs_f64();
            timed.step_seconds += total.as_secs_f64();
        }
    }
}

/// The ranks holding the rest of the model.
pub trait RemoteLayers: Send {
    /// One step through the whole model: `own` runs this rank's layers (lazily) on the step's
    /// embedded tokens; the residual stream after the model's last layer. Pipeline: `own`'s
    /// output goes through the other ranks' layers; tensor: the other ranks hear of the step
    /// first, since `own` sums with theirs.
    fn forward(&mut self, step: &RemoteStep, own: &mut dyn FnMut() -> Result<Array, String>) -> Result<Array, String>;
    /// Into how many parts a prefill step of `width` positions goes down the ring one after
    /// the other, so that the machines work on different parts at once (1: whole).
    fn parts_for(&self, width: usize) -> usize;
    /// The parts of one prefill step (`steps`, in order of positions): `own(i)` runs this rank's
    /// layers on part `i`; each part's residual stream after the model's last layer.
    fn forward_parts(
        &mut self,
        steps: &[RemoteStep],
        own: &mut dyn FnMut(usize) -> Result<Array, String>,
    ) -> Result<Vec<Array>, String>;
    /// Request `id`'s prompt start `tokens` is in rank 0's prefix cache: each other rank takes
    /// what its own holds of it (kept for the row's first step) and the fewest tokens any rank
    /// holds comes back.
    fn probe(&mut self, pending: &Pending, id: RequestId, tokens: &[u32]) -> Result<usize, String>;
    /// Called between steps (every few hundred ms when idle): unless a step went through
    /// lately, tell the other ranks rank 0 is still there, and find out whether they are.
    fn keep_alive(&mut self);
    /// The engine stops: the other ranks return.
    fn stop(&mut self);
    /// Whether the other ranks are still there.
    fn health(&self) -> LinkHealth;
    /// The most tokens of keys and values the other ranks have room for (the fewest over them),
    /// if they told.
    fn kv_capacity_tokens(&self) -> Option<usize>;
    /// The cluster as people see it.
    fn view(&self) -> ClusterView;
}

/// One prefill step as the engine asked for it, before it is cut into parts.
struct Whole<'a> {
    rows: &'a [RequestId],
    lengths: &'a [i32],
    /// `[rows, width]` token ids, flattened.
    tokens: &'a [u32],
    width: usize,
    began: Instant,
}

/// The engine's end of the link, and what changed since the other ranks last heard.
pub(crate) struct RemoteLink {
    layers: Box<dyn RemoteLayers>,
    pending: Pending,
    verifying: bool,
}

impl RemoteLink {
    pub fn new(layers: Box<dyn RemoteLayers>) -> RemoteLink {
        RemoteLink { layers, pending: Pending::default(), verifying: false }
    }

    /// The most tokens of keys and values the other ranks have room for.
    pub fn kv_capacity_tokens(&self) -> Option<usize> {
        self.layers.kv_capacity_tokens()
    }

    /// Between steps (idle, or waiting for memory): the other ranks hear from rank 0 in time.
    pub fn keep_alive(&mut self) {
        self.layers.keep_alive();
    }

    /// A request left the engine (finished, cancelled, failed).
    pub fn ended(&mut self, id: RequestId) {
        self.pending.ended.push(id);
    }

    /// The next step checks drafted tokens.
    pub fn verifying(&mut self) {
        self.verifying = true;
    }

    /// The verify step just run kept `kept` of its `width` positions per running row.
    pub fn kept(&mut self, width: i32, kept: &[i32]) {
        self.pending.kept = Some((width, kept.to_vec()));
    }

    /// What the prefix cache did since the last message.
    pub fn stored(&mut self, stores: Vec<StoreOp>) {
        self.pending.stores.extend(stores);
    }

    /// Hidden states after the final norm of `ids` (`[rows, positions]`) following what
    /// `batch` holds: this rank's layers, and the others'.
    pub fn forward(
        &mut self,
        model: &Transformer,
        which: StepBatch,
        batch: &mut Batch,
        ids: &Array,
    ) -> Result<Array, ModelError> {
        let rows: Vec<RequestId> = batch.seqs.iter().map(|s| s.id).collect();
        let lengths = batch.lengths();
        let began = Instant::now();
        let tokens = ids.as_slice::<u32>().to_vec();
        let parts = match which {
            StepBatch::Prefill if !self.verifying => self.layers.parts_for(ids.dim(1) as usize),
            _ => 1,
        };
        if parts > 1 {
            let step = Whole { rows: &rows, lengths: &lengths, tokens: &tokens, width: ids.dim(1) as usize, began };
            return self.forward_in_parts(model, batch, step, parts);
        }
        let h = model.embed_tokens(ids)?;
        let cache = &mut batch.cache;
        let mut own = || model.forward_layers(&h, cache).map_err(|e| e.to_string());
        let step = RemoteStep {
            batch: which,
            rows: &rows,
            lengths: &lengths,
            tokens: &tokens,
            verifying: std::mem::take(&mut self.verifying),
            pending: &self.pending,
            began,
        };
        let out = self.layers.forward(&step, &mut own).map_err(ModelError::Mlx)?;
        self.pending = Pending::default();
        model.final_norm(&out)
    }

    /// A prefill step in `parts` along its positions, each a step of its own for the other
    /// ranks (what changed since they last heard goes with the first): rank 0 runs part `i + 1`
    /// while the others run part `i`.
    fn forward_in_parts(
        &mut self,
        model: &Transformer,
        batch: &mut Batch,
        whole: Whole,
        parts: usize,
    ) -> Result<Array, ModelError> {
        let bounds: Vec<(usize, usize)> =
            (0..parts).map(|i| (whole.width * i / parts, whole.width * (i + 1) / parts)).collect();
        let rows = whole.rows.len();
        let tokens: Vec<Vec<u32>> = bounds
            .iter()
            .map(|&(a, b)| {
                (0..rows).flat_map(|r| &whole.tokens[r * whole.width + a..r * whole.width + b]).copied().collect()
            })
            .collect();
        let lengths: Vec<Vec<i32>> =
            bounds.iter().map(|&(a, _)| whole.lengths.iter().map(|&l| l + a as i32).collect()).collect();
        let pending = std::mem::take(&mut self.pending);
        let none = Pending::default();
        let steps: Vec<RemoteStep> = (0..parts)
            .map(|i| RemoteStep {
                batch: StepBatch::Prefill,
                rows: whole.rows,
                lengths: &lengths[i],
                tokens: &tokens[i],
                verifying: false,
                pending: if i == 0 { &pending } else { &none },
                began: whole.began,
            })
            .collect();
        let cache = &mut batch.cache;
        let mut own = |i: usize| {
            let (a, b) = bounds[i];
            let ids = Array::from_slice(&tokens[i], &[rows as i32, (b - a) as i32]);
            model.embed_tokens(&ids).and_then(|h| model.forward_layers(&h, cache)).map_err(|e| e.to_string())
        };
        let outs = self.layers.forward_parts(&steps, &mut own).map_err(ModelError::Mlx)?;
        let out = mlx_rs::ops::concatenate(&outs, 1)?;
        model.final_norm(&out)
    }

    /// How many of `tokens` (what rank 0 restored of request `id`'s prompt) every other rank
    /// restored too; 0 when a rank is lost (the row then fails at its first step).
    pub fn probe(&mut self, id: RequestId, tokens: &[u32]) -> usize {
        match self.layers.probe(&self.pending, id, tokens) {
            Ok(held) => {
                self.pending = Pending::default();
                held
            }
            Err(e) => {
                tracing::warn!("the other ranks' prefix caches did not answer: {e}");
                0
            }
        }
    }

    pub fn stop(&mut self) {
        self.layers.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_who_the_witness_says_is_gone_once_it_hears_of_it() {
        let health = LinkHealth::default();
        let told = Arc::new(Mutex::new(None::<String>));
        let seen = told.clone();
        health.set_witness(move || seen.lock().unwrap().clone());
        // The roster hears of the loss a moment after the link breaks.
        let hears = told.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            *hears.lock().unwrap() = Some("rank 1 (h:1) is gone".into());
        });
        health.fail("the cluster lost a rank: waiting for rank 2");
        assert_eq!(health.fault().unwrap(), "the cluster lost a rank: waiting for rank 2; rank 1 (h:1) is gone");
        // The first reason stays.
        health.fail("another");
        assert!(health.fault().unwrap().starts_with("the cluster lost a rank: waiting"));
        // Named already (the roster's own failure): not said twice.
        let health = LinkHealth::default();
        health.set_witness(|| Some("rank 1 (h:1) is gone".into()));
        health.fail("the cluster lost a rank: rank 1 (h:1) is gone");
        assert_eq!(health.fault().unwrap(), "the cluster lost a rank: rank 1 (h:1) is gone");
        // A witness that names no one is waited for a second at most.
        let health = LinkHealth::default();
        health.set_witness(|| None);
        let started = Instant::now();
        health.fail("waiting for rank 1");
        assert_eq!(health.fault().unwrap(), "waiting for rank 1");
        assert!(started.elapsed() < WITNESS_WAIT + Duration::from_millis(500));
    }
}
