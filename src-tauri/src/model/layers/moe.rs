//! Mixture-of-experts feed-forward: a router picks `top_k` experts per token and weights them;
//! the experts run batched, every token of every row through its own experts in one
//! `gather_mm` / `gather_qmm` per projection (as mlx-lm's `SwitchGLU`), never row by row.

use mlx_rs::ops::indexing::{put_along_axis, take_along_axis, topk_axis, IndexOp};
use mlx_rs::ops::{
    add, argpartition_axis, argsort_axis, divide, expand_dims_axes, floor_divide, gather_mm, multiply, negative,
    sigmoid, softmax_axis, sum_axis, unflatten,
};
use mlx_rs::{Array, Dtype};

use crate::model::config::{Activation, GroupedRouting, QuantSpec, Routing};
use crate::model::error::Result;
use crate::model::layers::mlp::{activate, gated};
use crate::model::layers::quant_ops;
use crate::model::layers::{Linear, Mlp, RmsNorm};

/// Every expert's matrix for one projection: `[experts, out, in]`, dense or packed.
pub enum SwitchMatrix {
    Dense { weight: Array },
    Quantized { weight: Array, scales: Array, biases: Option<Array>, quant: QuantSpec },
}

/// One projection of every expert, with an optional bias per expert (`[experts, out]`, gpt-oss).
pub struct SwitchLinear {
    pub matrix: SwitchMatrix,
    pub bias: Option<Array>,
}

impl SwitchLinear {
    /// `x`: `[.., 1, in]` rows, `experts`: the expert of each row (broadcast against `x`'s
    /// leading dimensions) -> `[.., 1, out]`.
    fn forward(&self, x: &Array, experts: &Array, sorted: bool) -> Result<Array> {
        let y = match &self.matrix {
            SwitchMatrix::Dense { weight } => gather_mm(x, weight.swap_axes(-1, -2)?, None, experts, sorted)?,
            SwitchMatrix::Quantized { weight, scales, biases, quant } => {
                quant_ops::gather_qmm(x, weight, scales, biases.as_ref(), experts, sorted, *quant)?
            }
        };
        Ok(match &self.bias {
            Some(bias) => add(&y, bias.take_axis(experts, 0)?.expand_dims(-2)?)?,
            None => y,
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = match &self.matrix {
            SwitchMatrix::Dense { weight } => vec![weight],
            SwitchMatrix::Quantized { weight, scales, biases, .. } => {
                [weight, scales].into_iter().chain(biases).collect()
            }
        };
        out.extend(&self.bias);
        out
    }
}

/// Every expert's gated MLP, stacked.
pub struct SwitchGlu {
    /// `None` for ungated experts (Nemotron-H's ReLU² `fc1` / `fc2`, read as up / down).
    pub gate: Option<SwitchLinear>,
    pub up: SwitchLinear,
    pub down: SwitchLinear,
    pub activation: Activation,
}

impl SwitchGlu {
    /// `x`: `[.., hidden]`, `experts`: `[.., k]` -> `[.., k, hidden]`.
    fn forward(&self, x: &Array, experts: &Array) -> Result<Array> {
        let x = expand_dims_axes(x, &[-2, -3])?;
        // Many tokens: group the rows by expert so each expert's weights are read once, in order.
        let sort = experts.size() >= 64;
        let (x, idx, inverse) = if sort {
            let k = experts.dim(-1);
            let flat = experts.flatten(None, None)?;
            let order = argsort_axis(&flat, 0)?;
            let inverse = argsort_axis(&order, 0)?;
            let rows = floor_divide(&order, Array::from_int(k))?;
            let x = x.flatten(0, -3)?.index(&rows);
            (x, flat.index(&order), Some(inverse))
        } else {
            (x, experts.clone(), None)
        };
        let up = self.up.forward(&x, &idx, sort)?;
        let hidden = match &self.gate {
            Some(gate) => gated(self.activation, &gate.forward(&x, &idx, sort)?, &up)?,
            None => activate(self.activation, &up)?,
        };
        let mut y = self.down.forward(&hidden, &idx, sort)?;
        if let Some(inverse) = inverse {
            let mut shape = experts.shape().to_vec();
            shape.extend_from_slice(&y.shape()[1..]);
            y = y.index(&inverse).reshape(&shape)?;
        }
        Ok(y.squeeze_axes(&[-2])?)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        self.gate.iter().chain([&self.up, &self.down]).flat_map(SwitchLinear::arrays).collect()
    }
}

/// A dense expert every token goes through, scaled by `sigmoid(gate(x))` where it has a gate
/// (Qwen2-MoE), else added as it is (DeepSeek, GLM).
pub struct SharedExpert {
    pub mlp: Mlp,
    pub gate: Option<Linear>,
}

pub struct MoeBlock {
    pub router: Linear,
    pub experts: SwitchGlu,
    pub top_k: i32,
    pub routing: Routing,
    pub shared: Option<SharedExpert>,
    /// The per-expert bias on the scores that choose experts (`[experts]`, f32; LFM2-MoE).
    pub expert_bias: Option<Array>,
}

impl MoeBlock {
    /// `x`: `[B, L, hidden]` -> `[B, L, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let logits = match self.routing {
            Routing::SigmoidGrouped(g) if g.f32_router => self.router.forward(&x.as_dtype(Dtype::Float32)?)?,
            _ => self.router.forward(x)?,
        };
        let (experts, weights) = route(&logits, self.top_k, self.routing, true, self.expert_bias.as_ref())?;
        let weights = match self.routing {
            Routing::SigmoidGrouped(g) if g.f32_router => weights.as_dtype(x.dtype())?,
            _ => weights,
        };
        let y = weighted_sum(&self.experts.forward(x, &experts)?, &weights)?;
        match &self.shared {
            None => Ok(y),
            Some(SharedExpert { mlp, gate: None }) => Ok(add(&y, mlp.forward(x)?)?),
            Some(SharedExpert { mlp, gate: Some(gate) }) => {
                let scale = sigmoid(gate.forward(x)?)?;
                Ok(add(&y, multiply(&scale, mlp.forward(x)?)?)?)
            }
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.router.arrays();
        out.extend(self.experts.arrays());
        out.extend(&self.expert_bias);
        if let Some(shared) = &self.shared {
            out.extend(shared.mlp.arrays());
            out.extend(shared.gate.iter().flat_map(Linear::arrays));
        }
        out
    }
}

/// The `k` experts each token goes to and their weights, from the router's logits `[B, L, E]`;
/// `precise`: the softmax accumulates in f32 for half-precision logits (as the reference asks,
/// per family); `bias`: what [`Routing::SigmoidThenTopK`] adds to the scores that choose.
fn route(logits: &Array, k: i32, routing: Routing, precise: bool, bias: Option<&Array>) -> Result<(Array, Array)> {
    Ok(match routing {
        Routing::SoftmaxThenTopK { normalize } => {
            let probs = softmax_axis(logits, -1, precise)?;
            let n = probs.dim(-1);
            let experts = argpartition_axis(&probs, n - k, -1)?.index((.., .., (n - k)..));
            let weights = take_along_axis(&probs, &experts, -1)?;
            let weights = if normalize { divide(&weights, sum_axis(&weights, -1, true)?)? } else { weights };
            (experts, weights)
        }
        Routing::TopKThenSoftmax { largest_last } => {
            // The same k either way; taken as the reference does, so the weighted sum
            // runs in its order.
            let experts = if largest_last {
                let n = logits.dim(-1);
                argpartition_axis(logits, n - k, -1)?.index((.., .., (n - k)..))
            } else {
                argpartition_axis(negative(logits)?, k - 1, -1)?.index((.., .., ..k))
            };
            let weights = softmax_axis(take_along_axis(logits, &experts, -1)?, -1, precise)?;
            (experts, weights)
        }
        Routing::SigmoidThenTopK { normalize, scale, .. } => {
            let scores = sigmoid(logits)?;
            let n = scores.dim(-1);
            let choosing = match bias {
                Some(bias) => add(scores.as_dtype(mlx_rs::Dtype::Float32)?, bias)?,
                None => scores.clone(),
            };
            let experts = argpartition_axis(&choosing, n - k, -1)?.index((.., .., (n - k)..));
            let mut weights = take_along_axis(&scores, &experts, -1)?;
            // Scalars in the scores' dtype, as the reference's Python floats.
            let dtype = weights.dtype();
            let scalar = |v: f32| Array::from_f32(v).as_dtype(dtype);
            if normalize {
                weights = divide(&weights, add(sum_axis(&weights, -1, true)?, scalar(1e-6)?)?)?;
            }
            (experts, multiply(&weights, scalar(scale)?)?)
        }
        Routing::SigmoidGrouped(g) => {
            let bias =
                bias.ok_or_else(|| crate::model::ModelError::Mlx("grouped routing needs the expert bias".into()))?;
            grouped_select(logits, k, g, bias)?
        }
    })
}

/// DeepSeek-V3's `group_expert_select`, step for step (the order of the k experts included,
/// which fixes the order of the weighted sum): groups outside the best `topk_group` have their
/// biased scores set to 0.0, as the reference does (not -inf).
fn grouped_select(logits: &Array, k: i32, g: GroupedRouting, bias: &Array) -> Result<(Array, Array)> {
    let scores = sigmoid(logits.as_dtype(Dtype::Float32)?)?;
    let mut choosing = add(&scores, bias)?;
    let n_group = g.n_group as i32;
    if n_group > 1 {
        let n = choosing.dim(-1);
        let grouped = unflatten(&choosing, -1, &[n_group, n / n_group])?;
        let group_scores = sum_axis(topk_axis(&grouped, 2, -1)?, -1, true)?;
        let dropped = n_group - g.topk_group as i32;
        let worst = argpartition_axis(&group_scores, dropped - 1, -2)?.index((.., .., ..dropped, ..));
        let zeroed = put_along_axis(&grouped, &worst, Array::from_f32(0.0), -2)?;
        choosing = zeroed.flatten(-2, -1)?;
    }
    let experts = argpartition_axis(negative(&choosing)?, k - 1, -1)?.index((.., .., ..k));
    let mut weights = take_along_axis(&scores, &experts, -1)?;
    if g.normalize {
        let sum = sum_axis(&weights, -1, true)?;
        let sum = if g.norm_eps > 0.0 { add(&sum, Array::from_f32(g.norm_eps))? } else { sum };
        weights = divide(&weights, &sum)?;
    }
    Ok((experts, multiply(&weights, Array::from_f32(g.scale))?))
}

/// The experts' outputs `[.., k, hidden]` summed with their weights `[.., k]`.
fn weighted_sum(y: &Array, weights: &Array) -> Result<Array> {
    Ok(sum_axis(multiply(y, weights.expand_dims(-1)?)?, -2, false)?.as_dtype(y.dtype())?)
}

/// Gemma 4's router: the input RMS-normalised with a learned scale (times hidden^-0.5), the top
/// k logits softmaxed, each chosen expert's weight scaled by its own learned factor.
pub struct ScaledRouter {
    pub proj: Linear,
    /// The norm's weight, already multiplied by hidden^-0.5.
    pub scale: Array,
    pub per_expert_scale: Array,
    pub eps: f32,
    pub top_k: i32,
}

/// Gemma 4's feed-forward with experts (26B-A4B): the dense MLP and the experts side by side,
/// each with its own norms, summed.
pub struct ParallelExperts {
    pub mlp: Mlp,
    pub post_mlp_norm: RmsNorm,
    pub router: ScaledRouter,
    pub pre_experts_norm: RmsNorm,
    pub experts: SwitchGlu,
    pub post_experts_norm: RmsNorm,
}

impl ParallelExperts {
    /// `h`: the residual stream `[B, L, hidden]`; `pre_mlp_norm`: the layer's norm before the MLP.
    pub fn forward(&self, h: &Array, pre_mlp_norm: &RmsNorm) -> Result<Array> {
        let dense = self.post_mlp_norm.forward(&self.mlp.forward(&pre_mlp_norm.forward(h)?)?)?;
        let r = &self.router;
        let logits = r.proj.forward(&mlx_rs::fast::rms_norm(h, Some(&r.scale), r.eps)?)?;
        // Gemma 4's reference takes this softmax in the logits' own precision.
        let routing = Routing::TopKThenSoftmax { largest_last: true };
        let (experts, weights) = route(&logits, r.top_k, routing, false, None)?;
        let weights = multiply(&weights, r.per_expert_scale.take_axis(&experts, 0)?)?;
        let y = self.experts.forward(&self.pre_experts_norm.forward(h)?, &experts)?;
        let routed = self.post_experts_norm.forward(&sum_axis(multiply(&y, weights.expand_dims(-1)?)?, -2, false)?)?;
        Ok(add(&dense, &routed)?)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.mlp.arrays();
        out.extend(self.router.proj.arrays());
        out.extend([&self.router.scale, &self.router.per_expert_scale]);
        out.extend(self.experts.arrays());
        out.extend([&self.post_mlp_norm.weight, &self.pre_experts_norm.weight, &self.post_experts_norm.weight]);
        out
    }
}
