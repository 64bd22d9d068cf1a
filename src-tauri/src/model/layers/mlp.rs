//! The gated feed-forward block: `down(act(gate(x)) * up(x))` (SwiGLU, or GELU for Gemma).

use mlx_rs::ops::{add, clip, maximum, minimum, multiply, sigmoid, split_equal};
use mlx_rs::Array;

use crate::model::config::Activation;
use crate::model::error::Result;
use crate::model::layers::Linear;

pub enum MlpProjections {
    Separate {
        gate: Linear,
        up: Linear,
        down: Linear,
    },
    /// Phi-3: `gate_up_proj` holds gate then up along the output dimension.
    Fused {
        gate_up: Linear,
        down: Linear,
    },
    /// No gate (Nemotron-H's ReLU²): `down(act(up(x)))`.
    Ungated {
        up: Linear,
        down: Linear,
    },
}

pub struct Mlp {
    pub projections: MlpProjections,
    pub activation: Activation,
}

impl Mlp {
    pub fn arrays(&self) -> Vec<&Array> {
        match &self.projections {
            MlpProjections::Separate { gate, up, down } => {
                [gate, up, down].into_iter().flat_map(Linear::arrays).collect()
            }
            MlpProjections::Fused { gate_up, down } | MlpProjections::Ungated { up: gate_up, down } => {
                [gate_up, down].into_iter().flat_map(Linear::arrays).collect()
            }
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (gate, up, down) = match &self.projections {
            MlpProjections::Separate { gate, up, down } => (gate.forward(x)?, up.forward(x)?, down),
            MlpProjections::Fused { gate_up, down } => {
                let mut halves = split_equal(gate_up.forward(x)?, 2, -1)?;
                let up = halves.pop().expect("split into 2");
                let gate = halves.pop().expect("split into 2");
                (gate, up, down)
            }
            MlpProjections::Ungated { up, down } => return down.forward(&activate(self.activation, &up.forward(x)?)?),
        };
        down.forward(&gated(self.activation, &gate, &up)?)
    }
}

/// `act(x)` for an ungated block (ReLU²: `relu(x)²`).
pub fn activate(activation: Activation, x: &Array) -> Result<Array> {
    match activation {
        Activation::Relu2 => {
            let relu = maximum(x, Array::from_f32(0.0).as_dtype(x.dtype())?)?;
            Ok(multiply(&relu, &relu)?)
        }
        other => Err(crate::model::ModelError::Mlx(format!("{other:?} needs a gate"))),
    }
}

/// `act(gate) * up`.
pub fn gated(activation: Activation, gate: &Array, up: &Array) -> Result<Array> {
    let activated = match activation {
        Activation::Relu2 => return Err(crate::model::ModelError::Mlx("ReLU² has no gate".into())),
        Activation::Silu => multiply(gate, sigmoid(gate)?)?,
        Activation::GeluTanh => mlx_rs::nn::gelu_approximate(gate)?,
        Activation::SwigluClamped { alpha, limit } => {
            // gpt-oss: the gate clipped from above, `up` into [-limit, limit] and shifted by one.
            let gate = minimum(gate, Array::from_f32(limit))?;
            let glu = multiply(&gate, sigmoid(multiply(&gate, Array::from_f32(alpha))?)?)?;
            let up = add(clip(up, (-limit, limit))?, Array::from_f32(1.0))?;
            return Ok(multiply(&up, &glu)?);
        }
    };
    Ok(multiply(&activated, up)?)
}
