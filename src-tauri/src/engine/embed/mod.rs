//! The engine of an encoder model (embeddings, reranking): one thread owns the model and serves
//! every caller. Each round takes every text waiting (many per request, from many requests),
//! sorts them by length so a batch pads little, and runs them in batches bounded in rows and in
//! the attention's working memory; a request's answer goes back once its last text is done. A
//! caller that stops waiting (its receiver dropped) has its texts skipped.

mod batches;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

pub use batches::{BatchCost, BatchLimits};

use super::turns::device_turns;

use crate::model::encoder::{Embedder, EncodedText, EncoderKind, EncoderTokenizer};
use crate::model::ModelError;

/// What to compute for a list of tokenized texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedTask {
    /// One vector per text (an embedding model).
    Vectors,
    /// One relevance score per query-document pair (a reranker).
    Scores,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EmbedOutput {
    Vectors(Vec<Vec<f32>>),
    Scores(Vec<f32>),
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum EmbedError {
    #[error("the embedding queue is full ({0} texts waiting); retry shortly")]
    Busy(usize),
    #[error("the model was unloaded or the server is stopping")]
    ShutDown,
    #[error("{0}")]
    Model(String),
}

/// What callers need to know of the loaded model without asking its thread.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EmbedderInfo {
    pub name: String,
    pub kind: EncoderKind,
    /// The vectors' length (0 for a reranker).
    pub dimensions: usize,
    pub normalizes: bool,
    /// The most tokens a text (or query-document pair) can have.
    pub max_tokens: usize,
    pub prompts: std::collections::BTreeMap<String, String>,
    /// The prompt's name used when a request names none.
    pub default_prompt: Option<String>,
    pub weights_bytes: usize,
    /// Token ids at or past it are not the model's.
    pub vocab_size: usize,
    /// Trained for shorter vectors (Matryoshka): a prefix of a vector is a vector too.
    pub matryoshka: bool,
}

/// Texts waiting at most, over all requests: past it a request is refused (busy), not queued.
pub const MAX_QUEUED_TEXTS: usize = 16_384;

struct Job {
    task: EmbedTask,
    texts: Vec<EncodedText>,
    reply: oneshot::Sender<Result<EmbedOutput, EmbedError>>,
}

struct Shared {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Texts submitted and not yet answered.
    queued_texts: AtomicUsize,
    /// Requests submitted and not yet answered.
    open_requests: AtomicUsize,
    stopping: Arc<AtomicBool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        stop(&self.jobs, &self.thread, &self.stopping);
    }
}

fn stop(jobs: &Mutex<Option<mpsc::Sender<Job>>>, thread: &Mutex<Option<JoinHandle<()>>>, stopping: &AtomicBool) {
    stopping.store(true, Ordering::SeqCst);
    jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(thread) = thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = thread.join();
    }
}

#[derive(Clone)]
pub struct EmbedHandle {
    shared: Arc<Shared>,
    info: Arc<EmbedderInfo>,
    tokenizer: Arc<EncoderTokenizer>,
}

impl EmbedHandle {
    /// Starts the model's thread, which runs `load`; returns once the model is loaded.
    pub fn start(
        limits: BatchLimits,
        load: impl FnOnce() -> Result<Embedder, ModelError> + Send + 'static,
    ) -> Result<EmbedHandle, ModelError> {
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            jobs: Mutex::new(Some(jobs_tx)),
            thread: Mutex::new(None),
            queued_texts: AtomicUsize::new(0),
            open_requests: AtomicUsize::new(0),
            stopping: Arc::new(AtomicBool::new(false)),
        });
        // The thread holds the handle's `Shared` weakly: its drop (the last handle gone) stops it.
        let weak = Arc::downgrade(&shared);
        let stopping = shared.stopping.clone();
        let thread = std::thread::Builder::new()
            .name("fastmlx-embed".into())
            .spawn(move || {
                crate::mlx::Backend::init();
                let model = match load() {
                    Ok(model) => model,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let info = EmbedderInfo {
                    name: model.name.clone(),
                    kind: model.kind(),
                    dimensions: model.dimensions(),
                    normalizes: model.normalizes(),
                    max_tokens: model.tokenizer.max_tokens,
                    prompts: model.prompts(),
                    default_prompt: model.default_prompt(),
                    weights_bytes: model.weights_bytes,
                    vocab_size: model.vocab_size(),
                    matryoshka: model.matryoshka(),
                };
                let _ = ready_tx.send(Ok((info, model.tokenizer.clone())));
                serve(&model, &jobs_rx, limits, &stopping, &|texts, requests| {
                    if let Some(shared) = weak.upgrade() {
                        shared.queued_texts.fetch_sub(texts, Ordering::SeqCst);
                        shared.open_requests.fetch_sub(requests, Ordering::SeqCst);
                    }
                });
            })
            .map_err(|e| ModelError::Mlx(format!("cannot start the embedding thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok((info, tokenizer))) => {
                *shared.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
                Ok(EmbedHandle { shared, info: Arc::new(info), tokenizer })
            }
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(ModelError::Mlx("the embedding thread ended while loading".into()))
            }
        }
    }

    pub fn info(&self) -> &EmbedderInfo {
        &self.info
    }

    /// The model's tokenizer: requests are tokenized (and checked against the model's limit) by
    /// the caller, before they reach the thread.
    pub fn tokenizer(&self) -> &Arc<EncoderTokenizer> {
        &self.tokenizer
    }

    /// Requests submitted and not yet answered (a model with any is busy: never evicted).
    pub fn open_requests(&self) -> usize {
        self.shared.open_requests.load(Ordering::SeqCst)
    }

    /// Computes `task` for `texts`; dropping the future gives up on the texts not yet run.
    pub async fn run(&self, task: EmbedTask, texts: Vec<EncodedText>) -> Result<EmbedOutput, EmbedError> {
        if texts.is_empty() {
            return Ok(match task {
                EmbedTask::Vectors => EmbedOutput::Vectors(Vec::new()),
                EmbedTask::Scores => EmbedOutput::Scores(Vec::new()),
            });
        }
        let n = texts.len();
        let queued = self.shared.queued_texts.fetch_add(n, Ordering::SeqCst);
        if queued + n > MAX_QUEUED_TEXTS && queued > 0 {
            self.shared.queued_texts.fetch_sub(n, Ordering::SeqCst);
            return Err(EmbedError::Busy(queued));
        }
        self.shared.open_requests.fetch_add(1, Ordering::SeqCst);
        let (reply, answer) = oneshot::channel();
        let sent = {
            let jobs = self.shared.jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.as_ref().is_some_and(|tx| tx.send(Job { task, texts, reply }).is_ok())
        };
        if !sent {
            self.shared.queued_texts.fetch_sub(n, Ordering::SeqCst);
            self.shared.open_requests.fetch_sub(1, Ordering::SeqCst);
            return Err(EmbedError::ShutDown);
        }
        answer.await.unwrap_or(Err(EmbedError::ShutDown))
    }

    /// Stops the thread once the batch it runs is done; waiting requests end `ShutDown`.
    pub fn shutdown(&self) {
        stop(&self.shared.jobs, &self.shared.thread, &self.shared.stopping);
    }
}

/// The thread's loop: a round per wake-up, until every handle is gone or shut down; idle for a
/// few seconds, MLX's buffer cache goes back to the system.
fn serve(
    model: &Embedder,
    jobs: &mpsc::Receiver<Job>,
    limits: BatchLimits,
    stopping: &AtomicBool,
    done: &dyn Fn(usize, usize),
) {
    let mut idle_since_round = false;
    let mut cost = BatchCost::default();
    loop {
        match jobs.recv_timeout(std::time::Duration::from_secs(3)) {
            Ok(first) => {
                let mut round = vec![first];
                round.extend(jobs.try_iter());
                run_round(model, round, limits, &mut cost, stopping, done);
                idle_since_round = true;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if std::mem::take(&mut idle_since_round) {
                    crate::mlx::give_back();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Runs every text of `round` in length-sorted batches and answers each request when its last
/// text is done (or with the error of the batch that failed it).
fn run_round(
    model: &Embedder,
    round: Vec<Job>,
    limits: BatchLimits,
    cost: &mut BatchCost,
    stopping: &AtomicBool,
    done: &dyn Fn(usize, usize),
) {
    struct Pending {
        job: Option<Job>,
        vectors: Vec<Option<Vec<f32>>>,
        scores: Vec<Option<f32>>,
        left: usize,
    }
    let mut pending: Vec<Pending> = round
        .into_iter()
        .map(|job| {
            let n = job.texts.len();
            Pending { vectors: vec![None; n], scores: vec![None; n], left: n, job: Some(job) }
        })
        .collect();
    for task in [EmbedTask::Vectors, EmbedTask::Scores] {
        // (request, text, length) of every text of this task.
        let items: Vec<(usize, usize, usize)> = pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.job.as_ref().is_some_and(|j| j.task == task))
            .flat_map(|(r, p)| {
                p.job
                    .as_ref()
                    .into_iter()
                    .flat_map(move |j| j.texts.iter().enumerate().map(move |(t, x)| (r, t, x.len())))
            })
            .collect();
        let lengths: Vec<usize> = items.iter().map(|i| i.2).collect();
        let order = batches::by_length(&lengths);
        let mut rest = &order[..];
        while !rest.is_empty() {
            if stopping.load(Ordering::SeqCst) {
                break;
            }
            // While chat decodes, a batch takes about half a decode step (`engine::turns`).
            let now = cost.within(limits, device_turns().encoder_budget());
            let n = batches::next_batch(&lengths, rest, now, model.attention_heads());
            let (batch, later) = rest.split_at(n);
            rest = later;
            let members: Vec<(usize, usize)> = batch
                .iter()
                .map(|&i| (items[i].0, items[i].1))
                .filter(|&(r, _)| pending[r].job.as_ref().is_some_and(|j| !j.reply.is_closed()))
                .collect();
            if members.is_empty() {
                continue;
            }
            let texts: Vec<EncodedText> =
                members.iter().map(|&(r, t)| pending[r].job.as_ref().expect("open").texts[t].clone()).collect();
            let padded = texts.len() * texts.iter().map(EncodedText::len).max().unwrap_or(0);
            let result = {
                let _turn = device_turns().encoder_batch();
                let began = std::time::Instant::now();
                let result = match task {
                    EmbedTask::Vectors => model.embed(&texts).map(EmbedOutput::Vectors),
                    EmbedTask::Scores => model.score(&texts).map(EmbedOutput::Scores),
                };
                cost.record(began.elapsed(), padded);
                result
            };
            match result {
                Ok(EmbedOutput::Vectors(vectors)) => {
                    for (&(r, t), v) in members.iter().zip(vectors) {
                        pending[r].vectors[t] = Some(v);
                        pending[r].left -= 1;
                    }
                }
                Ok(EmbedOutput::Scores(scores)) => {
                    for (&(r, t), s) in members.iter().zip(scores) {
                        pending[r].scores[t] = Some(s);
                        pending[r].left -= 1;
                    }
                }
                Err(e) => {
                    for &(r, _) in &members {
                        if let Some(job) = pending[r].job.take() {
                            done(job.texts.len(), 1);
                            let _ = job.reply.send(Err(EmbedError::Model(e.to_string())));
                        }
                    }
                }
            }
            for p in pending.iter_mut().filter(|p| p.left == 0) {
                if let Some(job) = p.job.take() {
                    done(job.texts.len(), 1);
                    let output = match job.task {
                        EmbedTask::Vectors => EmbedOutput::Vectors(p.vectors.drain(..).flatten().collect()),
                        EmbedTask::Scores => EmbedOutput::Scores(p.scores.drain(..).flatten().collect()),
                    };
                    let _ = job.reply.send(Ok(output));
                }
            }
        }
    }
    // Requests whose callers left before their texts ran, or that a shutdown cut short.
    for p in &mut pending {
        if let Some(job) = p.job.take() {
            done(job.texts.len(), 1);
            let _ = job.reply.send(Err(EmbedError::ShutDown));
        }
    }
}
