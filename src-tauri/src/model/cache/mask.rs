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
    /// `base`, and besides each query may see the later keys `later` marks among the step's own
    /// (`[B, 1, L, L]`): the other tokens of its image, in families whose image tokens see each
    /// other. Resolved by attention once the keys' length is known.
    WithLaterKeys { base: Box<AttentionMask>, later: Array },
}

impl AttentionMask {
    /// This mask with `later`'s keys allowed too, over `keys` own keys of which the step's
    /// `L` are the last: an explicit mask (or a shared one whose own part is).
    pub fn with_later_keys(&self, later: &Array, keys: i32) -> crate::model::error::Result<AttentionMask> {
        use mlx_rs::ops::{arange, concatenate, logical_or, zeros};
        let l = later.dim(-1);
        let padded = || -> crate::model::error::Result<Array> {
            if keys == l {
                return Ok(later.clone());
            }
            let past = zeros::<bool>(&[later.dim(0), 1, l, keys - l])?;
            Ok(concatenate(&[past, later.clone()], -1)?)
        };
        Ok(match self {
            // One query: no later key.
            AttentionMask::None => AttentionMask::None,
            AttentionMask::Causal => {
                let queries = arange::<_, i32>(keys - l, keys, None)?.reshape(&[l, 1])?;
                let columns = arange::<_, i32>(0, keys, None)?.reshape(&[1, keys])?;
                AttentionMask::Explicit(logical_or(&columns.le(&queries)?, &padded()?)?)
            }
            AttentionMask::Explicit(m) => AttentionMask::Explicit(logical_or(m, &padded()?)?),
            AttentionMask::Shared { prefix, own } => {
                AttentionMask::Shared { prefix: prefix.clone(), own: Box::new(own.with_later_keys(later, keys)?) }
            }
            AttentionMask::WithLaterKeys { base, later: inner } => {
                let both = logical_or(inner, later)?;
                base.with_later_keys(&both, keys)?
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(mask: &AttentionMask) -> Vec<bool> {
        match mask {
            AttentionMask::Explicit(m) => m.as_slice::<bool>().to_vec(),
            _ => panic!("an explicit mask"),
        }
    }

    #[test]
    fn later_keys_open_only_the_steps_own_later_columns() {
        // 3 new queries over 5 keys; query 0 sees new key 2, query 1 too (one image of 3 tokens
        // from query 0, and query 2 its last).
        let later = Array::from_slice(&[false, true, true, false, false, true, false, false, false], &[1, 1, 3, 3]);
        let causal = AttentionMask::Causal.with_later_keys(&later, 5).unwrap();
        #[rustfmt::skip]
        let want = [
            true, true, true, true, true,
            true, true, true, true, true,
            true, true, true, true, true,
        ];
        assert_eq!(rows(&causal), want);
        // Without the image: causal, the past always visible.
        let none = Array::from_slice(&[false; 9], &[1, 1, 3, 3]);
        #[rustfmt::skip]
        let plain = [
            true, true, true, false, false,
            true, true, true, true, false,
            true, true, true, true, true,
        ];
        assert_eq!(rows(&AttentionMask::Causal.with_later_keys(&none, 5).unwrap()), plain);
        // A window's explicit mask (2 keys) keeps its limits on the past.
        #[rustfmt::skip]
        let window = Array::from_slice(&[
            false, true, true, false, false,
            false, false, true, true, false,
            false, false, false, true, true,
        ], &[1, 1, 3, 5]);
        let windowed = AttentionMask::Explicit(window).with_later_keys(&later, 5).unwrap();
        #[rustfmt::skip]
        let want = [
            false, true, true, true, true,
            false, false, true, true, true,
            false, false, false, true, true,
        ];
        assert_eq!(rows(&windowed), want);
    }
}
