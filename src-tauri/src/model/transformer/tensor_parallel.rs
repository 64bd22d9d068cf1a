//! Tensor parallel: every rank of a cluster holds every layer, but only its share of each
//! layer's attention heads and MLP columns (as mlx-lm's `shard`): q, k, v, gate and up split by
//! output rows, o and down by input columns. After the attention and after the MLP the ranks sum
//! their partial outputs (`all_sum`), so each ends every layer with the whole residual stream.
//! The model is cut before it is read, so each rank reads its share (MLX reads lazily).

use std::sync::Arc;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use super::{DecoderLayer, FeedForward, Mixer, Transformer};
use crate::mlx::distributed::Group;
use crate::model::error::{ModelError, Result};
use crate::model::layers::{Attention, Linear, MlpProjections, QkvProjection, Sinks};

/// Along which axis of a `[out, in]` weight a projection is shared out.
#[derive(Clone, Copy)]
enum Split {
    /// Output rows (q, k, v, gate, up): each rank computes its own part of the output.
    Rows,
    /// Input columns (o, down): each rank computes a partial sum of the whole output.
    Columns,
}

/// The `rank`-th of `size` equal parts of `a` along `axis`.
fn part(a: &Array, axis: usize, rank: usize, size: usize) -> Result<Array> {
    let dim = a.dim(axis as i32) as usize;
    if !dim.is_multiple_of(size) {
        return Err(ModelError::Invalid(format!("a dimension of {dim} does not split into {size} equal parts")));
    }
    let (start, end) = ((rank * dim / size) as i32, ((rank + 1) * dim / size) as i32);
    let slice = match axis {
        0 => a.index((start..end, ..)),
        _ => a.index((.., start..end)),
    };
    // A slice is a view that keeps the whole weight's buffer; its own copy lets that go.
    Ok(slice.contiguous()?)
}

fn shard_linear(linear: &Linear, split: Split, rank: usize, size: usize) -> Result<Linear> {
    let axis = match split {
        Split::Rows => 0,
        Split::Columns => 1,
    };
    // A bias is per output: split with the rows; after columns, added once (by rank 0).
    let bias = |b: &Option<Array>| -> Result<Option<Array>> {
        match (split, b) {
            (Split::Rows, Some(b)) => Ok(Some(part(&b.reshape(&[-1, 1])?, 0, rank, size)?.reshape(&[-1])?)),
            (Split::Columns, Some(b)) if rank == 0 => Ok(Some(b.clone())),
            _ => Ok(None),
        }
    };
    Ok(match linear {
        Linear::Dense { weight, bias: b } => Linear::Dense { weight: part(weight, axis, rank, size)?, bias: bias(b)? },
        Linear::Quantized { weight, scales, biases, bias: b, quant } => {
            // Columns: each rank's share of the inputs must be whole quantization groups.
            if let Split::Columns = split {
                let inputs = scales.dim(1) as usize * quant.group_size as usize;
                if !inputs.is_multiple_of(size) || !(inputs / size).is_multiple_of(quant.group_size as usize) {
                    return Err(ModelError::Invalid(format!(
                        "{inputs} inputs in groups of {} do not split into {size} equal parts",
                        quant.group_size
                    )));
                }
            }
            Linear::Quantized {
                weight: part(weight, axis, rank, size)?,
                scales: part(scales, axis, rank, size)?,
                biases: biases.as_ref().map(|x| part(x, axis, rank, size)).transpose()?,
                bias: bias(b)?,
                quant: *quant,
            }
        }
    })
}

/// Why `attention` cannot be shared out across `size` ranks, if it cannot.
fn attention_refusal(a: &Attention, size: i32) -> Option<String> {
    if !matches!(a.qkv, QkvProjection::Separate { .. }) {
        return Some("its attention projections are fused or shared".into());
    }
    if a.whole_qk_norm {
        return Some("its q/k norms span every head".into());
    }
    if a.num_heads % size != 0 || a.num_kv_heads % size != 0 {
        return Some(format!("{} query and {} key/value heads do not split into {size}", a.num_heads, a.num_kv_heads));
    }
    None
}

fn shard_attention(a: &mut Attention, rank: usize, size: usize) -> Result<()> {
    if let QkvProjection::Separate { q, k, v } = &a.qkv {
        a.qkv = QkvProjection::Separate {
            q: shard_linear(q, Split::Rows, rank, size)?,
            k: shard_linear(k, Split::Rows, rank, size)?,
            v: shard_linear(v, Split::Rows, rank, size)?,
        };
    }
    a.o = shard_linear(&a.o, Split::Columns, rank, size)?;
    if let Some(sinks) = &a.sinks {
        a.sinks = Some(Sinks::new(part(&sinks.array.reshape(&[-1, 1])?, 0, rank, size)?.reshape(&[-1])?)?);
    }
    a.num_heads /= size as i32;
    a.num_kv_heads /= size as i32;
    Ok(())
}

impl Transformer {
    /// Why the model cannot be shared out by heads and columns across `size` ranks, if it
    /// cannot: what this build splits is standard attention and dense MLPs.
    pub fn tensor_refusal(&self, size: usize) -> Option<String> {
        if self.per_layer_inputs.is_some() || self.config.kv_cache_layers() < self.config.num_layers {
            return Some("its layers take per-layer inputs or share keys and values".into());
        }
        self.layers.iter().enumerate().find_map(|(i, layer)| {
            let why = match &layer.mixer {
                Mixer::Attention(a) => attention_refusal(a, size as i32),
                _ => Some("it has layers other than attention (latent or recurrent)".into()),
            };
            let why = why.or_else(|| match &layer.feed_forward {
                FeedForward::Dense(mlp) if matches!(mlp.projections, MlpProjections::Fused { .. }) => {
                    Some("its MLP's gate and up projections are fused".into())
                }
                FeedForward::Dense(_) | FeedForward::None => None,
                _ => Some("it has experts (tensor parallel splits dense MLPs)".into()),
            });
            why.map(|w| format!("layer {i}: {w}"))
        })
    }

    /// Keeps this rank's share of every layer's heads and columns; the ranks of `group` sum
    /// their partial outputs after each attention and MLP. The multi-token-prediction head is
    /// dropped.
    pub fn shard_tensors(&mut self, group: Arc<Group>) -> Result<()> {
        let (rank, size) = (group.rank(), group.size());
        if self.is_split() {
            return Err(ModelError::Invalid("the model is split already".into()));
        }
        if let Some(why) = self.tensor_refusal(size) {
            return Err(ModelError::Invalid(format!("this model cannot be split by tensors: {why}")));
        }
        for layer in &mut self.layers {
            if let Mixer::Attention(a) = &mut layer.mixer {
                shard_attention(a, rank, size)?;
            }
            if let FeedForward::Dense(mlp) = &mut layer.feed_forward {
                mlp.projections = match &mlp.projections {
                    MlpProjections::Separate { gate, up, down } => MlpProjections::Separate {
                        gate: shard_linear(gate, Split::Rows, rank, size)?,
                        up: shard_linear(up, Split::Rows, rank, size)?,
                        down: shard_linear(down, Split::Columns, rank, size)?,
                    },
                    MlpProjections::Ungated { up, down } => MlpProjections::Ungated {
                        up: shard_linear(up, Split::Rows, rank, size)?,
                        down: shard_linear(down, Split::Columns, rank, size)?,
                    },
                    MlpProjections::Fused { .. } => {
                        return Err(ModelError::Invalid("a fused MLP cannot be split by tensors".into()))
                    }
                };
            }
        }
        self.mtp = None;
        self.tensor = Some(group);
        Ok(())
    }
}

impl DecoderLayer {
    /// A branch's output summed over the ranks where the layer is shared out by tensors.
    pub(super) fn summed(group: Option<&Group>, x: Array) -> Result<Array> {
        match group {
            Some(g) => g.all_sum(&x).map_err(ModelError::Mlx),
            None => Ok(x),
        }
    }
}
