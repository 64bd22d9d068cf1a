//! Pulling a model from the Hub into FastMLX's folder: one download per repo at a time, which
//! any number of watchers (CLI progress bar, admin API stream, UI) can follow, cancel, or pick
//! up again later. A model becomes visible only when every file is verified: files are
//! assembled in a staging folder and moved into place last, with the manifest that marks
//! the folder as FastMLX's own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::discover::MANIFEST;
use super::download::{download_files, Progress};
use super::hub::{HubClient, HubError, RemoteFile};
use super::layout::StorePaths;
use super::select::select_model_files;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    /// `org/name` on the Hub.
    pub repo: String,
    pub revision: String,
    /// For GGUF repos: the file (or a part of its name, e.g. `Q4_0`).
    pub gguf: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PullState {
    Running,
    /// The model is ready at `path` under id `id`.
    Done {
        id: String,
        path: PathBuf,
    },
    Failed {
        message: String,
    },
    Cancelled,
}

impl PullState {
    pub fn is_finished(&self) -> bool {
        !matches!(self, PullState::Running)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PullStatus {
    pub repo: String,
    #[serde(flatten)]
    pub state: PullState,
    pub progress: Progress,
}

/// What a watcher holds: progress and state as they change.
#[derive(Clone)]
pub struct PullWatch {
    pub repo: String,
    pub progress: watch::Receiver<Progress>,
    pub state: watch::Receiver<PullState>,
}

impl PullWatch {
    pub fn status(&self) -> PullStatus {
        PullStatus {
            repo: self.repo.clone(),
            state: self.state.borrow().clone(),
            progress: self.progress.borrow().clone(),
        }
    }

    /// Waits for the end and returns how it ended.
    pub async fn finished(mut self) -> PullState {
        loop {
            let state = self.state.borrow().clone();
            if state.is_finished() || self.state.changed().await.is_err() {
                return state;
            }
        }
    }
}

struct Entry {
    watch: PullWatch,
    cancel: CancellationToken,
}

#[derive(Clone)]
pub struct Pulls {
    paths: StorePaths,
    hub: HubClient,
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

impl Pulls {
    pub fn new(paths: StorePaths, hub: HubClient) -> Pulls {
        Pulls { paths, hub, entries: Arc::new(Mutex::new(HashMap::new())) }
    }

    pub fn hub(&self) -> &HubClient {
        &self.hub
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts pulling `request.repo`, or joins the pull of it already running. Needs a tokio runtime.
    pub fn start(&self, request: PullRequest) -> PullWatch {
        let mut entries = self.entries();
        if let Some(entry) = entries.get(&request.repo).filter(|e| !e.watch.state.borrow().is_finished()) {
            return entry.watch.clone();
        }
        let (progress_tx, progress) = watch::channel(Progress::default());
        let (state_tx, state) = watch::channel(PullState::Running);
        let cancel = CancellationToken::new();
        let watch = PullWatch { repo: request.repo.clone(), progress, state };
        entries.insert(request.repo.clone(), Entry { watch: watch.clone(), cancel: cancel.clone() });
        let (hub, paths) = (self.hub.clone(), self.paths.clone());
        tokio::spawn(async move {
            let end = match pull(&hub, &paths, &request, &progress_tx, &cancel).await {
                Ok((id, path)) => PullState::Done { id, path },
                Err(HubError::Cancelled) => PullState::Cancelled,
                Err(e) => PullState::Failed { message: e.to_string() },
            };
            let _ = state_tx.send(end);
        });
        watch
    }

    /// Cancels a running pull (its partial files stay for a later resume); false if none runs.
    pub fn cancel(&self, repo: &str) -> bool {
        match self.entries().get(repo) {
            Some(entry) if !entry.watch.state.borrow().is_finished() => {
                entry.cancel.cancel();
                true
            }
            _ => false,
        }
    }

    /// Every pull of this session, running or ended.
    pub fn list(&self) -> Vec<PullStatus> {
        let mut list: Vec<PullStatus> = self.entries().values().map(|e| e.watch.status()).collect();
        list.sort_by(|a, b| a.repo.cmp(&b.repo));
        list
    }
}

async fn pull(
    hub: &HubClient,
    paths: &StorePaths,
    request: &PullRequest,
    progress: &watch::Sender<Progress>,
    cancel: &CancellationToken,
) -> Result<(String, PathBuf), HubError> {
    let info = hub.repo_info(&request.repo, &request.revision).await?;
    let files = select_model_files(hub, &info, &info.sha, request.gguf.as_deref()).await?;
    let staging = paths.staging_dir(&request.repo);
    download_files(hub, &request.repo, &info.sha, &files, &staging, progress, cancel).await?;
    let target = paths.repo_dir(&request.repo);
    let io = |path: &Path, e: std::io::Error| HubError::Io { path: path.display().to_string(), message: e.to_string() };
    if target.exists() && !target.join(MANIFEST).exists() {
        return Err(HubError::Io {
            path: target.display().to_string(),
            message: "already exists and was not downloaded by FastMLX; move it away first".into(),
        });
    }
    std::fs::create_dir_all(&target).map_err(|e| io(&target, e))?;
    // Files move into place one by one (a GGUF joins the other files of its repo); the
    // manifest, written last, is what makes the folder FastMLX's.
    for file in &files {
        let (from, to) = (staging.join(&file.name), target.join(&file.name));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        std::fs::rename(&from, &to).map_err(|e| io(&from, e))?;
    }
    write_manifest(&target, &request.repo, &info.sha, &files).map_err(|e| io(&target, e))?;
    let _ = std::fs::remove_dir_all(&staging);
    Ok(match files.iter().find(|f| f.name.ends_with(".gguf")) {
        Some(gguf) => (format!("{}/{}", request.repo, gguf.name), target.join(&gguf.name)),
        None => (request.repo.clone(), target),
    })
}

/// `.fastmlx-download.json`: the repo, its commit and the verified files (merged with earlier pulls).
fn write_manifest(dir: &Path, repo: &str, revision: &str, files: &[RemoteFile]) -> std::io::Result<()> {
    let path = dir.join(MANIFEST);
    let mut listed: Vec<serde_json::Value> = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|m| m.get("files").and_then(|f| f.as_array().cloned()))
        .unwrap_or_default();
    for file in files {
        listed.retain(|f| f.get("name").and_then(|n| n.as_str()) != Some(file.name.as_str()));
        listed.push(serde_json::json!({"name": file.name, "size": file.size, "sha256": file.sha256}));
    }
    let manifest = serde_json::json!({"repo": repo, "revision": revision, "files": listed,
        "downloaded_at": chrono::Utc::now().to_rfc3339()});
    let tmp = dir.join(format!("{MANIFEST}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(&manifest)?)?;
    std::fs::rename(tmp, path)
}
