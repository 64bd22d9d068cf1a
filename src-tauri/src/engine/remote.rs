//! The layers after this process's, on other machines: a pipeline cluster's other ranks
//! (`cluster::stage_server` runs them). The engine runs the first stage (its caches hold its
//! layers only) and hands the residual stream on at each forward; what the other ranks must do
//! to their own caches to stay in step with the engine's rides along with it.
//!
//! A worker keeps each batch's rows in the engine's order; the engine tells it the step's rows
//! by request id (rows that joined are added, with their own caches if a worker held them
//! elsewhere), the rows that ended anywhere since the last step, and the rejected drafts the
//! last verify step took back. Each row's cached length goes too, so a worker out of step
//! says so instead of computing on the wrong keys.

use std::sync::Arc;

use mlx_rs::Array;
use tokio::sync::watch;

use super::batch::Batch;
use super::request::RequestId;
use crate::model::transformer::StepInputs;
use crate::model::{ModelError, Transformer};

/// Which of the engine's batches a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepBatch {
    Running = 0,
    Prefill = 1,
}

/// One forward as the other ranks see it.
#[derive(Debug, Clone)]
pub struct RemoteStep<'a> {
    pub batch: StepBatch,
    /// The step's rows, in order.
    pub rows: &'a [RequestId],
    /// Tokens each row has cached before the step.
    pub lengths: &'a [i32],
    /// Rows that ended since the last step (their caches go).
    pub ended: &'a [RequestId],
    /// The last verify step's positions (`width`) and how many each running row kept: taken
    /// back before this step.
    pub kept: Option<(i32, &'a [i32])>,
    /// This step checks drafted tokens (recurrent layers keep each position's state).
    pub verifying: bool,
}

/// Whether the other ranks are still there: once a rank is lost (an error, or a wait past its
/// deadline while MLX may never return), the engine's requests end with this reason, new ones
/// are refused with it, and `/health` says it.
#[derive(Clone)]
pub struct LinkHealth(Arc<watch::Sender<Option<String>>>);

impl Default for LinkHealth {
    fn default() -> Self {
        LinkHealth(Arc::new(watch::channel(None).0))
    }
}

impl LinkHealth {
    /// The link is broken, for this reason (the first reason given stays).
    pub fn fail(&self, why: impl Into<String>) {
        let why = why.into();
        self.0.send_if_modified(|fault| {
            if fault.is_some() {
                return false;
            }
            tracing::error!("{why}");
            *fault = Some(why);
            true
        });
    }

    /// Why the link is broken, if it is.
    pub fn fault(&self) -> Option<String> {
        self.0.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.0.subscribe()
    }
}

/// The ranks holding the later layers.
pub trait RemoteLayers: Send {
    /// Runs `h` (`[rows, positions, hidden]`, after this rank's layers) through the other
    /// ranks' layers; the residual stream after the model's last layer.
    fn forward(&mut self, step: &RemoteStep, h: &Array) -> Result<Array, String>;
    /// The engine stops: the other ranks return.
    fn stop(&mut self);
    /// Whether the other ranks are still there.
    fn health(&self) -> LinkHealth;
}

/// The engine's end of the link, and what changed since the last step.
pub(crate) struct RemoteLink {
    layers: Box<dyn RemoteLayers>,
    ended: Vec<RequestId>,
    kept: Option<(i32, Vec<i32>)>,
    verifying: bool,
}

impl RemoteLink {
    pub fn new(layers: Box<dyn RemoteLayers>) -> RemoteLink {
        RemoteLink { layers, ended: Vec::new(), kept: None, verifying: false }
    }

    /// A request left the engine (finished, cancelled, failed).
    pub fn ended(&mut self, id: RequestId) {
        self.ended.push(id);
    }

    /// The next step checks drafted tokens.
    pub fn verifying(&mut self) {
        self.verifying = true;
    }

    /// The verify step just run kept `kept` of its `width` positions per running row.
    pub fn kept(&mut self, width: i32, kept: &[i32]) {
        self.kept = Some((width, kept.to_vec()));
    }

    /// Hidden states after the final norm of `ids` (`[rows, positions]`) following what
    /// `batch` holds: this rank's layers, then the others'.
    pub fn forward(
        &mut self,
        model: &Transformer,
        which: StepBatch,
        batch: &mut Batch,
        ids: &Array,
    ) -> Result<Array, ModelError> {
        let rows: Vec<RequestId> = batch.seqs.iter().map(|s| s.id).collect();
        let lengths = batch.lengths();
        let h = model.embed_tokens(ids)?;
        let h = model.forward_layers(&h, &mut batch.cache)?;
        let step = RemoteStep {
            batch: which,
            rows: &rows,
            lengths: &lengths,
            ended: &self.ended,
            kept: self.kept.as_ref().map(|(w, k)| (*w, k.as_slice())),
            verifying: std::mem::take(&mut self.verifying),
        };
        let out = self.layers.forward(&step, &h).map_err(ModelError::Mlx)?;
        self.ended.clear();
        self.kept = None;
        model.final_norm(&out)
    }

    pub fn stop(&mut self) {
        self.layers.stop();
    }
}

/// Hidden states after the final norm for `ids` following what `batch` holds: on this process
/// alone, or through the other ranks when the model is split across a cluster.
pub(crate) fn forward_batch_hidden(
    model: &Transformer,
    remote: Option<&mut RemoteLink>,
    which: StepBatch,
    batch: &mut Batch,
    ids: &Array,
    step: StepInputs,
) -> Result<Array, ModelError> {
    match remote {
        // A split model sees no images (they are dropped when it is split).
        Some(link) => link.forward(model, which, batch, ids),
        None => model.forward_hidden_with(ids, &mut batch.cache, step),
    }
}
