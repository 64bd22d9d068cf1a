//! What one sequence's key/value caches take in memory, by its length: the figure admission
//! reserves, the prefix cache budgets and the store's estimates read.

/// What one sequence's key/value caches take, by its length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvFootprint {
    /// Bytes per token in the layers that keep every token...
    pub full_per_token: usize,
    /// ...and in windowed layers, which hold at most `windowed_tokens` columns...
    pub windowed_per_token: usize,
    pub windowed_tokens: usize,
    /// ...and the recurrent layers' state, whatever the length (linear-attention hybrids).
    pub state_bytes: usize,
}

impl KvFootprint {
    /// Bytes for a sequence of `tokens` tokens.
    pub fn bytes(&self, tokens: usize) -> usize {
        let state = if tokens > 0 { self.state_bytes } else { 0 };
        self.full_per_token * tokens + self.windowed_per_token * tokens.min(self.windowed_tokens) + state
    }
}
