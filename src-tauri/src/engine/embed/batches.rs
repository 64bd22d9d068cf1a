//! How a round's texts are cut into batches: sorted by length, so each batch pads its rows to a
//! length close to theirs, and bounded in rows, in padded tokens, and in the attention scores a
//! layer holds at once (`rows × heads × len²` floats): the working memory of one forward.

/// The bounds of one batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub max_rows: usize,
    /// Rows × padded length.
    pub max_tokens: usize,
    /// Bytes of one layer's attention scores (f32).
    pub max_score_bytes: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        // 32 rows of 256 tokens as sentence-transformers' default batch; 256 MB of scores: 16
        // rows of 512 tokens at 16 heads, or fewer rows of longer texts.
        BatchLimits { max_rows: 32, max_tokens: 8_192, max_score_bytes: 256 << 20 }
    }
}

impl BatchLimits {
    /// About the memory one batch takes beside the weights: the scores, and each token's
    /// activations (16 KiB: a hidden size of 1024 in f32, a few copies alive at once).
    pub fn working_bytes(&self) -> u64 {
        (self.max_score_bytes + self.max_tokens * (16 << 10)) as u64
    }

    /// Whether `rows` rows padded to `len` tokens fit (a single row always does).
    fn fits(&self, rows: usize, len: usize, heads: usize) -> bool {
        rows <= 1
            || (rows <= self.max_rows
                && rows * len <= self.max_tokens
                && rows * heads * len * len * 4 <= self.max_score_bytes)
    }
}

/// Indices into `lengths`, shortest text first: the order batches take them in.
pub fn by_length(lengths: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    order
}

/// How many of `rest` (indices sorted by length) the next batch takes: at least one.
pub fn next_batch(lengths: &[usize], rest: &[usize], limits: BatchLimits, heads: usize) -> usize {
    // Sorted: each text taken is the longest so far, so it sets the padded length.
    let fit = rest.iter().enumerate().take_while(|&(n, &i)| limits.fits(n + 1, lengths[i], heads)).count();
    fit.max(1).min(rest.len())
}

/// What a batch costs, learnt from the batches run: seconds per padded token.
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchCost {
    per_token: Option<f64>,
}

impl BatchCost {
    pub fn record(&mut self, took: std::time::Duration, padded_tokens: usize) {
        let sample = took.as_secs_f64() / padded_tokens.max(1) as f64;
        self.per_token = Some(self.per_token.map_or(sample, |avg| 0.7 * avg + 0.3 * sample));
    }

    /// `limits` narrowed so a batch takes about `budget` (`None`: as they are).
    pub fn within(&self, limits: BatchLimits, budget: Option<std::time::Duration>) -> BatchLimits {
        match (budget, self.per_token) {
            (Some(budget), Some(per_token)) if per_token > 0.0 => {
                let tokens = (budget.as_secs_f64() / per_token).round() as usize;
                BatchLimits { max_tokens: tokens.clamp(1, limits.max_tokens), ..limits }
            }
            _ => limits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every batch of a round at once, shortest texts first.
    fn plan_batches(lengths: &[usize], limits: BatchLimits, heads: usize) -> Vec<Vec<usize>> {
        let order = by_length(lengths);
        let mut batches = Vec::new();
        let mut rest = &order[..];
        while !rest.is_empty() {
            let n = next_batch(lengths, rest, limits, heads);
            batches.push(rest[..n].to_vec());
            rest = &rest[n..];
        }
        batches
    }

    #[test]
    fn batches_are_sorted_bounded_and_cover_every_text() {
        let lengths: Vec<usize> = (0..100).map(|i| (i * 37) % 300 + 1).collect();
        let limits = BatchLimits { max_rows: 8, max_tokens: 1000, max_score_bytes: usize::MAX };
        let batches = plan_batches(&lengths, limits, 4);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        let mut previous_max = 0;
        for batch in &batches {
            let max = batch.iter().map(|&i| lengths[i]).max().unwrap();
            let min = batch.iter().map(|&i| lengths[i]).min().unwrap();
            assert!(min >= previous_max, "batches go from short to long");
            assert!(batch.len() <= 8 && (batch.len() == 1 || batch.len() * max <= 1000), "{batch:?}");
            previous_max = max;
        }
    }

    #[test]
    fn a_time_budget_narrows_the_batch() {
        let mut cost = BatchCost::default();
        let limits = BatchLimits::default();
        assert_eq!(cost.within(limits, Some(std::time::Duration::from_millis(10))).max_tokens, limits.max_tokens);
        // 1 ms per 100 tokens: 10 ms is 1,000 tokens, four rows of 256.
        cost.record(std::time::Duration::from_millis(10), 1000);
        let narrowed = cost.within(limits, Some(std::time::Duration::from_millis(10)));
        assert_eq!(narrowed.max_tokens, 1000);
        assert_eq!(next_batch(&[256; 10], &(0..10).collect::<Vec<_>>(), narrowed, 4), 3);
        assert_eq!(cost.within(limits, None).max_tokens, limits.max_tokens);
    }

    #[test]
    fn the_attention_scores_bound_long_rows() {
        // 4 heads × 512² × 4 bytes = 4 MiB a row: a 10 MiB bound takes two rows at a time.
        let limits = BatchLimits { max_rows: 32, max_tokens: usize::MAX, max_score_bytes: 10 << 20 };
        let batches = plan_batches(&[512; 5], limits, 4);
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 1]);
        // One row longer than any bound still runs, alone.
        assert_eq!(plan_batches(&[100_000], limits, 4), vec![vec![0]]);
    }
}
