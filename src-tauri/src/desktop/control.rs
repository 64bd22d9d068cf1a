//! The app's own side of the server: the tokio runtime, the models, the running server (which
//! the menu can stop and start again on the same address) and the menu's state.

use std::ffi::OsString;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::model::ModelKind;
use crate::server::{RunningServer, ServerConfig};
use crate::store::{Pulls, Residency};

use super::cluster_launch::{self, ChildState, ClusterChild, ClusterPlan, Launch};
use super::tray::{TrayCluster, TrayState};

/// The loadable chat models, and the embedding models and rerankers.
pub type Listed = (Vec<String>, Vec<String>);

pub struct Control {
    pub runtime: Arc<tokio::runtime::Runtime>,
    pub models: Residency,
    pub pulls: Pulls,
    pub config: ServerConfig,
    pub host: IpAddr,
    /// The port asked for; after the first start, the one actually bound (so the URL stays).
    pub port: Mutex<u16>,
    pub server: Mutex<Option<RunningServer>>,
    /// A model being loaded from the menu.
    pub loading: Mutex<Option<String>>,
    /// What the menu shows now (rebuilt only when this changes).
    pub shown: Mutex<Option<TrayState>>,
    /// The loadable local models (chat, then embedding and reranking) and when they were listed:
    /// the menu checks every second, the disk is scanned again only every few seconds.
    pub listed: Mutex<Option<(Instant, Listed)>>,
    /// The app's own `serve` flags, for a cluster's child process (`cluster_launch`).
    pub flags: Vec<OsString>,
    /// This Mac's rank of a cluster, running as a child process (or how it ended).
    pub cluster: Mutex<Option<ClusterChild>>,
    /// Held while the app's server or a cluster starts (see [`Control::start_server`]).
    starting: Mutex<()>,
    /// Why rank 0 refused the latest Take Back Now, and when (the menu shows it a while).
    take_back_refused: Mutex<Option<(Instant, String)>>,
    http: reqwest::Client,
}

/// How long the menu shows why rank 0 refused a Take Back Now.
const REFUSAL_SHOWN: Duration = Duration::from_secs(60);

/// What rank 0's refusal says: its error's message, else the body as it is, else the status.
fn refusal(status: reqwest::StatusCode, body: &str) -> String {
    let message = serde_json::from_str::<serde_json::Value>(body).ok().and_then(|v| {
        let message = v.get("error")?.get("message")?.as_str()?.to_string();
        Some(message)
    });
    match message.unwrap_or_else(|| body.trim().to_string()) {
        said if said.is_empty() => format!("rank 0 answered {status}"),
        said => said,
    }
}

/// How long a scan of the model folders stands for the menu.
const RESCAN: Duration = Duration::from_secs(5);

impl Control {
    pub fn new(
        runtime: Arc<tokio::runtime::Runtime>,
        (models, pulls): (Residency, Pulls),
        config: ServerConfig,
        (host, port): (IpAddr, u16),
        flags: Vec<OsString>,
    ) -> Control {
        Control {
            runtime,
            models,
            pulls,
            config,
            host,
            port: Mutex::new(port),
            server: Mutex::new(None),
            loading: Mutex::new(None),
            shown: Mutex::new(None),
            listed: Mutex::new(None),
            flags,
            cluster: Mutex::new(None),
            starting: Mutex::new(()),
            take_back_refused: Mutex::new(None),
            http: reqwest::Client::new(),
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The API's URL: the app's own server's, or a cluster's rank 0 serving in its place.
    pub fn url(&self) -> Option<String> {
        match Self::lock(&self.server).as_ref() {
            Some(server) => Some(server.url()),
            None => self.cluster_serves_api().then(|| format!("{}/v1", self.api_base())),
        }
    }

    /// The app's server, started, is the only one on its address: one start at a time, a
    /// cluster's included.
    pub fn start_server(&self) -> anyhow::Result<String> {
        let _one = Self::lock(&self.starting);
        self.start_server_now()
    }

    /// A cluster's rank 0 runs here, serving the API on the app's address.
    pub fn cluster_serves_api(&self) -> bool {
        Self::lock(&self.cluster).as_ref().is_some_and(|c| c.plan().rank == 0 && c.running())
    }

    /// `http://host:port` for the web UI's API calls.
    pub fn api_base(&self) -> String {
        format!(
            "http://{}:{}",
            if self.host.is_unspecified() { "127.0.0.1".to_string() } else { self.host.to_string() },
            *Self::lock(&self.port)
        )
    }

    fn start_server_now(&self) -> anyhow::Result<String> {
        if let Some(url) = self.url() {
            return Ok(url);
        }
        if self.cluster_serves_api() {
            anyhow::bail!("a cluster serves on this address: stop it first");
        }
        let port = *Self::lock(&self.port);
        let server = self.runtime.block_on(RunningServer::start(
            self.models.clone(),
            self.pulls.clone(),
            self.config.clone(),
            self.host,
            port,
        ))?;
        *Self::lock(&self.port) = server.address.port();
        let url = server.url();
        *Self::lock(&self.server) = Some(server);
        Ok(url)
    }

    pub fn stop_server(&self) {
        if let Some(server) = Self::lock(&self.server).take() {
            let _ = self.runtime.block_on(server.stop());
        }
    }

    /// Starts this Mac's rank of the cluster `plan` describes, as a child process serving with
    /// the app's settings. The app's models are unloaded first (the rank needs the memory);
    /// for rank 0 its server steps aside, the child serving the API on the same address until
    /// it ends, when the app's server starts again.
    pub fn start_cluster(self: &Arc<Self>, plan: ClusterPlan) -> Result<ChildState, String> {
        // Held throughout: a second start waits, then finds this one running; the app's server
        // (the last child's end starting it again, or the menu) waits too.
        let _one = Self::lock(&self.starting);
        if Self::lock(&self.cluster).as_ref().is_some_and(|c| !c.settled()) {
            return Err("a cluster is running already: stop it first".into());
        }
        let hosts = plan.host_file()?;
        plan.parallel()?;
        let model = self.models.catalog().find(&plan.model).map_err(|e| e.to_string())?;
        // By its id, so that rank 0 serves it under the name clients know (a model given to the
        // app by path is not in the child's catalog: by path).
        let model_arg: std::ffi::OsString = match model.source {
            crate::store::Source::Path => model.path.clone().into(),
            _ => plan.model.clone().into(),
        };
        let host_file = cluster_launch::host_file_path().ok_or("no folder for the host file on this system")?;
        if let Some(dir) = host_file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::write(&host_file, hosts.ring_json()).map_err(|e| format!("{}: {e}", host_file.display()))?;
        let program = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;

        self.runtime.block_on(self.models.unload_all());
        let rank_zero = plan.rank == 0;
        if rank_zero {
            self.stop_server();
        }
        let port = *Self::lock(&self.port);
        let args =
            Launch { plan: &plan, model: &model_arg, host_file: &host_file, host: self.host, port, flags: &self.flags }
                .args();
        // Settings from the config file are read by the child itself, as the file is now.
        let unset = crate::config_file::applied_keys();
        let mut env: Vec<(String, String)> =
            self.config.api_key.iter().map(|key| ("FASTMLX_API_KEY".to_string(), key.clone())).collect();
        // It ends with the app, a crash included.
        env.push((crate::cli::EXIT_WITH_PARENT_VAR.to_string(), std::process::id().to_string()));
        let this = Arc::downgrade(self);
        let on_exit = move || {
            // Rank 0's child served in the app's place: the app serves again.
            if let Some(control) = this.upgrade().filter(|_| rank_zero) {
                if let Err(e) = control.start_server() {
                    tracing::error!("cannot serve again after the cluster: {e:#}");
                }
            }
        };
        let child = match ClusterChild::spawn(plan, &program, &args, (&env, &unset), on_exit) {
            Ok(child) => child,
            Err(e) => {
                if rank_zero {
                    let _ = self.start_server_now();
                }
                return Err(format!("cannot start {}: {e}", program.display()));
            }
        };
        let state = child.state();
        *Self::lock(&self.cluster) = Some(child);
        // A refusal of the cluster before is not this one's.
        *Self::lock(&self.take_back_refused) = None;
        Ok(state)
    }

    /// Stops this Mac's rank of the cluster (rank 0: the app serves again once it has ended).
    pub fn stop_cluster(&self) -> Option<ChildState> {
        let child = Self::lock(&self.cluster).clone()?;
        child.stop();
        Some(child.state())
    }

    pub fn cluster_state(&self) -> Option<ChildState> {
        Self::lock(&self.cluster).as_ref().map(ClusterChild::state)
    }

    /// What the menu says of the cluster (for rank 0, what its server says: the lost machine),
    /// and the model rank 0 serves.
    fn tray_cluster(&self) -> Option<(TrayCluster, Option<String>)> {
        let child = Self::lock(&self.cluster).clone()?;
        let plan = child.plan();
        let machines = plan.host_file().map_or(plan.machines.len(), |h| h.ranks.len());
        let mut shown = TrayCluster { rank: plan.rank, machines, model: plan.model.clone(), ..Default::default() };
        if !child.running() {
            shown.ended = child.state().exit;
            return Some((shown, None));
        }
        if plan.rank != 0 {
            shown.latest = child.last_line();
            return Some((shown, None));
        }
        let seen = self.seen_from_rank_zero(&child);
        (shown.detail, shown.serving, shown.back) = (seen.problem, seen.serving, seen.back);
        let refused = Self::lock(&self.take_back_refused).clone();
        shown.refused = refused.filter(|(at, _)| at.elapsed() < REFUSAL_SHOWN).map(|(_, why)| why);
        Some((shown, seen.model))
    }

    /// Rank 0's child serving: asks it to take the machines that are back in now (what its
    /// `POST /admin/cluster/take-back` answers, as an error where it refuses).
    pub fn take_back(&self) -> anyhow::Result<()> {
        let url = format!("{}/admin/cluster/take-back", self.api_base());
        let mut request = self.http.post(url).timeout(Duration::from_secs(5));
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        let refused = self.runtime.block_on(async {
            let response = request.send().await.map_err(|e| format!("rank 0 did not answer: {e}"))?;
            let status = response.status();
            if status.is_success() {
                return Ok(());
            }
            Err(refusal(status, &response.text().await.unwrap_or_default()))
        });
        // Shown in the menu, above the button, for a minute or until the next try.
        *Self::lock(&self.take_back_refused) = refused.as_ref().err().map(|why| (Instant::now(), why.clone()));
        refused.map_err(|why| anyhow::anyhow!("rank 0 did not take the machines back: {why}"))
    }

    /// What rank 0's `/admin/status` says: its model, and why it does not serve, if it does not.
    fn seen_from_rank_zero(&self, child: &ClusterChild) -> cluster_launch::SeenFromRankZero {
        let url = format!("{}/admin/status", self.api_base());
        let mut request = self.http.get(url).timeout(Duration::from_millis(800));
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        let status = self.runtime.block_on(async { request.send().await?.error_for_status()?.json().await });
        let problem = match status {
            Ok(status) => return cluster_launch::seen_from_status(&status),
            Err(_) if child.age() < Duration::from_secs(10) => "starting…".to_string(),
            Err(e) => format!("its server does not answer: {e}"),
        };
        cluster_launch::SeenFromRankZero { problem: Some(problem), ..Default::default() }
    }

    /// What the menu should show now.
    pub fn tray_state(&self) -> TrayState {
        let loaded = self.models.loaded();
        let (models, encoders) = self.loadable_models();
        let (cluster, cluster_model) = self.tray_cluster().map_or((None, None), |(c, m)| (Some(c), m));
        let loaded_chat = loaded.iter().filter(|m| m.kind == ModelKind::Chat).map(|m| m.id.clone());
        let mut all = loaded_chat.clone().filter(|id| !models.contains(id)).collect::<Vec<_>>();
        all.extend(models);
        TrayState {
            url: self.url(),
            serving: loaded_chat.clone().next().or(cluster_model),
            models: all,
            loaded_encoders: loaded.iter().filter(|m| m.kind != ModelKind::Chat).map(|m| m.id.clone()).collect(),
            encoders,
            loading: Self::lock(&self.loading).clone(),
            tokens_per_sec: self.models.engines().iter().map(|s| s.engine.snapshot().decode_tokens_per_sec).sum(),
            cluster,
        }
    }

    /// The loadable chat models, and the embedding models and rerankers.
    fn loadable_models(&self) -> Listed {
        let mut listed = Self::lock(&self.listed);
        match listed.as_ref() {
            Some((at, ids)) if at.elapsed() < RESCAN => ids.clone(),
            _ => {
                let (chat, encoders): (Vec<_>, Vec<_>) = self
                    .models
                    .catalog()
                    .list()
                    .into_iter()
                    .filter(|m| m.summary.unloadable_reason.is_none())
                    .partition(|m| m.summary.kind == ModelKind::Chat);
                let ids = (chat.into_iter().map(|m| m.id).collect(), encoders.into_iter().map(|m| m.id).collect());
                *listed = Some((Instant::now(), ids));
                listed.as_ref().map(|(_, ids)| ids.clone()).unwrap_or_default()
            }
        }
    }

    /// Loads `id` in the background and makes it the one requests without a model go to.
    pub fn serve_model(self: &Arc<Self>, id: String) {
        *Self::lock(&self.loading) = Some(id.clone());
        let this = self.clone();
        self.runtime.spawn(async move {
            // A chat model becomes the one served; an embedding model or reranker loads beside it.
            if let Err(e) = this.models.load_any(&id, None).await {
                tracing::error!("cannot serve {id}: {e}");
            }
            *Self::lock(&this.loading) = None;
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refusal_is_told_by_its_message() {
        let body = r#"{"error":{"message":"no machine is back to take in","type":"invalid_request_error"}}"#;
        let conflict = reqwest::StatusCode::CONFLICT;
        assert_eq!(super::refusal(conflict, body), "no machine is back to take in");
        assert_eq!(super::refusal(conflict, "  Bad Gateway\n"), "Bad Gateway");
        assert_eq!(super::refusal(conflict, ""), "rank 0 answered 409 Conflict");
    }
}
