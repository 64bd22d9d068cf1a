//! Key/value caches, for one sequence ([`KvCache`]) and for the running batch
//! ([`BatchKvCache`], with its [`SharedKv`] prompt start held once), and what attention needs
//! from either: where the new tokens sit (their RoPE positions), which keys each query may see
//! ([`AttentionMask`]), and the appended keys and values ([`LayerCache`]). The layers use this
//! module; it uses none of them.

mod batch;
mod buffers;
mod footprint;
mod kv_tensor;
mod mask;
mod single;

use mlx_rs::Array;

pub use batch::{BatchKvCache, SharedKv};
pub use buffers::window_columns;
pub(crate) use buffers::{spare_capacity, window_drop, window_keep, Buffers};
pub use footprint::{KvFootprint, QuantizedFootprint};
pub use kv_tensor::{KvFormat, KvQuant, KvTensor, DEFAULT_KV_GROUP_SIZE};
pub use mask::AttentionMask;
pub use single::KvCache;

use crate::model::error::Result;

/// RoPE positions of the first new token.
pub enum Positions {
    /// One sequence (or rows that are all aligned): the same offset everywhere.
    Scalar(i32),
    /// A batch: one offset per row (`[batch]` int32), and the largest of them.
    Rows { offsets: Array, max: i32 },
}

impl Positions {
    pub fn max(&self) -> i32 {
        match self {
            Positions::Scalar(o) => *o,
            Positions::Rows { max, .. } => *max,
        }
    }
}

pub trait LayerCache {
    /// The positions of the next tokens to be added.
    fn positions(&self) -> Result<Positions>;
    /// The mask for `new_tokens` queries over the cache after they are added, in layers with
    /// attention window `window`.
    fn mask(&self, new_tokens: i32, window: Option<usize>) -> Result<AttentionMask>;
    /// Appends `[B, H, L, D]` keys/values and returns everything cached so far (after the
    /// shared segment, when there is one), in the format the cache stores them in.
    fn update(&mut self, keys: &Array, values: &Array) -> Result<(KvTensor, KvTensor)>;
    /// In a layer with attention window `window`, before new tokens: lets go of the keys and
    /// values no later token can see (all rows together), or keeps them a while longer.
    fn drop_outside(&mut self, window: usize) -> Result<()>;
    /// A recurrent layer's state: its arrays, `[B, ..]` each (none before its first tokens).
    fn states(&self) -> &[Array];
    fn set_states(&mut self, states: Vec<Array>);
    /// A recurrent layer took `n` more tokens: it keeps no keys, only the count moves.
    fn advance(&mut self, n: i32);
    /// The prompt start some rows share, held once, that they attend to before their own keys.
    fn shared(&self) -> Option<&SharedKv> {
        None
    }
    /// Whether this step checks drafted tokens (speculative decoding): a recurrent layer then
    /// also gives its state after each position (`set_step_states`), so that the step can keep
    /// only the tokens it accepts.
    fn verifying(&self) -> bool {
        false
    }
    /// A recurrent layer's states after each of this step's positions: per state, `[B, L, ..]`.
    fn set_step_states(&mut self, _states: Vec<Array>) {}
}
