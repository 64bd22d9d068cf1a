//! A layer's keys or values, `[B, H, L, D]`: at full precision, or quantized as mlx-lm's
//! `QuantizedKVCache` holds them (MLX's affine `quantize` along the head dimension: packed
//! `uint32` words `[B, H, L, D * bits / 32]`, and a scale and a bias per group of `group_size`
//! elements, `[B, H, L, D / group_size]` each). Every part has the same first three axes, so
//! whatever the caches do to rows (axis 0) and columns (axis 2) they do to each part alike.

use mlx_rs::ops::indexing::TryIndexMutOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::{Array, Dtype};

use crate::model::error::{ModelError, Result};

/// Elements per scale and bias unless told otherwise (mlx-lm's `kv_group_size` default).
pub const DEFAULT_KV_GROUP_SIZE: i32 = 64;

/// How keys and values are quantized: `bits` per element (4 or 8), one scale and bias per
/// `group_size` elements of a head's vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct KvQuant {
    pub bits: i32,
    pub group_size: i32,
}

impl KvQuant {
    /// Bits and group size MLX's quantized matmul takes (whatever the head size).
    pub fn check_format(&self) -> Result<()> {
        if !matches!(self.bits, 4 | 8) {
            return Err(ModelError::Invalid(format!("KV bits must be 4 or 8 (or 0: off), not {}", self.bits)));
        }
        if !matches!(self.group_size, 32 | 64 | 128) {
            return Err(ModelError::Invalid(format!(
                "the KV group size must be 32, 64 or 128, not {}",
                self.group_size
            )));
        }
        Ok(())
    }

    /// Whether heads of `head_dim` elements can be quantized so.
    pub fn check(&self, head_dim: i32) -> Result<()> {
        self.check_format()?;
        if head_dim % self.group_size != 0 {
            return Err(ModelError::Invalid(format!(
                "the KV group size {} does not divide the model's head size {head_dim}",
                self.group_size
            )));
        }
        Ok(())
    }

    /// Bytes one head's vector of `head_dim` elements takes, scales and biases in `dtype`.
    pub fn vector_bytes(&self, head_dim: usize, dtype_bytes: usize) -> usize {
        let groups = head_dim / self.group_size as usize;
        head_dim * self.bits as usize / 8 + 2 * groups * dtype_bytes
    }
}

/// How a cache stores keys and values: at full precision, or quantized from position `start`
/// on. A forward whose first token sits at `start` or later reads (and writes) the cache
/// quantized; one before it, at full precision; the prefill is cut at `start`, so which a token
/// gets depends on its position only, not on how the prompt was chunked or cached. With
/// `start` 0 that is mlx-lm's `QuantizedKVCache` from the first token; with a later `start`,
/// mlx-lm's `quantized_kv_start` (it converts after the forward that reaches it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct KvFormat {
    pub quant: Option<KvQuant>,
    pub start: i32,
}

impl KvFormat {
    pub const FULL: KvFormat = KvFormat { quant: None, start: 0 };

    /// The format of `bits` (0: full precision), `group_size` and `start` (the settings' and
    /// flags' figures), or why it is not one.
    pub fn from_settings(bits: i32, group_size: i32, start: i32) -> std::result::Result<KvFormat, String> {
        if start < 0 {
            return Err(format!("the KV start must be 0 or more, not {start}"));
        }
        let quant = KvQuant { bits, group_size };
        if bits == 0 {
            // Checked all the same: a group size set for later is not silently a bad one.
            return KvQuant { bits: 8, ..quant }.check_format().map(|()| KvFormat::FULL).map_err(|e| e.to_string());
        }
        quant.check_format().map_err(|e| e.to_string())?;
        Ok(KvFormat { quant: Some(quant), start })
    }

    /// Its figures as settings show them: bits (0: off), group size, start.
    pub fn settings(&self) -> (i32, i32, i32) {
        match self.quant {
            Some(q) => (q.bits, q.group_size, self.start),
            None => (0, DEFAULT_KV_GROUP_SIZE, self.start),
        }
    }

    /// The format of a forward whose first token is at position `len`.
    pub fn due(&self, len: i32) -> Option<KvQuant> {
        self.quant.filter(|_| len >= self.start)
    }

    /// How many of `n` tokens from position `len` a forward may take without crossing `start`.
    pub fn chunk_before_start(&self, len: i32, n: usize) -> usize {
        match self.quant {
            Some(_) if len < self.start => n.min((self.start - len) as usize),
            _ => n,
        }
    }
}

/// Keys or values `[B, H, L, D]`, at full precision or quantized.
#[derive(Clone)]
pub enum KvTensor {
    Dense(Array),
    Quantized { packed: Array, scales: Array, biases: Array, quant: KvQuant },
}

impl KvTensor {
    /// `x` (`[B, H, L, D]`) in the format `quant` asks for.
    pub fn new(x: &Array, quant: Option<KvQuant>) -> Result<KvTensor> {
        let Some(quant) = quant else { return Ok(KvTensor::Dense(x.clone())) };
        let (packed, scales, biases) = mlx_rs::ops::quantize(x, quant.group_size, quant.bits)?;
        Ok(KvTensor::Quantized { packed, scales, biases, quant })
    }

    pub fn quant(&self) -> Option<KvQuant> {
        match self {
            KvTensor::Dense(_) => None,
            KvTensor::Quantized { quant, .. } => Some(*quant),
        }
    }

    /// The arrays it is made of (one, or the packed words, scales and biases).
    pub fn parts(&self) -> Vec<&Array> {
        match self {
            KvTensor::Dense(a) => vec![a],
            KvTensor::Quantized { packed, scales, biases, .. } => vec![packed, scales, biases],
        }
    }

    fn first(&self) -> &Array {
        match self {
            KvTensor::Dense(a) => a,
            KvTensor::Quantized { packed, .. } => packed,
        }
    }

    /// Size of axis `axis` (0: rows, 1: heads, 2: columns; the last differs between parts).
    pub fn dim(&self, axis: i32) -> i32 {
        debug_assert!((0..3).contains(&axis), "the parts share only the first three axes");
        self.first().dim(axis)
    }

    /// The dtype keys and values are computed in (the scales' when quantized).
    pub fn dtype(&self) -> Dtype {
        match self {
            KvTensor::Dense(a) => a.dtype(),
            KvTensor::Quantized { scales, .. } => scales.dtype(),
        }
    }

    pub fn nbytes(&self) -> usize {
        self.parts().iter().map(|a| a.nbytes()).sum()
    }

    /// The same op on every part (an op on rows or columns: the parts share those axes).
    pub fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<KvTensor> {
        Ok(match self {
            KvTensor::Dense(a) => KvTensor::Dense(f(a)?),
            KvTensor::Quantized { packed, scales, biases, quant } => {
                KvTensor::Quantized { packed: f(packed)?, scales: f(scales)?, biases: f(biases)?, quant: *quant }
            }
        })
    }

    fn parts_mut(&mut self) -> Vec<&mut Array> {
        match self {
            KvTensor::Dense(a) => vec![a],
            KvTensor::Quantized { packed, scales, biases, .. } => vec![packed, scales, biases],
        }
    }

    /// Writes `new` (same format, same rows and heads) over columns `at..at + L`, in place.
    pub fn write_columns(&mut self, at: i32, new: &KvTensor) -> Result<()> {
        let rows = self.dim(0);
        self.write_at(0..rows, at, new)
    }

    /// Writes `new` (same format and heads) over rows `rows` and columns `at..at + L`, in place.
    pub fn write_at(&mut self, rows: std::ops::Range<i32>, at: i32, new: &KvTensor) -> Result<()> {
        if self.quant() != new.quant() {
            return Err(ModelError::Mlx("keys and values written in another format than held".into()));
        }
        let end = at + new.dim(2);
        for (part, new) in self.parts_mut().into_iter().zip(new.parts()) {
            part.try_index_mut((rows.clone(), .., at..end, ..), new)?;
        }
        Ok(())
    }

    /// Zeros of `like`'s format and `[rows, heads]`, `columns` wide.
    pub fn zeros(like: &KvTensor, rows: i32, heads: i32, columns: i32) -> Result<KvTensor> {
        like.map(|a| Ok(zeros_dtype(&[rows, heads, columns, a.dim(3)], a.dtype())?))
    }

    /// `parts` joined along `axis` (all in one format).
    pub fn concatenate(parts: &[KvTensor], axis: i32) -> Result<KvTensor> {
        let Some(first) = parts.first() else {
            return Err(ModelError::Mlx("nothing to concatenate".into()));
        };
        if parts.iter().any(|p| p.quant() != first.quant()) {
            return Err(ModelError::Mlx("keys and values of different formats joined".into()));
        }
        let join = |pick: &dyn Fn(&KvTensor) -> &Array| -> Result<Array> {
            Ok(concatenate(&parts.iter().map(|p| pick(p).clone()).collect::<Vec<_>>(), axis)?)
        };
        Ok(match first {
            KvTensor::Dense(_) => KvTensor::Dense(join(&|p| p.first())?),
            KvTensor::Quantized { quant, .. } => KvTensor::Quantized {
                packed: join(&|p| p.parts()[0])?,
                scales: join(&|p| p.parts()[1])?,
                biases: join(&|p| p.parts()[2])?,
                quant: *quant,
            },
        })
    }

    /// In format `quant` (quantized if it is not yet; a copy at full precision for `None`).
    pub fn in_format(&self, quant: Option<KvQuant>) -> Result<KvTensor> {
        match (self, quant) {
            (KvTensor::Dense(_), None) => Ok(self.clone()),
            (_, None) => Ok(KvTensor::Dense(self.dense()?)),
            (KvTensor::Dense(a), Some(q)) => KvTensor::new(a, Some(q)),
            (_, Some(q)) if self.quant() == Some(q) => Ok(self.clone()),
            (_, Some(q)) => KvTensor::new(&self.dense()?, Some(q)),
        }
    }

    /// At full precision (a copy when quantized).
    pub fn dense(&self) -> Result<Array> {
        Ok(match self {
            KvTensor::Dense(a) => a.clone(),
            KvTensor::Quantized { packed, scales, biases, quant } => {
                mlx_rs::ops::dequantize(packed, scales, biases, quant.group_size, quant.bits)?
            }
        })
    }
}
