//! Which keys each query may see in one forward pass: built by a layer kind's first cache (it
//! knows the rows' padding, windows and shared segment), read by attention.

use mlx_rs::Array;

/// How queries may look at keys in one forward pass.
pub enum AttentionMask {
    /// A single query token sees everything cached.
    None,
    /// The queries are the last positions of the keys, each seeing itself and what precedes it.
    Causal,
    /// An explicit boolean mask `[.., queries, keys]` (true = may attend).
    Explicit(Array),
    /// Keys in two parts: a shared segment, then each row's own keys. `prefix`: which shared
    /// keys each query may see (`[B, 1, L or 1, P or 1]`; `None`: all of them); `own`: the mask
    /// over the own keys.
    Shared { prefix: Option<Array>, own: Box<AttentionMask> },
}
