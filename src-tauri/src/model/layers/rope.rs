//! Rotary position embeddings, with the scalings the supported models use. Frequencies that do
//! not depend on the position are computed once at load; the maths follows MLX's `fast::rope`.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{add, concatenate, divide, gt, logical_and, lt, multiply, power, select, subtract};
use mlx_rs::Array;

use crate::model::cache::Positions;
use crate::model::config::{RopeConfig, RopeScaling};
use crate::model::error::Result;

pub struct Rope {
    dims: i32,
    traditional: bool,
    kind: Kind,
}

enum Kind {
    /// `base` and a position scale (1 / linear factor).
    Plain { base: f32, scale: f32 },
    /// Precomputed per-dimension frequencies and an input magnitude scale (Llama 3, longrope).
    Freqs { freqs: Array, input_scale: f32 },
    /// NTK base recomputed from the sequence length once it passes the trained context.
    DynamicNtk { base: f32, factor: f32, max_positions: f32 },
}

impl Rope {
    pub fn new(config: &RopeConfig, max_position_embeddings: usize) -> Result<Rope> {
        let dims = config.dims as i32;
        let base = config.theta;
        let kind = match &config.scaling {
            None => Kind::Plain { base, scale: 1.0 },
            Some(RopeScaling::Linear { factor }) => Kind::Plain { base, scale: 1.0 / factor },
            Some(RopeScaling::Dynamic { factor }) => {
                Kind::DynamicNtk { base, factor: *factor, max_positions: max_position_embeddings as f32 }
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                // Computed with MLX ops in mlx-lm's order, so the frequencies match it bit for bit.
                let old = *original_max_position_embeddings as f32;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                let freqs = base_freqs(base, dims)?;
                let wavelens = multiply(&freqs, f32_scalar(2.0 * std::f32::consts::PI))?;
                let freqs =
                    select(&gt(&wavelens, f32_scalar(low_wavelen))?, multiply(&freqs, f32_scalar(*factor))?, &freqs)?;
                let medium =
                    logical_and(gt(&wavelens, f32_scalar(high_wavelen))?, lt(&wavelens, f32_scalar(low_wavelen))?)?;
                let smooth = divide(
                    subtract(divide(f32_scalar(old), &wavelens)?, f32_scalar(*low_freq_factor))?,
                    f32_scalar(high_freq_factor - low_freq_factor),
                )?;
                let smooth_freqs =
                    divide(&freqs, add(divide(subtract(f32_scalar(1.0), &smooth)?, f32_scalar(*factor))?, &smooth)?)?;
                Kind::Freqs { freqs: select(&medium, &smooth_freqs, &freqs)?, input_scale: 1.0 }
            }
            Some(RopeScaling::Factors { factors }) => {
                let half = (dims as usize).div_ceil(2);
                if factors.len() != half {
                    return Err(crate::model::ModelError::Mlx(format!(
                        "rope_freqs has {} factors, expected {half}",
                        factors.len()
                    )));
                }
                let freqs = multiply(Array::from_slice(factors, &[half as i32]), base_freqs(base, dims)?)?;
                Kind::Freqs { freqs, input_scale: 1.0 }
            }
            Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
            }) => {
                let (freqs, input_scale) = yarn(
                    base,
                    dims,
                    *factor,
                    *original_max_position_embeddings as f32,
                    (*beta_fast, *beta_slow),
                    (*mscale, *mscale_all_dim),
                )?;
                Kind::Freqs { freqs, input_scale }
            }
            Some(RopeScaling::Proportional { factor, partial_rotary_factor }) => {
                // As mlx-lm's ProportionalRoPE: frequencies over the whole head for the rotated
                // pairs, infinite (no rotation) for the rest.
                let rotated = (dims as f32 * partial_rotary_factor) as i32;
                let exponents = divide(Array::arange::<i32, f32>(0, rotated, 2)?, f32_scalar(dims as f32))?;
                let rotating = multiply(f32_scalar(*factor), power(f32_scalar(base), exponents)?)?;
                let still =
                    Array::from_slice(&vec![f32::INFINITY; ((dims - rotated) / 2) as usize], &[(dims - rotated) / 2]);
                Kind::Freqs { freqs: concatenate(&[rotating, still], 0)?, input_scale: 1.0 }
            }
            Some(RopeScaling::LongRope { long_factor, original_max_position_embeddings, long_mscale, .. }) => {
                // As mlx-lm: the long factors always, and a magnitude scale when the model's
                // window is longer than the one it was pre-trained with.
                let half = (dims as usize).div_ceil(2);
                let factors: Vec<f32> = long_factor.iter().copied().chain(std::iter::repeat(1.0)).take(half).collect();
                let freqs = multiply(Array::from_slice(&factors, &[half as i32]), base_freqs(base, dims)?)?;
                let original = *original_max_position_embeddings as f32;
                let factor = max_position_embeddings as f32 / original;
                let input_scale =
                    long_mscale.unwrap_or(if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / original.ln()).sqrt() });
                Kind::Freqs { freqs, input_scale }
            }
        };
        Ok(Rope { dims, traditional: config.traditional, kind })
    }

    /// Rotates `x` of shape `[batch, heads, seq, head_dim]` whose first token of each row sits
    /// at `positions`.
    pub fn forward(&self, x: &Array, positions: &Positions) -> Result<Array> {
        let (base, scale, freqs, input_scale) = match &self.kind {
            Kind::Plain { base, scale } => (Some(*base), *scale, None, 1.0),
            Kind::Freqs { freqs, input_scale } => (None, 1.0, Some(freqs), *input_scale),
            Kind::DynamicNtk { base, factor, max_positions } => {
                let seq_len = ((x.dim(-2) + positions.max()) as f32).max(*max_positions);
                let d = self.dims as f32;
                let base = base * ((factor * seq_len / max_positions) - (factor - 1.0)).powf(d / (d - 2.0));
                (Some(base), 1.0, None, 1.0)
            }
        };
        let scaled;
        let x = if input_scale != 1.0 {
            scaled = self.scale_rotated(x, input_scale)?;
            &scaled
        } else {
            x
        };
        Ok(match positions {
            Positions::Scalar(offset) => {
                mlx_rs::fast::rope(x, self.dims, self.traditional, base, scale, *offset, freqs)?
            }
            Positions::Rows { offsets, .. } => {
                mlx_rs::fast::rope_dynamic(x, self.dims, self.traditional, base, scale, offsets, freqs)?
            }
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match &self.kind {
            Kind::Freqs { freqs, .. } => vec![freqs],
            _ => Vec::new(),
        }
    }

    /// Multiplies the rotated leading `dims` of the last axis by `scale`.
    fn scale_rotated(&self, x: &Array, scale: f32) -> Result<Array> {
        let head_dim = x.dim(-1);
        let rotated = multiply(x.try_index((.., .., .., ..self.dims))?, Array::from_f32(scale))?;
        if self.dims == head_dim {
            return Ok(rotated);
        }
        let rest = x.try_index((.., .., .., self.dims..))?;
        Ok(concatenate(&[rotated, rest], -1)?)
    }
}

fn f32_scalar(x: f32) -> Array {
    Array::from_f32(x)
}

/// YaRN's blended frequencies and magnitude scale, as mlx-lm's `YarnRoPE` computes them.
fn yarn(
    base: f32,
    dims: i32,
    factor: f32,
    original: f32,
    betas: (f32, f32),
    mscales: (f32, f32),
) -> Result<(Array, f32)> {
    let d = dims as f32;
    let correction =
        |rotations: f32| d * (original / (rotations * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
    let low = correction(betas.0).floor().max(0.0);
    let high = correction(betas.1).ceil().min(d - 1.0);
    let high = if low == high { high + 0.001 } else { high };
    let get_mscale = |m: f32| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
    let mscale = get_mscale(mscales.0) / get_mscale(mscales.1);
    let extra = base_freqs(base, dims)?;
    let inter = multiply(&extra, f32_scalar(factor))?;
    let ramp = divide(subtract(Array::arange::<i32, f32>(0, dims / 2, 1)?, f32_scalar(low))?, f32_scalar(high - low))?;
    let mask = subtract(f32_scalar(1.0), mlx_rs::ops::clip(&ramp, (0.0f32, 1.0f32))?)?;
    let blended = add(multiply(&inter, &mask)?, multiply(&extra, subtract(f32_scalar(1.0), &mask)?)?)?;
    Ok((divide(multiply(&inter, &extra)?, &blended)?, mscale))
}

/// `base ** (arange(0, dims, 2) / dims)`: each rotating pair's wavelength factor.
fn base_freqs(base: f32, dims: i32) -> Result<Array> {
    let exponents = divide(Array::arange::<i32, f32>(0, dims, 2)?, f32_scalar(dims as f32))?;
    Ok(power(f32_scalar(base), exponents)?)
}
