//! Multimodal rotary positions (M-RoPE, Qwen-VL and Qwen3.5): each token carries a time, a row
//! and a column position, and each rotating frequency reads one of the three. Text has all three
//! equal, where this is plain rotary at that position (so text-only steps keep `Rope`'s fused
//! kernel); a step with image tokens, or after them, computes cosines and sines from the
//! explicit positions once for all layers, in mlx-vlm's order of operations.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{add, concatenate, cos, divide, multiply, power, sin};
use mlx_rs::{Array, Dtype};

use crate::model::config::MropeConfig;
use crate::model::error::Result;

/// The frequencies and which position axis each reads.
pub struct MRope {
    /// `1 / base^(2i / dims)`, f32, `[dims / 2]`.
    inv_freq: Array,
    /// For each frequency, the axis (0 time, 1 row, 2 column) whose position it rotates by.
    selector: Array,
    pub dims: i32,
}

/// A step's rotation, shared by its attention layers: `[B, L, dims]` each, in the compute dtype.
pub struct CosSin {
    pub cos: Array,
    pub sin: Array,
}

impl MRope {
    pub fn new(config: &MropeConfig, theta: f32, dims: usize) -> Result<MRope> {
        let dims = dims as i32;
        let exponents = divide(Array::arange::<i32, f32>(0, dims, 2)?, Array::from_f32(dims as f32))?;
        let inv_freq = divide(Array::from_f32(1.0), power(Array::from_f32(theta), exponents)?)?;
        let selector = axis_of_each_frequency(config, dims as usize / 2);
        Ok(MRope { inv_freq, selector: Array::from_slice(&selector, &[selector.len() as i32]), dims })
    }

    /// Cosines and sines for positions `[3, B, L]` (int32).
    pub fn cos_sin(&self, positions: &Array, dtype: Dtype) -> Result<CosSin> {
        let chosen = positions.take_axis(&self.selector, 0)?.transpose_axes(&[1, 2, 0])?;
        let freqs = multiply(chosen.as_dtype(Dtype::Float32)?, &self.inv_freq)?;
        let emb = concatenate(&[&freqs, &freqs], -1)?;
        Ok(CosSin { cos: cos(&emb)?.as_dtype(dtype)?, sin: sin(&emb)?.as_dtype(dtype)? })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        vec![&self.inv_freq, &self.selector]
    }
}

/// `x` `[B, H, L, D]` rotated on its first `dims` features (split halves, as the reference's
/// `rotate_half`), the rest passed through.
pub fn apply(x: &Array, rotation: &CosSin) -> Result<Array> {
    let dims = rotation.cos.dim(-1);
    let (cos, sin) = (rotation.cos.expand_dims(1)?, rotation.sin.expand_dims(1)?);
    let rot = x.try_index((.., .., .., ..dims))?;
    let half = dims / 2;
    let (x1, x2) = (rot.try_index((.., .., .., ..half))?, rot.try_index((.., .., .., half..))?);
    let rotated = concatenate(&[&x2.negative()?, &x1], -1)?;
    let out = add(multiply(&rot, &cos)?, multiply(&rotated, &sin)?)?.as_dtype(x.dtype())?;
    if dims == x.dim(-1) {
        return Ok(out);
    }
    Ok(concatenate(&[&out, &x.try_index((.., .., .., dims..))?], -1)?)
}

/// Interleaved (Qwen3-VL, Qwen3.5): frequency `i` reads the row at `i = 1 mod 3` and the column
/// at `i = 2 mod 3` while within three times that axis's section, the time otherwise. Chunked
/// (Qwen2-VL): the sections in order.
fn axis_of_each_frequency(config: &MropeConfig, freqs: usize) -> Vec<i32> {
    let mut axis = vec![0i32; freqs];
    let [_, rows, columns] = config.section;
    if config.interleaved {
        for (a, (offset, len)) in [(1, (1, rows)), (2, (2, columns))] {
            for i in (offset..(len * 3).min(freqs)).step_by(3) {
                axis[i] = a;
            }
        }
    } else {
        let start = config.section[0];
        for (i, slot) in axis.iter_mut().enumerate().skip(start) {
            *slot = if i < start + rows {
                1
            } else if i < start + rows + columns {
                2
            } else {
                0
            };
        }
    }
    axis
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_vl_interleaves_rows_and_columns_into_the_time_frequencies() {
        let c = MropeConfig { section: [24, 20, 20], interleaved: true };
        let axis = axis_of_each_frequency(&c, 64);
        assert_eq!(&axis[..7], &[0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(axis.iter().filter(|&&a| a == 1).count(), 20);
        assert_eq!(axis.iter().filter(|&&a| a == 2).count(), 20);
        assert_eq!(&axis[57..], &[0, 1, 2, 0, 0, 0, 0], "past 3 x 20 the time reads them");
        let chunked = axis_of_each_frequency(&MropeConfig { section: [16, 24, 24], interleaved: false }, 64);
        assert_eq!((chunked[15], chunked[16], chunked[39], chunked[40], chunked[63]), (0, 1, 1, 2, 2));
    }

    #[test]
    fn equal_positions_rotate_as_plain_rope() {
        let c = MropeConfig { section: [2, 3, 3], interleaved: true };
        let m = MRope::new(&c, 10_000.0, 16).unwrap();
        let x = mlx_rs::random::normal::<f32>(&[1, 2, 3, 16], None, None, None).unwrap();
        let pos = Array::from_slice(&[5, 6, 7, 5, 6, 7, 5, 6, 7], &[3, 1, 3]);
        let ours = apply(&x, &m.cos_sin(&pos, Dtype::Float32).unwrap()).unwrap();
        let plain = mlx_rs::fast::rope(&x, 16, false, 10_000.0, 1.0, 5, None).unwrap();
        let diff = mlx_rs::ops::abs(&(ours - plain)).unwrap().max(None).unwrap().item_exact::<f32>();
        assert!(diff < 1e-5, "{diff}");
    }
}
