//! The decoder-only transformer every supported architecture is an instance of:
//! embeddings -> N x (norm, attention, residual, norm, feed-forward, residual) -> norm -> head.
//! The feed-forward is a dense MLP or a mixture of experts; Gemma adds norms on both branches'
//! outputs ("sandwich" norms).

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{add, clip, divide, multiply};
use mlx_rs::{Array, Dtype};

use crate::model::cache::Positions;
use crate::model::cache::{AttentionMask, LayerCache};
use crate::model::cache::{KvCache, KvFootprint, KvFormat, KvTensor};
use crate::model::config::{ModelConfig, NormPlacement, QkNorm, QueryScale, RecurrentKind, RopeConfig};
use crate::model::error::Result;
use crate::model::layers::{
    Attention, CosSin, DeltaProjections, Embedding, GatedDeltaNet, GatedNorm, KeysValues, LatentAttention, LatentQuery,
    Linear, MRope, Mamba2, Mlp, MlpProjections, MoeBlock, MultiLinear, ParallelExperts, PerLayerGate, PerLayerInputs,
    QkvProjection, RmsNorm, Rope, ScaledRouter, SharedExpert, ShortConv, Sinks, SwitchGlu,
};
use crate::model::weights::Weights;

pub mod mtp;
mod stage;
mod sum_clock;
mod tensor_parallel;
use mtp::MtpHead;
pub use stage::Stage;
pub use sum_clock::SumClock;
use sum_clock::TensorShare;

pub enum FeedForward {
    Dense(Mlp),
    Experts(Box<MoeBlock>),
    /// Gemma 4's dense MLP and experts side by side (only with sandwich norms).
    DenseAndExperts(Box<ParallelExperts>),
    /// A layer that only mixes tokens (Nemotron-H's mixer block with no MLP block after it).
    None,
}

impl FeedForward {
    /// `h`: the residual stream; `pre_norm`: the norm before the feed-forward, if it has one.
    fn forward(&self, h: &Array, pre_norm: Option<&RmsNorm>) -> Result<Array> {
        let normed = || -> Result<Array> {
            match pre_norm {
                Some(norm) => norm.forward(h),
                None => Ok(h.clone()),
            }
        };
        match self {
            FeedForward::Dense(mlp) => mlp.forward(&normed()?),
            FeedForward::Experts(moe) => moe.forward(&normed()?),
            FeedForward::DenseAndExperts(both) => match pre_norm {
                Some(norm) => both.forward(h, norm),
                None => Err(crate::model::ModelError::Mlx("Gemma 4's experts need the norm before them".into())),
            },
            FeedForward::None => Err(crate::model::ModelError::Mlx("no feed-forward to run".into())),
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            FeedForward::Dense(mlp) => mlp.arrays(),
            FeedForward::Experts(moe) => moe.arrays(),
            FeedForward::DenseAndExperts(both) => both.arrays(),
            FeedForward::None => Vec::new(),
        }
    }
}

/// The norms on the branches' outputs: on the feed-forward's, and (Gemma) one before it; the
/// layer's `post_attention_layernorm` then normalises the attention output instead.
pub struct OutputNorms {
    /// Gemma's; OLMo 3's feed-forward takes the residual stream as it is.
    pre_feedforward: Option<RmsNorm>,
    post_feedforward: RmsNorm,
    /// Gemma's residual adds clip in f16; OLMo 3's are plain.
    clipped: bool,
}

/// How a layer mixes tokens: attention over its cached keys, or a recurrence over its state.
pub enum Mixer {
    Attention(Box<Attention>),
    /// Multi-head latent attention (DeepSeek-V3): its cache holds latents, never reused.
    Latent(Box<LatentAttention>),
    GatedDelta(Box<GatedDeltaNet>),
    ShortConv(Box<ShortConv>),
    Mamba2(Box<Mamba2>),
}

impl Mixer {
    fn arrays(&self) -> Vec<&Array> {
        match self {
            Mixer::Attention(a) => a.arrays(),
            Mixer::Latent(a) => a.arrays(),
            Mixer::GatedDelta(g) => g.arrays(),
            Mixer::ShortConv(s) => s.arrays(),
            Mixer::Mamba2(m) => m.arrays(),
        }
    }
}

pub struct DecoderLayer {
    /// `None` when only the branch outputs are normalised (OLMo 3).
    input_norm: Option<RmsNorm>,
    mixer: Mixer,
    /// Before the feed-forward (Llama), or on the attention output (with `output_norms`);
    /// `None` in a layer without a feed-forward.
    post_attention_norm: Option<RmsNorm>,
    output_norms: Option<OutputNorms>,
    feed_forward: FeedForward,
    /// Gemma 4: the layer's per-layer input gate, and a learned scale on its output.
    per_layer_gate: Option<PerLayerGate>,
    output_scale: Option<Array>,
    /// Granite: both branches' outputs scaled before the residual adds (in the compute dtype).
    residual_scale: Option<Array>,
}

/// What a layer reads besides the residual stream.
struct LayerInputs<'a> {
    mask: &'a crate::model::cache::AttentionMask,
    positions: &'a Positions,
    /// The step's explicit rotation (M-RoPE positions given), for every attention layer.
    rotation: Option<&'a CosSin>,
    query_scale: Option<&'a Array>,
    /// This layer's slice of Gemma 4's per-layer inputs.
    per_layer: Option<Array>,
    /// The ranks to sum each branch's output over (tensor parallel).
    tensor: Option<&'a TensorShare>,
}

impl DecoderLayer {
    /// A full-attention layer of the model's kind from the tensors under `prefix` (the
    /// multi-token-prediction head's): attention shaped as the model's full-attention layers,
    /// and the feed-forward its layer 0 has (as the reference numbers the head's layer).
    pub(crate) fn build_full_attention(
        c: &ModelConfig,
        prefix: &str,
        weights: &mut Weights,
        norm: &NormLoader,
    ) -> Result<DecoderLayer> {
        let hidden = c.hidden_size as i32;
        let full = (0..c.num_layers).find(|&i| !c.is_recurrent(i) && c.layer_window(i).is_none()).unwrap_or(0);
        Ok(DecoderLayer {
            input_norm: Some(norm(weights, &format!("{prefix}.input_layernorm"), hidden)?),
            mixer: Mixer::Attention(Box::new(attention(c, full, prefix, weights, norm)?)),
            post_attention_norm: Some(norm(weights, &format!("{prefix}.post_attention_layernorm"), hidden)?),
            output_norms: None,
            feed_forward: feed_forward(c, 0, prefix, weights, norm)?,
            per_layer_gate: None,
            output_scale: None,
            residual_scale: None,
        })
    }

    /// The layer run by itself over `h` with its own cache (an attention layer's mask and
    /// positions from that cache).
    pub(crate) fn forward_alone<C: LayerCache>(&self, h: &Array, cache: &mut C) -> Result<Array> {
        let positions = cache.positions()?;
        let mask = cache.mask(h.dim(1), None)?;
        let inputs = LayerInputs {
            mask: &mask,
            positions: &positions,
            rotation: None,
            query_scale: None,
            per_layer: None,
            tensor: None,
        };
        Ok(self.forward(h, inputs, cache, KeysValues::Own)?.0)
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut out: Vec<&Array> = self.input_norm.iter().map(|n| &n.weight).collect();
        out.extend(self.post_attention_norm.iter().map(|n| &n.weight));
        if let Some(n) = &self.output_norms {
            out.extend(n.pre_feedforward.iter().map(|n| &n.weight));
            out.push(&n.post_feedforward.weight);
        }
        out.extend(self.mixer.arrays());
        out.extend(self.feed_forward.arrays());
        out.extend(self.per_layer_gate.iter().flat_map(PerLayerGate::arrays));
        out.extend(&self.output_scale);
        out
    }

    /// The layer's output and the keys and values its attention used (none for a recurrence).
    fn forward<C: LayerCache>(
        &self,
        h: &Array,
        inputs: LayerInputs,
        cache: &mut C,
        kv: KeysValues,
    ) -> Result<(Array, Option<(KvTensor, KvTensor)>)> {
        let x = match &self.input_norm {
            Some(norm) => norm.forward(h)?,
            None => h.clone(),
        };
        let (r, kv) = match &self.mixer {
            Mixer::Attention(attention) => {
                let (r, kv) = attention.forward(
                    &x,
                    inputs.mask,
                    inputs.positions,
                    inputs.rotation,
                    inputs.query_scale,
                    cache,
                    kv,
                )?;
                (r, Some(kv))
            }
            Mixer::Latent(latent) => (latent.forward(&x, inputs.mask, inputs.positions, cache)?, None),
            Mixer::GatedDelta(delta) => (delta.forward(&x, cache)?, None),
            Mixer::ShortConv(conv) => (conv.forward(&x, cache)?, None),
            Mixer::Mamba2(mamba) => (mamba.forward(&x, cache)?, None),
        };
        let r = Self::summed(inputs.tensor, r)?;
        let scaled = |r: Array| -> Result<Array> {
            match &self.residual_scale {
                Some(scale) => Ok(multiply(&r, scale)?),
                None => Ok(r),
            }
        };
        let out = match (&self.output_norms, &self.post_attention_norm) {
            (_, None) => add(h, scaled(r)?)?,
            (None, Some(post_attention_norm)) => {
                let h1 = add(h, scaled(r)?)?;
                let r = Self::summed(inputs.tensor, self.feed_forward.forward(&h1, Some(post_attention_norm))?)?;
                add(&h1, scaled(r)?)?
            }
            (Some(norms), Some(post_attention_norm)) => {
                let add = |x: &Array, y: &Array| if norms.clipped { residual(x, y) } else { Ok(add(x, y)?) };
                let h1 = add(h, &post_attention_norm.forward(&r)?)?;
                let r = Self::summed(inputs.tensor, self.feed_forward.forward(&h1, norms.pre_feedforward.as_ref())?)?;
                add(&h1, &norms.post_feedforward.forward(&r)?)?
            }
        };
        let out = match (&self.per_layer_gate, &inputs.per_layer) {
            (Some(gate), Some(input)) => gate.forward(&out, input)?,
            _ => out,
        };
        let out = match &self.output_scale {
            Some(scale) => multiply(&out, scale)?,
            None => out,
        };
        Ok((out, kv))
    }
}

/// `x + y`; in float16 summed in f32 and clipped to the f16 range, as Gemma's reference does
/// (its activations outgrow f16).
fn residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::Float16 {
        return Ok(add(x, y)?);
    }
    let sum = add(x.as_dtype(Dtype::Float32)?, y.as_dtype(Dtype::Float32)?)?;
    Ok(clip(&sum, (-65504.0f32, 65504.0f32))?.as_dtype(Dtype::Float16)?)
}

pub struct Transformer {
    pub config: ModelConfig,
    /// The dtype activations are computed in.
    pub dtype: Dtype,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None` when the output head is the transposed embedding (tied weights).
    lm_head: Option<Linear>,
    /// Gemma multiplies the embeddings by sqrt(hidden) (as an array in the compute dtype).
    embed_scale: Option<Array>,
    per_layer_inputs: Option<PerLayerInputs>,
    /// The checkpoint's multi-token-prediction head, where it ships one.
    pub mtp: Option<MtpHead>,
    /// Multimodal rotary positions (Qwen-VL, Qwen3.5), used where a step gives them.
    mrope: Option<MRope>,
    /// Granite divides its logits by this.
    logits_scaling: Option<f32>,
    /// The part of the model this process holds, as one rank of a cluster (`None`: all of it).
    stage: Option<Stage>,
    /// The ranks this process shares every layer's heads and columns with (tensor parallel).
    tensor: Option<TensorShare>,
}

/// Image features placed in a step's input: at the positions `mask` marks (`[B, L, 1]`), the
/// input embeddings are `embeds` (`[B, L, hidden]`), and each of the first layers' outputs gains
/// its `deepstack` features (Qwen3-VL), the same shape.
pub struct ImageInputs {
    pub mask: Array,
    pub embeds: Array,
    pub deepstack: Vec<Array>,
    /// Where the family's image tokens also see their image's later tokens.
    pub later: Option<LaterImageTokens>,
}

/// For each query of the step, the step's later tokens of its image (`[B, 1, L, L]` bool), and
/// which layer kinds let it see them (Gemma 3: every layer; Gemma 4: the sliding ones).
pub struct LaterImageTokens {
    pub keys: Array,
    pub full: bool,
    pub sliding: bool,
}

/// What a forward may take besides token ids, for sequences with images.
#[derive(Default, Clone, Copy)]
pub struct StepInputs<'a> {
    pub images: Option<&'a ImageInputs>,
    /// M-RoPE's (time, row, column) positions of every token of the step, `[3, B, L]` int32.
    pub positions: Option<&'a Array>,
}

impl Transformer {
    /// Builds the model from tensors named in the Hugging Face layout
    /// (`model.layers.N.self_attn.q_proj`, ...).
    pub fn build(config: ModelConfig, weights: &mut Weights) -> Result<Transformer> {
        let c = &config;
        let hidden = c.hidden_size as i32;
        let eps = c.rms_norm_eps;

        let embed = weights.embedding("model.embed_tokens", c.vocab_size as i32, hidden)?;
        let norm = |weights: &mut Weights, name: &str, dim: i32| -> Result<RmsNorm> {
            let mut n = weights.norm(name, dim, eps)?;
            if c.norm_plus_one {
                n.weight = add(&n.weight, Array::from_f32(1.0))?;
            }
            Ok(n)
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}");
            let sandwich = c.norms == NormPlacement::Sandwich;
            let output_norms = match c.norms {
                NormPlacement::Pre => None,
                NormPlacement::Sandwich | NormPlacement::Post => Some(OutputNorms {
                    pre_feedforward: if sandwich {
                        Some(norm(weights, &format!("{p}.pre_feedforward_layernorm"), hidden)?)
                    } else {
                        None
                    },
                    post_feedforward: norm(weights, &format!("{p}.post_feedforward_layernorm"), hidden)?,
                    clipped: sandwich,
                }),
            };
            let input_norm = match c.norms {
                NormPlacement::Post => None,
                NormPlacement::Pre | NormPlacement::Sandwich => {
                    Some(norm(weights, &format!("{p}.input_layernorm"), hidden)?)
                }
            };
            let per_layer_gate = match c.gemma4.as_ref().and_then(|g| g.per_layer_input) {
                Some(pli) => Some(PerLayerGate {
                    gate: weights.linear(&format!("{p}.per_layer_input_gate"), pli.size as i32, hidden, false)?,
                    projection: weights.linear(&format!("{p}.per_layer_projection"), hidden, pli.size as i32, false)?,
                    norm: norm(weights, &format!("{p}.post_per_layer_input_norm"), hidden)?,
                }),
                None => None,
            };
            let output_scale = match c.gemma4 {
                Some(_) => Some(weights.take_float(&format!("{p}.layer_scalar"), &[1])?),
                None => None,
            };
            let recurrent = c.hybrid.as_ref().filter(|_| c.is_recurrent(i)).map(|h| h.kind);
            let mixer = if let Some(kind) = recurrent {
                match kind {
                    RecurrentKind::ShortConv { .. } => Mixer::ShortConv(Box::new(short_conv(c, i, weights)?)),
                    RecurrentKind::GatedDelta => Mixer::GatedDelta(Box::new(gated_delta(c, i, weights)?)),
                    RecurrentKind::Mamba2(_) => Mixer::Mamba2(Box::new(mamba2(c, i, weights)?)),
                }
            } else if c.mla.is_some() {
                Mixer::Latent(Box::new(latent_attention(c, i, &p, weights)?))
            } else {
                Mixer::Attention(Box::new(attention(c, i, &p, weights, &norm)?))
            };
            let post_attention_norm = if c.no_ffn_layers.contains(&i) {
                None
            } else {
                Some(norm(weights, &format!("{p}.post_attention_layernorm"), hidden)?)
            };
            let residual_scale =
                c.multipliers.map(|m| Array::from_f32(m.residual).as_dtype(weights.dtype)).transpose()?;
            layers.push(DecoderLayer {
                input_norm,
                mixer,
                post_attention_norm,
                output_norms,
                feed_forward: feed_forward(c, i, &p, weights, &norm)?,
                per_layer_gate,
                output_scale,
                residual_scale,
            });
        }
        let per_layer_inputs = match c.gemma4.as_ref().and_then(|g| g.per_layer_input) {
            Some(pli) => {
                let width = (c.num_layers * pli.size) as i32;
                Some(PerLayerInputs {
                    embed: weights.embedding("model.embed_tokens_per_layer", pli.vocab_size as i32, width)?,
                    projection: weights.linear("model.per_layer_model_projection", width, hidden, false)?,
                    projection_norm: norm(weights, "model.per_layer_projection_norm", pli.size as i32)?,
                    layers: c.num_layers as i32,
                    size: pli.size as i32,
                    embed_scale: (pli.size as f64).sqrt() as f32,
                    projection_scale: (c.hidden_size as f64).powf(-0.5) as f32,
                })
            }
            None => None,
        };
        let mtp = MtpHead::build(c, weights, &norm)?;
        let mrope = c.mrope.as_ref().map(|m| MRope::new(m, c.rope.theta, c.rope.dims)).transpose()?;
        let norm = norm(weights, "model.norm", hidden)?;
        let lm_head = if c.tie_word_embeddings || !weights.contains("lm_head.weight") {
            None
        } else {
            Some(weights.linear("lm_head", c.vocab_size as i32, hidden, false)?)
        };
        let dtype = weights.dtype;
        let embed_scale = match (&c.gemma, &c.gemma4, &c.multipliers) {
            (Some(g), _, _) => Some(Array::from_f32(g.embed_scale).as_dtype(dtype)?),
            (None, Some(_), _) => Some(Array::from_f32((c.hidden_size as f64).sqrt() as f32).as_dtype(dtype)?),
            (None, None, Some(m)) => Some(Array::from_f32(m.embedding).as_dtype(dtype)?),
            _ => None,
        };
        let logits_scaling = c.multipliers.map(|m| m.logits_scaling);
        Ok(Transformer {
            config,
            dtype,
            embed,
            layers,
            norm,
            lm_head,
            embed_scale,
            per_layer_inputs,
            mtp,
            mrope,
            logits_scaling,
            stage: None,
            tensor: None,
        })
    }

    /// Every array of the model (of a stage: its layers', and the ends' where it holds them).
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out: Vec<&Array> = self.layers.iter().flat_map(DecoderLayer::arrays).collect();
        if self.stage.as_ref().is_none_or(|s| s.ends) {
            // The MTP head among them: listed once, so its bytes are counted once.
            out.extend(self.end_arrays());
        }
        out
    }

    /// The arrays outside the layers: embeddings, final norm, output head, per-layer inputs.
    fn end_arrays(&self) -> Vec<&Array> {
        let mut out = self.embed.arrays();
        out.extend(self.per_layer_inputs.iter().flat_map(PerLayerInputs::arrays));
        out.push(&self.norm.weight);
        out.extend(self.lm_head.iter().flat_map(Linear::arrays));
        out.extend(self.mrope.iter().flat_map(MRope::arrays));
        // The MTP head drafts where the model samples.
        out.extend(self.mtp.iter().flat_map(MtpHead::arrays));
        out
    }

    /// Reads every weight into memory now (MLX loads lazily), so load errors surface at load
    /// time and the first request does not pay for the I/O. Returns the bytes they take.
    pub fn materialize(&self) -> Result<usize> {
        let arrays = self.arrays();
        mlx_rs::transforms::eval(arrays.iter().copied())?;
        Ok(arrays.iter().map(|a| a.nbytes()).sum())
    }

    /// Key/value cache bytes per token of one sequence in what this process holds (every layer,
    /// a pipeline stage's layers, or its share of every layer's heads): the bytes its caches
    /// and its prefix cache take, so that budgets and reservations count in one unit.
    pub fn kv_bytes_per_token(&self) -> usize {
        let (part, whole) = self.held_part();
        self.config.kv_elements_per_token() * self.dtype_bytes() * part / whole
    }

    /// The part of the model's per-token keys and values this process holds, `(part, whole)`
    /// in elements per token. A stage holding none (recurrent layers only) counts as the whole:
    /// rank 0 must still count tokens, for the other ranks' room in tokens to bound what it admits.
    fn held_part(&self) -> (usize, usize) {
        let whole = self.config.kv_elements_per_token();
        let layers = self.stage().map_or(0..self.config.num_layers, |s| s.layers.clone());
        let part = match self.config.kv_elements_per_token_in(layers) {
            0 => whole,
            part => part,
        };
        (part, whole.max(1) * self.tensor_share().map_or(1, |(_, ranks)| ranks))
    }

    /// Key/value cache bytes per token of one sequence in the MTP head's layer (0 without one).
    pub fn mtp_kv_bytes_per_token(&self) -> usize {
        self.mtp.as_ref().map_or(0, |h| h.kv_elements_per_token() * self.dtype_bytes())
    }

    /// What a sequence's key/value caches take (windowed layers hold a bounded number), in
    /// what this process holds.
    pub fn kv_footprint(&self) -> KvFootprint {
        self.kv_footprint_in(KvFormat::FULL)
    }

    /// [`Self::kv_footprint`] with keys and values stored in `format`: the whole model's shape
    /// (how its layers' keys and values grow with a sequence, which is what the other ranks of
    /// a cluster hold too) scaled to the part this process holds.
    pub fn kv_footprint_in(&self, format: KvFormat) -> KvFootprint {
        let (part, whole) = self.held_part();
        self.config.kv_footprint_in(self.dtype_bytes(), format).scaled(part, whole)
    }

    /// The window of each cache's layer (`None`: it sees the whole sequence).
    pub fn cache_windows(&self) -> Vec<Option<usize>> {
        let first = self.first_layer();
        (0..self.cache_count()).map(|i| self.config.layer_window(first + i)).collect()
    }

    /// Bytes of one value in the compute dtype.
    pub fn dtype_bytes(&self) -> usize {
        if self.dtype == Dtype::Float32 {
            4
        } else {
            2
        }
    }

    /// One cache per layer that keeps one (Gemma 4's KV-shared layers use an earlier layer's).
    pub fn new_cache(&self) -> Vec<KvCache> {
        self.new_cache_in(KvFormat::FULL)
    }

    /// Empty caches storing keys and values in `format`.
    pub fn new_cache_in(&self, format: KvFormat) -> Vec<KvCache> {
        (0..self.cache_count()).map(|_| KvCache::with_format(format)).collect()
    }

    /// Hidden states after the final norm, `[B, L, hidden]`, for token ids `[B, L]` that follow
    /// what `cache` holds (one cache per layer that keeps one, all with the same layout).
    pub fn forward_hidden<C: LayerCache>(&self, ids: &Array, cache: &mut [C]) -> Result<Array> {
        self.forward_hidden_with(ids, cache, StepInputs::default())
    }

    /// [`Self::forward_hidden`] with images in the input and, where given, M-RoPE positions.
    pub fn forward_hidden_with<C: LayerCache>(&self, ids: &Array, cache: &mut [C], step: StepInputs) -> Result<Array> {
        let mut h = self.embed_tokens(ids)?;
        if let Some(images) = step.images {
            h = mlx_rs::ops::select(&images.mask, images.embeds.as_dtype(h.dtype())?, &h)?;
        }
        let rotation = match (step.positions, &self.mrope) {
            (Some(p), Some(mrope)) => Some(mrope.cos_sin(p, h.dtype())?),
            (Some(_), None) => {
                return Err(crate::model::ModelError::Mlx("M-RoPE positions for a model without M-RoPE".into()))
            }
            (None, _) => None,
        };
        // Gemma 4's per-layer inputs read image tokens as padding (id 0), as its reference.
        let per_layer = match (&self.per_layer_inputs, step.images) {
            (Some(p), Some(images)) => {
                let text_ids = mlx_rs::ops::select(&images.mask.squeeze_axes(&[-1])?, Array::from_int(0), ids)?;
                Some(p.forward(&text_ids.as_dtype(ids.dtype())?, &h)?)
            }
            (Some(p), None) => Some(p.forward(ids, &h)?),
            (None, _) => None,
        };
        let h = self.run_layers(h, cache, step, rotation.as_ref(), per_layer.as_ref())?;
        self.norm.forward(&h)
    }

    /// The layers this model holds (all, or a pipeline stage's) over the residual stream `h`
    /// (`[B, L, hidden]`), one cache per layer.
    fn run_layers<C: LayerCache>(
        &self,
        mut h: Array,
        cache: &mut [C],
        step: StepInputs,
        rotation: Option<&CosSin>,
        per_layer: Option<&Array>,
    ) -> Result<Array> {
        let len = h.dim(1);
        // Layer indices are the model's (a stage's first layer need not be 0); caches are this
        // model's own, one per layer it holds.
        let first_layer = self.first_layer();
        // Windowed layers let go of what no new token can see; all of them hold the same
        // columns, as do all full layers, so each kind's first cache gives the kind's mask.
        let window = |slot: usize| self.config.layer_window(first_layer + slot);
        for (slot, layer_cache) in cache.iter_mut().enumerate() {
            if let Some(w) = window(slot) {
                layer_cache.drop_outside(w)?;
            }
        }
        let first = cache.first().ok_or_else(|| crate::model::ModelError::Mlx("no cache".into()))?;
        let first_of = |local: bool| cache.iter().enumerate().find(|(s, _)| window(*s).is_some() == local);
        let positions = first.positions()?;
        let full_mask = first_of(false).map_or(first, |(_, c)| c).mask(len, None)?;
        let window_mask = match (self.config.sliding_window, first_of(true)) {
            (Some(w), Some((_, c))) => Some(c.mask(len, Some(w))?),
            _ => None,
        };
        let later = step.images.and_then(|images| images.later.as_ref());
        let see_later = |mask: AttentionMask, applies: bool| match later {
            Some(l) if applies => AttentionMask::WithLaterKeys { base: Box::new(mask), later: l.keys.clone() },
            _ => mask,
        };
        let full_mask = see_later(full_mask, later.is_some_and(|l| l.full));
        let window_mask = window_mask.map(|m| see_later(m, later.is_some_and(|l| l.sliding)));
        let query_scale = self.config.query_scale.map(|s| position_scale(s, &positions, len, h.dtype())).transpose()?;
        // Keys and values of this step by cache, for layers that reuse another's (Gemma 4).
        let reusing = self.config.kv_cache_layers() < self.layers.len();
        let mut produced: Vec<Option<(KvTensor, KvTensor)>> = vec![None; cache.len()];
        for (local, layer) in self.layers.iter().enumerate() {
            let i = first_layer + local;
            let mask = match (&window_mask, self.config.layer_window(i)) {
                (Some(m), Some(_)) => m,
                _ => &full_mask,
            };
            let inputs = LayerInputs {
                mask,
                positions: &positions,
                rotation,
                query_scale: query_scale.as_ref(),
                per_layer: per_layer.map(|p| p.index((.., .., i as i32, ..))),
                tensor: self.tensor.as_ref(),
            };
            // A stage never holds a layer that reuses another's cache (`stage_refusal`).
            let source = self.config.layer_attention(i).kv_source;
            let slot = source.unwrap_or(local);
            let layer_cache = cache
                .get_mut(slot)
                .ok_or_else(|| crate::model::ModelError::Mlx(format!("no cache for layer {slot}")))?;
            let (out, kv) = match source {
                Some(s) => {
                    let kv = produced[s].clone().ok_or_else(|| {
                        crate::model::ModelError::Mlx(format!("layer {i} reuses layer {s}, which ran no attention"))
                    })?;
                    layer.forward(&h, inputs, layer_cache, KeysValues::Reused(&kv))?
                }
                None => layer.forward(&h, inputs, layer_cache, KeysValues::Own)?,
            };
            h = match step.images.and_then(|images| images.deepstack.get(i).map(|d| (images, d))) {
                Some((images, deep)) => {
                    mlx_rs::ops::select(&images.mask, add(&out, deep.as_dtype(out.dtype())?)?, &out)?
                }
                None => out,
            };
            if reusing {
                produced[slot] = kv;
            }
        }
        Ok(h)
    }

    /// The input embeddings of token ids `[B, L]` (scaled where the family scales them).
    pub fn embed_tokens(&self, ids: &Array) -> Result<Array> {
        let h = self.embed.forward(ids)?;
        match &self.embed_scale {
            Some(scale) => Ok(multiply(&h, scale)?),
            None => Ok(h),
        }
    }

    /// Replaces the factor the embeddings are scaled by, where the family scales them (the
    /// embedding checkpoints of Gemma keep sqrt(hidden) exact, the chat ones round it to bf16).
    pub fn set_embed_scale(&mut self, scale: f32) -> Result<()> {
        if self.embed_scale.is_some() {
            self.embed_scale = Some(Array::from_f32(scale).as_dtype(self.dtype)?);
        }
        Ok(())
    }

    /// Logits over the vocabulary for hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Array) -> Result<Array> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(hidden)?,
            None => self.embed.as_linear(hidden)?,
        };
        if let Some(scaling) = self.logits_scaling {
            return Ok(divide(&logits, Array::from_f32(scaling).as_dtype(logits.dtype())?)?);
        }
        match self.config.gemma4.as_ref().and_then(|g| g.final_logit_softcap) {
            Some(cap) => soft_cap(&logits, cap),
            None => Ok(logits),
        }
    }

    /// Logits `[B, L, vocab]` for every position of `ids`.
    pub fn forward<C: LayerCache>(&self, ids: &Array, cache: &mut [C]) -> Result<Array> {
        let hidden = self.forward_hidden(ids, cache)?;
        self.logits(&hidden)
    }

    /// [`Self::forward`] with a step's images and positions.
    pub fn forward_with<C: LayerCache>(&self, ids: &Array, cache: &mut [C], step: StepInputs) -> Result<Array> {
        let hidden = self.forward_hidden_with(ids, cache, step)?;
        self.logits(&hidden)
    }

    /// Whether the model takes M-RoPE positions (a Qwen-VL or Qwen3.5 text model).
    pub fn has_mrope(&self) -> bool {
        self.mrope.is_some()
    }
}

/// Layer `i`'s rotary settings: sliding-window layers may have their own (Gemma 3's base,
/// OLMo 3's unscaled positions); Gemma 4's layers of each kind have theirs.
fn layer_rope(c: &ModelConfig, i: usize) -> RopeConfig {
    let local = c.layer_window(i).is_some();
    match (&c.sliding_rope, &c.gemma4) {
        (Some(rope), _) if local => rope.clone(),
        (_, Some(g)) if local => g.local_rope.clone(),
        (_, Some(g)) => g.global_rope.clone(),
        _ => c.rope.clone(),
    }
}

pub(crate) type NormLoader<'a> = dyn Fn(&mut Weights, &str, i32) -> Result<RmsNorm> + 'a;

/// Layer `i`'s attention, in the shape the config gives that layer, from the tensors under
/// `layer` (`model.layers.{i}` but for the multi-token-prediction head's).
fn attention(c: &ModelConfig, i: usize, layer: &str, weights: &mut Weights, norm: &NormLoader) -> Result<Attention> {
    let p = format!("{layer}.self_attn");
    let shape = c.layer_attention(i);
    let hidden = c.hidden_size as i32;
    let (head_dim, kv_heads) = (shape.head_dim as i32, shape.kv_heads as i32);
    let (q_dim, kv_dim) = (c.num_heads as i32 * head_dim, kv_heads * head_dim);
    let linear =
        |weights: &mut Weights, name: &str, rows: i32| weights.linear(&format!("{p}.{name}"), rows, hidden, c.qkv_bias);
    let qkv = if c.fused_projections {
        QkvProjection::Fused(linear(weights, "qkv_proj", q_dim + 2 * kv_dim)?)
    } else if shape.kv_source.is_some() {
        QkvProjection::QueryOnly(linear(weights, "q_proj", q_dim)?)
    } else if shape.keys_as_values {
        QkvProjection::KeysAsValues { q: linear(weights, "q_proj", q_dim)?, k: linear(weights, "k_proj", kv_dim)? }
    } else {
        // The hybrids' queries come with a gate per head.
        let q_rows = if gated_attention(c) { 2 * q_dim } else { q_dim };
        QkvProjection::Separate {
            q: linear(weights, "q_proj", q_rows)?,
            k: linear(weights, "k_proj", kv_dim)?,
            v: linear(weights, "v_proj", kv_dim)?,
        }
    };
    let whole = c.qk_norm == Some(QkNorm::Whole);
    let (q_width, k_width) = if whole { (q_dim, kv_dim) } else { (head_dim, head_dim) };
    let q_norm = if c.qk_norm.is_some() { Some(norm(weights, &format!("{p}.q_norm"), q_width)?) } else { None };
    let k_norm = if c.qk_norm.is_some() && shape.kv_source.is_none() {
        Some(norm(weights, &format!("{p}.k_norm"), k_width)?)
    } else {
        None
    };
    Ok(Attention {
        qkv,
        o: weights.linear(&format!("{p}.o_proj"), hidden, q_dim, c.o_bias)?,
        q_norm,
        k_norm,
        whole_qk_norm: whole,
        v_norm: c.gemma4.as_ref().map(|_| c.rms_norm_eps),
        rope: if c.nope_layers.contains(&i) {
            None
        } else {
            Some(Rope::new(&layer_rope(c, i), c.max_position_embeddings)?)
        },
        num_heads: c.num_heads as i32,
        num_kv_heads: kv_heads,
        head_dim,
        scale: c.attention_scale.unwrap_or((head_dim as f32).powf(-0.5)),
        sinks: if c.attention_sinks {
            Some(Sinks::new(weights.take_float(&format!("{p}.sinks"), &[c.num_heads as i32])?)?)
        } else {
            None
        },
        output_gate: gated_attention(c),
    })
}

/// Layer `i`'s multi-head latent attention, from the tensors under `layer`.
fn latent_attention(c: &ModelConfig, i: usize, layer: &str, weights: &mut Weights) -> Result<LatentAttention> {
    let m = c.mla.ok_or_else(|| crate::model::ModelError::Mlx("not a latent-attention model".into()))?;
    let p = format!("{layer}.self_attn");
    let hidden = c.hidden_size as i32;
    let heads = c.num_heads as i32;
    let (rank, nope, rope, value) = (m.kv_lora_rank as i32, m.nope_dim as i32, m.rope_dim as i32, m.value_dim as i32);
    let query = match m.q_lora_rank {
        Some(q) => LatentQuery::LowRank {
            a: weights.linear(&format!("{p}.q_a_proj"), q as i32, hidden, c.qkv_bias)?,
            norm: weights.norm(&format!("{p}.q_a_layernorm"), q as i32, m.lora_eps)?,
            b: weights.linear(&format!("{p}.q_b_proj"), heads * (nope + rope), q as i32, false)?,
        },
        None => LatentQuery::Direct(weights.linear(&format!("{p}.q_proj"), heads * (nope + rope), hidden, false)?),
    };
    let multi = |weights: &mut Weights, name: &str, outputs: i32, inputs: i32| -> Result<MultiLinear> {
        Ok(MultiLinear(weights.switch_linear(&format!("{p}.{name}"), heads, outputs, inputs, false)?.matrix))
    };
    Ok(LatentAttention {
        query,
        kv_a: weights.linear(&format!("{p}.kv_a_proj_with_mqa"), rank + rope, hidden, c.qkv_bias)?,
        kv_norm: weights.norm(&format!("{p}.kv_a_layernorm"), rank, m.lora_eps)?,
        embed_q: multi(weights, "embed_q", rank, nope)?,
        unembed_out: multi(weights, "unembed_out", value, rank)?,
        o: weights.linear(&format!("{p}.o_proj"), hidden, heads * value, c.o_bias)?,
        rope: Rope::new(&layer_rope(c, i), c.max_position_embeddings)?,
        heads,
        nope_dim: nope,
        rope_dim: rope,
        rank,
        scale: c.attention_scale.unwrap_or((c.head_dim as f32).powf(-0.5)),
    })
}

/// Whether the attention layers gate their output (Qwen3-Next's and Qwen3.5's).
fn gated_attention(c: &ModelConfig) -> bool {
    c.hybrid.as_ref().is_some_and(crate::model::config::HybridStyle::gated_attention)
}

/// Layer `i`'s short convolution (LFM2's stateful layers).
fn short_conv(c: &ModelConfig, i: usize, weights: &mut Weights) -> Result<ShortConv> {
    let h = c.hybrid.as_ref().ok_or_else(|| crate::model::ModelError::Mlx("not a hybrid model".into()))?;
    let crate::model::config::RecurrentKind::ShortConv { channels, bias } = h.kind else {
        return Err(crate::model::ModelError::Mlx("not a short-convolution model".into()));
    };
    let p = format!("model.layers.{i}.conv");
    let (hidden, channels) = (c.hidden_size as i32, channels as i32);
    Ok(ShortConv {
        in_proj: weights.linear(&format!("{p}.in_proj"), 3 * channels, hidden, bias)?,
        conv: weights.take_float(&format!("{p}.conv.weight"), &[channels, h.conv_kernel as i32, 1])?,
        conv_bias: if bias { Some(weights.take_float(&format!("{p}.conv.bias"), &[channels])?) } else { None },
        out: weights.linear(&format!("{p}.out_proj"), hidden, channels, bias)?,
        kernel: h.conv_kernel as i32,
    })
}

/// Layer `i`'s Gated DeltaNet (a hybrid's linear-attention layer).
fn gated_delta(c: &ModelConfig, i: usize, weights: &mut Weights) -> Result<GatedDeltaNet> {
    let h = c.hybrid.as_ref().ok_or_else(|| crate::model::ModelError::Mlx("not a hybrid model".into()))?;
    let p = format!("model.layers.{i}.linear_attn");
    let hidden = c.hidden_size as i32;
    let (nk, nv, dk, dv) = (h.key_heads as i32, h.value_heads as i32, h.key_dim as i32, h.value_dim as i32);
    let channels = h.conv_channels() as i32;
    let linear =
        |weights: &mut Weights, name: &str, rows: i32| weights.linear(&format!("{p}.{name}"), rows, hidden, false);
    let projections = if h.grouped_projections {
        DeltaProjections::Grouped {
            qkvz: linear(weights, "in_proj_qkvz", channels + nv * dv)?,
            ba: linear(weights, "in_proj_ba", 2 * nv)?,
        }
    } else {
        DeltaProjections::Separate {
            qkv: linear(weights, "in_proj_qkv", channels)?,
            z: linear(weights, "in_proj_z", nv * dv)?,
            b: linear(weights, "in_proj_b", nv)?,
            a: linear(weights, "in_proj_a", nv)?,
        }
    };
    Ok(GatedDeltaNet {
        projections,
        conv: weights.take_float(&format!("{p}.conv1d.weight"), &[channels, h.conv_kernel as i32, 1])?,
        dt_bias: weights.take_float(&format!("{p}.dt_bias"), &[nv])?,
        a_log: weights.take_f32(&format!("{p}.A_log"), &[nv])?,
        norm: weights.norm(&format!("{p}.norm"), dv, c.rms_norm_eps)?,
        out: weights.linear(&format!("{p}.out_proj"), hidden, nv * dv, false)?,
        key_heads: nk,
        value_heads: nv,
        key_dim: dk,
        value_dim: dv,
        kernel: h.conv_kernel as i32,
    })
}

/// Layer `i`'s Mamba-2 mixer (Granite 4.0-H's and Nemotron-H's stateful layers).
fn mamba2(c: &ModelConfig, i: usize, weights: &mut Weights) -> Result<Mamba2> {
    let h = c.hybrid.as_ref().ok_or_else(|| crate::model::ModelError::Mlx("not a hybrid model".into()))?;
    let RecurrentKind::Mamba2(m) = h.kind else {
        return Err(crate::model::ModelError::Mlx("not a Mamba-2 model".into()));
    };
    let p = format!("model.layers.{i}.mamba");
    let hidden = c.hidden_size as i32;
    let (groups, state, heads, head_dim) =
        (h.key_heads as i32, h.key_dim as i32, h.value_heads as i32, h.value_dim as i32);
    let (width, channels, kernel) = (heads * head_dim, h.conv_channels() as i32, h.conv_kernel as i32);
    let weight = weights.take_float(&format!("{p}.norm.weight"), &[width])?;
    let norm = if m.grouped_norm {
        GatedNorm::Grouped { weight, eps: m.norm_eps, groups }
    } else {
        GatedNorm::Whole { weight, eps: m.norm_eps }
    };
    Ok(Mamba2 {
        in_proj: weights.linear(&format!("{p}.in_proj"), width + channels + heads, hidden, m.proj_bias)?,
        conv: weights.take_float(&format!("{p}.conv1d.weight"), &[channels, kernel, 1])?,
        conv_bias: if m.conv_bias { Some(weights.take_float(&format!("{p}.conv1d.bias"), &[channels])?) } else { None },
        dt_bias: weights.take_stored(&format!("{p}.dt_bias"), &[heads])?,
        a_log: weights.take_stored(&format!("{p}.A_log"), &[heads])?,
        d: weights.take_stored(&format!("{p}.D"), &[heads])?,
        norm,
        out_proj: weights.linear(&format!("{p}.out_proj"), hidden, width, m.proj_bias)?,
        heads,
        head_dim,
        state,
        groups,
        kernel,
        dt_limit: m.dt_limit,
    })
}

/// Layer `i`'s feed-forward (from the tensors under `layer`): experts where the config puts
/// them, else a dense MLP.
fn feed_forward(
    c: &ModelConfig,
    i: usize,
    layer: &str,
    weights: &mut Weights,
    norm: &NormLoader,
) -> Result<FeedForward> {
    if c.no_ffn_layers.contains(&i) {
        return Ok(FeedForward::None);
    }
    let p = format!("{layer}.mlp");
    let hidden = c.hidden_size as i32;
    let dense = |weights: &mut Weights, p: &str, inter: i32| -> Result<Mlp> {
        let projections = if !c.activation.is_gated() {
            MlpProjections::Ungated {
                up: weights.linear(&format!("{p}.up_proj"), inter, hidden, c.mlp_bias)?,
                down: weights.linear(&format!("{p}.down_proj"), hidden, inter, c.mlp_bias)?,
            }
        } else if c.fused_projections {
            MlpProjections::Fused {
                gate_up: weights.linear(&format!("{p}.gate_up_proj"), 2 * inter, hidden, false)?,
                down: weights.linear(&format!("{p}.down_proj"), hidden, inter, false)?,
            }
        } else {
            MlpProjections::Separate {
                gate: weights.linear(&format!("{p}.gate_proj"), inter, hidden, c.mlp_bias)?,
                up: weights.linear(&format!("{p}.up_proj"), inter, hidden, c.mlp_bias)?,
                down: weights.linear(&format!("{p}.down_proj"), hidden, inter, c.mlp_bias)?,
            }
        };
        Ok(Mlp { projections, activation: c.activation })
    };
    let Some(moe) = c.moe.as_ref().filter(|m| m.is_sparse(i)) else {
        return Ok(FeedForward::Dense(dense(weights, &p, c.layer_intermediate_size(i) as i32)?));
    };
    let (n, inter) = (moe.num_experts as i32, moe.intermediate_size as i32);
    if c.gemma4.is_some() {
        let l = layer;
        let e = format!("{l}.experts.switch_glu");
        let scale = weights.take_float(&format!("{l}.router.scale"), &[hidden])?;
        return Ok(FeedForward::DenseAndExperts(Box::new(ParallelExperts {
            mlp: dense(weights, &p, c.layer_intermediate_size(i) as i32)?,
            post_mlp_norm: norm(weights, &format!("{l}.post_feedforward_layernorm_1"), hidden)?,
            router: ScaledRouter {
                proj: weights.linear(&format!("{l}.router.proj"), n, hidden, false)?,
                scale: multiply(
                    &scale,
                    Array::from_f32((c.hidden_size as f64).powf(-0.5) as f32).as_dtype(scale.dtype())?,
                )?,
                per_expert_scale: weights.take_float(&format!("{l}.router.per_expert_scale"), &[n])?,
                eps: c.rms_norm_eps,
                top_k: moe.top_k as i32,
            },
            pre_experts_norm: norm(weights, &format!("{l}.pre_feedforward_layernorm_2"), hidden)?,
            experts: SwitchGlu {
                gate: Some(weights.switch_linear(&format!("{e}.gate_proj"), n, inter, hidden, false)?),
                up: weights.switch_linear(&format!("{e}.up_proj"), n, inter, hidden, false)?,
                down: weights.switch_linear(&format!("{e}.down_proj"), n, hidden, inter, false)?,
                activation: c.activation,
            },
            post_experts_norm: norm(weights, &format!("{l}.post_feedforward_layernorm_2"), hidden)?,
        })));
    }
    weights.stack_experts(&p, moe.num_experts)?;
    let b = moe.biases;
    let experts = SwitchGlu {
        gate: if c.activation.is_gated() {
            Some(weights.switch_linear(&format!("{p}.switch_mlp.gate_proj"), n, inter, hidden, b)?)
        } else {
            None
        },
        up: weights.switch_linear(&format!("{p}.switch_mlp.up_proj"), n, inter, hidden, b)?,
        down: weights.switch_linear(&format!("{p}.switch_mlp.down_proj"), n, hidden, inter, b)?,
        activation: c.activation,
    };
    let shared = match moe.shared_expert_size {
        Some(size) if moe.shared_expert_gated => Some(SharedExpert {
            mlp: dense(weights, &format!("{p}.shared_expert"), size as i32)?,
            gate: Some(weights.linear(&format!("{p}.shared_expert_gate"), 1, hidden, false)?),
        }),
        Some(size) => {
            Some(SharedExpert { mlp: dense(weights, &format!("{p}.shared_experts"), size as i32)?, gate: None })
        }
        None => None,
    };
    Ok(FeedForward::Experts(Box::new(MoeBlock {
        router: weights.linear(&format!("{p}.gate"), n, hidden, moe.biases)?,
        experts,
        top_k: moe.top_k as i32,
        routing: moe.routing,
        shared,
        expert_bias: if moe.routing.has_expert_bias() {
            Some(weights.take_f32(&format!("{p}.expert_bias"), &[n])?)
        } else {
            None
        },
    })))
}

/// `cap * tanh(x / cap)`, with `cap` in `x`'s dtype.
fn soft_cap(x: &Array, cap: f32) -> Result<Array> {
    let cap = Array::from_f32(cap).as_dtype(x.dtype())?;
    Ok(multiply(mlx_rs::ops::tanh(divide(x, &cap)?)?, &cap)?)
}

/// Ministral 3's query multiplier for `len` new tokens at `positions`: `[L, 1]` for one offset,
/// `[B, 1, L, 1]` for a batch's rows.
fn position_scale(scale: QueryScale, positions: &Positions, len: i32, dtype: Dtype) -> Result<Array> {
    let steps = Array::arange::<i32, f32>(0, len, 1)?;
    let at = match positions {
        Positions::Scalar(offset) => add(&steps, Array::from_f32(*offset as f32))?.reshape(&[len, 1])?,
        Positions::Rows { offsets, .. } => {
            let rows = offsets.dim(0);
            add(&offsets.as_dtype(Dtype::Float32)?.reshape(&[rows, 1])?, &steps)?.reshape(&[rows, 1, len, 1])?
        }
    };
    let windows = mlx_rs::ops::floor(divide(&at, Array::from_f32(scale.original_max_position_embeddings as f32))?)?;
    let factor = add(
        multiply(mlx_rs::ops::log(add(&windows, Array::from_f32(1.0))?)?, Array::from_f32(scale.beta))?,
        Array::from_f32(1.0),
    )?;
    Ok(factor.as_dtype(dtype)?)
}
