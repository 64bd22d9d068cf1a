//! The app's own side of the server: the tokio runtime, the models, the running server (which
//! the menu can stop and start again on the same address) and the menu's state.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::model::ModelKind;
use crate::server::{RunningServer, ServerConfig};
use crate::store::{Pulls, Residency};

use super::tray::TrayState;

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
}

/// How long a scan of the model folders stands for the menu.
const RESCAN: Duration = Duration::from_secs(5);

impl Control {
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn url(&self) -> Option<String> {
        Self::lock(&self.server).as_ref().map(RunningServer::url)
    }

    /// `http://host:port` for the web UI's API calls.
    pub fn api_base(&self) -> String {
        format!(
            "http://{}:{}",
            if self.host.is_unspecified() { "127.0.0.1".to_string() } else { self.host.to_string() },
            *Self::lock(&self.port)
        )
    }

    pub fn start_server(&self) -> anyhow::Result<String> {
        if let Some(url) = self.url() {
            return Ok(url);
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

    /// What the menu should show now.
    pub fn tray_state(&self) -> TrayState {
        let loaded = self.models.loaded();
        let (models, encoders) = self.loadable_models();
        let loaded_chat = loaded.iter().filter(|m| m.kind == ModelKind::Chat).map(|m| m.id.clone());
        let mut all = loaded_chat.clone().filter(|id| !models.contains(id)).collect::<Vec<_>>();
        all.extend(models);
        TrayState {
            url: self.url(),
            serving: loaded_chat.clone().next(),
            models: all,
            loaded_encoders: loaded.iter().filter(|m| m.kind != ModelKind::Chat).map(|m| m.id.clone()).collect(),
            encoders,
            loading: Self::lock(&self.loading).clone(),
            tokens_per_sec: self.models.engines().iter().map(|s| s.engine.snapshot().decode_tokens_per_sec).sum(),
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
