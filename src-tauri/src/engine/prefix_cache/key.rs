//! Block keys: a hash chain over the model's identity and every token up to the end of a block,
//! so the key of a block names the whole prefix it ends, and the longest cached prefix of a
//! prompt is found by one lookup per block, never by scanning.

use sha2::{Digest, Sha256};

/// The key of a cached block (or of the empty prefix: the model's identity).
pub type BlockKey = [u8; 32];

/// The key of the block holding `tokens` after the prefix `parent` names.
pub fn chain(parent: &BlockKey, tokens: &[u32]) -> BlockKey {
    let mut hasher = Sha256::new();
    hasher.update(parent);
    hasher.update((tokens.len() as u32).to_le_bytes());
    for t in tokens {
        hasher.update(t.to_le_bytes());
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of the whole `block`-token blocks of `tokens`, from the root `identity`.
    fn whole_block_keys(identity: &BlockKey, tokens: &[u32], block: usize) -> Vec<BlockKey> {
        let mut keys = Vec::new();
        let mut parent = *identity;
        for chunk in tokens.chunks_exact(block) {
            parent = chain(&parent, chunk);
            keys.push(parent);
        }
        keys
    }

    #[test]
    fn a_key_names_the_whole_prefix() {
        let root = [7u8; 32];
        let a = whole_block_keys(&root, &[1, 2, 3, 4, 5, 6], 2);
        let b = whole_block_keys(&root, &[1, 2, 3, 4, 9, 9], 2);
        assert_eq!(a.len(), 3);
        assert_eq!(a[..2], b[..2], "same tokens, same keys");
        assert_ne!(a[2], b[2]);
        let c = whole_block_keys(&root, &[9, 2, 3, 4], 2);
        assert_ne!(a[1], c[1], "block 2 holds the same tokens, but after another prefix");
        let other_model = whole_block_keys(&[8u8; 32], &[1, 2], 2);
        assert_ne!(a[0], other_model[0]);
        assert_ne!(chain(&root, &[1, 2]), chain(&root, &[1, 2, 0]), "a partial block is not its extension");
    }
}
