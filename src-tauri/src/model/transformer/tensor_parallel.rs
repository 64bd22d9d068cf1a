//! Tensor parallel: every rank of a cluster holds every layer, but only its share of each
//! layer's attention heads and MLP columns (as mlx-lm's `shard`): q, k, v, gate and up split by
//! output rows, o and down by input columns, every expert likewise (the router whole). After the attention and after the MLP the ranks sum
//! their partial outputs (`all_sum`), so each ends every layer with the whole residual stream.
//! The model is cut before it is read, so each rank reads its share (MLX reads lazily).

use std::sync::Arc;

use mlx_rs::Array;

use super::{DecoderLayer, FeedForward, Mixer, SumClock, TensorShare, Transformer};
use crate::mlx::distributed::Group;
use crate::model::config::QuantSpec;
use crate::model::error::{ModelError, Result};
use crate::model::layers::{
    Attention, Linear, MlpProjections, MoeBlock, QkvProjection, Sinks, SwitchGlu, SwitchLinear, SwitchMatrix,
};

/// Along which axis of a `[out, in]` weight a projection is shared out.
#[derive(Clone, Copy)]
enum Split {
    /// Output rows (q, k, v, gate, up): each rank computes its own part of the output.
    Rows,
    /// Input columns (o, down): each rank computes a partial sum of the whole output.
    Columns,
}

/// The `rank`-th of `size` equal parts of `a` along `axis` (negative: from the end).
fn part(a: &Array, axis: i32, rank: usize, size: usize) -> Result<Array> {
    let dim = a.dim(axis) as usize;
    if !dim.is_multiple_of(size) {
        return Err(ModelError::Invalid(format!("a dimension of {dim} does not split into {size} equal parts")));
    }
    let mut parts = a.split_equal(size as i32, axis)?;
    // A slice is a view that keeps the whole weight's buffer; its own copy lets that go.
    Ok(parts.swap_remove(rank).contiguous()?)
}

impl Split {
    /// The axis of a weight (`[.., out, in]`, packed or not, and its scales) this splits.
    fn axis(self) -> i32 {
        match self {
            Split::Rows => -2,
            Split::Columns => -1,
        }
    }
}

/// A bias (`[.., out]`): split with the rows; after columns, added once (by rank 0).
fn shard_bias(bias: &Option<Array>, split: Split, rank: usize, size: usize) -> Result<Option<Array>> {
    match (split, bias) {
        (Split::Rows, Some(b)) => Ok(Some(part(b, -1, rank, size)?)),
        (Split::Columns, Some(b)) if rank == 0 => Ok(Some(b.clone())),
        _ => Ok(None),
    }
}

/// A quantized weight split by columns must give each rank whole quantization groups.
fn check_groups(scales: &Array, quant: &QuantSpec, split: Split, size: usize) -> Result<()> {
    let inputs = scales.dim(-1) as usize * quant.group_size as usize;
    match split {
        Split::Columns
            if !inputs.is_multiple_of(size) || !(inputs / size).is_multiple_of(quant.group_size as usize) =>
        {
            Err(ModelError::Invalid(format!(
                "{inputs} inputs in groups of {} do not split into {size} equal parts",
                quant.group_size
            )))
        }
        _ => Ok(()),
    }
}

fn shard_linear(linear: &Linear, split: Split, rank: usize, size: usize) -> Result<Linear> {
    let axis = split.axis();
    Ok(match linear {
        Linear::Dense { weight, bias } => {
            Linear::Dense { weight: part(weight, axis, rank, size)?, bias: shard_bias(bias, split, rank, size)? }
        }
        Linear::Quantized { weight, scales, biases, bias, quant } => {
            check_groups(scales, quant, split, size)?;
            Linear::Quantized {
                weight: part(weight, axis, rank, size)?,
                scales: part(scales, axis, rank, size)?,
                biases: biases.as_ref().map(|x| part(x, axis, rank, size)).transpose()?,
                bias: shard_bias(bias, split, rank, size)?,
                quant: *quant,
            }
        }
    })
}

/// Every expert's projection, split as [`shard_linear`] splits one (each expert keeps its share
/// of its intermediate columns, as mlx-lm shards experts).
fn shard_switch(linear: &SwitchLinear, split: Split, rank: usize, size: usize) -> Result<SwitchLinear> {
    let axis = split.axis();
    let matrix = match &linear.matrix {
        SwitchMatrix::Dense { weight } => SwitchMatrix::Dense { weight: part(weight, axis, rank, size)? },
        SwitchMatrix::Quantized { weight, scales, biases, quant } => {
            check_groups(scales, quant, split, size)?;
            SwitchMatrix::Quantized {
                weight: part(weight, axis, rank, size)?,
                scales: part(scales, axis, rank, size)?,
                biases: biases.as_ref().map(|x| part(x, axis, rank, size)).transpose()?,
                quant: *quant,
            }
        }
    };
    Ok(SwitchLinear { matrix, bias: shard_bias(&linear.bias, split, rank, size)? })
}

fn shard_mlp(projections: &MlpProjections, rank: usize, size: usize) -> Result<MlpProjections> {
    Ok(match projections {
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
    })
}

/// The experts (each one's intermediate columns) and the shared expert; the router stays whole
/// on every rank, so every rank picks the same experts.
fn shard_experts(moe: &mut MoeBlock, rank: usize, size: usize) -> Result<()> {
    let e = &moe.experts;
    moe.experts = SwitchGlu {
        gate: e.gate.as_ref().map(|g| shard_switch(g, Split::Rows, rank, size)).transpose()?,
        up: shard_switch(&e.up, Split::Rows, rank, size)?,
        down: shard_switch(&e.down, Split::Columns, rank, size)?,
        activation: e.activation,
    };
    if let Some(shared) = &mut moe.shared {
        shared.mlp.projections = shard_mlp(&shared.mlp.projections, rank, size)?;
    }
    Ok(())
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
        a.sinks = Some(Sinks::new(part(&sinks.array, -1, rank, size)?)?);
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
            let fused = |p: &MlpProjections| matches!(p, MlpProjections::Fused { .. });
            let why = why.or_else(|| match &layer.feed_forward {
                FeedForward::Dense(mlp) if fused(&mlp.projections) => {
                    Some("its MLP's gate and up projections are fused".into())
                }
                FeedForward::Experts(moe) if moe.shared.as_ref().is_some_and(|s| fused(&s.mlp.projections)) => {
                    Some("its shared expert's gate and up projections are fused".into())
                }
                FeedForward::Dense(_) | FeedForward::Experts(_) | FeedForward::None => None,
                FeedForward::DenseAndExperts(_) => Some("its dense MLP and experts run side by side".into()),
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
            match &mut layer.feed_forward {
                FeedForward::Dense(mlp) => mlp.projections = shard_mlp(&mlp.projections, rank, size)?,
                FeedForward::Experts(moe) => shard_experts(moe, rank, size)?,
                FeedForward::DenseAndExperts(_) | FeedForward::None => {}
            }
        }
        self.mtp = None;
        self.tensor = Some(TensorShare { group, clock: Arc::new(SumClock::default()) });
        Ok(())
    }

    /// This rank's share of every layer, `(rank, ranks)`, where the model is shared out.
    pub fn tensor_share(&self) -> Option<(usize, usize)> {
        self.tensor.as_ref().map(|t| (t.group.rank(), t.group.size()))
    }

    /// The clock of this rank's sums, where the model is shared out.
    pub fn sum_clock(&self) -> Option<Arc<SumClock>> {
        self.tensor.as_ref().map(|t| t.clock.clone())
    }

    /// The sums one step through the model takes once shared out: one after each attention,
    /// one after each MLP that has its own residual.
    pub fn sums_per_step(&self) -> usize {
        self.layers.iter().map(|l| 1 + l.post_attention_norm.is_some() as usize).sum()
    }
}

impl DecoderLayer {
    /// A branch's output summed over the ranks where the layer is shared out by tensors.
    pub(super) fn summed(share: Option<&TensorShare>, x: Array) -> Result<Array> {
        match share {
            Some(t) => t.sum(x),
            None => Ok(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layers::quant_ops;
    use mlx_rs::ops::indexing::IndexOp;

    fn random(shape: &[i32], seed: u64) -> Array {
        mlx_rs::random::normal::<f32>(shape, None, None, &mlx_rs::random::key(seed).unwrap()).unwrap()
    }

    fn max_diff(a: &Array, b: &Array) -> f32 {
        let d = mlx_rs::ops::abs(a.subtract(b).unwrap()).unwrap().max(None).unwrap();
        d.item_exact::<f32>()
    }

    /// Rows: the ranks' outputs side by side are the whole output; columns: each rank's output
    /// from its share of the inputs sums to the whole output, the bias counted once.
    fn check_parts_make_the_whole(linear: &Linear, x: &Array, size: usize) {
        let whole = linear.forward(x).unwrap();
        let rows: Vec<Array> =
            (0..size).map(|r| shard_linear(linear, Split::Rows, r, size).unwrap().forward(x).unwrap()).collect();
        let joined = mlx_rs::ops::concatenate(&rows, -1).unwrap();
        assert!(max_diff(&joined, &whole) < 1e-4, "rows");
        let inputs = x.dim(-1) / size as i32;
        let mut sum: Option<Array> = None;
        for r in 0..size {
            let share = x.index((.., r as i32 * inputs..(r as i32 + 1) * inputs));
            let y = shard_linear(linear, Split::Columns, r, size).unwrap().forward(&share).unwrap();
            sum = Some(match sum {
                Some(s) => s.add(&y).unwrap(),
                None => y,
            });
        }
        assert!(max_diff(&sum.unwrap(), &whole) < 1e-4, "columns");
    }

    #[test]
    fn shares_of_a_projection_make_the_whole_dense_and_quantized_with_a_bias_once() {
        let x = random(&[3, 128], 1);
        let dense = Linear::Dense { weight: random(&[64, 128], 2), bias: Some(random(&[64], 3)) };
        check_parts_make_the_whole(&dense, &x, 2);
        let spec = QuantSpec::affine(32, 4);
        let (weight, scales, biases) = quant_ops::quantize(&random(&[64, 128], 4), spec).unwrap();
        let quantized = Linear::Quantized { weight, scales, biases, bias: Some(random(&[64], 5)), quant: spec };
        check_parts_make_the_whole(&quantized, &x, 2);
        // 128 inputs in 4 parts are 32 each: whole groups of 32; in 8 parts they are not.
        check_parts_make_the_whole(&quantized, &x, 4);
        let e = shard_linear(&quantized, Split::Columns, 0, 8).err().unwrap().to_string();
        assert!(e.contains("groups of 32"), "{e}");
    }

    #[test]
    fn experts_split_by_their_own_columns_with_the_bias_on_rank_0() {
        let up = SwitchLinear { matrix: SwitchMatrix::Dense { weight: random(&[4, 64, 32], 6) }, bias: None };
        let down = SwitchLinear {
            matrix: SwitchMatrix::Dense { weight: random(&[4, 32, 64], 7) },
            bias: Some(random(&[4, 32], 8)),
        };
        let up1 = shard_switch(&up, Split::Rows, 1, 2).unwrap();
        let SwitchMatrix::Dense { weight } = &up1.matrix else { panic!("dense") };
        assert_eq!(weight.shape(), &[4, 32, 32]);
        let SwitchMatrix::Dense { weight: whole } = &up.matrix else { panic!("dense") };
        assert_eq!(max_diff(weight, &whole.index((.., 32..64, ..))), 0.0);
        let down0 = shard_switch(&down, Split::Columns, 0, 2).unwrap();
        let down1 = shard_switch(&down, Split::Columns, 1, 2).unwrap();
        let SwitchMatrix::Dense { weight } = &down1.matrix else { panic!("dense") };
        assert_eq!(weight.shape(), &[4, 32, 32]);
        assert!(down0.bias.is_some() && down1.bias.is_none());
    }
}
