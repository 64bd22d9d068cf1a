//! The models on disk as one catalog: list, find by id (or path), delete.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::discover::{discover, LocalModel, Source};
use super::layout::StorePaths;
use crate::model::inspect;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("no model {0:?} on this machine (`fastmlx ls` lists them; `fastmlx pull <repo>` downloads one)")]
    NotFound(String),
    #[error("{id} was not downloaded by FastMLX ({path}); delete it with force to remove those files anyway")]
    NotOwned { id: String, path: PathBuf },
    #[error("cannot delete {path}: {message}")]
    Io { path: PathBuf, message: String },
}

/// The models in the model folders, and the ones given by path on the command line (shared
/// by every clone, so a model given at start stays known by its id after an unload).
#[derive(Debug, Clone)]
pub struct Catalog {
    paths: StorePaths,
    given: Arc<Mutex<Vec<LocalModel>>>,
}

impl Catalog {
    pub fn new(paths: StorePaths) -> Catalog {
        Catalog { paths, given: Arc::default() }
    }

    pub fn paths(&self) -> &StorePaths {
        &self.paths
    }

    /// The models given on the command line first (the user named them), then the folders'.
    pub fn list(&self) -> Vec<LocalModel> {
        let given: Vec<LocalModel> = self.given.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut models: Vec<LocalModel> =
            given.iter().map(|m| LocalModel { summary: inspect(&m.path), ..m.clone() }).collect();
        models.extend(discover(&self.paths).into_iter().filter(|m| !given.iter().any(|g| g.id == m.id)));
        models
    }

    /// A model by id: in the model folders or given on the command line. Never by path: names
    /// from HTTP requests end here, and a path there would let any client open (or probe for)
    /// any file on the machine.
    pub fn find(&self, id: &str) -> Result<LocalModel, CatalogError> {
        self.list().into_iter().find(|m| m.id == id).ok_or_else(|| CatalogError::NotFound(id.to_string()))
    }

    /// For the command line only: a model by id, or by path (a folder or `.gguf` file anywhere),
    /// which is then remembered, so that the model stays known by its id.
    pub fn find_or_add_path(&self, id_or_path: &str) -> Result<LocalModel, CatalogError> {
        if let Ok(model) = self.find(id_or_path) {
            return Ok(model);
        }
        let path = Path::new(id_or_path);
        if !path.exists() {
            return Err(CatalogError::NotFound(id_or_path.to_string()));
        }
        let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let model = Self::at_path(&path);
        let mut given = self.given.lock().unwrap_or_else(|e| e.into_inner());
        given.retain(|m| m.id != model.id);
        given.push(model.clone());
        Ok(model)
    }

    /// A model given by its path: its id is the folder or file name (without `.gguf`).
    pub fn at_path(path: &Path) -> LocalModel {
        let id = path
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| path.display().to_string());
        LocalModel { summary: inspect(path), id, path: path.to_path_buf(), source: Source::Path, owned: false }
    }

    /// Deletes a model FastMLX downloaded; others only with `force` (for the HF cache, the
    /// whole `models--org--name` folder).
    pub fn delete(&self, id: &str, force: bool) -> Result<PathBuf, CatalogError> {
        let model =
            self.list().into_iter().find(|m| m.id == id).ok_or_else(|| CatalogError::NotFound(id.to_string()))?;
        if !model.owned && !force {
            return Err(CatalogError::NotOwned { id: model.id, path: model.path });
        }
        let target = match model.source {
            // <cache>/models--org--name/snapshots/<rev>[/file.gguf]
            Source::HfCache => model
                .path
                .ancestors()
                .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("models--")))
                .unwrap_or(&model.path)
                .to_path_buf(),
            _ => model.path.clone(),
        };
        let result = if target.is_dir() { std::fs::remove_dir_all(&target) } else { std::fs::remove_file(&target) };
        result.map_err(|e| CatalogError::Io { path: target.clone(), message: e.to_string() })?;
        // A downloaded GGUF's folder goes too once no model is left in it.
        if let (true, Some(folder)) = (model.owned && model.summary.format == "gguf", target.parent()) {
            let models_left = std::fs::read_dir(folder)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "gguf"));
            if !models_left {
                let _ = std::fs::remove_dir_all(folder);
            }
        }
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::discover::MANIFEST;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn model_folder(dir: &Path) {
        write(
            &dir.join("config.json"),
            r#"{"model_type": "llama", "max_position_embeddings": 2048, "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-5,
            "quantization": {"group_size": 64, "bits": 4}}"#,
        );
        write(&dir.join("tokenizer.json"), "{}");
        write(&dir.join("model.safetensors"), "x");
    }

    /// A Hugging Face cache, an LM Studio folder and FastMLX's own, as each tool lays them out.
    fn layout(root: &Path) -> StorePaths {
        let own = root.join("own");
        model_folder(&own.join("mlx-community/Qwen2.5-0.5B-Instruct-4bit"));
        write(&own.join("mlx-community/Qwen2.5-0.5B-Instruct-4bit").join(MANIFEST), "{}");
        write(&own.join("loose.gguf"), "GGUF");
        model_folder(&own.join(".downloads/mlx-community--partial"));
        let hf = root.join("hf");
        let repo = hf.join("models--mlx-community--Llama-3.2-1B-Instruct-4bit");
        model_folder(&repo.join("snapshots/abc123"));
        write(&repo.join("refs/main"), "abc123");
        std::fs::create_dir_all(repo.join("snapshots/old")).unwrap();
        let gguf_repo = hf.join("models--bartowski--Phi-GGUF");
        write(&gguf_repo.join("snapshots/r1/Phi-Q4_0.gguf"), "GGUF");
        write(&hf.join("datasets--x--y/snapshots/r/data.json"), "{}");
        let lms = root.join("lms");
        write(&lms.join("lmstudio-community/Qwen3-GGUF/Qwen3-Q4_K_M.gguf"), "GGUF");
        model_folder(&lms.join("mlx-community/gemma-mlx"));
        StorePaths { models_dir: own, hf_cache: Some(hf), lmstudio: vec![lms], extra: Vec::new() }
    }

    #[test]
    fn discovers_every_layout_with_ids_and_owners() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(layout(dir.path()));
        let models = catalog.list();
        let ids: Vec<(&str, Source, bool)> = models.iter().map(|m| (m.id.as_str(), m.source, m.owned)).collect();
        assert_eq!(
            ids,
            vec![
                ("loose", Source::Fastmlx, false),
                ("mlx-community/Qwen2.5-0.5B-Instruct-4bit", Source::Fastmlx, true),
                ("bartowski/Phi-GGUF/Phi-Q4_0.gguf", Source::HfCache, false),
                ("mlx-community/Llama-3.2-1B-Instruct-4bit", Source::HfCache, false),
                ("lmstudio-community/Qwen3-GGUF/Qwen3-Q4_K_M.gguf", Source::Lmstudio, false),
                ("mlx-community/gemma-mlx", Source::Lmstudio, false),
            ]
        );
        let llama = catalog.find("mlx-community/Llama-3.2-1B-Instruct-4bit").unwrap();
        assert!(llama.path.ends_with("snapshots/abc123"), "refs/main's snapshot: {}", llama.path.display());
        assert_eq!(llama.summary.architecture.as_deref(), Some("llama"));
        assert_eq!(llama.summary.quantization.as_deref(), Some("4-bit (group 64)"));
        assert_eq!(llama.summary.context_length, Some(2048));
        assert!(llama.summary.parameters.is_some_and(|p| p > 0));
        assert_eq!(llama.summary.unloadable_reason, None);
        let loose = catalog.find("loose").unwrap();
        assert!(loose.summary.unloadable_reason.as_deref().is_some_and(|r| r.contains("GGUF header")));
    }

    #[test]
    fn delete_owned_only_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(layout(dir.path()));
        let err = catalog.delete("mlx-community/Llama-3.2-1B-Instruct-4bit", false).unwrap_err();
        assert!(matches!(err, CatalogError::NotOwned { .. }), "{err}");
        assert!(catalog.find("mlx-community/Llama-3.2-1B-Instruct-4bit").is_ok());
        catalog.delete("mlx-community/Qwen2.5-0.5B-Instruct-4bit", false).unwrap();
        assert!(matches!(catalog.find("mlx-community/Qwen2.5-0.5B-Instruct-4bit"), Err(CatalogError::NotFound(_))));
        let removed = catalog.delete("mlx-community/Llama-3.2-1B-Instruct-4bit", true).unwrap();
        assert!(removed.ends_with("models--mlx-community--Llama-3.2-1B-Instruct-4bit") && !removed.exists());
        assert!(matches!(catalog.delete("nope", true), Err(CatalogError::NotFound(_))));
    }

    #[test]
    fn ids_only_except_paths_the_command_line_adds() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = StorePaths::only(&dir.path().join("own"));
        paths.extra = vec![dir.path().join("mine")];
        model_folder(&dir.path().join("mine/my-model"));
        model_folder(&dir.path().join("elsewhere/given"));
        let catalog = Catalog::new(paths);
        let mine = catalog.find("my-model").unwrap();
        assert_eq!(mine.source, Source::Folder);
        let given_path = dir.path().join("elsewhere/given");
        let by_path = given_path.to_string_lossy().into_owned();
        assert!(matches!(catalog.find(&by_path), Err(CatalogError::NotFound(_))), "a path is no name");
        assert!(matches!(
            catalog.find_or_add_path(&dir.path().join("nope").to_string_lossy()),
            Err(CatalogError::NotFound(_))
        ));
        let given = catalog.find_or_add_path(&by_path).unwrap();
        assert_eq!((given.id.as_str(), given.source), ("given", Source::Path));
        let clone = catalog.clone();
        assert_eq!(
            clone.find("given").unwrap().path,
            given_path.canonicalize().unwrap(),
            "known by its id from now on, in every clone"
        );
        assert_eq!(clone.list().iter().filter(|m| m.id == "given").count(), 1);
    }
}
