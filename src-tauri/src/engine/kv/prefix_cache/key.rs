//! Block keys: a hash chain over the model's identity and every token up to the end of a block,
//! so the key of a block names the whole prefix it ends, and the longest cached prefix of a
//! prompt is found by one lookup per block, never by scanning. The chain starts from the
//! model's identity ([`model_identity`]), so no block of one model ever serves another.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::model::{KvFormat, LoadedModel};

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

/// What makes a model's numbers what they are: its weight and config files as they are on
/// disk, the compute dtype, the weights' in-memory size (packed or expanded), the configuration
/// (RoPE included), and the context window it is served with.
pub fn model_identity(model: &LoadedModel, context_length: usize, format: KvFormat) -> BlockKey {
    let mut h = Sha256::new();
    h.update(b"fastmlx prefix cache v1\0");
    describe_files(&model.path, &mut |line| h.update(line.as_bytes()));
    let t = &model.transformer;
    h.update(format!("{:?}\0{:?}\0{}\0{context_length}\0", t.config, t.dtype, model.weights_bytes).as_bytes());
    // At full precision as before (the blocks on disk stay valid); a quantized format's blocks
    // (and its start: which positions were quantized) are its own.
    if format.quant.is_some() {
        h.update(format!("kv {format:?}\0").as_bytes());
    }
    // A cluster rank's blocks hold its own layers only.
    if let Some(stage) = t.stage() {
        h.update(format!("stage {:?}\0", stage.layers).as_bytes());
    }
    // A tensor-parallel rank's blocks hold its share of every layer's heads.
    if let Some((rank, ranks)) = t.tensor_share() {
        h.update(format!("share {rank}/{ranks}\0").as_bytes());
    }
    h.finalize().into()
}

/// One line per weight/config file: name, size, modification time.
fn describe_files(path: &Path, out: &mut impl FnMut(String)) {
    let mut files: Vec<std::path::PathBuf> = if path.is_dir() {
        std::fs::read_dir(path).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_file()).collect()
    } else {
        vec![path.to_path_buf()]
    };
    files.sort();
    for file in files {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let weights_or_config = name.ends_with(".safetensors") || name.ends_with(".gguf") || name == "config.json";
        if !weights_or_config {
            continue;
        }
        let meta = std::fs::metadata(&file).ok();
        let size = meta.as_ref().map_or(0, std::fs::Metadata::len);
        let modified = meta
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        out(format!("{name}\0{size}\0{modified}\n"));
    }
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
