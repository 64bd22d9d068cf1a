//! Which model a command uses when none is named.

use std::path::PathBuf;

/// The default model: SmolLM2-135M-Instruct, Q4_1 GGUF (fetched by `scripts/setup.sh`).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the default model is looked for: FastMLX's data folder, then the source tree's cache
/// (where the setup script puts it).
pub fn default_model_path() -> Option<PathBuf> {
    let data_dir =
        directories::ProjectDirs::from("", "", "FastMLX").map(|d| d.data_dir().join("models").join(DEFAULT_MODEL_FILE));
    let source_cache = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/models").join(DEFAULT_MODEL_FILE);
    data_dir.into_iter().chain([source_cache]).find(|p| p.exists())
}

/// `--model`, else `FASTMLX_MODEL`, else the default model.
pub fn resolve_model_path(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(path) = flag.or_else(|| std::env::var_os("FASTMLX_MODEL").map(PathBuf::from)) {
        return Ok(path);
    }
    default_model_path().ok_or_else(|| {
        anyhow::anyhow!(
            "no --model given and the default model ({DEFAULT_MODEL_FILE}) is not installed: run scripts/setup.sh"
        )
    })
}
