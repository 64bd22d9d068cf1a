//! A Hugging Face folder's files as every loader reads them: JSON, the safetensors weights
//! (checked against truncation), the dtype they were saved in, and MLX's quantization config.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};
use serde_json::Value;

use crate::model::arch;
use crate::model::config::{QuantMode, QuantSpec};
use crate::model::error::{ModelError, Result};
use crate::model::weights::QuantConfig;

/// A JSON file, with the path in any error.
pub fn read_json(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ModelError::NotFound { path: path.to_path_buf() },
        _ => ModelError::Io { path: path.to_path_buf(), source },
    })?;
    crate::model::json::parse_json(&text)
        .map_err(|e| ModelError::Config { path: path.to_path_buf(), message: format!("invalid JSON: {e}") })
}

/// The safetensors files of the checkpoint: those the index names, else every `*.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let map = read_json(&index)?;
        let files: BTreeSet<String> = map
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| ModelError::Config { path: index.clone(), message: "no \"weight_map\"".into() })?
            .values()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|source| ModelError::Io { path: dir.to_path_buf(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::NotFound { path: dir.join("*.safetensors") });
    }
    Ok(files)
}

pub fn read_safetensors(dir: &Path) -> Result<HashMap<String, Array>> {
    let mut tensors = HashMap::new();
    for file in weight_files(dir)? {
        if !file.exists() {
            return Err(ModelError::NotFound { path: file });
        }
        check_safetensors_size(&file)?;
        let part = Array::load_safetensors(&file)
            .map_err(|e| ModelError::Weights { path: file.clone(), message: e.to_string() })?;
        tensors.extend(part);
    }
    Ok(tensors)
}

/// The names of the tensors in the folder's safetensors files, read from their headers alone.
pub fn tensor_names(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for file in weight_files(dir)? {
        let (header, _, _) = safetensors_header(&file)?;
        names.extend(header.keys().filter(|k| *k != "__metadata__").cloned());
    }
    Ok(names)
}

/// A safetensors file's header, its length and the file's length.
fn safetensors_header(file: &Path) -> Result<(serde_json::Map<String, Value>, u64, u64)> {
    use std::io::Read;
    let bad = |message: String| ModelError::Weights { path: file.to_path_buf(), message };
    let mut f = fs::File::open(file).map_err(|source| ModelError::Io { path: file.to_path_buf(), source })?;
    let actual = f.metadata().map_err(|source| ModelError::Io { path: file.to_path_buf(), source })?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| bad("truncated: no safetensors header".into()))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > 100_000_000 || 8 + header_len > actual {
        return Err(bad(format!(
            "corrupt or truncated safetensors header ({header_len} bytes declared, file has {actual})"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header).map_err(|_| bad("truncated safetensors header".into()))?;
    let header: Value = serde_json::from_slice(&header).map_err(|e| bad(format!("corrupt safetensors header: {e}")))?;
    match header {
        Value::Object(map) => Ok((map, header_len, actual)),
        _ => Err(bad("corrupt safetensors header: not an object".into())),
    }
}

/// Checks that the file is as long as its header says, so a truncated download is reported as
/// such (MLX reads tensors lazily and would fail later, far from the cause).
fn check_safetensors_size(file: &Path) -> Result<()> {
    let (header, header_len, actual) = safetensors_header(file)?;
    let end = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    if 8 + header_len + end > actual {
        return Err(ModelError::Weights {
            path: file.to_path_buf(),
            message: format!("truncated: tensors need {} bytes, file has {actual}", 8 + header_len + end),
        });
    }
    Ok(())
}

/// The dtype the checkpoint was saved in (`torch_dtype`/`dtype`, else its first float tensor).
pub fn stored_dtype(config: &Value, tensors: &HashMap<String, Array>) -> Dtype {
    let named = config.get("torch_dtype").or_else(|| config.get("dtype")).and_then(Value::as_str);
    match named {
        Some("bfloat16") => Dtype::Bfloat16,
        Some("float16") => Dtype::Float16,
        Some("float32") => Dtype::Float32,
        _ => tensors
            .values()
            .map(Array::dtype)
            .find(|d| matches!(d, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32))
            .unwrap_or(Dtype::Float32),
    }
}

/// `"quantization"` (or `"quantization_config"`) as MLX writes it: a default spec plus
/// per-layer entries (`{"group_size", "bits"}`, or `false` for a layer left unquantized).
pub fn quant_config(config: &Value, path: &Path) -> Result<QuantConfig> {
    let Some(q) = config.get("quantization").or_else(|| config.get("quantization_config")) else {
        return Ok(QuantConfig::default());
    };
    let bad =
        |message: String| ModelError::Quantization { path: path.to_path_buf(), name: "quantization".into(), message };
    if let Some(mode) = q.get("mode") {
        if serde_json::from_value::<QuantMode>(mode.clone()).is_err() {
            return Err(bad(format!("mode {mode} (supported: \"affine\", \"mxfp4\", \"nvfp4\", \"mxfp8\")")));
        }
    }
    match q.get("quant_method").and_then(Value::as_str) {
        // OpenAI's gpt-oss ships its experts in mxfp4, which MLX computes with as is.
        Some("mxfp4") => {
            let spec = QuantSpec { group_size: 32, bits: 4, mode: QuantMode::Mxfp4 };
            return Ok(QuantConfig { default: Some(spec), ..QuantConfig::default() });
        }
        Some(method) => {
            return Err(bad(format!("{method:?} checkpoints are not MLX-quantized; use an MLX conversion")))
        }
        None => {}
    }
    let spec = |v: &Value| -> Option<QuantSpec> { serde_json::from_value(v.clone()).ok() };
    let default = spec(q).ok_or_else(|| bad("needs integer \"group_size\" and \"bits\"".into()))?;
    let overrides = q
        .as_object()
        .map(|m| {
            m.iter().filter(|(_, v)| v.is_object()).filter_map(|(k, v)| Some((module_name(k)?, spec(v)?))).collect()
        })
        .unwrap_or_default();
    Ok(QuantConfig { default: Some(default), overrides, infer_bits_with_group: None })
}

/// A per-module quantization key in the names the loader uses (see
/// [`arch::canonical_tensor_name`]).
fn module_name(key: &str) -> Option<String> {
    let name = arch::canonical_tensor_name(&format!("{key}.weight"))?;
    Some(name.trim_end_matches(".weight").to_string())
}
