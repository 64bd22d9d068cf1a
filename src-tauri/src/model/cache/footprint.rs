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
    /// With keys and values quantized once a sequence is long enough: the same per-token
    /// figures from then on (`None`: at full precision throughout).
    pub quantized: Option<QuantizedFootprint>,
}

/// Bytes per token of a sequence's quantized keys and values (packed words, scales and biases),
/// once it holds `from` tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuantizedFootprint {
    pub full_per_token: usize,
    pub windowed_per_token: usize,
    pub from: usize,
}

impl KvFootprint {
    /// Every per-token figure times `part / whole` (a cluster rank's part of the model's keys
    /// and values, counted in the whole model's shape); the recurrent state stays whole.
    pub fn scaled(self, part: usize, whole: usize) -> KvFootprint {
        let whole = whole.max(1);
        let scale = |bytes: usize| (bytes as u128 * part as u128 / whole as u128) as usize;
        KvFootprint {
            full_per_token: scale(self.full_per_token),
            windowed_per_token: scale(self.windowed_per_token),
            quantized: self.quantized.map(|q| QuantizedFootprint {
                full_per_token: scale(q.full_per_token),
                windowed_per_token: scale(q.windowed_per_token),
                ..q
            }),
            ..self
        }
    }

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
        let cheapest = self.quantized.map_or(self.full_per_token, |q| q.full_per_token.min(self.full_per_token));
        let (mut low, mut high) = (1usize, budget / cheapest.max(1) + 1);
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

    /// Bytes for a sequence of `tokens` tokens. Once quantized, never less than it held just
    /// before (so the figure grows with the length: its full-precision keys and values are
    /// converted in one go).
    pub fn bytes(&self, tokens: usize) -> usize {
        let state = if tokens > 0 { self.state_bytes } else { 0 };
        let kv =
            |full: usize, windowed: usize, tokens: usize| full * tokens + windowed * tokens.min(self.windowed_tokens);
        let dense = |tokens| kv(self.full_per_token, self.windowed_per_token, tokens);
        let held = match self.quantized {
            Some(q) if tokens >= q.from => kv(q.full_per_token, q.windowed_per_token, tokens).max(dense(q.from)),
            _ => dense(tokens),
        };
        held + state
    }

    /// Bytes of the layers that keep every token, for a sequence of `tokens` tokens (what a row
    /// saves by not holding a shared prompt start of that length).
    pub fn full_layers_bytes(&self, tokens: usize) -> usize {
        match self.quantized {
            Some(q) if tokens >= q.from => q.full_per_token * tokens,
            _ => self.full_per_token * tokens,
        }
    }

    /// The same sequence at full precision throughout.
    pub fn full_precision(&self) -> KvFootprint {
        KvFootprint { quantized: None, ..*self }
    }
}
