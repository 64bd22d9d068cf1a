//! The model's hyper-parameters, normalised from a Hugging Face `config.json` or GGUF metadata
//! into one struct that the shared transformer reads. Architecture files fill it in.

use serde::Deserialize;

/// The architectures this build can run (`model_type` in `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Phi3,
    Qwen3Moe,
    Qwen2Moe,
    Mixtral,
    Gemma3,
    GptOss,
    Ministral3,
    Gemma4,
    /// Linear-attention hybrids: Gated DeltaNet layers with gated full attention every few.
    Qwen3Next,
    Qwen35,
    /// LFM2: short-convolution blocks with attention layers among them.
    Lfm2,
    /// SmolLM3: Llama's layers, every few of them without rotary positions.
    SmolLm3,
    /// Seed-OSS: Llama's layers with biases where its config puts them.
    SeedOss,
    /// OLMo 3: norms on the branch outputs only, q/k norms over whole projections, three
    /// sliding-window layers to one full.
    Olmo3,
    /// GLM-4.5/4.6/4.7: partial rotary, dense first layers, then experts chosen by biased
    /// sigmoid scores in groups, beside a shared expert.
    Glm4Moe,
    /// MiniMax-M2: experts in every layer chosen by biased sigmoid scores, q/k norms over whole
    /// projections.
    MiniMax,
    /// DeepSeek-V3.x and Kimi K2: multi-head latent attention, grouped sigmoid experts.
    DeepseekV3,
    /// GLM-4.7-Flash: DeepSeek-V3's layers with the model's own norm epsilon.
    Glm4MoeLite,
    /// Granite 4.0-H: Mamba-2 layers with a few attention layers, scaled residuals, experts
    /// beside a shared MLP.
    GraniteMoeHybrid,
    /// Nemotron-H and Nemotron 3: Mamba-2, attention (no rotary), ReLU² MLPs and experts as
    /// separate blocks, paired into decoder layers.
    NemotronH,
}

impl Arch {
    pub const ALL: [Arch; 24] = [
        Arch::Llama,
        Arch::Mistral,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Phi3,
        Arch::Qwen3Moe,
        Arch::Qwen2Moe,
        Arch::Mixtral,
        Arch::Gemma3,
        Arch::GptOss,
        Arch::Ministral3,
        Arch::Gemma4,
        Arch::Qwen3Next,
        Arch::Qwen35,
        Arch::Lfm2,
        Arch::SmolLm3,
        Arch::SeedOss,
        Arch::Olmo3,
        Arch::Glm4Moe,
        Arch::MiniMax,
        Arch::DeepseekV3,
        Arch::Glm4MoeLite,
        Arch::GraniteMoeHybrid,
        Arch::NemotronH,
    ];

    /// The `model_type`s this build loads, for error messages.
    pub fn supported() -> String {
        Arch::ALL.map(Arch::model_type).join(", ")
    }

    /// Whether most of its layers keep a recurrent state (linear-attention hybrids).
    pub fn is_hybrid(self) -> bool {
        matches!(self, Arch::Qwen3Next | Arch::Qwen35 | Arch::Lfm2 | Arch::GraniteMoeHybrid | Arch::NemotronH)
    }

    pub fn from_model_type(model_type: &str) -> Option<Arch> {
        Some(match model_type {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            // Qwen3-VL's text model is Qwen3's, with M-RoPE (`rope_scaling.mrope_section`).
            "qwen3" | "qwen3_vl" | "qwen3_vl_text" => Arch::Qwen3,
            "phi3" => Arch::Phi3,
            // Qwen3-VL-MoE's text model is Qwen3-MoE's, with M-RoPE.
            "qwen3_moe" | "qwen3_vl_moe" | "qwen3_vl_moe_text" => Arch::Qwen3Moe,
            "qwen2_moe" => Arch::Qwen2Moe,
            "mixtral" => Arch::Mixtral,
            "gemma3_text" => Arch::Gemma3,
            "gpt_oss" => Arch::GptOss,
            "ministral3" => Arch::Ministral3,
            "gemma4_text" => Arch::Gemma4,
            "qwen3_next" => Arch::Qwen3Next,
            // The text model of Qwen3.5/3.6, dense or with experts (`text_config`).
            "qwen3_5" | "qwen3_5_text" | "qwen3_5_moe" | "qwen3_5_moe_text" => Arch::Qwen35,
            // LFM2 and LFM2-MoE (its first layers dense, experts after them).
            "lfm2" | "lfm2_moe" => Arch::Lfm2,
            "smollm3" => Arch::SmolLm3,
            "seed_oss" => Arch::SeedOss,
            "olmo3" => Arch::Olmo3,
            "glm4_moe" => Arch::Glm4Moe,
            // mlx-lm's name for MiniMax-M2's `minimax_m2` (`utils.py`'s remapping).
            "minimax" | "minimax_m2" => Arch::MiniMax,
            // Kimi K2 is DeepSeek-V3's architecture (mlx-lm maps it so).
            "deepseek_v3" | "kimi_k2" => Arch::DeepseekV3,
            "glm4_moe_lite" => Arch::Glm4MoeLite,
            "granitemoehybrid" => Arch::GraniteMoeHybrid,
            "nemotron_h" => Arch::NemotronH,
            _ => return None,
        })
    }

    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen2Moe => "qwen2_moe",
            Arch::Mixtral => "mixtral",
            Arch::Gemma3 => "gemma3_text",
            Arch::GptOss => "gpt_oss",
            Arch::Ministral3 => "ministral3",
            Arch::Gemma4 => "gemma4_text",
            Arch::Qwen3Next => "qwen3_next",
            Arch::Qwen35 => "qwen3_5",
            Arch::Lfm2 => "lfm2",
            Arch::SmolLm3 => "smollm3",
            Arch::SeedOss => "seed_oss",
            Arch::Olmo3 => "olmo3",
            Arch::Glm4Moe => "glm4_moe",
            Arch::MiniMax => "minimax",
            Arch::DeepseekV3 => "deepseek_v3",
            Arch::Glm4MoeLite => "glm4_moe_lite",
            Arch::GraniteMoeHybrid => "granitemoehybrid",
            Arch::NemotronH => "nemotron_h",
        }
    }
}

/// Rotary position embedding variants (`rope_scaling` in `config.json`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear { factor: f32 },
    /// NTK-aware base, stretched once a sequence passes the trained context (as mlx-lm).
    Dynamic { factor: f32 },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position_embeddings: usize },
    /// Per-pair wavelength factors as GGUF stores them for Llama 3.1 (`rope_freqs.weight`).
    Factors { factors: Vec<f32> },
    /// YaRN (gpt-oss): frequencies blended between interpolation and extrapolation by a ramp
    /// over the dimensions, and a magnitude scale on the rotated part.
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f32,
        beta_slow: f32,
        mscale: f32,
        mscale_all_dim: f32,
    },
    /// Phi-3's "longrope"/"su": per-dimension factors plus a magnitude scale.
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        short_mscale: Option<f32>,
        long_mscale: Option<f32>,
    },
    /// Gemma 4's global layers: the plain frequencies over the whole head (times `factor`) for
    /// the leading `partial_rotary_factor` of it; the other pairs do not rotate.
    Proportional { factor: f32, partial_rotary_factor: f32 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f32,
    /// How many leading dimensions of each head rotate (head_dim unless partial rotary).
    pub dims: usize,
    /// Interleaved pairs (GPT-J style) instead of split halves (NeoX/HF style).
    pub traditional: bool,
    pub scaling: Option<RopeScaling>,
}

/// How M-RoPE shares the rotating frequencies among the time, row and column positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MropeConfig {
    /// Frequencies per axis (time, row, column), summing to half the rotating dimensions.
    pub section: [usize; 3],
    /// Qwen3-VL's and Qwen3.5's layout (row and column frequencies interleaved with time's)
    /// rather than Qwen2-VL's three blocks.
    pub interleaved: bool,
}

/// How a linear layer's weights are quantized, as MLX stores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct QuantSpec {
    pub group_size: i32,
    pub bits: i32,
    #[serde(default)]
    pub mode: QuantMode,
}

impl QuantSpec {
    pub fn affine(group_size: i32, bits: i32) -> QuantSpec {
        QuantSpec { group_size, bits, mode: QuantMode::Affine }
    }

    /// Whether MLX has kernels for this combination (checked before any weight is read).
    pub fn is_supported(&self) -> bool {
        match self.mode {
            QuantMode::Affine => matches!(self.bits, 2 | 3 | 4 | 5 | 6 | 8) && matches!(self.group_size, 32 | 64 | 128),
            QuantMode::Mxfp4 => self.bits == 4 && self.group_size == 32,
            QuantMode::Nvfp4 => self.bits == 4 && self.group_size == 16,
            QuantMode::Mxfp8 => self.bits == 8 && self.group_size == 32,
        }
    }
}

/// MLX's quantization modes (`"mode"` in the config): integer codes with a scale and bias per
/// group, or small floats with a shared 8-bit-float scale per group (no biases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuantMode {
    #[default]
    Affine,
    Mxfp4,
    Nvfp4,
    Mxfp8,
}

/// The feed-forward block's activation: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    Silu,
    /// GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// gpt-oss: `(clip(up, ±limit) + 1) * g * sigmoid(alpha * g)` with `g = min(gate, limit)`.
    SwigluClamped {
        alpha: f32,
        limit: f32,
    },
    /// Nemotron-H: `down(relu(up(x))²)`, no gate projection (dense MLP and experts alike).
    Relu2,
}

impl Activation {
    /// Whether the block has a gate projection beside `up` (all but ReLU²'s).
    pub fn is_gated(self) -> bool {
        self != Activation::Relu2
    }
}

/// How a router turns its logits into the experts a token uses and their weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Softmax over all experts, then the top k (Qwen MoE); `normalize`: rescale the k weights
    /// to sum to one (`norm_topk_prob`).
    SoftmaxThenTopK { normalize: bool },
    /// The top k logits, then a softmax over them (Mixtral; gpt-oss with `largest_last`, which
    /// only changes the order the reference sums the k experts in).
    TopKThenSoftmax { largest_last: bool },
    /// Each expert's sigmoid score; the top k chosen by score plus a learned per-expert bias
    /// when `expert_bias` (the bias picks, the unbiased scores weigh), optionally rescaled to sum
    /// to one, times `scale` (LFM2-MoE).
    SigmoidThenTopK { normalize: bool, expert_bias: bool, scale: f32 },
    /// DeepSeek-V3's `noaux_tc` (GLM-4.x, MiniMax-M2): sigmoid scores in f32; experts chosen by
    /// score plus the learned bias among the `topk_group` best of `n_group` groups (a group's
    /// worth: the sum of its two best); the chosen experts' unbiased scores, rescaled to sum to
    /// one when `normalize` (`+ norm_eps`; DeepSeek only with more than one expert), times `scale`.
    SigmoidGrouped(GroupedRouting),
}

/// The settings of [`Routing::SigmoidGrouped`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupedRouting {
    pub n_group: usize,
    pub topk_group: usize,
    pub normalize: bool,
    pub norm_eps: f32,
    pub scale: f32,
    /// MiniMax: the router runs in f32 and the weights return to the input's dtype before the
    /// experts' outputs are summed (DeepSeek's sum runs in f32).
    pub f32_router: bool,
}

impl Routing {
    /// Whether a learned per-expert bias joins the scores that choose experts.
    pub fn has_expert_bias(&self) -> bool {
        matches!(self, Routing::SigmoidThenTopK { expert_bias: true, .. } | Routing::SigmoidGrouped(_))
    }
}

/// Mixture-of-experts feed-forward layers: each token goes through `top_k` of `num_experts`
/// SwiGLU experts, weighted by the router.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    /// Hidden size of each expert.
    pub intermediate_size: usize,
    pub routing: Routing,
    /// A dense expert every token also goes through...
    pub shared_expert_size: Option<usize>,
    /// ...scaled by a sigmoid gate (Qwen2-MoE's `shared_expert`), or not (DeepSeek's and GLM's
    /// `shared_experts`).
    pub shared_expert_gated: bool,
    /// Which layers have experts (the others keep a dense MLP); empty means all.
    pub sparse_layers: Vec<bool>,
    /// Biases on the router and on every expert's projections (gpt-oss).
    pub biases: bool,
}

impl MoeConfig {
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.get(layer).copied().unwrap_or(self.sparse_layers.is_empty())
    }
}

/// Queries scaled up with their position past the pre-training window, `1 + beta * ln(1 +
/// floor(position / original))` (Llama 4's long-context scaling, used by Ministral 3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryScale {
    pub beta: f32,
    pub original_max_position_embeddings: usize,
}

/// Gemma's departures from the Llama block.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaStyle {
    /// Embeddings multiplied by sqrt(hidden_size) (rounded to bf16, as the reference does).
    pub embed_scale: f32,
}

/// Gemma 4's departures from Gemma 3's block (which it otherwise follows, with plain `weight`
/// norms and unscaled attention logits).
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4Style {
    /// Full-attention layers have their own head size and KV head count...
    pub global_head_dim: usize,
    pub global_kv_heads: usize,
    /// ...their keys may double as values (no `v_proj`; the larger models)...
    pub global_keys_as_values: bool,
    /// ...and their own rotary settings; sliding-window layers use `local_rope`.
    pub global_rope: RopeConfig,
    pub local_rope: RopeConfig,
    /// Layers from this one on compute no keys or values: each attends over those of the last
    /// earlier layer of its kind (`num_kv_shared_layers`). Equal to the layer count when none do.
    pub first_kv_shared: usize,
    /// Extra features per layer and token, from a second embedding table and the input.
    pub per_layer_input: Option<PerLayerInput>,
    /// KV-shared layers' MLPs are twice as wide.
    pub double_wide_mlp: bool,
    /// Logits squashed into `(-cap, cap)` by `cap * tanh(x / cap)`.
    pub final_logit_softcap: Option<f32>,
}

/// Gemma 4's per-layer inputs (the small "E" models): `size` features per layer and token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerLayerInput {
    pub size: usize,
    pub vocab_size: usize,
}

/// One layer's attention shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerAttention {
    pub head_dim: usize,
    pub kv_heads: usize,
    pub keys_as_values: bool,
    /// The earlier layer whose keys and values (and cache) this one uses instead of its own.
    pub kv_source: Option<usize>,
}

/// Where a checkpoint keeps its multi-token-prediction head (`mtp.fc`, `mtp.layers.0`, ...).
pub const MTP_PREFIX: &str = "mtp";

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope: RopeConfig,
    /// The context window the model was trained for.
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Mistral-style sliding-window attention: each token sees at most this many keys...
    pub sliding_window: Option<usize>,
    /// ...in these layers (`layer_types` "sliding_attention"); empty means every layer.
    pub sliding_layers: Vec<bool>,
    /// Biases on q/k/v projections (Qwen2).
    pub qkv_bias: bool,
    /// A bias on the attention output projection too (gpt-oss).
    pub o_bias: bool,
    /// Biases on the MLP's projections (Seed-OSS's `mlp_bias`).
    pub mlp_bias: bool,
    /// Layers whose attention has no rotary positions (SmolLM3's NoPE layers).
    pub nope_layers: Vec<usize>,
    /// A learned per-head logit in every attention softmax (gpt-oss's sinks).
    pub attention_sinks: bool,
    /// RMS norms on q and k before rotary: per head (Qwen3) or over the whole projection.
    pub qk_norm: Option<QkNorm>,
    /// q/k/v in one `qkv_proj` and gate/up in one `gate_up_proj` (Phi-3).
    pub fused_projections: bool,
    pub activation: Activation,
    /// Attention logits scale; `None` means `head_dim^-0.5`.
    pub attention_scale: Option<f32>,
    /// RMS norms scale by `1 + weight` (Gemma) instead of `weight`.
    pub norm_plus_one: bool,
    /// Where a layer's norms sit.
    pub norms: NormPlacement,
    /// The sliding-window layers' rotary settings where they differ from `rope` (Gemma 3's
    /// base, OLMo 3's unscaled positions).
    pub sliding_rope: Option<RopeConfig>,
    pub gemma: Option<GemmaStyle>,
    pub moe: Option<MoeConfig>,
    pub query_scale: Option<QueryScale>,
    pub gemma4: Option<Gemma4Style>,
    pub hybrid: Option<HybridStyle>,
    /// Multi-token-prediction layers the checkpoint may ship (`mtp.*`, Qwen3.5 and Qwen3-Next:
    /// `mtp_num_hidden_layers`); 0: none.
    pub mtp_layers: usize,
    /// Multimodal rotary positions (Qwen-VL's `mrope_section`): text rotates as plain rotary,
    /// image tokens by their time, row and column.
    pub mrope: Option<MropeConfig>,
    /// Multi-head latent attention in every layer (DeepSeek-V3): `head_dim` is then the query's
    /// (`nope + rope`) and `rope` the rotary part's.
    pub mla: Option<MlaStyle>,
    /// Granite's scalars on the embeddings, on both branches before the residual adds, and on
    /// the logits (divided).
    pub multipliers: Option<Multipliers>,
    /// Layers with no feed-forward (Nemotron-H: a mixer block not followed by an MLP block);
    /// they have no `post_attention_layernorm` either.
    pub no_ffn_layers: Vec<usize>,
}

/// Granite's multipliers (`embedding_multiplier`, `residual_multiplier`, `logits_scaling`; its
/// `attention_multiplier` is the attention scale).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Multipliers {
    pub embedding: f32,
    pub residual: f32,
    pub logits_scaling: f32,
}

/// Multi-head latent attention's sizes: the cache holds `kv_lora_rank + rope_dim` elements per
/// token and layer, whatever the head count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlaStyle {
    /// The queries' low-rank bottleneck (`None`: a direct projection).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    /// Per head: the query and key dimensions without and with rotary positions, and the value's.
    pub nope_dim: usize,
    pub rope_dim: usize,
    pub value_dim: usize,
    /// The bottlenecks' norms' epsilon (DeepSeek fixes 1e-6; GLM-4.7-Flash uses the model's).
    pub lora_eps: f32,
}

impl MlaStyle {
    /// Cache elements per token and layer: the latent, then the rotary key.
    pub fn cache_elements(&self) -> usize {
        self.kv_lora_rank + self.rope_dim
    }

    /// The attention's parameters in one layer, for a model of `hidden` and `heads`.
    fn parameters(&self, hidden: u64, heads: u64) -> u64 {
        let (rank, nope, rope, value) =
            (self.kv_lora_rank as u64, self.nope_dim as u64, self.rope_dim as u64, self.value_dim as u64);
        let query = match self.q_lora_rank.map(|r| r as u64) {
            Some(q) => hidden * q + q + q * heads * (nope + rope),
            None => hidden * heads * (nope + rope),
        };
        query + hidden * (rank + rope) + rank + heads * nope * rank + heads * value * rank + heads * value * hidden
    }
}

/// What the q/k norms normalise over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// Each head (Qwen3, Gemma, GLM-4.x).
    PerHead,
    /// The whole projection, before it is split into heads (OLMo 3, MiniMax-M2).
    Whole,
}

/// Where a decoder layer's RMS norms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before the attention and before the feed-forward (Llama).
    Pre,
    /// Before and after both branches (Gemma's four norms; its residual adds clip in f16).
    Sandwich,
    /// On the branches' outputs only (OLMo 3): no norm on the layer's input.
    Post,
}

/// Hybrids: most layers keep a fixed-size state per sequence (Qwen3-Next's and Qwen3.5's Gated
/// DeltaNet layers, LFM2's short convolutions); the others are full attention (with a sigmoid
/// output gate in the Qwen families).
#[derive(Debug, Clone, PartialEq)]
pub struct HybridStyle {
    /// Per layer: whether it keeps a state (else it is attention).
    pub linear_layers: Vec<bool>,
    pub kind: RecurrentKind,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    /// The causal convolution's width (it keeps `conv_kernel - 1` inputs).
    pub conv_kernel: usize,
    /// Qwen3-Next: q, k, v, z in one projection grouped per key head, b and a in another;
    /// Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    pub grouped_projections: bool,
}

/// What a hybrid's stateful layers are. (The Gated DeltaNet's shape is `HybridStyle`'s.)
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RecurrentKind {
    GatedDelta,
    /// Mamba-2 (Granite 4.0-H, Nemotron-H), shaped by `HybridStyle`: `key_heads` groups of
    /// `key_dim` state dimensions for B and C, `value_heads` heads of `value_dim`; the state
    /// per row is `[value_heads, value_dim, key_dim]` in f32, as the Gated DeltaNet's matrices.
    Mamba2(Mamba2Style),
    /// LFM2: gates and a depthwise convolution over `channels` (the hidden size).
    ShortConv {
        channels: usize,
        bias: bool,
    },
}

/// A Mamba-2 layer's settings besides its shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mamba2Style {
    pub conv_bias: bool,
    /// Biases on `in_proj` and `out_proj`.
    pub proj_bias: bool,
    /// The time step's clip (`time_step_limit`; the upper bound may be infinite).
    pub dt_limit: (f32, f32),
    /// Nemotron: the gated norm per group of heads, its weight applied apart; Granite: one
    /// norm over the whole width.
    pub grouped_norm: bool,
    pub norm_eps: f32,
}

impl HybridStyle {
    /// Channels of the convolution: q, k and v (Gated DeltaNet), x, B and C (Mamba-2), or the
    /// hidden size.
    pub fn conv_channels(&self) -> usize {
        match self.kind {
            RecurrentKind::GatedDelta | RecurrentKind::Mamba2(_) => {
                2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
            }
            RecurrentKind::ShortConv { channels, .. } => channels,
        }
    }

    /// Whether the attention layers gate their output (the Qwen families).
    pub fn gated_attention(&self) -> bool {
        self.kind == RecurrentKind::GatedDelta
    }

    /// Bytes of one sequence's state in one layer: the convolution's inputs (compute dtype)
    /// and the recurrence's matrices (f32).
    pub fn state_bytes(&self, dtype_bytes: usize) -> usize {
        (self.conv_kernel - 1) * self.conv_channels() * dtype_bytes + self.matrix_bytes()
    }

    /// Bytes of the recurrence's matrices in one sequence's state (0 for a short convolution).
    pub fn matrix_bytes(&self) -> usize {
        self.value_heads * self.value_dim * self.key_dim * 4
    }

    /// The layer's parameters.
    fn parameters(&self, hidden: u64) -> u64 {
        if let RecurrentKind::ShortConv { channels, bias } = self.kind {
            let c = channels as u64;
            let biases = if bias { 3 * c + c + c } else { 0 };
            return 3 * c * hidden + c * self.conv_kernel as u64 + c * c + biases;
        }
        if let RecurrentKind::Mamba2(m) = self.kind {
            let (heads, width) = (self.value_heads as u64, (self.value_heads * self.value_dim) as u64);
            let conv = self.conv_channels() as u64;
            let in_rows = width + conv + heads;
            let proj_bias = if m.proj_bias { in_rows + hidden } else { 0 };
            let conv_bias = if m.conv_bias { conv } else { 0 };
            // in_proj, the convolution, dt_bias / A_log / D, the norm, out_proj.
            return hidden * in_rows
                + conv * self.conv_kernel as u64
                + conv_bias
                + 3 * heads
                + width
                + width * hidden
                + proj_bias;
        }
        let nv = self.value_heads as u64;
        let dv = self.value_dim as u64;
        let conv = self.conv_channels() as u64;
        let projections = hidden * (conv + nv * dv + 2 * nv);
        projections + conv * self.conv_kernel as u64 + 2 * nv + dv + nv * dv * hidden
    }
}
impl ModelConfig {
    /// Whether layer `i` keeps a recurrent state instead of keys and values.
    pub fn is_recurrent(&self, i: usize) -> bool {
        self.hybrid.as_ref().is_some_and(|h| h.linear_layers.get(i).copied().unwrap_or(false))
    }

    /// The attention window of layer `i`, if it has one.
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        let sliding = self.sliding_layers.get(i).copied().unwrap_or(self.sliding_layers.is_empty());
        self.sliding_window.filter(|_| sliding)
    }

    /// Layer `i`'s attention shape: the model's, or Gemma 4's per layer kind.
    pub fn layer_attention(&self, i: usize) -> LayerAttention {
        let uniform = LayerAttention {
            head_dim: self.head_dim,
            kv_heads: self.num_kv_heads,
            keys_as_values: false,
            kv_source: None,
        };
        let Some(g) = &self.gemma4 else { return uniform };
        let local = self.layer_window(i).is_some();
        let kv_source = (i >= g.first_kv_shared)
            .then(|| (0..g.first_kv_shared).rev().find(|&j| self.layer_window(j).is_some() == local))
            .flatten();
        if local {
            return LayerAttention { kv_source, ..uniform };
        }
        LayerAttention {
            head_dim: g.global_head_dim,
            kv_heads: if g.global_keys_as_values { g.global_kv_heads } else { self.num_kv_heads },
            keys_as_values: g.global_keys_as_values,
            kv_source,
        }
    }

    /// How many layers keep a key/value cache (the first ones; the rest reuse theirs).
    pub fn kv_cache_layers(&self) -> usize {
        self.gemma4.as_ref().map_or(self.num_layers, |g| g.first_kv_shared.min(self.num_layers))
    }

    /// Layer `i`'s dense MLP width.
    pub fn layer_intermediate_size(&self, i: usize) -> usize {
        match &self.gemma4 {
            Some(g) if g.double_wide_mlp && i >= g.first_kv_shared && g.first_kv_shared > 0 => {
                2 * self.intermediate_size
            }
            _ => self.intermediate_size,
        }
    }

    /// Key and value elements one token adds to the caches (all layers that keep one).
    pub fn kv_elements_per_token(&self) -> usize {
        self.kv_elements_per_token_in(0..self.num_layers)
    }

    /// [`Self::kv_elements_per_token`] of `layers` only (a pipeline stage's).
    pub fn kv_elements_per_token_in(&self, layers: std::ops::Range<usize>) -> usize {
        if let Some(mla) = &self.mla {
            return layers.len() * mla.cache_elements();
        }
        (layers.start..layers.end.min(self.kv_cache_layers()))
            .filter(|&i| !self.is_recurrent(i))
            .map(|i| self.layer_attention(i))
            .map(|a| 2 * a.kv_heads * a.head_dim)
            .sum()
    }

    /// What one sequence's key/value caches take with `dtype_bytes`-byte elements: windowed
    /// layers hold a bounded number of tokens.
    pub fn kv_footprint(&self, dtype_bytes: usize) -> crate::model::KvFootprint {
        self.kv_footprint_in(dtype_bytes, crate::model::KvFormat::FULL)
    }

    /// [`Self::kv_footprint`] with keys and values stored in `format`.
    pub fn kv_footprint_in(&self, dtype_bytes: usize, format: crate::model::KvFormat) -> crate::model::KvFootprint {
        let vector = |head_dim: usize, quant: Option<crate::model::KvQuant>| match quant {
            Some(q) => q.vector_bytes(head_dim, dtype_bytes),
            None => head_dim * dtype_bytes,
        };
        let per_layer = |i: usize, quant| match &self.mla {
            Some(mla) => mla.cache_elements() * dtype_bytes,
            None => {
                let a = self.layer_attention(i);
                2 * a.kv_heads * vector(a.head_dim, quant)
            }
        };
        let layers = || (0..self.kv_cache_layers()).filter(|&i| !self.is_recurrent(i));
        let full = |quant| layers().filter(|&i| self.layer_window(i).is_none()).map(|i| per_layer(i, quant)).sum();
        let windowed = |quant| layers().filter(|&i| self.layer_window(i).is_some()).map(|i| per_layer(i, quant)).sum();
        let recurrent = (0..self.num_layers).filter(|&i| self.is_recurrent(i)).count();
        crate::model::KvFootprint {
            full_per_token: full(None),
            windowed_per_token: windowed(None),
            windowed_tokens: self.sliding_window.map_or(0, crate::model::cache::window_columns),
            state_bytes: self.hybrid.as_ref().map_or(0, |h| recurrent * h.state_bytes(dtype_bytes)),
            quantized: format.quant.map(|q| crate::model::cache::QuantizedFootprint {
                full_per_token: full(Some(q)),
                windowed_per_token: windowed(Some(q)),
                from: format.start.max(0) as usize,
            }),
        }
    }

    /// Why keys and values cannot be stored in `format` in this model (a group size that does
    /// not divide a layer's head size), if they cannot.
    pub fn check_kv_format(&self, format: crate::model::KvFormat) -> Result<(), String> {
        let Some(quant) = format.quant else { return Ok(()) };
        if self.mla.is_some() {
            // mlx-lm's latent attention takes no quantized cache: there is no reference to match.
            return Err(
                "keys and values of latent attention (DeepSeek-V3, Kimi K2, GLM-4.7-Flash) are not quantized".into()
            );
        }
        let layers = (0..self.kv_cache_layers()).filter(|&i| !self.is_recurrent(i));
        for head_dim in layers.map(|i| self.layer_attention(i).head_dim).collect::<std::collections::BTreeSet<_>>() {
            quant.check(head_dim as i32).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The KV-cache quantization at `bits` this model's heads allow: 64 elements per scale
    /// where they can (mlx-lm's default), else 32; `None` where neither divides them.
    pub fn kv_quant_for(&self, bits: i32) -> Option<crate::model::KvQuant> {
        [64, 32]
            .into_iter()
            .map(|group_size| crate::model::KvQuant { bits, group_size })
            .find(|&q| self.check_kv_format(crate::model::KvFormat { quant: Some(q), start: 0 }).is_ok())
    }

    /// A rough parameter count (embeddings + layers, every expert), for listings and memory
    /// estimates.
    pub fn parameter_count(&self) -> u64 {
        let (h, v) = (self.hidden_size as u64, self.vocab_size as u64);
        let layers: u64 = (0..self.num_layers)
            .map(|l| self.attention_parameters(l) + self.ffn_parameters(l, false) + self.layer_extras(l))
            .sum();
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        let per_layer_input = self.per_layer_input().map_or(0, |p| {
            let width = (self.num_layers * p.size) as u64;
            p.vocab_size as u64 * width + h * width + p.size as u64
        });
        v * h + head + layers + h + per_layer_input
    }

    /// Multiply-accumulates per token in one layer's linear projections, counting only the
    /// experts a token goes through (what a step costs, not what the model holds).
    pub fn active_linear_macs(&self) -> u64 {
        let total: u64 =
            (0..self.num_layers).map(|l| self.attention_parameters(l) + self.ffn_parameters(l, true)).sum();
        total / self.num_layers.max(1) as u64
    }

    fn per_layer_input(&self) -> Option<PerLayerInput> {
        self.gemma4.as_ref().and_then(|g| g.per_layer_input)
    }

    /// Layer `l`'s attention projections and q/k norms.
    fn attention_parameters(&self, l: usize) -> u64 {
        let a = self.layer_attention(l);
        let h = self.hidden_size as u64;
        match (&self.hybrid, &self.mla) {
            (Some(hybrid), _) if self.is_recurrent(l) => return hybrid.parameters(h),
            (_, Some(mla)) => return mla.parameters(h, self.num_heads as u64),
            _ => {}
        }
        // The hybrids' attention projects a gate beside every query.
        let gated = self.hybrid.as_ref().is_some_and(HybridStyle::gated_attention);
        let gate = if gated { h * (self.num_heads * a.head_dim) as u64 } else { 0 };
        let q = (self.num_heads * a.head_dim) as u64;
        let kv = (a.kv_heads * a.head_dim) as u64;
        let own_kv = match (a.kv_source, a.keys_as_values) {
            (Some(_), _) => 0,
            (None, true) => h * kv,
            (None, false) => 2 * h * kv,
        };
        let norms = match self.qk_norm {
            None => 0,
            Some(QkNorm::Whole) => q + kv,
            Some(QkNorm::PerHead) if a.kv_source.is_some() => a.head_dim as u64,
            Some(QkNorm::PerHead) => 2 * a.head_dim as u64,
        };
        2 * h * q + own_kv + norms + gate
    }

    /// Layer `l`'s norms and Gemma 4's per-layer input gate and scalar.
    fn layer_extras(&self, l: usize) -> u64 {
        let h = self.hidden_size as u64;
        let norms = match self.norms {
            NormPlacement::Sandwich => 4 * h,
            NormPlacement::Pre if self.no_ffn_layers.contains(&l) => h,
            NormPlacement::Pre | NormPlacement::Post => 2 * h,
        };
        let per_layer = self.per_layer_input().map_or(0, |p| 2 * h * p.size as u64 + h);
        let scalar = u64::from(self.gemma4.is_some());
        norms + per_layer + scalar
    }

    /// The feed-forward parameters of layer `l`; with `active`, only a token's experts.
    fn ffn_parameters(&self, l: usize, active: bool) -> u64 {
        if self.no_ffn_layers.contains(&l) {
            return 0;
        }
        let h = self.hidden_size as u64;
        // Matrices per MLP: gate, up and down, or (ReLU²) up and down.
        let mats = if self.activation.is_gated() { 3 } else { 2 };
        let dense = mats * h * self.layer_intermediate_size(l) as u64;
        match &self.moe {
            Some(moe) if moe.is_sparse(l) => {
                let experts = if active { moe.top_k } else { moe.num_experts } as u64;
                let gate = if moe.shared_expert_gated { h } else { 0 };
                let shared = moe.shared_expert_size.map_or(0, |s| mats * h * s as u64 + gate);
                let bias = moe.routing.has_expert_bias();
                let router = h * moe.num_experts as u64 + if bias { moe.num_experts as u64 } else { 0 };
                // Gemma 4 runs its dense MLP beside the experts, with three more norms and a
                // router that scales its input and each expert.
                let beside = if self.gemma4.is_some() { dense + 3 * h + h + moe.num_experts as u64 } else { 0 };
                experts * mats * h * moe.intermediate_size as u64 + router + shared + beside
            }
            _ => dense,
        }
    }
}
