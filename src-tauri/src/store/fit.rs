//! Whether a model found on the Hub would fit this machine: the CLI's search and the dashboard's
//! Discover page show the same badge.

/// The weights as they sit in GPU memory (about their size on the Hub), plus a fifth for the KV
/// cache and MLX's buffers. (On a CPU FastMLX expands quantized weights to f32 when they fit;
/// the estimate is for the product's target, Apple Silicon.)
pub fn memory_needed(storage_bytes: u64) -> u64 {
    storage_bytes / 5 * 6
}

/// "fits" within 60% of the machine's memory, "tight" up to 85%, else "too big".
pub fn fit(needed: u64, machine: u64) -> &'static str {
    if needed <= machine / 100 * 60 {
        "fits"
    } else if needed <= machine / 100 * 85 {
        "tight"
    } else {
        "too big"
    }
}
