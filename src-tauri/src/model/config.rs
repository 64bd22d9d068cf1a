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
}

impl Arch {
    pub const ALL: [Arch; 5] = [Arch::Llama, Arch::Mistral, Arch::Qwen2, Arch::Qwen3, Arch::Phi3];

    pub fn from_model_type(model_type: &str) -> Option<Arch> {
        Some(match model_type {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "phi3" => Arch::Phi3,
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
    /// Phi-3's "longrope"/"su": per-dimension factors plus a magnitude scale.
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        short_mscale: Option<f32>,
        long_mscale: Option<f32>,
    },
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

/// Affine quantization of a linear layer's weights, as MLX stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct QuantSpec {
    pub group_size: i32,
    pub bits: i32,
}

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
    /// RMS norm on each head of q and k before rotary (Qwen3).
    pub qk_norm: bool,
    /// q/k/v in one `qkv_proj` and gate/up in one `gate_up_proj` (Phi-3).
    pub fused_projections: bool,
}

impl ModelConfig {
    /// The attention window of layer `i`, if it has one.
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        let sliding = self.sliding_layers.get(i).copied().unwrap_or(self.sliding_layers.is_empty());
        self.sliding_window.filter(|_| sliding)
    }

    /// A rough parameter count (embedding + layers), for listings and memory estimates.
    pub fn parameter_count(&self) -> u64 {
        let (h, i, v) = (self.hidden_size as u64, self.intermediate_size as u64, self.vocab_size as u64);
        let q = (self.num_heads * self.head_dim) as u64;
        let kv = (self.num_kv_heads * self.head_dim) as u64;
        let per_layer = h * q * 2 + h * kv * 2 + 3 * h * i + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + head + per_layer * self.num_layers as u64 + h
    }
}
