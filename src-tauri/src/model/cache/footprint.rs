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
    /// The longest sequence whose caches fit in `budget` bytes (`usize::MAX`: any, when a token
    /// costs nothing past the windows, as in a model of windowed and recurrent layers only).
    pub fn tokens_within(&self, budget: usize) -> usize {
        if self.bytes(1) > budget {
            return 0;
        }
        if self.full_per_token == 0 {
            return if self.bytes(self.windowed_tokens.max(1)) <= budget { usize::MAX } else { self.windowed_tokens };
        }
        // bytes() grows with tokens: the largest count within the budget.
        let (mut low, mut high) = (1usize, budget / self.full_per_token + 1);
        while low < high {
            let mid = (low + high).div_ceil(2);
            if self.bytes(mid) <= budget {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        low
    }

    /// Bytes for a sequence of `tokens` tokens.
    pub fn bytes(&self, tokens: usize) -> usize {
        let state = if tokens > 0 { self.state_bytes } else { 0 };
        self.full_per_token * tokens + self.windowed_per_token * tokens.min(self.windowed_tokens) + state
    }
}
