//! Building blocks shared by the architectures: each one is the same maths wherever it is used.

mod attention;
mod embedding;
mod gated_delta;
mod linear;
mod mamba2;
mod mla;
mod mlp;
mod moe;
pub mod mrope;
mod norm;
mod per_layer_input;
pub mod quant_ops;
mod rope;
mod shared_attention;
mod short_conv;

pub use attention::{Attention, KeysValues, QkvProjection, Sinks};
pub use embedding::Embedding;
pub use gated_delta::{DeltaProjections, GatedDeltaNet};
pub use linear::Linear;
pub use mamba2::{GatedNorm, Mamba2};
pub use mla::{LatentAttention, LatentQuery, MultiLinear};
pub use mlp::{Mlp, MlpProjections};
pub use moe::{MoeBlock, ParallelExperts, ScaledRouter, SharedExpert, SwitchGlu, SwitchLinear, SwitchMatrix};
pub use mrope::{CosSin, MRope};
pub use norm::{LayerNorm, RmsNorm};
pub use per_layer_input::{PerLayerGate, PerLayerInputs};
pub use rope::Rope;
pub use short_conv::ShortConv;
