//! What one engine step needs beyond what the process already holds, from the model's shape:
//! the prefill step's transient peak as a function of rows, chunk and context (the attention
//! score matrix where the backend materialises it), the decode step's, and the key/value
//! buffers the step adds. The governor admits a step when its prediction fits under the
//! ceiling, and checks each prediction against MLX's own peak counter.

use crate::model::config::{MlaStyle, RecurrentKind};
use crate::model::{KvQuant, ModelConfig};

/// Key/value buffers grow by this many positions at a time (`model::cache`'s step).
const KV_STEP: usize = 256;

/// The shape of one forward pass: `rows` sequences, `tokens` new tokens each, attending to a
/// shared segment of `shared` positions besides their own, `logits_rows` of them giving their
/// next token's logits. `buffers`: each cache layer's key/value buffers before the step, columns
/// used and room (rows are aligned on the right, so every row writes at the same column).
#[derive(Debug, Clone, Copy)]
pub struct StepShape<'a> {
    pub rows: usize,
    pub tokens: usize,
    pub shared: usize,
    pub logits_rows: usize,
    pub buffers: &'a [Buffer],
}

/// One cache layer's key/value buffers: columns used, and columns allocated; how they are held
/// (quantized or not), and whether the step quantizes them first (a batch reaching its start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Buffer {
    pub width: usize,
    pub capacity: usize,
    pub quant: Option<KvQuant>,
    pub converting: Option<KvQuant>,
}

/// One layer's sizes, as the step's transient sees them.
#[derive(Debug, Clone, Copy)]
enum LayerCost {
    Attention {
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        window: Option<usize>,
        keeps_kv: bool,
        /// Queries and keys normalised per head: one more copy of each.
        qk_norm: bool,
        /// A gate projected beside every query, applied to the output (the Qwen hybrids).
        gated: bool,
        /// The layer's MLP is dense (not experts).
        dense_mlp: bool,
        /// The score matrix is freed before the MLP's intermediates are made (Gemma 4's layers
        /// with experts beside the dense MLP, measured: their peak barely grows with context).
        scores_gone_by_mlp: bool,
        /// Multi-head latent attention: its cache holds a latent and a rotary key per token.
        latent: Option<MlaStyle>,
    },
    /// A linear-attention layer: its projections' width, its state per sequence (of which the
    /// delta rule's matrices), and the width of its output per token.
    /// Mamba-2's chunked scan also holds, per head, a few f32 matrices over the chunk's positions
    /// (`scan_heads`; 0 for the others).
    Recurrent { width: usize, state_bytes: usize, matrix_bytes: usize, output: usize, scan_heads: usize },
}

/// The model's memory shape, computed once at load.
#[derive(Debug, Clone)]
pub struct CostModel {
    /// Bytes of one activation element (the compute dtype).
    act: usize,
    hidden: usize,
    vocab: usize,
    /// Each layer: its mixer, and the elements per token its MLP holds at its peak.
    layers: Vec<(LayerCost, usize)>,
    /// Whether attention writes the whole score matrix to memory (MLX's CPU device; on Metal
    /// only for head sizes its fused kernels do not take, and over quantized keys).
    materializes_scores: bool,
    /// How every sequence's keys and values are held from its first token (`None`: at full
    /// precision, or quantized only from a later start: reservations count them unquantized).
    kv_quant: Option<KvQuant>,
}

impl CostModel {
    pub fn new(config: &ModelConfig, act_bytes: usize, gpu: bool) -> CostModel {
        // Gate, up and their product alive at once; gpt-oss's clamps and scaled sigmoid make
        // two more (measured).
        let copies =
            if matches!(config.activation, crate::model::config::Activation::SwigluClamped { .. }) { 5 } else { 3 };
        let layers = (0..config.num_layers)
            .map(|i| {
                let mlp = match &config.moe {
                    Some(moe) if moe.is_sparse(i) => {
                        // Each token's experts and a shared expert, the router's scores, and the
                        // experts' inputs gathered in expert order and their outputs before the
                        // weighted sum (two copies of `top_k` rows, measured).
                        let experts = copies
                            * (moe.top_k * moe.intermediate_size + moe.shared_expert_size.unwrap_or(0))
                            + 2 * moe.top_k * config.hidden_size
                            + 3 * moe.num_experts;
                        // Gemma 4's dense MLP runs beside them, both branches' intermediates alive
                        // at once, and their sum.
                        match config.gemma4 {
                            Some(_) => experts + copies * config.layer_intermediate_size(i) + config.hidden_size,
                            None => experts,
                        }
                    }
                    _ => copies * config.layer_intermediate_size(i),
                };
                let sparse = config.moe.as_ref().is_some_and(|m| m.is_sparse(i));
                let cost = match &config.hybrid {
                    Some(h) if config.is_recurrent(i) => LayerCost::Recurrent {
                        // The input projections' width: the convolved channels and the output
                        // gate (Gated DeltaNet), or the gates and the channels (a short convolution).
                        width: match h.kind {
                            RecurrentKind::ShortConv { channels, .. } => 3 * channels,
                            RecurrentKind::GatedDelta => h.conv_channels() + h.value_heads * h.value_dim,
                            // The gate, x | B | C, and a time step per head.
                            RecurrentKind::Mamba2(_) => h.conv_channels() + h.value_heads * (h.value_dim + 1),
                        },
                        state_bytes: h.state_bytes(act_bytes),
                        matrix_bytes: h.matrix_bytes(),
                        output: h.value_heads * h.value_dim,
                        scan_heads: match h.kind {
                            RecurrentKind::Mamba2(_) => h.value_heads,
                            _ => 0,
                        },
                    },
                    _ => {
                        let a = config.layer_attention(i);
                        LayerCost::Attention {
                            q_heads: config.num_heads,
                            kv_heads: a.kv_heads,
                            head_dim: a.head_dim,
                            window: config.layer_window(i),
                            keeps_kv: a.kv_source.is_none() && i < config.kv_cache_layers(),
                            qk_norm: config.qk_norm.is_some(),
                            gated: config.hybrid.as_ref().is_some_and(|h| h.gated_attention()),
                            dense_mlp: !sparse,
                            scores_gone_by_mlp: sparse && config.gemma4.is_some(),
                            latent: config.mla,
                        }
                    }
                };
                (cost, mlp)
            })
            .collect();
        let fused_head = |d: usize| matches!(d, 64 | 80 | 96 | 128 | 256);
        // Latent attention's scores always exist whole: their rotary part is the mask.
        let materializes_scores = !gpu || !fused_head(config.head_dim) || config.mla.is_some();
        CostModel {
            act: act_bytes,
            hidden: config.hidden_size,
            vocab: config.vocab_size,
            layers,
            materializes_scores,
            kv_quant: None,
        }
    }

    /// The same model with keys and values quantized as `quant` says from every sequence's first
    /// token (the per-token figures of reservations and growth).
    pub fn with_kv_quant(mut self, quant: Option<KvQuant>) -> CostModel {
        self.kv_quant = quant;
        self
    }

    /// How every sequence's keys and values are held from its first token (`None`: see the field).
    pub fn kv_quant(&self) -> Option<KvQuant> {
        self.kv_quant
    }

    /// Bytes of one key or value vector of `head_dim` elements held as `quant` says.
    fn vector_bytes(&self, head_dim: usize, quant: Option<KvQuant>) -> usize {
        quant.map_or(head_dim * self.act, |q| q.vector_bytes(head_dim, self.act))
    }

    /// Bytes one token's keys and values take in a layer of `kv_heads` x `head_dim` (a latent
    /// attention layer's: its latent and rotary key, never quantized).
    fn token_bytes(&self, kv_heads: usize, head_dim: usize, latent: Option<MlaStyle>, quant: Option<KvQuant>) -> usize {
        match latent {
            Some(m) => m.cache_elements() * self.act,
            None => 2 * kv_heads * self.vector_bytes(head_dim, quant),
        }
    }

    /// Bytes a forward of `shape` allocates beyond what is held before it: the largest layer's
    /// intermediates (MLX frees a layer's buffers as the next one runs), the logits, and the
    /// key/value buffers that grow (old and new alive at once while one is copied).
    pub fn step_bytes(&self, shape: StepShape<'_>) -> usize {
        let (growth, trim) = self.buffer_bytes(shape);
        (self.compute_bytes(shape) + growth).max(trim + STEP_OVERHEAD)
    }

    /// The step's intermediates and logits, its buffers' growth aside.
    fn compute_bytes(&self, shape: StepShape<'_>) -> usize {
        let StepShape { rows, tokens, shared, logits_rows, buffers } = shape;
        let (r, n, a) = (rows, tokens, self.act);
        let widest = buffers.iter().map(|b| b.width).max().unwrap_or(0);
        // A prefill step (several tokens a row) keeps more copies of each token's hidden state
        // and projections alive than a decode step: the norms, the rotary, the residual adds
        // and the attention's output (measured at 8 rows x 64 and 128 tokens, where the score
        // matrix is small).
        let prefill = n > 1;
        let residual = r * n * self.hidden * a * if prefill { 6 } else { 4 };
        let per_layer = self.layers.iter().enumerate().map(|(i, &(cost, mlp))| {
            let (mixer, scores) = match cost {
                LayerCost::Attention { q_heads, latent: Some(m), .. } => {
                    let width = buffers.get(i).map_or(widest, |b| b.width);
                    let seen = shared + width + n;
                    let copies = if prefill { 4 } else { 2 };
                    let projections = r * n * copies * (q_heads * (m.nope_dim + m.rope_dim) + m.cache_elements()) * a;
                    // Prefill projects every cached latent to each head's keys and values; decode
                    // carries the query into the latent space and the output out of it.
                    let expanded = if prefill {
                        r * q_heads * seen * (m.nope_dim + m.value_dim) * a
                    } else {
                        2 * r * q_heads * m.kv_lora_rank * a
                    };
                    // The rotary scores, masked (a copy), and the attention's own scores.
                    let scores = 3 * r * q_heads * n * seen * a.max(4);
                    (projections + expanded + scores, scores)
                }
                LayerCost::Attention { q_heads, kv_heads, head_dim, window, qk_norm, gated, .. } => {
                    // A layer sharing another's cache sees as many keys as that one; a windowed
                    // layer, what it keeps once it has dropped what no token sees again.
                    let width = buffers.get(i).map_or(widest, |b| b.width);
                    let width = window_width(width, window);
                    let seen = shared + width + n;
                    let copies = if prefill { 4 } else { 2 } + usize::from(qk_norm);
                    let projections = r * n * copies * (q_heads + kv_heads) * head_dim * a;
                    // The gate, its sigmoid and the gated output.
                    let gate = if gated { 3 * r * n * q_heads * head_dim * a } else { 0 };
                    // Attention over a shared segment reorders the queries (one copy) and sums two
                    // partial outputs (two more).
                    let split = if shared > 0 { 3 * r * n * q_heads * head_dim * a } else { 0 };
                    // The score matrix, once: the masked scores and the probabilities are written
                    // over it (the peak grows by one matrix per position of context, measured).
                    // Attention over quantized keys is composed of ops: it writes them everywhere.
                    let quantized = buffers.get(i).is_some_and(|b| b.quant.or(b.converting).is_some());
                    let materialized = self.materializes_scores || quantized;
                    let scores = if materialized { r * q_heads * n * seen * a.max(4) } else { 0 };
                    (projections + gate + split + scores, scores)
                }
                // The projections and convolution; in the recurrence's ops form, the state of
                // each row and the next one (MLX frees the older as it goes, measured), and every
                // token's output until they are stacked.
                // The delta rule (state matrices) keeps twice that per token in a prefill step; a
                // short convolution does not (both measured). The convolution's window twice:
                // concatenated with the new inputs, and copied out as the next state (measured in
                // decode steps).
                LayerCost::Recurrent { width, state_bytes, matrix_bytes, output, scan_heads } => {
                    let per_token = if matrix_bytes > 0 && prefill { 2 } else { 1 };
                    let window = 2 * r * (state_bytes - matrix_bytes);
                    // Mamba-2's scan: per head, C·B, the decays (with the segment sums that make
                    // them) and their product over a chunk's positions, in f32; `dt·x` and the
                    // output in f32 for every token; a third state (the carried one decayed, added
                    // to the chunk's own; measured in decode steps).
                    let chunk = n.min(256);
                    let scan = if scan_heads > 0 {
                        5 * r * scan_heads * chunk * chunk * 4 + 2 * r * n * output * 4 + r * matrix_bytes
                    } else {
                        0
                    };
                    (
                        per_token * (4 * r * n * width * a + 2 * r * n * output * a)
                            + 2 * r * state_bytes
                            + window
                            + scan,
                        0,
                    )
                }
            };
            // What of the mixer is still alive while a later layer runs (below): in a decode
            // step, not the delta rule's state matrices (measured).
            let lingering = match cost {
                LayerCost::Recurrent { matrix_bytes, .. } if n == 1 => mixer - 2 * r * matrix_bytes,
                _ => mixer,
            };
            // The mixer's intermediates are still alive while the MLP's are made, the score matrix
            // among them (measured: counting it only before the MLP under-predicts every model
            // with experts but Gemma 4).
            let bytes = match cost {
                LayerCost::Attention { scores_gone_by_mlp: true, .. } => mixer.max(mixer - scores + r * n * mlp * a),
                _ => mixer + r * n * mlp * a,
            };
            (cost, lingering, bytes)
        });
        // MLX runs independent branches of the graph in its own order: in a hybrid, a recurrent
        // mixer's intermediates can still be alive while an attention layer and its dense MLP
        // run (measured in Qwen3.5 and LFM2); not while one with experts does (measured in
        // Qwen3-Next, Qwen3.5-MoE and LFM2-MoE).
        let (mut attention, mut attention_dense, mut recurrent, mut recurrent_mixer) = (0, 0, 0, 0);
        for (cost, lingering, bytes) in per_layer {
            match cost {
                LayerCost::Recurrent { .. } => {
                    recurrent = recurrent.max(bytes);
                    recurrent_mixer = recurrent_mixer.max(lingering);
                }
                LayerCost::Attention { dense_mlp: true, .. } => attention_dense = attention_dense.max(bytes),
                LayerCost::Attention { .. } => attention = attention.max(bytes),
            }
        }
        let layer_peak = recurrent.max(attention).max(attention_dense + recurrent_mixer);
        // The last positions' logits in the compute dtype and in f32.
        let logits = logits_rows * self.vocab * (a + 4);
        // Rows of different lengths (or a shared segment) need an explicit mask, one byte per
        // score of a head, built by each layer as it runs; rows that all start together do not.
        let mask = if widest + shared > 0 { r * n * (shared + widest + n) } else { 0 };
        residual + layer_peak + logits + mask + STEP_OVERHEAD
    }

    /// Key/value bytes the step adds: nothing in a layer whose buffers have room, else its new
    /// columns (buffers grow to the next multiple of [`KV_STEP`] past what they hold), plus
    /// the largest growing layer's old buffers beside their copy. Second, the largest copy a
    /// windowed layer makes as it drops its oldest columns: that copy is evaluated on its own,
    /// before the step's compute, and frees the larger buffers it replaces.
    fn buffer_bytes(&self, shape: StepShape<'_>) -> (usize, usize) {
        use crate::model::cache::{spare_capacity, window_drop, window_keep};
        let spare = |used: usize| spare_capacity(used as i32) as usize;
        let mut added = 0;
        // The largest layer's old buffers beside their grown copy, and the largest trimmed copy.
        let (mut largest_copy, mut largest_trim) = (0, 0);
        for (i, &(cost, _)) in self.layers.iter().enumerate() {
            let (LayerCost::Attention { kv_heads, head_dim, window, keeps_kv: true, latent, .. }, Some(b)) =
                (cost, shape.buffers.get(i))
            else {
                continue;
            };
            let column = shape.rows * self.token_bytes(kv_heads, head_dim, latent, b.quant.or(b.converting));
            // Quantized first: the quantized copy beside the full-precision buffers it replaces.
            if let Some(q) = b.converting {
                largest_copy =
                    largest_copy.max(shape.rows * self.token_bytes(kv_heads, head_dim, latent, Some(q)) * b.capacity);
            }
            let (mut width, mut capacity) = (b.width, b.capacity);
            // A windowed layer first drops the columns no token will see again, into new buffers.
            // The old ones are already held; the copy is what is new, and the old are freed.
            if let Some(w) = window.filter(|&w| window_drop(width as i32, w) > 0) {
                let kept = window_keep(w) as usize;
                let trimmed = spare(kept + KV_STEP - 1);
                largest_trim = largest_trim.max(column * trimmed);
                (width, capacity) = (kept, trimmed);
            }
            let needed = width + shape.tokens;
            if needed > capacity {
                added += column * (spare(needed) - capacity);
                largest_copy = largest_copy.max(column * capacity);
            }
        }
        (added + largest_copy, largest_trim)
    }

    /// What a decode step of up to `rows` rows at up to `context` positions may need when the
    /// running batch holds `batch_kv` bytes of keys and values: its intermediates, a step's worth
    /// of new columns, and one layer's buffer copied as it grows.
    pub fn decode_reserve(&self, rows: usize, context: usize, batch_kv: usize) -> usize {
        let buffers = vec![
            Buffer { width: context, capacity: context + 1, quant: self.kv_quant, converting: None };
            self.layers.len()
        ];
        let shape = StepShape { rows, tokens: 1, shared: 0, logits_rows: rows, buffers: &buffers };
        let attention_layers = self.kv_layers().max(1);
        self.compute_bytes(shape) + rows * self.kv_per_token() * KV_STEP + batch_kv / attention_layers
    }

    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Layers that keep keys and values of their own.
    pub fn kv_layers(&self) -> usize {
        self.layers.iter().filter(|(c, _)| matches!(c, LayerCost::Attention { keeps_kv: true, .. })).count()
    }

    /// Key/value bytes a row's buffers grow by at once (a step of columns in every layer).
    pub fn growth_per_row(&self) -> usize {
        self.kv_per_token() * KV_STEP
    }

    /// One row's recurrent states in all layers (0 for a model without recurrent layers).
    pub fn recurrent_state_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|&(c, _)| match c {
                LayerCost::Recurrent { state_bytes, .. } => state_bytes,
                LayerCost::Attention { .. } => 0,
            })
            .sum()
    }

    /// Key/value bytes one token adds in all layers.
    pub fn kv_per_token(&self) -> usize {
        self.layers
            .iter()
            .map(|&(c, _)| match c {
                LayerCost::Attention { kv_heads, head_dim, keeps_kv: true, latent, .. } => {
                    self.token_bytes(kv_heads, head_dim, latent, self.kv_quant)
                }
                _ => 0,
            })
            .sum()
    }

    /// What one request holds at `context` tokens: keys and values (a windowed layer at most its
    /// window and the step of columns it drops at once) and each recurrent layer's state.
    pub fn request_bytes_at(&self, context: usize) -> usize {
        use crate::model::cache::window_keep;
        self.layers
            .iter()
            .map(|&(c, _)| match c {
                LayerCost::Attention { kv_heads, head_dim, window, keeps_kv: true, latent, .. } => {
                    let held = window.map_or(context, |w| context.min(window_keep(w) as usize + KV_STEP));
                    self.token_bytes(kv_heads, head_dim, latent, self.kv_quant) * held
                }
                LayerCost::Attention { .. } => 0,
                LayerCost::Recurrent { state_bytes, .. } => state_bytes,
            })
            .sum()
    }

    /// A prefill forward: `rows` prompts, `tokens` more each into `buffers` (and a shared
    /// segment of `shared` they attend to), `ending` of them ending their prompt.
    pub fn prefill_bytes(&self, rows: usize, tokens: usize, buffers: &[Buffer], shared: usize, ending: usize) -> usize {
        self.step_bytes(StepShape { rows, tokens, shared, logits_rows: ending, buffers })
    }

    /// A verify step (speculative decoding): `width` positions for each of `rows` rows, logits
    /// at every one, and recurrent layers' states after each position until the step keeps one.
    pub fn verify_bytes(&self, rows: usize, width: usize, buffers: &[Buffer], shared: usize) -> usize {
        self.prefill_bytes(rows, width, buffers, shared, rows * width) + rows * width * self.recurrent_state_bytes()
    }

    /// A decode step: one token for each of `rows` rows into `buffers`.
    pub fn decode_bytes(&self, rows: usize, buffers: &[Buffer], shared: usize) -> usize {
        self.step_bytes(StepShape { rows, tokens: 1, shared, logits_rows: rows, buffers })
    }
}

/// Columns a layer attends to in a step that starts with `width` of them: a windowed layer
/// first drops the leading ones no token will see again.
fn window_width(width: usize, window: Option<usize>) -> usize {
    use crate::model::cache::{window_drop, window_keep};
    match window {
        Some(w) if window_drop(width as i32, w) > 0 => window_keep(w) as usize,
        _ => width,
    }
}

/// What every step allocates whatever its size (rotary tables, small per-op buffers), measured
/// on the tiny models.
const STEP_OVERHEAD: usize = 64 << 10;

/// Each cache layer's buffers as a step sees them.
pub fn buffers_of(cache: &[crate::model::BatchKvCache]) -> Vec<Buffer> {
    cache
        .iter()
        .map(|c| Buffer {
            width: c.width().max(0) as usize,
            capacity: c.capacity().max(0) as usize,
            quant: c.held_quant(),
            converting: c.converts_next(),
        })
        .collect()
}
