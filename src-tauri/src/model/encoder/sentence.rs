//! The sentence-transformers folder layout: `modules.json` lists the modules a text goes
//! through (the transformer, `1_Pooling`, `2_Dense`, `Normalize`), `sentence_bert_config.json`
//! the most tokens it takes, `config_sentence_transformers.json` the instructions put before
//! queries and documents. A plain Hugging Face folder without them pools by the mean, as
//! sentence-transformers does for one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use serde::Deserialize;
use serde_json::Value;

use super::pooling::{Pooling, PoolingMode};
use crate::model::checkpoint::{read_json, read_safetensors};
use crate::model::error::{ModelError, Result};
use crate::model::layers::Linear;
use crate::model::weights::{QuantConfig, Weights};

/// What happens to the encoder's token vectors.
pub struct SentenceLayout {
    pub pooling: Pooling,
    pub dense: Vec<Dense>,
    pub normalize: bool,
    /// `max_seq_length`, when the folder says.
    pub max_seq_length: Option<usize>,
    pub lowercase: bool,
    /// Named instructions (`"query": "query: "`), and the one used when none is asked for.
    pub prompts: BTreeMap<String, String>,
    pub default_prompt: Option<String>,
}

/// A `Dense` module: a linear map and its activation.
pub struct Dense {
    linear: Linear,
    tanh: bool,
    pub out_features: i32,
}

impl Dense {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.linear.forward(x)?;
        Ok(if self.tanh { mlx_rs::ops::tanh(&y)? } else { y })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        self.linear.arrays()
    }
}

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct DenseConfig {
    in_features: i32,
    out_features: i32,
    #[serde(default = "yes")]
    bias: bool,
    #[serde(default)]
    activation_function: Option<String>,
}

fn yes() -> bool {
    true
}

impl SentenceLayout {
    pub fn read(dir: &Path, compute: mlx_rs::Dtype) -> Result<SentenceLayout> {
        let optional = |name: &str| -> Result<Option<Value>> {
            let path = dir.join(name);
            if path.exists() {
                read_json(&path).map(Some)
            } else {
                Ok(None)
            }
        };
        let bert_config = optional("sentence_bert_config.json")?.unwrap_or(Value::Null);
        let max_seq_length = bert_config.get("max_seq_length").and_then(Value::as_u64).map(|n| n as usize);
        let lowercase = bert_config.get("do_lower_case").and_then(Value::as_bool).unwrap_or(false);
        let st_config = optional("config_sentence_transformers.json")?.unwrap_or(Value::Null);
        let prompts = st_config
            .get("prompts")
            .and_then(Value::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
            .unwrap_or_default();
        let default_prompt = st_config.get("default_prompt_name").and_then(Value::as_str).map(str::to_string);

        let mut layout = SentenceLayout {
            pooling: Pooling::new(PoolingMode::Mean),
            dense: Vec::new(),
            normalize: false,
            max_seq_length,
            lowercase,
            prompts,
            default_prompt,
        };
        let Some(modules) = optional("modules.json")? else { return Ok(layout) };
        let modules_path = dir.join("modules.json");
        let modules: Vec<Module> = serde_json::from_value(modules)
            .map_err(|e| ModelError::Config { path: modules_path.clone(), message: e.to_string() })?;
        for module in modules {
            let kind = module.kind.rsplit('.').next().unwrap_or_default();
            let folder = dir.join(&module.path);
            match kind {
                "Transformer" => {}
                "Pooling" => {
                    let path = folder.join("config.json");
                    layout.pooling = Pooling::from_json(&read_json(&path)?, &path)?;
                }
                "Dense" => layout.dense.push(read_dense(&folder, compute)?),
                "Normalize" => layout.normalize = true,
                other => {
                    return Err(ModelError::Config {
                        path: modules_path,
                        message: format!(
                            "sentence-transformers module {other:?} is not supported (supported: Transformer, \
                             Pooling, Dense, Normalize)"
                        ),
                    })
                }
            }
        }
        Ok(layout)
    }
}

fn read_dense(folder: &Path, compute: mlx_rs::Dtype) -> Result<Dense> {
    let config_path = folder.join("config.json");
    let config: DenseConfig = serde_json::from_value(read_json(&config_path)?)
        .map_err(|e| ModelError::Config { path: config_path.clone(), message: e.to_string() })?;
    let activation = config.activation_function.as_deref().unwrap_or("torch.nn.modules.linear.Identity");
    let tanh = match activation.rsplit('.').next().unwrap_or_default() {
        "Tanh" => true,
        "Identity" => false,
        other => {
            return Err(ModelError::Config {
                path: config_path,
                message: format!("Dense activation {other:?} is not supported (supported: Tanh, Identity)"),
            })
        }
    };
    if !folder.join("model.safetensors").exists() {
        return Err(ModelError::NotFound { path: folder.join("model.safetensors") });
    }
    let tensors = read_safetensors(folder)?;
    let mut weights = Weights::new(tensors, PathBuf::from(folder), QuantConfig::default(), compute);
    let linear = weights.linear("linear", config.out_features, config.in_features, config.bias)?;
    Ok(Dense { linear, tanh, out_features: config.out_features })
}
