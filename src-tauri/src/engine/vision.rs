//! Encoded images kept by content hash, so that a conversation whose prompt misses the prefix
//! cache at its image (an edit before it, another system prompt) does not pay the vision tower
//! again for the same picture. Bounded in bytes; the least recently used go first.

use crate::model::vision::VisionFeatures;

/// What the cache may hold: a few screenshots' features (a 1280 x 800 image on Qwen3-VL-8B is
/// 1,000 tokens x 4,096 x 4 feature sets x 2 bytes: 33 MB).
pub const ENCODED_IMAGES_BYTES: usize = 128 << 20;

#[derive(Default)]
pub struct EncodedImages {
    /// Most recently used last.
    entries: Vec<([u8; 32], VisionFeatures, usize)>,
    bytes: usize,
}

impl EncodedImages {
    pub fn get(&mut self, hash: &[u8; 32]) -> Option<VisionFeatures> {
        let at = self.entries.iter().position(|(h, _, _)| h == hash)?;
        let entry = self.entries.remove(at);
        let features = entry.1.clone();
        self.entries.push(entry);
        Some(features)
    }

    pub fn contains(&self, hash: &[u8; 32]) -> bool {
        self.entries.iter().any(|(h, _, _)| h == hash)
    }

    pub fn insert(&mut self, hash: [u8; 32], features: VisionFeatures) {
        let bytes = features.merged.nbytes() + features.deepstack.iter().map(|d| d.nbytes()).sum::<usize>();
        if bytes > ENCODED_IMAGES_BYTES || self.entries.iter().any(|(h, _, _)| *h == hash) {
            return;
        }
        while self.bytes + bytes > ENCODED_IMAGES_BYTES && !self.entries.is_empty() {
            let (_, _, gone) = self.entries.remove(0);
            self.bytes -= gone;
        }
        self.bytes += bytes;
        self.entries.push((hash, features, bytes));
    }

    /// Gives everything back (memory pressure, shutdown).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
