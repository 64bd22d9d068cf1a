//! The engine's public face: start it, submit requests, read metrics, shut it down. Cheap to
//! clone and safe to share between threads and tasks.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::{mpsc as tokio_mpsc, watch};

use super::config::{EngineConfig, ModelInfo};
use super::metrics::Metrics;
use super::remote::{ClusterStatus, ClusterView, LinkHealth, RemoteLayers, RemoteLink};
use super::request::{Event, Finish, Request, RequestId};
use super::scheduler::{Command, Scheduler};
use super::speculative::{check_vocabularies, DraftModel, Mode};
use crate::model::{LoadedModel, ModelError};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the server is busy: {queued} requests are waiting; try again shortly")]
    Busy { queued: usize },
    #[error("the prompt has {tokens} tokens; the context window is {limit}")]
    PromptTooLong { tokens: usize, limit: usize },
    #[error(
        "the prompt alone needs {needed} bytes of KV cache; under this server's memory ceiling ({ceiling} bytes, the weights taking {weights}) at most {budget} are left for a request"
    )]
    TooLarge { needed: usize, budget: usize, ceiling: usize, weights: usize },
    #[error("{0}")]
    Invalid(String),
    #[error("the engine has shut down")]
    ShutDown,
    /// The engine cannot serve (a machine of its cluster is gone): why.
    #[error("{0}")]
    Unavailable(String),
}

/// The events of one request. Dropping it cancels the request.
pub struct RequestStream {
    pub id: RequestId,
    rx: tokio_mpsc::UnboundedReceiver<Event>,
    /// Fires when the engine starts the request (admits it to prefill).
    started: Option<tokio::sync::oneshot::Receiver<()>>,
    /// The finish read by `started` when the request ended before it started.
    pending: Option<Event>,
    /// Set when a machine of the engine's cluster is lost: the stream ends with that error
    /// even while the engine itself waits on the machine (MLX may never return).
    fault: Option<watch::Receiver<Option<String>>>,
    /// Its finish was read: nothing follows.
    ended: bool,
}

/// The error finish of a request whose engine lost a machine of its cluster.
fn fault_finish(why: String) -> Event {
    Event::Finish(Finish {
        reason: super::request::FinishReason::Unavailable,
        stop: None,
        error: Some(why),
        usage: Default::default(),
        timings: Default::default(),
    })
}

impl RequestStream {
    pub async fn recv(&mut self) -> Option<Event> {
        if self.ended {
            return None;
        }
        let event = match self.pending.take() {
            Some(event) => Some(event),
            None => match self.fault.as_mut() {
                None => self.rx.recv().await,
                Some(fault) => tokio::select! {
                    biased;
                    event = self.rx.recv() => event,
                    why = fault.wait_for(Option::is_some) => {
                        let why = why.ok().and_then(|w| w.clone()).unwrap_or_default();
                        Some(fault_finish(why))
                    }
                },
            },
        };
        self.ended = matches!(event, Some(Event::Finish(_)) | None);
        self.as_fault(event)
    }

    /// The engine's own error finish, when its cluster lost a machine, is that fault's.
    fn as_fault(&self, event: Option<Event>) -> Option<Event> {
        let lost = self.fault.as_ref().is_some_and(|fault| fault.borrow().is_some());
        match event {
            Some(Event::Finish(mut finish)) if lost && finish.reason == super::request::FinishReason::Error => {
                finish.reason = super::request::FinishReason::Unavailable;
                Some(Event::Finish(finish))
            }
            other => other,
        }
    }

    /// For callers outside an async runtime (a lost cluster machine ends the stream as in
    /// [`Self::recv`]).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        if self.fault.is_none() && !self.ended {
            let event = match self.pending.take() {
                Some(event) => Some(event),
                None => self.rx.blocking_recv(),
            };
            self.ended = matches!(event, Some(Event::Finish(_)) | None);
            return event;
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().ok()?;
        runtime.block_on(self.recv())
    }

    /// The next event if one is already there.
    pub fn try_recv_now(&mut self) -> Option<Event> {
        if self.ended {
            return None;
        }
        let event = self.pending.take().or_else(|| self.rx.try_recv().ok()).or_else(|| {
            let why = self.fault.as_ref().and_then(|f| f.borrow().clone())?;
            Some(fault_finish(why))
        });
        self.ended = matches!(event, Some(Event::Finish(_)));
        event
    }

    /// Waits until the engine starts the request; its finish when it ended without starting
    /// (it waited past `max_queue_wait`, or the engine shut down or lost a cluster machine). A
    /// server answers that with an error status before it sends any headers of a stream. The
    /// finish is also the stream's next event.
    pub async fn started(&mut self) -> Result<(), Finish> {
        let Some(started) = self.started.take() else { return Ok(()) };
        let began = match self.fault.as_mut() {
            None => started.await.is_ok(),
            Some(fault) => tokio::select! {
                biased;
                began = started => began.is_ok(),
                _ = fault.wait_for(Option::is_some) => false,
            },
        };
        if began {
            return Ok(());
        }
        // Ended first: its finish is the next event (or the engine is gone).
        let finish = match self.recv().await {
            Some(Event::Finish(finish)) => finish,
            Some(other) => {
                self.pending = Some(other);
                return Ok(());
            }
            None => return Ok(()),
        };
        self.ended = false;
        self.pending = Some(Event::Finish(finish.clone()));
        Err(finish)
    }
}

pub(crate) struct Shared {
    /// Requests submitted and not yet started (the scheduler counts them down).
    pub queued: Arc<AtomicUsize>,
    pub next_id: AtomicU64,
    pub config: EngineConfig,
    pub info: ModelInfo,
    /// A split model's link to the other ranks of its cluster.
    pub link: Option<LinkHealth>,
    pub cluster: Option<ClusterView>,
}

/// Loads a draft model (on the engine thread).
pub type DraftLoader = Box<dyn FnOnce() -> Result<LoadedModel, ModelError> + Send>;

/// `draft`, ready to draft for `model` if its vocabulary is `model`'s.
fn draft_for(model: &LoadedModel, draft: LoadedModel) -> Result<DraftModel, ModelError> {
    if let Err(message) = check_vocabularies(&model.tokenizer, &draft.tokenizer) {
        return Err(ModelError::Config {
            path: draft.path.clone(),
            message: format!("cannot draft for {}: {message}", model.name),
        });
    }
    tracing::info!("{}: drafting with {}", model.name, draft.name);
    Ok(DraftModel::new(draft, model.transformer.config.vocab_size, crate::mlx::gpu_available()))
}

#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    metrics: watch::Receiver<Metrics>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl EngineHandle {
    /// Starts the engine thread, which loads the model with `load` and then serves requests.
    /// Returns once the model is loaded (or failed to load).
    pub fn start(
        config: EngineConfig,
        load: impl FnOnce() -> Result<LoadedModel, ModelError> + Send + 'static,
    ) -> Result<EngineHandle, ModelError> {
        Self::start_with_draft(config, load, None)
    }

    /// As [`EngineHandle::start`], with a draft model (`load_draft`) that proposes tokens for
    /// the model: loaded after it, refused when its tokenizer is not the model's.
    pub fn start_with_draft(
        config: EngineConfig,
        load: impl FnOnce() -> Result<LoadedModel, ModelError> + Send + 'static,
        load_draft: Option<DraftLoader>,
    ) -> Result<EngineHandle, ModelError> {
        Self::start_inner(config, move || Ok((load()?, None)), load_draft)
    }

    /// As [`EngineHandle::start`] for a model split across a cluster: `load` gives this rank's
    /// stage of it and the link to the ranks holding the later layers; a draft model, if any, is
    /// loaded whole here (it drafts on this rank; the pipeline checks its tokens).
    pub fn start_split(
        config: EngineConfig,
        load: impl FnOnce() -> Result<(LoadedModel, Box<dyn RemoteLayers>), ModelError> + Send + 'static,
        load_draft: Option<DraftLoader>,
    ) -> Result<EngineHandle, ModelError> {
        Self::start_inner(config, move || load().map(|(model, remote)| (model, Some(remote))), load_draft)
    }

    fn start_inner(
        config: EngineConfig,
        load: impl FnOnce() -> Result<(LoadedModel, Option<Box<dyn RemoteLayers>>), ModelError> + Send + 'static,
        load_draft: Option<DraftLoader>,
    ) -> Result<EngineHandle, ModelError> {
        let (commands, inbox) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (metrics_tx, metrics) = watch::channel(Metrics::default());
        let engine_config = config.clone();
        let queued = Arc::new(AtomicUsize::new(0));
        let engine_queued = queued.clone();
        let thread = std::thread::Builder::new()
            .name("fastmlx-engine".into())
            .spawn(move || {
                crate::mlx::Backend::init();
                // The draft model first: a split model's other ranks hear from this thread once
                // the engine runs, and wait for it no longer than their deadline.
                let draft = match load_draft.map(|load_draft| load_draft()).transpose() {
                    Ok(draft) => draft,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let (model, remote) = match load() {
                    Ok((model, _))
                        if engine_config.speculative.mode == Mode::Mtp && model.transformer.mtp.is_none() =>
                    {
                        let _ = ready_tx.send(Err(ModelError::Config {
                            path: model.path.clone(),
                            message: "--speculative mtp: the model ships no multi-token-prediction head (`mtp.*` \
                                      tensors: Qwen3.5/3.6 and Qwen3-Next checkpoints as Hugging Face publishes \
                                      them have one; MLX conversions usually drop it)"
                                .into(),
                        }));
                        return;
                    }
                    Ok((model, remote)) => match model.transformer.config.check_kv_format(engine_config.kv_format) {
                        Ok(()) => (model, remote),
                        Err(message) => {
                            let _ = ready_tx.send(Err(ModelError::Config { path: model.path.clone(), message }));
                            return;
                        }
                    },
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let draft = match draft.map(|draft| draft_for(&model, draft)).transpose() {
                    Ok(draft) => draft,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let link = remote.as_ref().map(|r| (r.health(), r.view()));
                let remote = remote.map(RemoteLink::new);
                let scheduler = Scheduler::new(model, draft, engine_config, metrics_tx, engine_queued, remote);
                let _ = ready_tx.send(Ok((scheduler.info(), link)));
                scheduler.run(inbox);
            })
            .map_err(|e| ModelError::Mlx(format!("cannot start the engine thread: {e}")))?;
        let (info, link) =
            ready_rx.recv().map_err(|_| ModelError::Mlx("the engine thread died while loading".into()))??;
        let (link, cluster) = link.unzip();
        let shared = Arc::new(Shared { queued, next_id: AtomicU64::new(1), config, info, link, cluster });
        Ok(EngineHandle { commands, shared, metrics, thread: Arc::new(Mutex::new(Some(thread))) })
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.shared.info
    }

    /// What the engine was started with.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Queues a request. Fails at once, without queuing, when the request can never run or
    /// the queue is full.
    pub fn submit(&self, request: Request) -> Result<RequestStream, SubmitError> {
        if let Some(why) = self.fault() {
            return Err(SubmitError::Unavailable(why));
        }
        self.validate(&request)?;
        let queued = self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if queued >= self.shared.config.max_queue {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Busy { queued });
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio_mpsc::unbounded_channel();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let command = Command::Submit { id, request: Box::new(request), events: tx, started: started_tx };
        if self.commands.send(command).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::ShutDown);
        }
        let fault = self.fault_watch();
        Ok(RequestStream { id, rx, started: Some(started), pending: None, fault, ended: false })
    }

    fn validate(&self, r: &Request) -> Result<(), SubmitError> {
        let info = &self.shared.info;
        if r.prompt_ids.is_empty() {
            return Err(SubmitError::Invalid("the prompt is empty".into()));
        }
        if r.prompt_ids.len() >= info.context_length {
            return Err(SubmitError::PromptTooLong { tokens: r.prompt_ids.len(), limit: info.context_length });
        }
        if let Some(images) = &r.images {
            check_images(info, r, images).map_err(SubmitError::Invalid)?;
        }
        if let Some(bad) = r.prompt_ids.iter().find(|&&t| t as usize >= info.vocab_size) {
            return Err(SubmitError::Invalid(format!(
                "token id {bad} is outside the vocabulary ({})",
                info.vocab_size
            )));
        }
        if r.max_tokens == 0 {
            return Err(SubmitError::Invalid("max_tokens must be at least 1".into()));
        }
        if r.logprobs.is_some_and(|n| n > 20) {
            return Err(SubmitError::Invalid("at most 20 top logprobs can be returned".into()));
        }
        r.params.validate().map_err(|e| SubmitError::Invalid(e.to_string()))?;
        // The prompt and its first token must fit; output past the budget ends with `length`.
        let needed = info.kv_footprint.bytes(r.prompt_ids.len() + 1);
        if needed > info.kv_budget_bytes {
            return Err(SubmitError::TooLarge {
                needed,
                budget: info.kv_budget_bytes,
                ceiling: info.memory_ceiling,
                weights: info.weights_bytes,
            });
        }
        Ok(())
    }

    /// Why the engine cannot serve, where its model is split across a cluster that lost a
    /// machine.
    pub fn fault(&self) -> Option<String> {
        self.shared.link.as_ref().and_then(LinkHealth::fault)
    }

    /// Changes once its cluster lost a machine (`None`: its model is not split).
    pub fn fault_watch(&self) -> Option<watch::Receiver<Option<String>>> {
        self.shared.link.as_ref().map(LinkHealth::subscribe)
    }

    /// Its cluster's machines, links and step costs, where its model is split across one.
    pub fn cluster(&self) -> Option<ClusterStatus> {
        self.shared.cluster.as_ref().map(ClusterView::snapshot)
    }

    pub fn metrics(&self) -> watch::Receiver<Metrics> {
        self.metrics.clone()
    }

    /// Empties the prefix cache (takes effect between two steps).
    pub fn clear_prefix_cache(&self) {
        let _ = self.commands.send(Command::ClearPrefixCache);
    }

    pub fn snapshot(&self) -> Metrics {
        self.metrics.borrow().clone()
    }

    /// Cancels every request (each gets its `Cancelled` finish), frees the model and MLX's
    /// memory, and waits for the engine thread to end. Also done when the last handle is
    /// dropped, so the thread never outlives its users (MLX must not be torn down at process
    /// exit under a running engine).
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
        if self.fault().is_some() {
            // It may be waiting on a lost machine, which MLX never gives up: left behind.
            tracing::warn!("{}: the engine thread is left behind (its cluster lost a machine)", self.shared.info.name);
            return;
        }
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        if Arc::strong_count(&self.thread) == 1 {
            self.shutdown();
        }
    }
}

/// A request's images agree with its prompt: the model sees, the positions and keys cover the
/// prompt, and each image's tokens are image tokens inside it.
fn check_images(info: &ModelInfo, r: &Request, images: &crate::model::vision::PromptImages) -> Result<(), String> {
    let Some(processor) = &info.vision else {
        return Err(format!("the model {} reads text only in FastMLX", info.name));
    };
    let len = r.prompt_ids.len();
    if images.positions.len() > len || images.key_ids.len() > len {
        return Err("the images' positions do not match the prompt".into());
    }
    for (k, image) in images.images.iter().enumerate() {
        let span = r.prompt_ids.get(image.start..image.start + image.tokens);
        if !span.is_some_and(|s| s.iter().all(|&t| t == processor.image_token)) {
            return Err(format!("image {k}'s tokens are not where the prompt has them"));
        }
        let pixels = &image.pixels;
        if processor.tokens_of(pixels) != image.tokens || pixels.values.len() != pixels.patches() * pixels.row_len {
            return Err(format!("image {k}'s pixels do not match its {} tokens", image.tokens));
        }
    }
    Ok(())
}
