//! The published `config.json` of the real models each family stands for (tests/data/configs,
//! see SOURCES.md there) read into the right configuration, and their parameter counts (what
//! the inspector's memory estimate rests on) equal to a count by hand and close to the
//! published totals.

use fastmlx::model::arch::{self, HfConfig};
use fastmlx::model::config::{Activation, Arch, NormPlacement, QkNorm, Routing};
use fastmlx::model::{KvFootprint, ModelConfig};

fn config(file: &str) -> ModelConfig {
    let path = format!("{}/tests/data/configs/{file}", env!("CARGO_MANIFEST_DIR"));
    let raw: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let text = arch::text_config(&raw);
    let model_type = text["model_type"].as_str().unwrap();
    let arch = Arch::from_model_type(model_type).unwrap_or_else(|| panic!("{file}: {model_type} not supported"));
    let hf: HfConfig = serde_json::from_value(text).unwrap_or_else(|e| panic!("{file}: {e}"));
    arch::model_config(arch, &hf).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Parameters of a llama-style layer stack, counted by hand: embeddings (and an untied head),
/// per layer q/k/v/o, the feed-forward `ffn` and the `norms` (two or four of the hidden size,
/// plus q/k norms of the head size).
struct Count {
    vocab: u64,
    hidden: u64,
    layers: u64,
    q_dim: u64,
    kv_dim: u64,
    ffn: u64,
    norms: u64,
    tied: bool,
}

impl Count {
    fn total(&self) -> u64 {
        let attention = 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim;
        let head = if self.tied { 0 } else { self.vocab * self.hidden };
        self.vocab * self.hidden + head + self.layers * (attention + self.ffn + self.norms) + self.hidden
    }
}

/// Within 1.5% of a published total (given to three figures).
fn assert_close(got: u64, published: f64, what: &str) {
    assert_within(got, published, 0.015, what);
}

fn assert_within(got: u64, published: f64, tolerance: f64, what: &str) {
    let ratio = got as f64 / published;
    assert!((ratio - 1.0).abs() < tolerance, "{what}: {got} parameters vs published {published:e}");
}

#[test]
fn qwen3_moe_configs() {
    for (file, inter, total, active) in
        [("qwen3-30b-a3b.json", 768, 30.5e9, 3.3e9), ("qwen3-coder-30b-a3b-instruct.json", 768, 30.5e9, 3.3e9)]
    {
        let c = config(file);
        assert_eq!(c.arch, Arch::Qwen3Moe);
        assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (48, 32, 4, 128), "{file}");
        assert!(c.qk_norm.is_some() && !c.qkv_bias && !c.tie_word_embeddings, "{file}");
        let moe = c.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size), (128, 8, inter), "{file}");
        assert_eq!(moe.routing, Routing::SoftmaxThenTopK { normalize: true });
        assert!((0..48).all(|l| moe.is_sparse(l)) && moe.shared_expert_size.is_none());
        // By hand: 128 experts of 3 x 2048 x 768, a 2048 x 128 router, two norms and the q/k
        // norms (2 x 128) per layer.
        let ffn = 128 * 3 * 2048 * 768 + 2048 * 128;
        let hand = Count {
            vocab: 151_936,
            hidden: 2048,
            layers: 48,
            q_dim: 4096,
            kv_dim: 512,
            ffn,
            norms: 2 * 2048 + 2 * 128,
            tied: false,
        };
        assert_eq!(c.parameter_count(), hand.total(), "{file}");
        assert_close(c.parameter_count(), total, file);
        let active_count = 2 * 151_936 * 2048 + 48 * c.active_linear_macs();
        // ("3.3B activated" is rounded: 3.35B by this count.)
        assert_within(active_count, active, 0.03, file);
    }
    let c = config("qwen3-235b-a22b.json");
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((c.num_layers, moe.num_experts, moe.top_k, moe.intermediate_size), (94, 128, 8, 1536));
    assert_close(c.parameter_count(), 235.1e9, "Qwen3-235B-A22B");
    assert_within(2 * 151_936 * 4096 + 94 * c.active_linear_macs(), 22.2e9, 0.03, "Qwen3-235B-A22B active");
}

#[test]
fn mixtral_and_qwen2_moe_configs() {
    let c = config("mixtral-8x7b-instruct-v0.1.json");
    assert_eq!(c.arch, Arch::Mixtral);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size), (8, 2, 14_336));
    assert_eq!(moe.routing, Routing::TopKThenSoftmax { largest_last: false });
    let hand = Count {
        vocab: 32_000,
        hidden: 4096,
        layers: 32,
        q_dim: 4096,
        kv_dim: 1024,
        ffn: 8 * 3 * 4096 * 14_336 + 4096 * 8,
        norms: 2 * 4096,
        tied: false,
    };
    assert_eq!(c.parameter_count(), hand.total());
    assert_close(c.parameter_count(), 46.7e9, "Mixtral 8x7B");
    assert_within(2 * 32_000 * 4096 + 32 * c.active_linear_macs(), 12.9e9, 0.03, "Mixtral 8x7B active");

    let c = config("qwen2-57b-a14b.json");
    assert_eq!(c.arch, Arch::Qwen2Moe);
    assert!(c.qkv_bias);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size),
        (64, 8, 2560, Some(20_480))
    );
    assert_close(c.parameter_count(), 57.4e9, "Qwen2-57B-A14B");
}

#[test]
fn gemma3_configs_plain_and_wrapped() {
    let c = config("gemma-3-1b-it.json");
    assert_eq!(c.arch, Arch::Gemma3);
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (26, 4, 1, 256));
    assert!(c.norm_plus_one && c.norms == NormPlacement::Sandwich && c.qk_norm.is_some());
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!(c.attention_scale, Some(1.0 / 16.0));
    assert_eq!(c.sliding_window, Some(512));
    let globals: Vec<usize> = (0..26).filter(|&l| c.layer_window(l).is_none()).collect();
    assert_eq!(globals, [5, 11, 17, 23], "every sixth layer is global");
    let gemma = c.gemma.as_ref().unwrap();
    let local = c.sliding_rope.as_ref().unwrap();
    assert_eq!((gemma.embed_scale, local.theta, local.scaling.is_none()), (34.0, 10_000.0, true));
    assert_eq!((c.rope.theta, c.max_position_embeddings), (1e6, 32_768));
    // Tied head; four norms per block plus q/k norms of 256.
    let hand = Count {
        vocab: 262_144,
        hidden: 1152,
        layers: 26,
        q_dim: 1024,
        kv_dim: 256,
        ffn: 3 * 1152 * 6912,
        norms: 4 * 1152 + 2 * 256,
        tied: true,
    };
    assert_eq!(c.parameter_count(), hand.total());
    assert_close(c.parameter_count(), 0.9999e9, "Gemma 3 1B");

    // The multimodal 4B states only a few text fields: the rest are the family's defaults.
    let c = config("gemma-3-4b-it.json");
    assert_eq!(c.arch, Arch::Gemma3);
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size), (34, 8, 4, 256, 262_208));
    assert_eq!(c.sliding_window, Some(1024));
    assert_eq!((c.rope.theta, c.max_position_embeddings), (1e6, 131_072));
    assert_eq!(c.attention_scale, Some(1.0 / 16.0));
    assert!(matches!(c.rope.scaling, Some(fastmlx::model::config::RopeScaling::Linear { factor }) if factor == 8.0));
    assert_close(c.parameter_count(), 3.88e9, "Gemma 3 4B (text)");

    let c = config("gemma-3-27b-it.json");
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (62, 32, 16, 128));
    assert_eq!(c.attention_scale, Some(168f32.powf(-0.5)));
    assert_close(c.parameter_count(), 27.0e9, "Gemma 3 27B (text)");
    // Its 52 local layers keep their 1024-token window (and at most 512 columns more), its 10
    // global ones everything: a 32k-token bf16 sequence takes 3.3 GB, not 16.6 GB.
    let per_layer = 2 * 16 * 128 * 2;
    let kv = c.kv_footprint(2);
    assert_eq!((kv.full_per_token, kv.windowed_per_token, kv.windowed_tokens), (10 * per_layer, 52 * per_layer, 1536));
    assert_eq!(kv.bytes(32_768), 10 * per_layer * 32_768 + 52 * per_layer * 1536);
    assert_eq!(kv.bytes(1000), 62 * per_layer * 1000, "shorter than the window: every layer holds it all");
}

#[test]
fn mistral_small_3_1_reads_its_text_model() {
    let c = config("mistral-small-3.1-24b-instruct-2503.json");
    assert_eq!(c.arch, Arch::Mistral);
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size), (40, 32, 8, 128, 131_072));
    assert_eq!(c.rope.theta, 1e9);
    assert!(!c.tie_word_embeddings);
    assert_close(c.parameter_count(), 23.57e9, "Mistral Small 3.1 (text)");
}

#[test]
fn gpt_oss_configs() {
    for (file, layers, experts, total, active) in
        [("gpt-oss-20b.json", 24, 32, 20.91e9, 3.61e9), ("gpt-oss-120b.json", 36, 128, 116.83e9, 5.13e9)]
    {
        let c = config(file);
        assert_eq!(c.arch, Arch::GptOss);
        assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (layers, 64, 8, 64), "{file}");
        assert!(c.attention_sinks && c.qkv_bias && c.o_bias && !c.tie_word_embeddings, "{file}");
        assert_eq!(c.activation, Activation::SwigluClamped { alpha: 1.702, limit: 7.0 });
        assert_eq!(c.sliding_window, Some(128));
        assert!((0..layers).all(|l| c.layer_window(l).is_some() == (l % 2 == 0)), "{file}: alternating layers");
        // Half the layers keep a 128-token window: 64 tokens at least, 512 columns more at most.
        let half = layers / 2 * (2 * 8 * 64 * 2);
        assert_eq!(
            c.kv_footprint(2),
            KvFootprint {
                full_per_token: half,
                windowed_per_token: half,
                windowed_tokens: 640,
                state_bytes: 0,
                quantized: None
            }
        );
        assert!(matches!(
            c.rope.scaling,
            Some(fastmlx::model::config::RopeScaling::Yarn { factor, original_max_position_embeddings: 4096, .. })
                if factor == 32.0
        ));
        let moe = c.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.biases), (experts, 4, 2880, true));
        // Published totals count biases and sinks too (well under 0.1%).
        assert_close(c.parameter_count(), total, file);
        // OpenAI's "active" counts the output head but not the embedding lookup.
        assert_within(201_088 * 2880 + layers as u64 * c.active_linear_macs(), active, 0.03, file);
    }
}

/// Gemma 4's parameters counted by hand, layer by layer: (total, active, per-layer embedding
/// table). `kinds[l]`: whether layer `l` is global.
#[allow(clippy::too_many_arguments)]
fn gemma4_count(
    hidden: u64,
    heads: u64,
    (head_dim, global_head_dim): (u64, u64),
    (kv_heads, global_kv_heads, keys_as_values): (u64, u64, bool),
    globals: &[bool],
    first_shared: usize,
    (intermediate, double_wide): (u64, bool),
    per_layer: u64,
    experts: Option<(u64, u64, u64)>,
) -> (u64, u64, u64) {
    let vocab = 262_144;
    let layers = globals.len();
    let (mut total, mut active) = (vocab * hidden + hidden, vocab * hidden + hidden);
    for (l, &global) in globals.iter().enumerate() {
        let d = if global { global_head_dim } else { head_dim };
        let kv = if global && keys_as_values { global_kv_heads } else { kv_heads };
        // q, o and q_norm; k (and v) and k_norm only in layers that keep their own cache.
        let mut attention = 2 * hidden * heads * d + d;
        if l < first_shared {
            attention += if global && keys_as_values { 1 } else { 2 } * hidden * kv * d + d;
        }
        let width = if double_wide && l >= first_shared { 2 * intermediate } else { intermediate };
        let dense = 3 * hidden * width;
        // Four norms, the per-layer input gate (two projections and a norm), the layer scalar.
        let extras = 4 * hidden + if per_layer > 0 { 2 * hidden * per_layer + hidden } else { 0 } + 1;
        let (all, used) = match experts {
            // The router (projection, input scale, per-expert scale) and three more norms.
            Some((n, k, size)) => {
                let beside = hidden * n + hidden + n + 3 * hidden;
                (dense + n * 3 * hidden * size + beside, dense + k * 3 * hidden * size + beside)
            }
            None => (dense, dense),
        };
        total += attention + all + extras;
        active += attention + used + extras;
    }
    let table = vocab * layers as u64 * per_layer;
    let per_layer_inputs = if per_layer > 0 { table + hidden * layers as u64 * per_layer + per_layer } else { 0 };
    (total + per_layer_inputs, active + per_layer_inputs, table)
}

#[test]
fn gemma4_configs() {
    let every = |n: usize, period: usize| -> Vec<bool> { (0..n).map(|l| (l + 1) % period == 0).collect() };

    // E2B: 35 layers, every fifth global; the last 20 reuse keys and values, with MLPs twice
    // as wide; 256 per-layer input features.
    let c = config("gemma-4-e2b.json");
    assert_eq!(c.arch, Arch::Gemma4);
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size), (35, 8, 1, 256, 262_144));
    let globals: Vec<usize> = (0..35).filter(|&l| c.layer_window(l).is_none()).collect();
    assert_eq!(globals, [4, 9, 14, 19, 24, 29, 34]);
    assert_eq!((c.kv_cache_layers(), c.layer_intermediate_size(14), c.layer_intermediate_size(15)), (15, 6144, 12_288));
    let g = c.gemma4.as_ref().unwrap();
    assert_eq!((g.global_head_dim, g.first_kv_shared, g.final_logit_softcap), (512, 15, Some(30.0)));
    assert_eq!(g.per_layer_input.map(|p| (p.size, p.vocab_size)), Some((256, 262_144)));
    assert!(matches!(
        g.global_rope.scaling,
        Some(fastmlx::model::config::RopeScaling::Proportional { partial_rotary_factor, .. }) if partial_rotary_factor == 0.25
    ));
    assert_eq!((g.global_rope.theta, g.local_rope.theta, g.global_rope.dims, g.local_rope.dims), (1e6, 1e4, 512, 256));
    assert_eq!(c.attention_scale, Some(1.0));
    assert!(c.tie_word_embeddings && c.qk_norm.is_some() && c.norms == NormPlacement::Sandwich && !c.norm_plus_one);
    // Shared layers take the last sliding (13) or global (14) layer's keys and values.
    assert_eq!((c.layer_attention(15).kv_source, c.layer_attention(19).kv_source), (Some(13), Some(14)));
    assert_eq!(c.layer_attention(19).head_dim, 512);
    // Key/value elements per token: 12 sliding (1 x 256) and 3 global (1 x 512) layers.
    assert_eq!(c.kv_elements_per_token(), 2 * (12 * 256 + 3 * 512));
    let (total, _, table) =
        gemma4_count(1536, 8, (256, 512), (1, 1, false), &every(35, 5), 15, (6144, true), 256, None);
    assert_eq!(c.parameter_count(), total);
    // Google: 2.3B "effective" (without the per-layer table), 5.1B with it and the vision and
    // audio encoders (not loaded here: ~0.45B).
    assert_close(total - table, 2.3e9, "Gemma 4 E2B effective");

    // E4B: 42 layers, every sixth global, 18 shared, no double-wide MLPs.
    let c = config("gemma-4-e4b-it.json");
    assert_eq!((c.num_layers, c.num_kv_heads, c.kv_cache_layers(), c.layer_intermediate_size(41)), (42, 2, 24, 10_240));
    let (total, _, table) =
        gemma4_count(2560, 8, (256, 512), (2, 2, false), &every(42, 6), 24, (10_240, false), 256, None);
    assert_eq!(c.parameter_count(), total);
    // Published "4.5B effective": rounded down (4.64B counted).
    assert_within(total - table, 4.5e9, 0.035, "Gemma 4 E4B effective");

    // 26B-A4B (an MLX 4-bit conversion): experts beside every dense MLP, global keys as values.
    let c = config("gemma-4-26b-a4b-it-mlx-4bit.json");
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.kv_cache_layers()), (30, 16, 8, 30));
    let g = c.gemma4.as_ref().unwrap();
    assert_eq!((g.global_kv_heads, g.global_keys_as_values, g.per_layer_input), (2, true, None));
    let a = c.layer_attention(5);
    assert_eq!((a.head_dim, a.kv_heads, a.keys_as_values), (512, 2, true));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size), (128, 8, 704));
    let (total, active, _) =
        gemma4_count(2816, 16, (256, 512), (8, 2, true), &every(30, 6), 30, (2112, false), 0, Some((128, 8, 704)));
    assert_eq!(c.parameter_count(), total);
    assert_close(total, 25.2e9, "Gemma 4 26B-A4B");
    assert_within(active, 3.8e9, 0.03, "Gemma 4 26B-A4B active");

    // 31B dense.
    let c = config("gemma-4-31b-it.json");
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.kv_cache_layers()), (60, 32, 16, 60));
    let (total, _, _) = gemma4_count(5376, 32, (256, 512), (16, 4, true), &every(60, 6), 60, (21_504, false), 0, None);
    assert_eq!(c.parameter_count(), total);
    assert_close(total, 30.7e9, "Gemma 4 31B");
}

/// The inspector (model listings, `/api/tags`, the memory estimate) reads each of them as
/// loadable (but an FP8 release, with the reason), with the parameter count above and the
/// quantization the config names.
#[test]
fn the_inspector_lists_every_family_as_loadable() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let model = tempfile::tempdir().unwrap();
        std::fs::copy(&path, model.path().join("config.json")).unwrap();
        std::fs::write(model.path().join("tokenizer.json"), "{}").unwrap();
        std::fs::write(model.path().join("model.safetensors"), "").unwrap();
        let summary = fastmlx::model::inspect(model.path());
        // Kimi K2's and DeepSeek-V3.1's releases are FP8, which FastMLX does not read (their MLX
        // conversions load).
        let fp8 = file == "kimi-k2-instruct.json" || file == "deepseek-v3.1.json";
        let expected = fp8.then_some("fp8 quantization is not supported (use an MLX conversion)");
        assert_eq!(summary.unloadable_reason.as_deref(), expected, "{file}");
        assert_eq!(summary.parameters, Some(config(&file).parameter_count()), "{file}");
        if file.starts_with("gpt-oss") {
            assert_eq!(summary.quantization.as_deref(), Some("mxfp4"), "{file}");
        }
        seen += 1;
    }
    assert!(seen >= 10, "{seen} configs");
}

/// A linear-attention hybrid's parameters counted by hand: (vocab, hidden, layers, one full
/// layer in `interval`), attention (heads, kv heads, head size; queries with a gate each),
/// Gated DeltaNet (key heads, value heads, key and value head size, kernel), feed-forward
/// (dense width, or experts: count, width, shared expert width).
fn hybrid_count(
    (vocab, hidden, layers, interval): (u64, u64, u64, u64),
    (heads, kv_heads, head_dim): (u64, u64, u64),
    (nk, nv, dk, dv, kernel): (u64, u64, u64, u64, u64),
    ffn: Result<u64, (u64, u64, u64)>,
) -> u64 {
    let full = layers / interval;
    let linear = layers - full;
    let q = heads * head_dim;
    let attention = 2 * hidden * q + 2 * hidden * kv_heads * head_dim + q * hidden + 2 * head_dim;
    let channels = 2 * nk * dk + nv * dv;
    let delta = hidden * (channels + nv * dv + 2 * nv) + channels * kernel + 2 * nv + dv + nv * dv * hidden;
    let ffn = match ffn {
        Ok(width) => 3 * hidden * width,
        Err((experts, width, shared)) => hidden * experts + experts * 3 * hidden * width + 3 * hidden * shared + hidden,
    };
    let per_layer_norms = 2 * hidden;
    full * attention + linear * delta + layers * (ffn + per_layer_norms) + 2 * vocab * hidden + hidden
}

#[test]
fn linear_attention_hybrid_configs() {
    // Qwen3-Next-80B-A3B: 36 Gated DeltaNet layers, 12 gated attention layers, 512 experts.
    let c = config("qwen3-next-80b-a3b-instruct.json");
    assert_eq!(c.arch, Arch::Qwen3Next);
    let h = c.hybrid.as_ref().unwrap();
    assert_eq!((h.key_heads, h.value_heads, h.key_dim, h.value_dim, h.conv_kernel), (16, 32, 128, 128, 4));
    assert!(h.grouped_projections);
    let full: Vec<usize> = (0..48).filter(|&l| !c.is_recurrent(l)).collect();
    assert_eq!(full, (0..12).map(|i| 4 * i + 3).collect::<Vec<_>>(), "every fourth layer is full attention");
    assert_eq!((c.head_dim, c.rope.dims, c.rope.theta), (256, 64, 1e7), "a quarter of each head rotates");
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size), (512, 10, 512, Some(512)));
    assert!(matches!(moe.routing, Routing::SoftmaxThenTopK { normalize: true }));
    let hand = hybrid_count((151_936, 2048, 48, 4), (16, 2, 256), (16, 32, 128, 128, 4), Err((512, 512, 512)));
    assert_eq!(c.parameter_count(), hand);
    // The checkpoint's 81.3 B count the multi-token-prediction layer (~1.65 B), not loaded.
    assert_within(c.parameter_count(), 81.32e9, 0.025, "Qwen3-Next-80B-A3B");
    // Memory: 12 layers keep keys and values (2 KV heads of 256), 36 a fixed state each (the
    // convolution's last 3 inputs of 8,192 channels, 32 matrices of 128 x 128 in f32).
    let kv = c.kv_footprint(2);
    assert_eq!(kv.full_per_token, 12 * 2 * 2 * 256 * 2);
    assert_eq!(kv.state_bytes, 36 * (3 * 8192 * 2 + 32 * 128 * 128 * 4));
    assert_eq!(kv.bytes(32_768), 12 * 2048 * 32_768 + 36 * 2_146_304, "805 MB of KV and 77 MB of state");

    // Qwen3.6-27B (qwen3_5, dense): 48 + 16 layers, the text model inside its multimodal config.
    let c = config("qwen3.6-27b.json");
    assert_eq!(c.arch, Arch::Qwen35);
    let h = c.hybrid.as_ref().unwrap();
    assert_eq!((h.key_heads, h.value_heads, h.key_dim, h.value_dim), (16, 48, 128, 128));
    assert!(!h.grouped_projections && c.moe.is_none());
    assert_eq!((0..64).filter(|&l| !c.is_recurrent(l)).count(), 16);
    assert_eq!((c.rope.dims, c.rope.theta), (64, 1e7), "from rope_parameters");
    let hand = hybrid_count((248_320, 5120, 64, 4), (24, 4, 256), (16, 48, 128, 128, 4), Ok(17_408));
    assert_eq!(c.parameter_count(), hand);
    // The published 27.8 B count the vision tower and the multi-token-prediction layer too.
    assert_within(c.parameter_count(), 27.78e9, 0.04, "Qwen3.6-27B (text)");

    // Qwen3.6-35B-A3B (qwen3_5_moe): experts in every layer, no dense width in the config.
    let c = config("qwen3.6-35b-a3b.json");
    assert_eq!(c.arch, Arch::Qwen35);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size), (256, 8, 512, Some(512)));
    assert!((0..40).all(|l| moe.is_sparse(l)));
    let hand = hybrid_count((248_320, 2048, 40, 4), (16, 2, 256), (16, 32, 128, 128, 4), Err((256, 512, 512)));
    assert_eq!(c.parameter_count(), hand);
    assert_within(c.parameter_count(), 35.95e9, 0.04, "Qwen3.6-35B-A3B (text)");
}

#[test]
fn lfm2_moe_has_dense_layers_then_experts_chosen_with_a_bias() {
    let c = config("lfm2-8b-a1b.json");
    assert_eq!(c.arch, Arch::Lfm2);
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size), (24, 32, 8, 64, 7168));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size), (32, 4, 1792));
    assert_eq!(moe.routing, Routing::SigmoidThenTopK { normalize: true, expert_bias: true, scale: 1.0 });
    assert!(!moe.is_sparse(0) && !moe.is_sparse(1) && (2..24).all(|l| moe.is_sparse(l)));
    let attention: Vec<usize> = (0..24).filter(|&l| !c.is_recurrent(l)).collect();
    assert_eq!(attention, [2, 6, 10, 14, 18, 21]);
    // By hand: tied embeddings, 18 convolution blocks, 6 attention layers with q/k norms, two
    // dense MLPs of 7168, 22 layers of 32 experts of 1792 with a router and its bias, norms.
    let (h, v) = (2048u64, 65_536u64);
    let conv = 3 * h * h + 3 * h + h * h;
    let attention = 2 * h * h + 2 * 512 * h + 2 * 64;
    let experts = 32 * 3 * h * 1792 + 32 * h + 32;
    let hand = v * h + 18 * conv + 6 * attention + 2 * 3 * h * 7168 + 22 * experts + 24 * 2 * h + h;
    assert_eq!(c.parameter_count(), hand);
    // The model card: 8.3B parameters, "1.5B active" (1.56B here with the embeddings, 4 of the
    // 32 experts in each layer: the card rounds, or leaves out part of them).
    assert!((8_250_000_000..8_350_000_000).contains(&hand), "{hand}");
    let active = hand - 22 * 28 * 3 * h * 1792;
    assert!((1_400_000_000..1_600_000_000).contains(&active), "{active}");
}

#[test]
fn lfm2_reads_its_own_field_names() {
    let c = config("lfm2-1.2b.json");
    assert_eq!(c.arch, Arch::Lfm2);
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (16, 32, 8, 64));
    // block_ff_dim 12288, auto-adjusted: two thirds, times 1.0, a multiple of 256.
    assert_eq!(c.intermediate_size, 8192);
    assert_eq!((c.rms_norm_eps, c.rope.theta, c.rope.dims), (1e-5, 1e6, 64));
    assert!(c.tie_word_embeddings && c.qk_norm.is_some());
    let attention: Vec<usize> = (0..16).filter(|&l| !c.is_recurrent(l)).collect();
    assert_eq!(attention, [2, 5, 8, 10, 12, 14], "full_attn_idxs");
    let h = c.hybrid.as_ref().unwrap();
    assert_eq!((h.conv_kernel, h.conv_channels(), h.gated_attention()), (3, 2048, false));
    // By hand: tied embeddings, 10 convolution blocks (in 3H x H, depthwise H x 3, out H x H),
    // 6 attention layers with q/k norms, 16 MLPs of 8192, two norms a layer and the final one.
    let (h, v) = (2048u64, 65_536u64);
    let conv = 3 * h * h + 3 * h + h * h;
    let attention = 2 * h * h + 2 * 512 * h + 2 * 64;
    let hand = v * h + 10 * conv + 6 * attention + 16 * (3 * h * 8192 + 2 * h) + h;
    assert_eq!(c.parameter_count(), hand);
    assert_eq!(hand, 1_170_340_608, "the model card's count, exactly");
    // State: the last 2 inputs of 2048 channels in each of 10 layers.
    assert_eq!(c.kv_footprint(2).state_bytes, 10 * 2 * 2048 * 2);
}

#[test]
fn glm_4_7_reads_as_grouped_sigmoid_experts_after_three_dense_layers() {
    let c = config("glm-4.7.json");
    assert_eq!(c.arch, Arch::Glm4Moe);
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (92, 96, 8, 128));
    assert_eq!((c.rope.dims, c.rope.theta, c.rope.scaling.is_none()), (64, 1e6, true), "half of each head rotates");
    assert!(c.qkv_bias && !c.o_bias && c.qk_norm == Some(QkNorm::PerHead) && !c.tie_word_embeddings);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size), (160, 8, 1536, Some(1536)));
    assert!(!moe.shared_expert_gated);
    let Routing::SigmoidGrouped(g) = moe.routing else { panic!("{:?}", moe.routing) };
    assert_eq!((g.n_group, g.topk_group, g.normalize, g.norm_eps, g.scale), (1, 1, true, 0.0, 2.5));
    assert!((0..3).all(|l| !moe.is_sparse(l)) && (3..92).all(|l| moe.is_sparse(l)));
    // By hand (biases left out, as the estimate does): untied embeddings, 92 attention blocks
    // with per-head q/k norms, 3 dense MLPs of 12288, 89 layers of 160 experts of 1536 with a
    // router and its bias and a shared expert of 1536, two norms a layer and the final one.
    let (h, v) = (5120u64, 151_552u64);
    let attention = 2 * h * 96 * 128 + 2 * h * 8 * 128 + 2 * 128;
    let experts = 160 * 3 * h * 1536 + 160 * h + 160 + 3 * h * 1536;
    let hand = 2 * v * h + 92 * (attention + 2 * h) + 3 * 3 * h * 12288 + 89 * experts + h;
    assert_eq!(c.parameter_count(), hand);
    // Published: 355B with the multi-token-prediction layer (one more MoE layer, ~3.9B, which
    // FastMLX drops), 32B active.
    assert_within(hand + attention + experts, 355e9, 0.015, "GLM-4.7 with its MTP layer");
    let active = hand - 89 * 152 * 3 * h * 1536 - 2 * v * h;
    assert_within(active, 32e9, 0.05, "GLM-4.7 active");
    // Keys and values: 92 layers x 8 heads x 128 x 2, in bf16.
    assert_eq!(c.kv_footprint(2).full_per_token, 92 * 2 * 8 * 128 * 2);
}

#[test]
fn minimax_m2_reads_as_experts_everywhere_with_whole_projection_norms() {
    let c = config("minimax-m2.7.json");
    assert_eq!(c.arch, Arch::MiniMax);
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (62, 48, 8, 128));
    assert_eq!((c.rope.dims, c.rope.theta), (64, 5e6), "rotary_dim");
    assert!(!c.qkv_bias && c.qk_norm == Some(QkNorm::Whole) && !c.tie_word_embeddings);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size), (256, 8, 1536, None));
    assert!((0..62).all(|l| moe.is_sparse(l)));
    let Routing::SigmoidGrouped(g) = moe.routing else { panic!("{:?}", moe.routing) };
    assert_eq!((g.n_group, g.normalize, g.norm_eps, g.scale, g.f32_router), (1, true, 1e-20, 1.0, true));
    // By hand: untied embeddings; per layer q/k/v/o, q/k norms over the whole projections
    // (6144 + 1024), 256 experts of 1536, a router and its bias, two norms; the final norm.
    let (h, v) = (3072u64, 200_064u64);
    let attention = 2 * h * 48 * 128 + 2 * h * 8 * 128 + 48 * 128 + 8 * 128;
    let experts = 256 * 3 * h * 1536 + 256 * h + 256;
    let hand = 2 * v * h + 62 * (attention + experts + 2 * h) + h;
    assert_eq!(c.parameter_count(), hand);
    assert_close(hand, 230e9, "MiniMax-M2");
    // "10B activated": 8 of the 256 experts, the embeddings left out.
    let active = hand - 62 * 248 * 3 * h * 1536 - 2 * v * h;
    assert_within(active, 10e9, 0.05, "MiniMax-M2 active");
}

/// A latent-attention layer's parameters by hand: the query (through its bottleneck, with its
/// norm), the latent and rotary key with the latent's norm, each head's key and value
/// projections out of the latent, the output.
fn latent_attention(h: u64, heads: u64, q_rank: u64, rank: u64, nope: u64, rope: u64, value: u64) -> u64 {
    h * q_rank
        + q_rank
        + q_rank * heads * (nope + rope)
        + h * (rank + rope)
        + rank
        + heads * nope * rank
        + heads * value * rank
        + heads * value * h
}

#[test]
fn glm_4_7_flash_reads_as_latent_attention_with_a_model_report_s_exact_count() {
    let c = config("glm-4.7-flash.json");
    assert_eq!(c.arch, Arch::Glm4MoeLite);
    let mla = c.mla.unwrap();
    assert_eq!(
        (mla.q_lora_rank, mla.kv_lora_rank, mla.nope_dim, mla.rope_dim, mla.value_dim),
        (Some(768), 512, 192, 64, 256)
    );
    assert_eq!((c.num_layers, c.num_heads, c.head_dim, c.rope.dims, c.rope.traditional), (47, 20, 256, 64, true));
    assert_eq!(mla.lora_eps, 1e-5, "mlx-lm's glm4_moe_lite: the model's epsilon (transformers prints 1e-6)");
    assert_eq!(c.attention_scale, Some(256f32.powf(-0.5)), "no YaRN");
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size), (64, 4, 1536, Some(1536)));
    let Routing::SigmoidGrouped(g) = moe.routing else { panic!("{:?}", moe.routing) };
    assert_eq!((g.norm_eps, g.scale), (1e-20, 1.8));
    assert!(!moe.is_sparse(0) && (1..47).all(|l| moe.is_sparse(l)));
    // By hand: untied embeddings, 47 latent-attention layers, one dense MLP of 10240, 46 layers
    // of 64 experts of 1536 with a router, its bias and a shared expert, norms.
    let (h, v) = (2048u64, 154_880u64);
    let attention = latent_attention(h, 20, 768, 512, 192, 64, 256);
    let experts = 64 * 3 * h * 1536 + 64 * h + 64 + 3 * h * 1536;
    let hand = 2 * v * h + 47 * (attention + 2 * h) + 3 * h * 10240 + 46 * experts + h;
    assert_eq!(c.parameter_count(), hand);
    // A model report (tests/data/configs/SOURCES.md) counts 31,221,488,576 parameters in the
    // checkpoint: these and the multi-token-prediction layer FastMLX drops (a 48th layer with its
    // own embeddings, head, input projection [2048, 4096] and three norms).
    let mtp = attention + experts + 2 * h + 2048 * 4096 + 2 * v * h + 3 * h;
    assert_eq!(hand + mtp, 31_221_488_576);
    // The cache: a latent and a rotary key per token and layer, 47 x 576 x 2 bytes in bf16.
    assert_eq!(c.kv_footprint(2).full_per_token, 47 * 576 * 2);
    assert!(c.kv_quant_for(8).is_none() && c.kv_quant_for(4).is_none());
}

#[test]
fn kimi_k2_reads_as_deepseek_v3_with_a_model_report_s_exact_count() {
    let c = config("kimi-k2-instruct.json");
    assert_eq!(c.arch, Arch::DeepseekV3);
    let mla = c.mla.unwrap();
    assert_eq!(
        (mla.q_lora_rank, mla.kv_lora_rank, mla.nope_dim, mla.value_dim, mla.lora_eps),
        (Some(1536), 512, 128, 128, 1e-6)
    );
    assert_eq!((c.num_layers, c.num_heads, c.head_dim, c.rope.theta), (61, 64, 192, 50_000.0));
    // YaRN's factor 32 with mscale_all_dim 1: 192^-0.5 x (0.1 ln 32 + 1)^2.
    let s = 0.1 * 32f32.ln() + 1.0;
    assert!((c.attention_scale.unwrap() - 192f32.powf(-0.5) * s * s).abs() < 1e-7);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size), (384, 8, 2048, Some(2048)));
    let Routing::SigmoidGrouped(g) = moe.routing else { panic!("{:?}", moe.routing) };
    assert_eq!((g.n_group, g.norm_eps, g.scale), (1, 0.0, 2.827));
    let (h, v) = (7168u64, 163_840u64);
    let attention = latent_attention(h, 64, 1536, 512, 128, 64, 128);
    let experts = 384 * 3 * h * 2048 + 384 * h + 384 + 3 * h * 2048;
    let hand = 2 * v * h + 61 * (attention + 2 * h) + 3 * h * 18432 + 60 * experts + h;
    assert_eq!(c.parameter_count(), hand);
    // The model report counts 1,026,470,731,056 tensor elements in the FP8 release: these, the
    // FP8 blocks' scales (one per 128 x 128 block of every quantized matrix) and the rotary
    // frequencies each layer stores (56 elements, bf16).
    let blocks = |rows: u64, cols: u64| rows.div_ceil(128) * cols.div_ceil(128);
    let attention_scales =
        blocks(576, h) + blocks(16384, 512) + blocks(h, 8192) + blocks(1536, h) + blocks(12288, 1536) + 56;
    let mlp_scales = |w: u64| blocks(w, h) * 2 + blocks(h, w);
    let scales = 61 * attention_scales + mlp_scales(18432) + 60 * (384 * mlp_scales(2048) + mlp_scales(2048));
    assert_eq!(hand + scales, 1_026_470_731_056);
    assert_eq!(c.kv_footprint(2).full_per_token, 61 * 576 * 2, "70,272 bytes a token in bf16");
}

#[test]
fn deepseek_v3_1_and_smollm3_have_their_published_exact_counts() {
    // DeepSeek-V3.1: checkpoint-header audits count 671,026,419,200 parameters without the
    // multi-token-prediction layer (which mlx-lm, and FastMLX, drop).
    let c = config("deepseek-v3.1.json");
    assert_eq!(c.arch, Arch::DeepseekV3);
    let (h, v) = (7168u64, 129_280u64);
    let attention = latent_attention(h, 128, 1536, 512, 128, 64, 128);
    let experts = 256 * 3 * h * 2048 + 256 * h + 256 + 3 * h * 2048;
    let hand = 2 * v * h + 61 * (attention + 2 * h) + 3 * 3 * h * 18432 + 58 * experts + h;
    assert_eq!(c.parameter_count(), hand);
    assert_eq!(hand, 671_026_419_200);
    let Routing::SigmoidGrouped(g) = c.moe.as_ref().unwrap().routing else { panic!() };
    assert_eq!((g.n_group, g.topk_group, g.scale), (8, 4, 2.5));
    assert_eq!(c.kv_footprint(2).full_per_token, 70_272, "the latent (512) and rotary key (64) of 61 layers");

    // SmolLM3-3B: tied (the key is absent, the default holds), every fourth layer without rotary;
    // its safetensors index says 3,075,098,624.
    let c = config("smollm3-3b.json");
    assert_eq!(c.arch, Arch::SmolLm3);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.nope_layers, (0..9).map(|k| 4 * k + 3).collect::<Vec<_>>());
    let (h, v) = (2048u64, 128_256u64);
    let layer = 2 * h * h + 2 * h * 512 + 3 * h * 11008 + 2 * h;
    assert_eq!(c.parameter_count(), v * h + 36 * layer + h);
    assert_eq!(c.parameter_count(), 3_075_098_624);
    assert_eq!(c.kv_footprint(2).full_per_token, 36 * 2 * 4 * 128 * 2);
}

/// A Mamba-2 layer's parameters: in_proj, the convolution (and its bias), dt_bias / A_log / D,
/// the gated norm, out_proj.
fn mamba2_params(h: u64, heads: u64, head_dim: u64, groups: u64, state: u64, kernel: u64, conv_bias: bool) -> u64 {
    let width = heads * head_dim;
    let conv = width + 2 * groups * state;
    h * (width + conv + heads) + conv * kernel + if conv_bias { conv } else { 0 } + 3 * heads + width + width * h
}

#[test]
fn nemotron_3_nano_pairs_its_blocks_into_layers_with_the_exact_published_count() {
    let c = config("nemotron-3-nano-30b-a3b.json");
    assert_eq!(c.arch, Arch::NemotronH);
    // 52 blocks: 23 Mamba-2, 6 attention, 23 experts. Each mixer takes the experts block after
    // it; six Mamba blocks are followed by attention and have none.
    assert_eq!(c.num_layers, 29);
    let mamba: Vec<usize> = (0..29).filter(|&l| c.is_recurrent(l)).collect();
    assert_eq!(mamba.len(), 23);
    assert_eq!(c.no_ffn_layers.len(), 6);
    assert!(c.no_ffn_layers.iter().all(|l| mamba.contains(l)), "the mixers before attention are Mamba's");
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((0..29).filter(|&l| moe.is_sparse(l)).count(), 23);
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size), (128, 6, 1856, Some(3712)));
    let Routing::SigmoidGrouped(g) = moe.routing else { panic!("{:?}", moe.routing) };
    assert_eq!((g.n_group, g.normalize, g.norm_eps, g.scale), (1, true, 1e-20, 2.5));
    assert_eq!(c.activation, Activation::Relu2);
    assert_eq!(c.nope_layers.len(), 29, "no rotary anywhere");
    let h = c.hybrid.as_ref().unwrap();
    assert_eq!((h.key_heads, h.key_dim, h.value_heads, h.value_dim, h.conv_kernel), (8, 128, 64, 64, 4));
    let fastmlx::model::config::RecurrentKind::Mamba2(m) = h.kind else { panic!("{:?}", h.kind) };
    assert_eq!((m.dt_limit, m.grouped_norm, m.conv_bias, m.proj_bias), ((0.0, f32::INFINITY), true, true, false));
    // By hand: embeddings and head, 23 Mamba-2 and 6 attention mixers (no biases), 23 experts
    // blocks (ReLU²: up and down only; a router with its bias; the shared expert), a norm per
    // block and the final one. llama.cpp counts 31,577,940,288 in the GGUF.
    let (hd, v) = (2688u64, 131_072u64);
    let attention = 2 * hd * 32 * 128 + 2 * hd * 2 * 128;
    let experts = 128 * 2 * hd * 1856 + 128 * hd + 128 + 2 * hd * 3712;
    let hand =
        2 * v * hd + 23 * mamba2_params(hd, 64, 64, 8, 128, 4, true) + 6 * attention + 23 * experts + 52 * hd + hd;
    assert_eq!(c.parameter_count(), hand);
    assert_eq!(hand, 31_577_940_288);
    // Memory: keys and values in the 6 attention layers; per sequence, 23 states of the
    // convolution's last 3 inputs (6,144 channels) and 64 x 64 x 128 f32.
    let kv = c.kv_footprint(2);
    assert_eq!(kv.full_per_token, 6 * 2 * 2 * 128 * 2);
    assert_eq!(kv.state_bytes, 23 * (3 * 6144 * 2 + 64 * 64 * 128 * 4));
    assert_eq!(kv.state_bytes, 49_082_368);
}

#[test]
fn granite_4_0_h_small_has_its_multipliers_and_the_exact_published_count() {
    let c = config("granite-4.0-h-small.json");
    assert_eq!(c.arch, Arch::GraniteMoeHybrid);
    let attention: Vec<usize> = (0..40).filter(|&l| !c.is_recurrent(l)).collect();
    assert_eq!(attention, [5, 15, 25, 35]);
    let m = c.multipliers.unwrap();
    assert_eq!((m.embedding, m.residual, m.logits_scaling), (12.0, 0.22, 16.0));
    assert_eq!(c.attention_scale, Some(0.0078125));
    assert_eq!(c.nope_layers.len(), 40, "position_embedding_type \"nope\"");
    assert!(c.tie_word_embeddings);
    let h = c.hybrid.as_ref().unwrap();
    let fastmlx::model::config::RecurrentKind::Mamba2(style) = h.kind else { panic!("{:?}", h.kind) };
    assert_eq!(style.dt_limit, (0.001, 100.0), "mlx-lm's default when the config states none");
    assert!(!style.grouped_norm);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_expert_size), (72, 10, 768, Some(1536)));
    assert_eq!(moe.routing, Routing::TopKThenSoftmax { largest_last: true });
    // By hand: tied embeddings, 36 Mamba-2 and 4 attention mixers, 40 feed-forwards of 72
    // SwiGLU experts with their router and a shared SwiGLU MLP, two norms a layer, the final
    // norm. llama.cpp counts 32,207,337,984.
    let (hd, v) = (4096u64, 100_352u64);
    let attention = 2 * hd * 4096 + 2 * hd * 8 * 128;
    let ffn = 72 * 3 * hd * 768 + 72 * hd + 3 * hd * 1536;
    let hand = v * hd + 36 * mamba2_params(hd, 128, 64, 1, 128, 4, true) + 4 * attention + 40 * (ffn + 2 * hd) + hd;
    assert_eq!(c.parameter_count(), hand);
    assert_eq!(hand, 32_207_337_984);
    let kv = c.kv_footprint(2);
    assert_eq!(kv.full_per_token, 4 * 2 * 8 * 128 * 2);
    assert_eq!(kv.state_bytes, 36 * (3 * 8448 * 2 + 128 * 64 * 128 * 4));
}

/// Configs carry an infinite time-step limit as Python's json writes it (a bare `Infinity`,
/// not JSON) or as transformers and mlx-lm save it (`{"__float__": "Infinity"}`): both read.
#[test]
fn infinite_time_step_limits_read_in_both_spellings() {
    let path = format!("{}/tests/data/configs/nemotron-3-nano-30b-a3b.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    let limit = |spelling: &str| {
        let edited = text.replacen('{', &format!("{{\n  \"time_step_limit\": [0.001, {spelling}],"), 1);
        let raw = fastmlx::model::json::parse_json(&edited).unwrap();
        let hf: HfConfig = serde_json::from_value(arch::text_config(&raw)).unwrap();
        let c = arch::model_config(Arch::NemotronH, &hf).unwrap();
        let fastmlx::model::config::RecurrentKind::Mamba2(m) = c.hybrid.unwrap().kind else { panic!() };
        m.dt_limit
    };
    assert_eq!(limit("Infinity"), (0.001, f32::INFINITY));
    assert_eq!(limit(r#"{"__float__": "Infinity"}"#), (0.001, f32::INFINITY));
    assert_eq!(limit("50.0"), (0.001, 50.0));
    assert!(serde_json::from_str::<serde_json::Value>(&text.replacen('{', "{\"x\": Infinity,", 1)).is_err());
}
