//! Which files of a Hub repo make a model: a Hugging Face / MLX folder's config, tokenizer and
//! weights (only the shards its index names), or one GGUF file chosen by name or quantization.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::hub::{HubClient, HubError, RemoteFile, RepoInfo};

const INDEX_FILE: &str = "model.safetensors.index.json";
/// Besides the weights, what a Hugging Face / MLX model folder may need.
const MODEL_FILES: &[&str] = &[
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    INDEX_FILE,
];
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// The files to fetch for a model: a Hugging Face / MLX folder (`gguf: None`), or the one GGUF
/// file whose name is `gguf` or contains it (case-insensitive), e.g. `Q4_K_M`. With a sharded
/// model this keeps every top-level `.safetensors`; [`select_model_files`] narrows them to the
/// shards the index names.
pub fn select_files(info: &RepoInfo, gguf: Option<&str>) -> Result<Vec<RemoteFile>, HubError> {
    match gguf {
        Some(pattern) => select_gguf(info, pattern).map(|file| vec![file]),
        None => select_model_folder(info),
    }
}

/// [`select_files`], then for a sharded model only the shards its index names (the index is
/// read from the Hub at `revision`).
pub async fn select_model_files(
    client: &HubClient,
    info: &RepoInfo,
    revision: &str,
    gguf: Option<&str>,
) -> Result<Vec<RemoteFile>, HubError> {
    let files = select_files(info, gguf)?;
    if !files.iter().any(|f| f.name == INDEX_FILE) {
        return Ok(files);
    }
    let index = client.fetch_small_file(&info.id, revision, INDEX_FILE, MAX_INDEX_BYTES).await?;
    let shards = shards_in_index(&index)
        .map_err(|e| selection_error(info, format!("{INDEX_FILE} is not a valid index: {e}")))?;
    keep_indexed_shards(info, files, &shards)
}

/// The shard files a `model.safetensors.index.json` maps weights to.
pub fn shards_in_index(index_json: &[u8]) -> Result<BTreeSet<String>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    Ok(serde_json::from_slice::<Index>(index_json)?.weight_map.into_values().collect())
}

/// Drops the `.safetensors` files the index does not name (e.g. a consolidated copy of the shards).
pub fn keep_indexed_shards(
    info: &RepoInfo,
    files: Vec<RemoteFile>,
    shards: &BTreeSet<String>,
) -> Result<Vec<RemoteFile>, HubError> {
    if let Some(missing) = shards.iter().find(|shard| !files.iter().any(|f| &f.name == *shard)) {
        return Err(selection_error(info, format!("{INDEX_FILE} names {missing}, which the repo does not have")));
    }
    Ok(files.into_iter().filter(|f| !f.name.ends_with(".safetensors") || shards.contains(&f.name)).collect())
}

fn select_model_folder(info: &RepoInfo) -> Result<Vec<RemoteFile>, HubError> {
    if !info.files.iter().any(|f| f.name == "config.json") {
        let ggufs = gguf_names(info);
        let message = if ggufs.is_empty() {
            "no config.json at the top of the repo: not a Hugging Face / MLX model folder".to_string()
        } else {
            format!("no config.json: this is a GGUF repo; choose one of its files: {}", ggufs.join(", "))
        };
        return Err(selection_error(info, message));
    }
    // Top level only: subfolders hold other formats (original/, onnx/, ...).
    let files: Vec<RemoteFile> = info
        .files
        .iter()
        .filter(|f| {
            !f.name.contains('/') && (MODEL_FILES.contains(&f.name.as_str()) || f.name.ends_with(".safetensors"))
        })
        .cloned()
        .collect();
    if !files.iter().any(|f| f.name.ends_with(".safetensors")) {
        return Err(selection_error(
            info,
            "no .safetensors weights at the top of the repo (FastMLX does not load .bin or .pt checkpoints)".into(),
        ));
    }
    Ok(files)
}

fn select_gguf(info: &RepoInfo, pattern: &str) -> Result<RemoteFile, HubError> {
    let ggufs: Vec<&RemoteFile> =
        info.files.iter().filter(|f| f.name.to_ascii_lowercase().ends_with(".gguf")).collect();
    if ggufs.is_empty() {
        return Err(selection_error(info, "the repo has no .gguf file".into()));
    }
    let base_name = |name: &str| name.rsplit('/').next().unwrap_or(name).to_string();
    if let Some(exact) = ggufs.iter().find(|f| f.name == pattern || base_name(&f.name) == pattern) {
        return Ok((*exact).clone());
    }
    let needle = pattern.to_lowercase();
    let matching: Vec<&RemoteFile> =
        ggufs.iter().copied().filter(|f| f.name.to_lowercase().contains(&needle)).collect();
    match matching.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(selection_error(
            info,
            format!("no .gguf file matches {pattern:?}; the repo has: {}", gguf_names(info).join(", ")),
        )),
        several => {
            let names: Vec<&str> = several.iter().map(|f| f.name.as_str()).collect();
            Err(selection_error(
                info,
                format!("{pattern:?} matches several .gguf files: {}; give one exact name", names.join(", ")),
            ))
        }
    }
}

fn gguf_names(info: &RepoInfo) -> Vec<String> {
    info.files.iter().filter(|f| f.name.to_ascii_lowercase().ends_with(".gguf")).map(|f| f.name.clone()).collect()
}

fn selection_error(info: &RepoInfo, message: String) -> HubError {
    HubError::Selection { repo: info.id.clone(), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, size: u64) -> RemoteFile {
        RemoteFile { name: name.into(), size: Some(size), sha256: None }
    }

    fn repo(names: &[&str]) -> RepoInfo {
        RepoInfo {
            id: "org/model".into(),
            sha: "abc".into(),
            files: names.iter().map(|n| file(n, 1)).collect(),
            gated: false,
            tags: vec![],
            library: None,
        }
    }

    fn names(files: &[RemoteFile]) -> Vec<&str> {
        files.iter().map(|f| f.name.as_str()).collect()
    }

    fn selection_message(result: Result<impl std::fmt::Debug, HubError>) -> String {
        match result {
            Err(e @ HubError::Selection { .. }) => e.to_string(),
            other => panic!("expected a selection error, got {other:?}"),
        }
    }

    #[test]
    fn mlx_folder_files_only() {
        let info = repo(&[
            ".gitattributes",
            "README.md",
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "generation_config.json",
            "chat_template.jinja",
            "tokenizer.model",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "original/consolidated.pth",
            "original/params.json",
            "onnx/model.safetensors",
            "figure.png",
        ]);
        let selected = select_files(&info, None).unwrap();
        assert_eq!(
            names(&selected),
            [
                "config.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "special_tokens_map.json",
                "generation_config.json",
                "chat_template.jinja",
                "tokenizer.model",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json"
            ]
        );
    }

    #[test]
    fn a_folder_needs_config_and_safetensors() {
        let message = selection_message(select_files(&repo(&["model.safetensors", "tokenizer.json"]), None));
        assert!(message.contains("org/model") && message.contains("config.json"), "{message}");
        let message = selection_message(select_files(&repo(&["config.json", "pytorch_model.bin"]), None));
        assert!(message.contains(".safetensors"), "{message}");
        let message = selection_message(select_files(&repo(&["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf"]), None));
        assert!(message.contains("GGUF repo") && message.contains("m-Q8_0.gguf"), "{message}");
    }

    #[test]
    fn gguf_by_exact_name_or_case_insensitive_part() {
        let info =
            repo(&["README.md", "Model-Q4_K_M.gguf", "Model-Q4_K_S.gguf", "Model-Q8_0.gguf", "sub/Model-F16.gguf"]);
        assert_eq!(names(&select_files(&info, Some("q4_k_m")).unwrap()), ["Model-Q4_K_M.gguf"]);
        assert_eq!(names(&select_files(&info, Some("Model-Q8_0.gguf")).unwrap()), ["Model-Q8_0.gguf"]);
        assert_eq!(names(&select_files(&info, Some("Model-F16.gguf")).unwrap()), ["sub/Model-F16.gguf"]);
        let several = selection_message(select_files(&info, Some("Q4_K")));
        assert!(
            several.contains("several")
                && several.contains("Model-Q4_K_M.gguf")
                && several.contains("Model-Q4_K_S.gguf"),
            "{several}"
        );
        let none = selection_message(select_files(&info, Some("IQ2_XS")));
        assert!(
            none.contains("IQ2_XS") && none.contains("Model-Q8_0.gguf") && none.contains("sub/Model-F16.gguf"),
            "{none}"
        );
        assert!(selection_message(select_files(&repo(&["config.json"]), Some("Q4"))).contains("no .gguf"));
    }

    #[test]
    fn index_keeps_only_its_shards() {
        let info = repo(&[
            "config.json",
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "consolidated.safetensors",
        ]);
        let index = br#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}"#;
        let shards = shards_in_index(index).unwrap();
        let kept = keep_indexed_shards(&info, select_files(&info, None).unwrap(), &shards).unwrap();
        assert_eq!(
            names(&kept),
            [
                "config.json",
                "model.safetensors.index.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
        let missing: BTreeSet<String> = ["model-00003-of-00003.safetensors".to_string()].into();
        assert!(selection_message(keep_indexed_shards(&info, select_files(&info, None).unwrap(), &missing))
            .contains("model-00003-of-00003"));
        assert!(shards_in_index(b"{\"no\": 1}").is_err());
    }
}
