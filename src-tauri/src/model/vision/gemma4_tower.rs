//! Gemma 4's eyes: its own vision transformer (patches of any grid projected linearly, a learnt
//! position per column and per row, Gemma's sandwich-normed blocks with q/k norms, 2D rotary
//! positions and optionally clipped projections, attention across the whole image unscaled),
//! each 3 x 3 group of patches averaged into one token (times sqrt(hidden), then optionally
//! standardised), and the embedder that maps the tokens to the language model's width.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{add, clip, concatenate, cos, multiply, sin, split_equal, subtract};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;
use serde_json::Value;

use crate::model::error::{ModelError, Result};
use crate::model::layers::{Linear, RmsNorm};
use crate::model::weights::Weights;

/// The tower's shape: `config.json`'s `vision_config` (Gemma 4 E2B's where it is silent).
#[derive(Debug, Clone, Deserialize)]
pub struct Gemma4VisionConfig {
    #[serde(default = "defaults::hidden_size")]
    pub hidden_size: usize,
    #[serde(default = "defaults::intermediate_size")]
    pub intermediate_size: usize,
    #[serde(default = "defaults::num_hidden_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "defaults::num_attention_heads")]
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "defaults::patch_size")]
    pub patch_size: usize,
    #[serde(default = "defaults::pooling_kernel_size")]
    pub pooling_kernel_size: usize,
    #[serde(default = "defaults::position_embedding_size")]
    pub position_embedding_size: usize,
    #[serde(default = "defaults::rms_norm_eps")]
    pub rms_norm_eps: f32,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    #[serde(default)]
    pub standardize: bool,
    #[serde(default)]
    pub use_clipped_linears: bool,
}

mod defaults {
    pub fn hidden_size() -> usize {
        768
    }
    pub fn intermediate_size() -> usize {
        3072
    }
    pub fn num_hidden_layers() -> usize {
        16
    }
    pub fn num_attention_heads() -> usize {
        12
    }
    pub fn patch_size() -> usize {
        16
    }
    pub fn pooling_kernel_size() -> usize {
        3
    }
    pub fn position_embedding_size() -> usize {
        10240
    }
    pub fn rms_norm_eps() -> f32 {
        1e-6
    }
}

impl Gemma4VisionConfig {
    fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    fn rope_theta(&self) -> f32 {
        self.rope_parameters.as_ref().and_then(|r| r.get("rope_theta")).and_then(Value::as_f64).unwrap_or(100.0) as f32
    }
}

/// A projection whose input and output may be clamped (the checkpoint's scalars).
struct ClippedLinear {
    linear: Linear,
    input: Option<(Array, Array)>,
    output: Option<(Array, Array)>,
}

impl ClippedLinear {
    fn build(weights: &mut Weights, prefix: &str, outputs: i32, inputs: i32, clipped: bool) -> Result<Self> {
        let linear = weights.linear(&format!("{prefix}.linear"), outputs, inputs, false)?;
        let mut bounds = |lo: &str, hi: &str| -> Result<Option<(Array, Array)>> {
            let (lo, hi) = (format!("{prefix}.{lo}"), format!("{prefix}.{hi}"));
            if !clipped || !weights.contains(&lo) || !weights.contains(&hi) {
                return Ok(None);
            }
            let (lo, hi) = (weights.take(&lo)?, weights.take(&hi)?);
            Ok(Some((lo.as_dtype(weights.dtype)?, hi.as_dtype(weights.dtype)?)))
        };
        let input = bounds("input_min", "input_max")?;
        let output = bounds("output_min", "output_max")?;
        Ok(ClippedLinear { linear, input, output })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let x = match &self.input {
            Some((lo, hi)) => clip(x, (lo, hi))?,
            None => x.clone(),
        };
        let y = self.linear.forward(&x)?;
        Ok(match &self.output {
            Some((lo, hi)) => clip(&y, (lo, hi))?,
            None => y,
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut all = self.linear.arrays();
        for (lo, hi) in self.input.iter().chain(&self.output) {
            all.push(lo);
            all.push(hi);
        }
        all
    }
}

struct Block {
    input_norm: RmsNorm,
    post_attention_norm: RmsNorm,
    pre_feedforward_norm: RmsNorm,
    post_feedforward_norm: RmsNorm,
    q: ClippedLinear,
    k: ClippedLinear,
    v: ClippedLinear,
    o: ClippedLinear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    gate: ClippedLinear,
    up: ClippedLinear,
    down: ClippedLinear,
}

pub struct Gemma4Tower {
    pub config: Gemma4VisionConfig,
    input_proj: Linear,
    /// `[2, positions, hidden]`: by column, then by row.
    position_table: Array,
    blocks: Vec<Block>,
    standardize: Option<(Array, Array)>,
    projection: Linear,
}

impl Gemma4Tower {
    /// Takes the tower's tensors (under `tower`, e.g. `vision_tower.`) and the embedder's (under
    /// `embedder`, e.g. `embed_vision.`) out of `weights`.
    pub fn build(
        config: Gemma4VisionConfig,
        text_hidden: usize,
        weights: &mut Weights,
        tower: &str,
        embedder: &str,
    ) -> Result<Gemma4Tower> {
        let c = &config;
        let head_dim = c.head_dim();
        let kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        if !head_dim.is_multiple_of(4) || kv_heads != c.num_attention_heads {
            return Err(ModelError::Invalid(format!(
                "vision tower: head_dim {head_dim} must divide by 4 and the heads be as many as the key heads"
            )));
        }
        let (h, i) = (c.hidden_size as i32, c.intermediate_size as i32);
        let inner = (c.num_attention_heads * head_dim) as i32;
        let name = |n: &str| format!("{tower}{n}");
        let p = c.patch_size as i32;
        let input_proj = weights.linear(&name("patch_embedder.input_proj"), h, 3 * p * p, false)?;
        let position_table = weights
            .take_float(&name("patch_embedder.position_embedding_table"), &[2, c.position_embedding_size as i32, h])?;
        let eps = c.rms_norm_eps;
        let clipped = c.use_clipped_linears;
        let blocks = (0..c.num_hidden_layers)
            .map(|l| {
                let b = name(&format!("encoder.layers.{l}"));
                let mut lin =
                    |n: &str, o: i32, i: i32| ClippedLinear::build(weights, &format!("{b}.{n}"), o, i, clipped);
                let (q, k, v, o) = (
                    lin("self_attn.q_proj", inner, h)?,
                    lin("self_attn.k_proj", inner, h)?,
                    lin("self_attn.v_proj", inner, h)?,
                    lin("self_attn.o_proj", h, inner)?,
                );
                let (gate, up, down) =
                    (lin("mlp.gate_proj", i, h)?, lin("mlp.up_proj", i, h)?, lin("mlp.down_proj", h, i)?);
                let mut norm = |n: &str, dim: usize| weights.norm(&format!("{b}.{n}"), dim as i32, eps);
                Ok(Block {
                    input_norm: norm("input_layernorm", c.hidden_size)?,
                    post_attention_norm: norm("post_attention_layernorm", c.hidden_size)?,
                    pre_feedforward_norm: norm("pre_feedforward_layernorm", c.hidden_size)?,
                    post_feedforward_norm: norm("post_feedforward_layernorm", c.hidden_size)?,
                    q_norm: norm("self_attn.q_norm", head_dim)?,
                    k_norm: norm("self_attn.k_norm", head_dim)?,
                    q,
                    k,
                    v,
                    o,
                    gate,
                    up,
                    down,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let standardize = if c.standardize {
            Some((weights.take_f32(&name("std_bias"), &[h])?, weights.take_f32(&name("std_scale"), &[h])?))
        } else {
            None
        };
        let projection = weights.linear(&format!("{embedder}embedding_projection"), text_hidden as i32, h, false)?;
        Ok(Gemma4Tower { config, input_proj, position_table, blocks, standardize, projection })
    }

    /// The language-model features of one image of `grid` (height, width in patches) whose
    /// patches are `pixels` (`[patches, row_len]`, values in [0, 1]): `[tokens, text hidden]`.
    pub fn forward(&self, pixels: &Array, grid: [usize; 2]) -> Result<Array> {
        let c = &self.config;
        let [gh, gw] = grid;
        let k = c.pooling_kernel_size;
        if pixels.shape().first() != Some(&((gh * gw) as i32)) || !gh.is_multiple_of(k) || !gw.is_multiple_of(k) {
            return Err(ModelError::Invalid(format!(
                "vision tower: {:?} pixel rows for {gh} x {gw} patches",
                pixels.shape()
            )));
        }
        if gh.max(gw) > c.position_embedding_size {
            return Err(ModelError::Invalid(format!("vision tower: {gh} x {gw} patches past its position table")));
        }
        let dtype = self.position_table.dtype();
        // The processor's [0, 1] to the tower's [-1, 1].
        let x = subtract(&pixels.as_dtype(dtype)?, &Array::from_f32(0.5).as_dtype(dtype)?)?;
        let x = multiply(&x, &Array::from_f32(2.0).as_dtype(dtype)?)?;
        let mut x = self.input_proj.forward(&x)?;
        let columns: Vec<i32> = (0..gh * gw).map(|i| (i % gw) as i32).collect();
        let rows: Vec<i32> = (0..gh * gw).map(|i| (i / gw) as i32).collect();
        let n = (gh * gw) as i32;
        let by_column = self.position_table.index(0).take_axis(Array::from_slice(&columns, &[n]), 0)?;
        let by_row = self.position_table.index(1).take_axis(Array::from_slice(&rows, &[n]), 0)?;
        x = add(&x, &add(&by_column, &by_row)?)?;
        let (cos_t, sin_t) = self.rotary(gh, gw, dtype)?;
        let heads = c.num_attention_heads as i32;
        let head_dim = c.head_dim() as i32;
        let eps = c.rms_norm_eps;
        for b in &self.blocks {
            let normed = b.input_norm.forward(&x)?;
            let split = |t: Array| t.reshape(&[n, heads, head_dim]);
            let rotate = |t: Array| -> Result<Array> {
                // Each half (columns, then rows) rotated within itself, halves not interleaved.
                let quarters = split_equal(&t, 4, -1)?;
                let rotated = concatenate(
                    &[quarters[1].negative()?, quarters[0].clone(), quarters[3].negative()?, quarters[2].clone()],
                    -1,
                )?;
                Ok(add(&multiply(&t, &cos_t)?, &multiply(&rotated, &sin_t)?)?
                    .transpose_axes(&[1, 0, 2])?
                    .expand_dims(0)?)
            };
            let q = rotate(f32_norm(&split(b.q.forward(&normed)?)?, Some(&b.q_norm), eps)?)?;
            let kk = rotate(f32_norm(&split(b.k.forward(&normed)?)?, Some(&b.k_norm), eps)?)?;
            let v = f32_norm(&split(b.v.forward(&normed)?)?, None, eps)?.transpose_axes(&[1, 0, 2])?.expand_dims(0)?;
            let o = mlx_rs::fast::scaled_dot_product_attention(&q, &kk, &v, 1.0, None, None)?;
            let o = o.squeeze_axes(&[0])?.transpose_axes(&[1, 0, 2])?.reshape(&[n, heads * head_dim])?;
            x = add(&x, &b.post_attention_norm.forward(&b.o.forward(&o)?)?)?;
            let normed = b.pre_feedforward_norm.forward(&x)?;
            let mlp = multiply(&mlx_rs::nn::gelu_approximate(b.gate.forward(&normed)?)?, &b.up.forward(&normed)?)?;
            x = add(&x, &b.post_feedforward_norm.forward(&b.down.forward(&mlp)?)?)?;
        }
        // Each k x k group of patches averaged into a token, row-major, in f32 (as transformers).
        let (th, tw, hidden) = ((gh / k) as i32, (gw / k) as i32, c.hidden_size as i32);
        let x = x.as_dtype(Dtype::Float32)?.reshape(&[th, k as i32, tw, k as i32, hidden])?;
        let pooled = x.mean_axes(&[1, 3], None)?.reshape(&[th * tw, hidden])?;
        let mut pooled = multiply(&pooled, Array::from_f32((c.hidden_size as f32).sqrt()))?;
        if let Some((bias, scale)) = &self.standardize {
            pooled = multiply(&subtract(&pooled, bias)?, scale)?;
        }
        let pooled = pooled.as_dtype(dtype)?;
        let normed = f32_norm(&pooled, None, eps)?;
        self.projection.forward(&normed)
    }

    /// Each patch's rotary cos and sin, `[patches, 1, head_dim]`: the first half of a head turns
    /// with the patch's column, the second with its row, each half as `[angles, angles]`.
    fn rotary(&self, gh: usize, gw: usize, dtype: Dtype) -> Result<(Array, Array)> {
        let head_dim = self.config.head_dim();
        let per_axis = head_dim / 2;
        let theta = self.config.rope_theta();
        let timescales: Vec<f32> = (0..per_axis / 2).map(|j| theta.powf(2.0 * j as f32 / per_axis as f32)).collect();
        let mut angles = Vec::with_capacity(gh * gw * head_dim);
        for i in 0..gh * gw {
            for position in [(i % gw) as f32, (i / gw) as f32] {
                let one: Vec<f32> = timescales.iter().map(|t| position / t).collect();
                angles.extend_from_slice(&one);
                angles.extend_from_slice(&one);
            }
        }
        let angles = Array::from_slice(&angles, &[(gh * gw) as i32, 1, head_dim as i32]);
        Ok((cos(&angles)?.as_dtype(dtype)?, sin(&angles)?.as_dtype(dtype)?))
    }

    /// Bytes one image of `patches` patches holds at its peak in the tower (images go one at a
    /// time): a block's activations and, where attention is not fused, its scores.
    pub fn peak_bytes(&self, patches: usize, fused_attention: bool, dtype_bytes: usize) -> usize {
        let c = &self.config;
        let activations = patches * (8 * c.hidden_size + 3 * c.intermediate_size) * dtype_bytes;
        let scores = if fused_attention { 0 } else { 3 * c.num_attention_heads * patches * patches * 4 / 2 };
        activations + scores
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = self.input_proj.arrays();
        all.push(&self.position_table);
        all.extend(self.projection.arrays());
        if let Some((bias, scale)) = &self.standardize {
            all.push(bias);
            all.push(scale);
        }
        for b in &self.blocks {
            for n in [
                &b.input_norm,
                &b.post_attention_norm,
                &b.pre_feedforward_norm,
                &b.post_feedforward_norm,
                &b.q_norm,
                &b.k_norm,
            ] {
                all.push(&n.weight);
            }
            for l in [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down] {
                all.extend(l.arrays());
            }
        }
        all
    }
}

/// RMS normalisation in f32 (with a weight used as it is, or none), back in the input's dtype.
fn f32_norm(x: &Array, norm: Option<&RmsNorm>, eps: f32) -> Result<Array> {
    let weight = norm.map(|n| n.weight.as_dtype(Dtype::Float32)).transpose()?;
    let y = mlx_rs::fast::rms_norm(&x.as_dtype(Dtype::Float32)?, weight.as_ref(), eps)?;
    Ok(y.as_dtype(x.dtype())?)
}
