//! Where models live: FastMLX's own models folder, the Hugging Face cache and LM Studio's
//! folder, each as the user's environment says.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct StorePaths {
    /// FastMLX's own models (downloads land here).
    pub models_dir: PathBuf,
    /// The Hugging Face hub cache (`models--org--name/snapshots/<rev>/` folders).
    pub hf_cache: Option<PathBuf>,
    /// LM Studio's models folders (`publisher/repo/`).
    pub lmstudio: Vec<PathBuf>,
    /// More folders the user keeps models in (`FASTMLX_MODEL_DIRS`, comma-separated; `model_dirs`
    /// in `config.toml`), laid out like FastMLX's own. The only way to reach models elsewhere
    /// over HTTP: requests name models, never paths.
    pub extra: Vec<PathBuf>,
}

impl StorePaths {
    /// `FASTMLX_MODELS_DIR` or the platform data folder; the HF cache from `HF_HUB_CACHE`,
    /// `HF_HOME`, `XDG_CACHE_HOME` or `~/.cache/huggingface/hub` (the rules `huggingface_hub`
    /// follows); LM Studio's from `LMSTUDIO_MODELS_DIR`, `~/.lmstudio/models` or
    /// `~/.cache/lm-studio/models`.
    pub fn from_env() -> StorePaths {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let home = directories::BaseDirs::new().map(|d| d.home_dir().to_path_buf());
        let models_dir = var("FASTMLX_MODELS_DIR")
            .or_else(|| directories::ProjectDirs::from("", "", "FastMLX").map(|d| d.data_dir().join("models")))
            .unwrap_or_else(|| PathBuf::from("models"));
        let hf_cache = var("HF_HUB_CACHE")
            .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
            .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
            .or_else(|| home.as_ref().map(|h| h.join(".cache/huggingface/hub")));
        let lmstudio = match var("LMSTUDIO_MODELS_DIR") {
            Some(dir) => vec![dir],
            None => home.iter().flat_map(|h| [h.join(".lmstudio/models"), h.join(".cache/lm-studio/models")]).collect(),
        };
        let extra = std::env::var("FASTMLX_MODEL_DIRS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .collect();
        StorePaths { models_dir, hf_cache, lmstudio, extra }
    }

    /// Only FastMLX's folder (tests, and setups that want no discovery).
    pub fn only(models_dir: &Path) -> StorePaths {
        StorePaths { models_dir: models_dir.to_path_buf(), hf_cache: None, lmstudio: Vec::new(), extra: Vec::new() }
    }

    /// Where a downloaded repo ends up: `<models>/<org>/<name>`.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.models_dir.join(repo)
    }

    /// Where it is assembled while downloading (never listed as a model).
    pub fn staging_dir(&self, repo: &str) -> PathBuf {
        self.models_dir.join(".downloads").join(repo.replace('/', "--"))
    }
}
