//! Which models are loaded, each in its own engine: loading on demand (a request naming a
//! model that is not loaded loads it), unloading, least-recently-used eviction within a memory
//! budget, and an idle time-out (Ollama's `keep_alive`). Loading is refused with a clear error
//! rather than pushing the machine into swap.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

use super::catalog::{Catalog, CatalogError};
use super::discover::LocalModel;
use crate::engine::embed::{BatchLimits, EmbedHandle};
use crate::engine::remote::{HeldBack, RemoteLayers};
use crate::engine::{DraftLoader, EngineConfig, EngineHandle};
use crate::mlx::Backend;
use crate::model::load::load_embedder;
use crate::model::{load_model_with, LoadOptions, LoadedModel, ModelError, ModelKind, ModelSummary};

#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("{id} cannot be loaded by this build: {reason}")]
    Unloadable { id: String, reason: String },
    #[error("{id} needs about {needed_mb} MB (weights and KV cache); {free_mb} MB of the {budget_mb} MB memory budget is free{busy}")]
    NoRoom { id: String, needed_mb: u64, free_mb: u64, budget_mb: u64, busy: String },
    #[error("loading {id} failed: {message}")]
    LoadFailed { id: String, message: String },
    #[error("{0} is not loaded")]
    NotLoaded(String),
    #[error("no model is loaded and none was named")]
    NoModel,
    #[error("{id} is {} model, not {} model", article(*.kind), article(*.wanted))]
    WrongKind { id: String, kind: ModelKind, wanted: ModelKind },
    #[error("no {} model is loaded and none was named", .0.as_str())]
    NoModelOfKind(ModelKind),
    /// A model split across a cluster, not (or no longer) formed: served once it is.
    #[error("{id} is not served yet: {reason}")]
    Waiting { id: String, reason: String },
    /// A model served for a cluster (split across it, or alone on rank 0 while the others are
    /// gone) stays loaded while the server runs: unloaded, its workers would end, and a request
    /// would load it again outside the cluster.
    #[error("{id} is served for a cluster: it stays loaded until the server stops")]
    Pinned { id: String },
}

fn article(kind: ModelKind) -> &'static str {
    match kind {
        ModelKind::Chat => "a chat",
        ModelKind::Embedding => "an embedding",
        ModelKind::Reranker => "a reranker",
    }
}

#[derive(Clone)]
pub struct ResidencyConfig {
    pub engine: EngineConfig,
    pub load: LoadOptions,
    /// The process's memory ceiling (`--memory-limit`): the loaded models' weights and KV
    /// budgets are planned within it, MLX's limits are set from it, and each engine keeps its
    /// steps under it (`engine::memory`).
    pub memory_budget: u64,
    /// Unload a model unused for this long (`None`: never).
    pub keep_alive: Option<Duration>,
    /// Draft models (`--draft-model`): a catalog id, and the catalog id of the model that drafts
    /// tokens for it, loaded with it.
    pub drafts: Vec<(String, String)>,
    /// Models with a KV format of their own (`--model-kv`); the others use `engine.kv_format`.
    pub model_kv: Vec<super::ModelKv>,
}

impl Default for ResidencyConfig {
    fn default() -> Self {
        ResidencyConfig {
            engine: EngineConfig::default(),
            load: LoadOptions::default(),
            memory_budget: crate::mlx::default_ceiling(),
            keep_alive: None,
            drafts: Vec::new(),
            model_kv: Vec::new(),
        }
    }
}

/// The engine settings of chat model `id` given `kv` bytes of KV budget.
fn chat_engine_config(config: &ResidencyConfig, id: &str, kv: u64) -> EngineConfig {
    EngineConfig {
        kv_budget_bytes: Some(kv as usize),
        memory_ceiling: Some(config.memory_budget as usize),
        kv_format: super::model_kv::format_for(&config.model_kv, id, config.engine.kv_format),
        ..config.engine.clone()
    }
}

/// A loaded model, as listings show it.
#[derive(Debug, Clone, Serialize)]
pub struct LoadedStatus {
    pub id: String,
    /// What it serves: chat, embedding or reranker.
    pub kind: ModelKind,
    pub path: PathBuf,
    /// Weights and KV budget, in bytes.
    pub memory_bytes: u64,
    pub weights_bytes: u64,
    pub kv_budget_bytes: u64,
    pub idle_secs: u64,
    /// Seconds until the idle time-out unloads it.
    pub expires_in_secs: Option<u64>,
    pub running: usize,
    pub queued: usize,
    /// The context window it serves (prompt and output tokens): the model's own, or less under
    /// `--ctx`.
    pub context_length: usize,
    /// The draft model loaded with it (`--draft-model`), whose weights count in its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    /// Whether its own multi-token-prediction head drafts for it (`mtp.*` in the checkpoint).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub mtp_head: bool,
    /// Why it cannot serve, where it is split across a cluster that lost a machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Its cluster's machines, links and step costs, where it is split across one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::engine::remote::ClusterStatus>,
}

/// A model chosen to serve a request: its id (as the API reports it) and its engine.
#[derive(Clone)]
pub struct Served {
    pub id: String,
    pub engine: EngineHandle,
    /// Served alone on rank 0 for a cluster whose other machines are gone: that cluster.
    alone: Option<crate::engine::remote::ClusterStatus>,
    /// Its cluster's machines that are back, as rank 0 last told.
    returns: Returns,
}

impl Served {
    /// The cluster it is served for: split across it, or alone on rank 0 while the others are
    /// gone (shown as a cluster of one machine, with the ones it serves without).
    pub fn cluster(&self) -> Option<crate::engine::remote::ClusterStatus> {
        self.engine.cluster().or_else(|| self.alone.clone()).map(|c| self.returns.shown_in(c))
    }
}

/// Rank 0 of a cluster: its machines that are back and waiting to be taken in, when they are
/// (`idle` or `asked`), and whether a person asked to take them in now.
#[derive(Debug, Clone, Default)]
struct Returns {
    back: Vec<String>,
    held: Vec<HeldBack>,
    when: Option<String>,
    asked: bool,
}

impl Returns {
    fn shown_in(&self, mut cluster: crate::engine::remote::ClusterStatus) -> crate::engine::remote::ClusterStatus {
        cluster.back = self.back.clone();
        cluster.held = self.held.clone();
        cluster.take_back = self.when.clone();
        cluster
    }

    /// Whether an ask has machines to take: back, or held off (a person may try those sooner).
    fn any(&self) -> bool {
        !self.back.is_empty() || !self.held.is_empty()
    }
}

/// An embedding model or reranker chosen to serve a request.
#[derive(Clone)]
pub struct ServedEncoder {
    pub id: String,
    pub engine: EmbedHandle,
}

/// A loaded model's engine: text generation, or an encoder's.
#[derive(Clone)]
enum Engine {
    Chat(EngineHandle),
    Encoder(EmbedHandle),
}

impl Engine {
    fn kind(&self) -> ModelKind {
        match self {
            Engine::Chat(_) => ModelKind::Chat,
            Engine::Encoder(e) => e.info().kind.into(),
        }
    }

    fn shutdown(&self) {
        match self {
            Engine::Chat(e) => e.shutdown(),
            Engine::Encoder(e) => e.shutdown(),
        }
    }
}

struct Resident {
    id: String,
    path: PathBuf,
    engine: Engine,
    /// Weights plus KV budget.
    footprint: u64,
    last_used: Instant,
    keep_alive: Option<Duration>,
    /// Split across a cluster: never evicted, unloaded only when the server stops.
    pinned: bool,
    /// Served alone on rank 0 for a cluster whose other machines are gone: the cluster as it
    /// stands (this machine, the ones it serves without).
    alone: Option<crate::engine::remote::ClusterStatus>,
}

impl Resident {
    fn busy(&self) -> bool {
        match &self.engine {
            Engine::Chat(engine) => {
                let m = engine.snapshot();
                m.running > 0 || m.queued > 0
            }
            Engine::Encoder(engine) => engine.open_requests() > 0,
        }
    }
}

struct Inner {
    catalog: Catalog,
    /// Changeable while serving (the dashboard's settings); applies to what loads next.
    config: Mutex<ResidencyConfig>,
    /// Most recently used last.
    residents: Mutex<Vec<Resident>>,
    /// One load at a time (each may need to evict others first).
    loading: tokio::sync::Mutex<()>,
    /// Bumped when the set of loaded models changes (tray menu, UI).
    changes: watch::Sender<u64>,
    /// The model this process serves split across a cluster, while the cluster forms: its id
    /// and why it does not serve yet. Requests for it are refused with that, never loaded here.
    awaited: Mutex<Option<Awaited>>,
    /// Rank 0 of a cluster: the machines back, and a person's ask to take them in.
    returns: Mutex<Returns>,
}

/// A model waiting for its cluster to form.
#[derive(Debug, Clone, Serialize)]
pub struct Awaited {
    pub id: String,
    pub reason: String,
    /// It is being loaded whole on this machine instead (its cluster's other machines gone):
    /// a request for it may load it.
    #[serde(skip)]
    whole: bool,
}

#[derive(Clone)]
pub struct Residency {
    inner: Arc<Inner>,
}

const KV_FLOOR: u64 = 256 << 20;

impl Residency {
    pub fn new(catalog: Catalog, config: ResidencyConfig) -> Residency {
        let (changes, _) = watch::channel(0);
        apply_ceiling(config.memory_budget);
        Residency {
            inner: Arc::new(Inner {
                catalog,
                config: Mutex::new(config),
                residents: Mutex::new(Vec::new()),
                loading: tokio::sync::Mutex::new(()),
                changes,
                awaited: Mutex::new(None),
                returns: Mutex::default(),
            }),
        }
    }

    pub fn catalog(&self) -> &Catalog {
        &self.inner.catalog
    }

    pub fn memory_budget(&self) -> u64 {
        self.config().memory_budget
    }

    pub fn config(&self) -> ResidencyConfig {
        self.inner.config.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes the settings: the memory budget and engine settings apply to models loaded from
    /// now on, the keep-alive to every loaded model at once.
    pub fn update_config(&self, change: impl FnOnce(&mut ResidencyConfig)) -> ResidencyConfig {
        let config = {
            let mut config = self.inner.config.lock().unwrap_or_else(|e| e.into_inner());
            change(&mut config);
            config.clone()
        };
        apply_ceiling(config.memory_budget);
        for resident in self.residents().iter_mut() {
            resident.keep_alive = config.keep_alive;
        }
        config
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    fn residents(&self) -> std::sync::MutexGuard<'_, Vec<Resident>> {
        self.inner.residents.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Model `id` is split across a cluster that has not formed (`reason` says what it waits
    /// for): requests for it, and requests naming no model while none is loaded, are refused
    /// with that until [`Self::load_split`] loads it.
    pub fn await_split(&self, id: &str, reason: impl Into<String>) {
        self.set_awaited(Some(Awaited { id: id.to_string(), reason: reason.into(), whole: false }));
    }

    fn set_awaited(&self, awaited: Option<Awaited>) {
        *self.inner.awaited.lock().unwrap_or_else(|e| e.into_inner()) = awaited;
        self.inner.changes.send_modify(|n| *n += 1);
    }

    /// The model waited for is loaded whole on this machine instead (its cluster's other
    /// machines are gone and it fits here), then served as any model; while it loads, requests
    /// naming no model are told `reason`.
    pub async fn load_whole_instead(&self, id: &str, reason: impl Into<String>) -> Result<Served, ResidencyError> {
        self.set_awaited(Some(Awaited { id: id.to_string(), reason: reason.into(), whole: true }));
        let loaded = self.load(id, None).await;
        self.set_awaited(None);
        loaded
    }

    /// `id`, loaded whole on rank 0 of a cluster whose other machines are gone, stays loaded
    /// (as a split model does) and shows `cluster` (this machine, the ones it serves without).
    pub fn pin_alone(&self, id: &str, cluster: crate::engine::remote::ClusterStatus) {
        if let Some(resident) = self.residents().iter_mut().find(|r| r.id == id) {
            resident.pinned = true;
            resident.keep_alive = None;
            resident.alone = Some(cluster);
        }
        self.inner.changes.send_modify(|n| *n += 1);
    }

    /// The draft model paired with `id` (`--draft-model`), if one is.
    fn draft_of(&self, config: &ResidencyConfig, id: &str) -> Result<Option<LocalModel>, ResidencyError> {
        match config.drafts.iter().find(|(target, _)| target == id) {
            Some((_, draft)) => Ok(Some(self.inner.catalog.find(draft)?)),
            None => Ok(None),
        }
    }

    fn returns(&self) -> std::sync::MutexGuard<'_, Returns> {
        self.inner.returns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rank 0 of a cluster: the machines that are back (named), taken in when `when` says
    /// (`idle` or `asked`), and those back but held off. An ask with none lapses.
    pub fn set_returns(&self, back: Vec<String>, held: Vec<HeldBack>, when: &str) {
        let mut returns = self.returns();
        (returns.back, returns.held) = (back, held);
        returns.asked &= returns.any();
        returns.when = Some(when.to_string());
    }

    /// No machine is to be taken back by this process any more (it starts again): an ask finds
    /// none.
    pub fn clear_back(&self) {
        let mut returns = self.returns();
        returns.back.clear();
        returns.held.clear();
        returns.asked = false;
    }

    /// A person asks to take the cluster's machines that are back in now: the machines, or
    /// why there are none.
    pub fn ask_take_back(&self) -> Result<Vec<String>, String> {
        let mut returns = self.returns();
        if returns.when.is_none() {
            return Err("no cluster here has machines to take back (it serves no model across a cluster, or its cluster is forming)".into());
        }
        if !returns.any() {
            return Err("no machine the cluster serves without is back to take in".into());
        }
        returns.asked = true;
        Ok(returns.back.iter().cloned().chain(returns.held.iter().map(|h| h.machine.clone())).collect())
    }

    /// Whether a person asked to take the machines that are back in now (the ask is used up).
    pub fn take_back_asked(&self) -> bool {
        std::mem::take(&mut self.returns().asked)
    }

    /// The model waiting for its cluster, if one is.
    pub fn awaited(&self) -> Option<Awaited> {
        self.inner.awaited.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why `id` is refused while its cluster forms (not while it is loaded whole instead).
    fn split_waiting_error(&self, id: &str) -> Option<ResidencyError> {
        self.waiting_error(Some(id)).filter(|_| !self.awaited().is_some_and(|a| a.whole))
    }

    fn waiting_error(&self, id: Option<&str>) -> Option<ResidencyError> {
        let awaited = self.awaited()?;
        (id.is_none_or(|id| id == awaited.id))
            .then_some(ResidencyError::Waiting { id: awaited.id, reason: awaited.reason })
    }

    /// The engine for `id` (loading it if needed); with no id, the most recently used model.
    pub async fn serve(&self, id: Option<&str>) -> Result<Served, ResidencyError> {
        let id = match self.named_or_latest(id, ModelKind::Chat) {
            Some(id) => id,
            None => return Err(self.waiting_error(None).unwrap_or(ResidencyError::NoModel)),
        };
        let engine = self.engine(&id).await?;
        self.chat_engine(id, engine)
    }

    /// The embedding model or reranker `id` (loading it if needed); with no id, the most recently
    /// used one of `kind`.
    pub async fn serve_encoder(&self, id: Option<&str>, kind: ModelKind) -> Result<ServedEncoder, ResidencyError> {
        let id = self.named_or_latest(id, kind).ok_or(ResidencyError::NoModelOfKind(kind))?;
        match self.engine(&id).await? {
            Engine::Encoder(engine) if ModelKind::from(engine.info().kind) == kind => Ok(ServedEncoder { id, engine }),
            other => Err(ResidencyError::WrongKind { id, kind: other.kind(), wanted: kind }),
        }
    }

    /// `id` when one is named, else the most recently used loaded model of `kind`.
    fn named_or_latest(&self, id: Option<&str>, kind: ModelKind) -> Option<String> {
        match id.filter(|i| !i.is_empty()) {
            Some(id) => Some(id.to_string()),
            None => self.residents().iter().rev().find(|r| r.engine.kind() == kind).map(|r| r.id.clone()),
        }
    }

    /// The engine of `id`, loaded now if it is not.
    async fn engine(&self, id: &str) -> Result<Engine, ResidencyError> {
        // A split model its cluster is forming again for takes no new request, loaded or not.
        if let Some(waiting) = self.split_waiting_error(id) {
            return Err(waiting);
        }
        match self.touch(id) {
            Some(engine) => Ok(engine),
            None => self.load_engine(id, None).await,
        }
    }

    /// Marks `id` used and returns its engine, if it is loaded.
    fn touch(&self, id: &str) -> Option<Engine> {
        let mut residents = self.residents();
        let i = residents.iter().position(|r| r.id == id)?;
        let mut resident = residents.remove(i);
        resident.last_used = Instant::now();
        let engine = resident.engine.clone();
        residents.push(resident);
        Some(engine)
    }

    /// For the command line: loads a model given by id or by path (then known by its id from
    /// here on, also after an unload).
    pub async fn load_given(&self, id_or_path: &str) -> Result<Served, ResidencyError> {
        let model = self.inner.catalog.find_or_add_path(id_or_path)?;
        self.load(&model.id, None).await
    }

    /// Loads the chat model `id` (a catalog id, never a path) unless it is loaded; `keep_alive`
    /// overrides the default time-out.
    pub async fn load(&self, id: &str, keep_alive: Option<Duration>) -> Result<Served, ResidencyError> {
        let engine = self.load_engine(id, keep_alive).await?;
        self.chat_engine(id.to_string(), engine)
    }

    /// Loads the chat model at `id_or_path` split across a cluster: `load` gives this rank's
    /// stage and the link to the others (from the model's path and the load options). It stays
    /// loaded until unloaded; its KV budget is what the ceiling leaves beside the stage.
    pub async fn load_split(
        &self,
        id_or_path: &str,
        load: impl FnOnce(PathBuf, LoadOptions) -> Result<(LoadedModel, Box<dyn RemoteLayers>), ModelError> + Send + 'static,
    ) -> Result<Served, ResidencyError> {
        let _one_at_a_time = self.inner.loading.lock().await;
        let model = self.inner.catalog.find_or_add_path(id_or_path)?;
        let config = self.config();
        // A draft model (`--draft-model`) is loaded whole on this rank beside its stage.
        let draft = self.draft_of(&config, &model.id)?;
        // The stage's share of the weights is known once it is built; the engine measures what
        // the process holds when it sizes its KV budget.
        let draft_weights = draft.as_ref().map_or(0, |d| estimated_weights_bytes(&d.summary, &config.load));
        let kv = self.make_room(&model.id, draft_weights)?;
        let engine_config = chat_engine_config(&config, &model.id, kv);
        let (path, options) = (model.path.clone(), config.load);
        let load_draft = draft.map(|d| draft_loader(d, options));
        let failed = |e: String| ResidencyError::LoadFailed { id: model.id.clone(), message: e };
        let engine = tokio::task::spawn_blocking(move || {
            EngineHandle::start_split(engine_config, move || load(path, options), load_draft)
        })
        .await
        .map_err(|e| failed(e.to_string()))?
        .map_err(|e| failed(e.to_string()))?;
        let footprint = engine.model_info().weights_bytes as u64 + kv;
        let engine = self.add_resident(model.id.clone(), model.path, Engine::Chat(engine), footprint, None);
        if let Some(resident) = self.residents().iter_mut().find(|r| r.id == model.id) {
            resident.pinned = true;
        }
        self.set_awaited(None);
        self.chat_engine(model.id, engine)
    }

    /// Loads `id`, of any kind, unless it is loaded (Ollama's and the UI's load, which serve
    /// every kind); returns its kind.
    pub async fn load_any(&self, id: &str, keep_alive: Option<Duration>) -> Result<ModelKind, ResidencyError> {
        Ok(self.load_engine(id, keep_alive).await?.kind())
    }

    async fn load_engine(&self, id: &str, keep_alive: Option<Duration>) -> Result<Engine, ResidencyError> {
        let _one_at_a_time = self.inner.loading.lock().await;
        if let Some(engine) = self.touch(id) {
            if keep_alive.is_some() {
                self.set_keep_alive(id, keep_alive);
            }
            return Ok(engine);
        }
        // Never loaded whole here while it waits for its cluster.
        if let Some(waiting) = self.split_waiting_error(id) {
            return Err(waiting);
        }
        let model = self.inner.catalog.find(id)?;
        if let Some(reason) = model.summary.unloadable_reason.clone() {
            return Err(ResidencyError::Unloadable { id: model.id, reason });
        }
        if model.summary.kind != ModelKind::Chat {
            return self.load_encoder(model, keep_alive).await;
        }
        let config = self.config();
        let draft = self.draft_of(&config, &model.id)?;
        let weights = estimated_weights_bytes(&model.summary, &config.load)
            + draft.as_ref().map_or(0, |d| estimated_weights_bytes(&d.summary, &config.load));
        let kv = self.make_room(&model.id, weights)?;
        let engine_config = chat_engine_config(&config, &model.id, kv);
        let (path, options) = (model.path.clone(), config.load);
        let load_draft = draft.map(|d| draft_loader(d, options));
        let engine = tokio::task::spawn_blocking(move || {
            let load = move || load_model_with(&path, &Backend::init(), &options);
            EngineHandle::start_with_draft(engine_config, load, load_draft)
        })
        .await
        .map_err(|e| ResidencyError::LoadFailed { id: model.id.clone(), message: e.to_string() })?
        .map_err(|e| ResidencyError::LoadFailed { id: model.id.clone(), message: e.to_string() })?;
        let footprint = engine.model_info().weights_bytes as u64 + kv;
        Ok(self.add_resident(model.id, model.path, Engine::Chat(engine), footprint, keep_alive.or(config.keep_alive)))
    }

    /// An embedding model or reranker: its weights and one batch's working memory.
    async fn load_encoder(
        &self,
        model: super::discover::LocalModel,
        keep_alive: Option<Duration>,
    ) -> Result<Engine, ResidencyError> {
        let config = self.config();
        let limits = BatchLimits::default();
        let working = limits.working_bytes();
        let weights = estimated_weights_bytes(&model.summary, &config.load);
        self.make_room(&model.id, weights + working)?;
        let path = model.path.clone();
        let failed = |message: String| ResidencyError::LoadFailed { id: model.id.clone(), message };
        let engine = tokio::task::spawn_blocking(move || {
            EmbedHandle::start(limits, move || load_embedder(&path, &Backend::init()))
        })
        .await
        .map_err(|e| failed(e.to_string()))?
        .map_err(|e| failed(e.to_string()))?;
        let footprint = engine.info().weights_bytes as u64 + working;
        Ok(self.add_resident(
            model.id,
            model.path,
            Engine::Encoder(engine),
            footprint,
            keep_alive.or(config.keep_alive),
        ))
    }

    fn add_resident(
        &self,
        id: String,
        path: PathBuf,
        engine: Engine,
        footprint: u64,
        keep_alive: Option<Duration>,
    ) -> Engine {
        let resident = Resident {
            id,
            path,
            engine: engine.clone(),
            footprint,
            last_used: Instant::now(),
            keep_alive,
            pinned: false,
            alone: None,
        };
        self.residents().push(resident);
        self.inner.changes.send_modify(|n| *n += 1);
        engine
    }

    /// Frees room for a model whose weights take `weights` bytes, unloading idle models least
    /// recently used first; returns the KV budget it gets.
    fn make_room(&self, id: &str, weights: u64) -> Result<u64, ResidencyError> {
        let config = self.config();
        let budget = config.memory_budget;
        let kv_wanted = config.engine.kv_budget_bytes.map_or_else(|| (budget / 4).max(KV_FLOOR), |k| k as u64);
        let mut evicted = Vec::new();
        let result = {
            let mut residents = self.residents();
            loop {
                let used: u64 = residents.iter().map(|r| r.footprint).sum();
                let free = budget.saturating_sub(used);
                if weights + KV_FLOOR <= free {
                    break Ok(kv_wanted.min(free - weights));
                }
                match residents.iter().position(|r| !r.busy() && !r.pinned) {
                    Some(i) => evicted.push(residents.remove(i)),
                    None => {
                        let busy: Vec<&str> = residents.iter().map(|r| r.id.as_str()).collect();
                        let busy =
                            if busy.is_empty() { String::new() } else { format!(" (in use by {})", busy.join(", ")) };
                        let mb = |b: u64| b >> 20;
                        break Err(ResidencyError::NoRoom {
                            id: id.to_string(),
                            needed_mb: mb(weights + KV_FLOOR),
                            free_mb: mb(free),
                            budget_mb: mb(budget),
                            busy,
                        });
                    }
                }
            }
        };
        for resident in evicted {
            tracing::info!("unloading {} to make room for {id}", resident.id);
            resident.engine.shutdown();
            self.inner.changes.send_modify(|n| *n += 1);
        }
        result
    }

    /// How long `id` stays loaded when idle (`None`: for good); `Duration::ZERO` unloads it
    /// once its requests are done.
    pub fn set_keep_alive(&self, id: &str, keep_alive: Option<Duration>) {
        if let Some(r) = self.residents().iter_mut().find(|r| r.id == id) {
            r.keep_alive = keep_alive;
        }
    }

    /// Unloads `id`, cancelling its running requests, and frees its memory.
    pub async fn unload(&self, id: &str) -> Result<(), ResidencyError> {
        self.unload_even_pinned(id, false).await
    }

    async fn unload_even_pinned(&self, id: &str, even_pinned: bool) -> Result<(), ResidencyError> {
        let resident = {
            let mut residents = self.residents();
            let i =
                residents.iter().position(|r| r.id == id).ok_or_else(|| ResidencyError::NotLoaded(id.to_string()))?;
            if residents[i].pinned && !even_pinned {
                return Err(ResidencyError::Pinned { id: id.to_string() });
            }
            residents.remove(i)
        };
        let engine = resident.engine;
        let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
        self.inner.changes.send_modify(|n| *n += 1);
        Ok(())
    }

    pub fn loaded(&self) -> Vec<LoadedStatus> {
        let now = Instant::now();
        self.residents()
            .iter()
            .rev()
            .map(|r| {
                let idle = now.duration_since(r.last_used);
                let mut status = LoadedStatus {
                    id: r.id.clone(),
                    kind: r.engine.kind(),
                    path: r.path.clone(),
                    memory_bytes: r.footprint,
                    weights_bytes: 0,
                    kv_budget_bytes: 0,
                    idle_secs: idle.as_secs(),
                    expires_in_secs: r.keep_alive.map(|k| k.saturating_sub(idle).as_secs_f64().ceil() as u64),
                    running: 0,
                    queued: 0,
                    context_length: 0,
                    draft_model: None,
                    mtp_head: false,
                    fault: None,
                    cluster: None,
                };
                match &r.engine {
                    Engine::Chat(engine) => {
                        let (m, info) = (engine.snapshot(), engine.model_info());
                        status.weights_bytes = info.weights_bytes as u64;
                        status.kv_budget_bytes = info.kv_budget_bytes as u64;
                        status.running = m.running;
                        status.queued = m.queued;
                        status.context_length = info.context_length;
                        status.draft_model = info.draft_model.clone();
                        status.mtp_head = info.mtp_head;
                        status.fault = engine.fault();
                        status.cluster =
                            engine.cluster().or_else(|| r.alone.clone()).map(|c| self.returns().shown_in(c));
                    }
                    Engine::Encoder(engine) => {
                        status.weights_bytes = engine.info().weights_bytes as u64;
                        status.running = engine.open_requests();
                        status.context_length = engine.info().max_tokens;
                    }
                }
                status
            })
            .collect()
    }

    /// Every local model: the catalog's, then those loaded by path (`serve --model <file>`),
    /// which live outside the model folders. Reads the disk.
    /// What `model` would serve here under the current ceiling and engine settings.
    pub fn plan_for(&self, model: &LocalModel) -> Option<crate::engine::memory::ServingPlan> {
        let config = self.config();
        super::fit::plan_for(&model.path, &model.summary, &config.load, config.memory_budget, config.engine.max_batch)
    }

    pub fn local_models(&self) -> Vec<LocalModel> {
        let loaded: Vec<(String, PathBuf)> = self.residents().iter().map(|r| (r.id.clone(), r.path.clone())).collect();
        let mut models = self.inner.catalog.list();
        for (id, path) in loaded {
            if !models.iter().any(|m| m.id == id) {
                models.push(LocalModel { id, ..Catalog::at_path(&path) });
            }
        }
        models
    }

    /// A local model by id.
    pub fn find_local(&self, id: &str) -> Result<LocalModel, CatalogError> {
        self.local_models().into_iter().find(|m| m.id == id).ok_or_else(|| CatalogError::NotFound(id.to_string()))
    }

    /// The engines of the loaded chat models (metrics).
    pub fn engines(&self) -> Vec<Served> {
        self.residents()
            .iter()
            .filter_map(|r| match &r.engine {
                Engine::Chat(engine) => Some(Served {
                    id: r.id.clone(),
                    engine: engine.clone(),
                    alone: r.alone.clone(),
                    returns: self.returns().clone(),
                }),
                Engine::Encoder(_) => None,
            })
            .collect()
    }

    /// Unloads models idle past their time-out; returns their ids.
    pub async fn unload_idle(&self) -> Vec<String> {
        let now = Instant::now();
        let expired: Vec<String> = self
            .residents()
            .iter()
            .filter(|r| r.keep_alive.is_some_and(|k| now.duration_since(r.last_used) >= k) && !r.busy() && !r.pinned)
            .map(|r| r.id.clone())
            .collect();
        for id in &expired {
            let _ = self.unload(id).await;
        }
        expired
    }

    /// Checks for idle models every few seconds, for as long as the runtime lives.
    pub fn spawn_idle_reaper(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                for id in this.unload_idle().await {
                    tracing::info!("unloaded {id}: idle past its keep-alive");
                }
            }
        })
    }

    /// The chat engine `engine` (of the resident `id`) is, or why it is not one.
    fn chat_engine(&self, id: String, engine: Engine) -> Result<Served, ResidencyError> {
        match engine {
            Engine::Chat(engine) => {
                let alone = self.residents().iter().find(|r| r.id == id).and_then(|r| r.alone.clone());
                Ok(Served { id, engine, alone, returns: self.returns().clone() })
            }
            other => Err(ResidencyError::WrongKind { id, kind: other.kind(), wanted: ModelKind::Chat }),
        }
    }

    /// Unloads everything (server shutdown).
    pub async fn unload_all(&self) {
        let ids: Vec<String> = self.residents().iter().map(|r| r.id.clone()).collect();
        for id in ids {
            let _ = self.unload_even_pinned(&id, true).await;
        }
    }
}

/// What loads a draft model beside the model it drafts for.
fn draft_loader(draft: LocalModel, options: LoadOptions) -> DraftLoader {
    Box::new(move || load_model_with(&draft.path, &Backend::init(), &options))
}

/// Sets MLX's own limits from the ceiling (process-wide).
fn apply_ceiling(ceiling: u64) {
    let limits = crate::mlx::apply_limits(ceiling, crate::mlx::gpu_available());
    tracing::debug!("MLX limits: {limits:?}");
}

/// Memory the weights will take once loaded: on a CPU quantized weights are expanded to f32
/// when they fit (see `WeightFormat::Auto`), elsewhere what the inspector counts (a GGUF's
/// blocks repacked) or about their size on disk.
pub fn estimated_weights_bytes(summary: &ModelSummary, options: &LoadOptions) -> u64 {
    let quantized = summary
        .quantization
        .as_deref()
        .is_some_and(|q| q.contains("bit") || q.contains("mxfp") || q.contains("nvfp") || q.starts_with('Q'));
    match summary.parameters {
        Some(params) if quantized && crate::model::load::expands_quantized(options, params) => params * 4,
        _ => summary.loaded_bytes.unwrap_or(summary.size_bytes),
    }
}
