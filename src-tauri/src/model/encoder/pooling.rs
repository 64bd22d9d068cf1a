//! sentence-transformers' `Pooling` module (`1_Pooling/config.json`): token vectors to one
//! vector per text, by each mode the config turns on, concatenated in sentence-transformers'
//! order (cls, max, mean, mean·√len, weighted mean, last token).

use std::path::Path;

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{concatenate, divide, maximum, multiply, sqrt, sum_axis};
use mlx_rs::Array;
use serde::Deserialize;

use crate::model::error::{ModelError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMode {
    Cls,
    Max,
    Mean,
    MeanSqrtLen,
    WeightedMean,
    LastToken,
}

#[derive(Debug, Clone)]
pub struct Pooling {
    pub modes: Vec<PoolingMode>,
    /// Whether the prompt's tokens (an instruction before the text) count in the mean and max.
    pub include_prompt: bool,
}

#[derive(Deserialize, Default)]
struct Raw {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    #[serde(default = "yes")]
    include_prompt: bool,
}

fn yes() -> bool {
    true
}

impl Pooling {
    pub fn new(mode: PoolingMode) -> Pooling {
        Pooling { modes: vec![mode], include_prompt: true }
    }

    pub fn from_json(json: &serde_json::Value, path: &Path) -> Result<Pooling> {
        let raw: Raw = serde_json::from_value(json.clone())
            .map_err(|e| ModelError::Config { path: path.to_path_buf(), message: e.to_string() })?;
        let modes: Vec<PoolingMode> = [
            (raw.pooling_mode_cls_token, PoolingMode::Cls),
            (raw.pooling_mode_max_tokens, PoolingMode::Max),
            (raw.pooling_mode_mean_tokens, PoolingMode::Mean),
            (raw.pooling_mode_mean_sqrt_len_tokens, PoolingMode::MeanSqrtLen),
            (raw.pooling_mode_weightedmean_tokens, PoolingMode::WeightedMean),
            (raw.pooling_mode_lasttoken, PoolingMode::LastToken),
        ]
        .into_iter()
        .filter_map(|(on, mode)| on.then_some(mode))
        .collect();
        if modes.is_empty() {
            return Err(ModelError::Config { path: path.to_path_buf(), message: "no pooling mode is set".into() });
        }
        Ok(Pooling { modes, include_prompt: raw.include_prompt })
    }

    /// `hidden`: `[rows, len, dim]`; row `r` has `lengths[r]` tokens (padded on the right), the
    /// first `prompt_lengths[r]` of them an instruction. Returns `[rows, dim * modes]`.
    pub fn forward(&self, hidden: &Array, lengths: &[usize], prompt_lengths: &[usize]) -> Result<Array> {
        let (rows, len) = (lengths.len(), hidden.shape()[1] as usize);
        let first =
            |r: usize| if self.include_prompt { 0 } else { prompt_lengths[r].min(lengths[r].saturating_sub(1)) };
        let host_mask = |weight: &dyn Fn(usize) -> f32| -> Vec<f32> {
            (0..rows)
                .flat_map(|r| (0..len).map(move |j| (r, j)))
                .map(|(r, j)| if j >= first(r) && j < lengths[r] { weight(j) } else { 0.0 })
                .collect()
        };
        let shape = [rows as i32, len as i32, 1];
        let hidden_f32 = hidden.as_dtype(mlx_rs::Dtype::Float32)?;
        let mut parts = Vec::with_capacity(self.modes.len());
        for mode in &self.modes {
            let part = match mode {
                PoolingMode::Cls => hidden_f32.try_index((.., 0, ..))?,
                PoolingMode::Max => {
                    // Outside the mask, -1e9 as sentence-transformers sets it.
                    let m = Array::from_slice(&host_mask(&|_| 1.0), &shape);
                    let masked = hidden_f32
                        .multiply(&m)?
                        .add(&multiply(&Array::from_f32(1.0).subtract(&m)?, Array::from_f32(-1e9))?)?;
                    masked.max_axis(1, false)?
                }
                PoolingMode::Mean | PoolingMode::MeanSqrtLen | PoolingMode::WeightedMean => {
                    let weights = if *mode == PoolingMode::WeightedMean {
                        host_mask(&|j| (j + 1) as f32)
                    } else {
                        host_mask(&|_| 1.0)
                    };
                    let w = Array::from_slice(&weights, &shape);
                    let total = sum_axis(&multiply(&hidden_f32, &w)?, 1, false)?;
                    let count = maximum(&sum_axis(&w, 1, false)?, Array::from_f32(1e-9))?;
                    if *mode == PoolingMode::MeanSqrtLen {
                        divide(&total, &sqrt(&count)?)?
                    } else {
                        divide(&total, &count)?
                    }
                }
                PoolingMode::LastToken => {
                    let last: Vec<i32> = lengths.iter().map(|&n| n.saturating_sub(1) as i32).collect();
                    let index = Array::from_slice(&last, &[rows as i32, 1, 1]);
                    hidden_f32.take_along_axis(&index, 1)?.squeeze_axes(&[1])?
                }
            };
            parts.push(part);
        }
        Ok(if parts.len() == 1 { parts.pop().expect("one part") } else { concatenate(&parts, 1)? })
    }
}
