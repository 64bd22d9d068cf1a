//! Finding the models already on disk, without copying them: FastMLX's folder, the Hugging
//! Face cache (snapshot layout) and LM Studio's folder.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::layout::StorePaths;
use crate::model::{inspect, ModelSummary};

/// Marks a folder FastMLX downloaded (and so may delete); written last, after every file is verified.
pub const MANIFEST: &str = ".fastmlx-download.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// FastMLX's models folder.
    Fastmlx,
    HfCache,
    Lmstudio,
    /// One of the user's extra model folders (`FASTMLX_MODEL_DIRS`).
    Folder,
    /// Given by path on the command line.
    Path,
}

#[derive(Debug, Clone, Serialize)]
pub struct LocalModel {
    /// The Hugging Face name where there is one (`org/name`), else the file name.
    pub id: String,
    pub path: PathBuf,
    pub source: Source,
    /// FastMLX downloaded it: deleting it is allowed without `force`.
    pub owned: bool,
    #[serde(flatten)]
    pub summary: ModelSummary,
}

/// Every model found, FastMLX's own first; an id found twice keeps its first place.
pub fn discover(paths: &StorePaths) -> Vec<LocalModel> {
    let mut found = Vec::new();
    own_models(&paths.models_dir, Source::Fastmlx, &mut found);
    if let Some(cache) = &paths.hf_cache {
        hf_cache_models(cache, &mut found);
    }
    for root in &paths.lmstudio {
        two_level_models(root, Source::Lmstudio, &mut found);
    }
    for root in &paths.extra {
        own_models(root, Source::Folder, &mut found);
    }
    let mut seen = std::collections::HashSet::new();
    found.retain(|(id, _, _)| seen.insert(id.clone()));
    found
        .into_iter()
        .map(|(id, path, source)| {
            // A downloaded folder holds the manifest; a downloaded GGUF sits next to it.
            let folder = if path.is_dir() { Some(path.as_path()) } else { path.parent() };
            let owned = source == Source::Fastmlx && folder.is_some_and(|f| f.join(MANIFEST).exists());
            LocalModel { summary: inspect(&path), id, path, source, owned }
        })
        .collect()
}

type Found = Vec<(String, PathBuf, Source)>;

fn is_model_folder(dir: &Path) -> bool {
    dir.join("config.json").is_file()
}

fn is_gguf(path: &Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).collect();
    paths.sort();
    paths
}

fn hidden(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// `<models>/*.gguf` (id: the file name without `.gguf`), `<models>/<name>/` and `<models>/<org>/<name>/`.
fn own_models(root: &Path, source: Source, found: &mut Found) {
    for path in entries(root).into_iter().filter(|p| !hidden(p)) {
        if is_gguf(&path) {
            let id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            found.push((id, path, source));
        } else if path.is_dir() && is_model_folder(&path) {
            found.push((file_name(&path), path, source));
        }
    }
    two_level_models(root, source, found);
}

/// `<root>/<org>/<name>/` folders with a `config.json` (id `org/name`), and `.gguf` files in
/// them (id `org/name/file.gguf`).
fn two_level_models(root: &Path, source: Source, found: &mut Found) {
    for org in entries(root).into_iter().filter(|p| p.is_dir() && !hidden(p) && !is_model_folder(p)) {
        for repo in entries(&org).into_iter().filter(|p| p.is_dir() && !hidden(p)) {
            let id = format!("{}/{}", file_name(&org), file_name(&repo));
            if is_model_folder(&repo) {
                found.push((id, repo, source));
            } else {
                for file in entries(&repo).into_iter().filter(|p| is_gguf(p)) {
                    found.push((format!("{id}/{}", file_name(&file)), file, source));
                }
            }
        }
    }
}

/// `models--<org>--<name>/snapshots/<revision>/`: the revision `refs/main` names, else the
/// newest snapshot.
fn hf_cache_models(cache: &Path, found: &mut Found) {
    for repo in entries(cache) {
        let name = file_name(&repo);
        let Some(id) = name.strip_prefix("models--").map(|r| r.replacen("--", "/", 1)) else { continue };
        let snapshots = repo.join("snapshots");
        let main = std::fs::read_to_string(repo.join("refs/main"))
            .ok()
            .map(|s| snapshots.join(s.trim()))
            .filter(|p| p.is_dir());
        let newest = || {
            entries(&snapshots)
                .into_iter()
                .filter(|p| p.is_dir())
                .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        };
        let Some(snapshot) = main.or_else(newest) else { continue };
        if is_model_folder(&snapshot) {
            found.push((id, snapshot, Source::HfCache));
        } else {
            for file in entries(&snapshot).into_iter().filter(|p| is_gguf(p)) {
                found.push((format!("{id}/{}", file_name(&file)), file, Source::HfCache));
            }
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
