//! The SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`.

use mlx_rs::ops::{multiply, sigmoid, split_equal};
use mlx_rs::Array;

use crate::model::error::Result;
use crate::model::layers::Linear;

pub enum Mlp {
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
}

impl Mlp {
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Mlp::Separate { gate, up, down } => [gate, up, down].into_iter().flat_map(Linear::arrays).collect(),
            Mlp::Fused { gate_up, down } => [gate_up, down].into_iter().flat_map(Linear::arrays).collect(),
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (gate, up, down) = match self {
            Mlp::Separate { gate, up, down } => (gate.forward(x)?, up.forward(x)?, down),
            Mlp::Fused { gate_up, down } => {
                let mut halves = split_equal(gate_up.forward(x)?, 2, -1)?;
                let up = halves.pop().expect("split into 2");
                let gate = halves.pop().expect("split into 2");
                (gate, up, down)
            }
        };
        let activated = multiply(multiply(&gate, sigmoid(&gate)?)?, &up)?;
        down.forward(&activated)
    }
}
