//! KV-cache quantization (8 and 4 bits, from a start position on): greedy tokens equal to the
//! reference (mlx-lm's quantized path, or dense attention over quantized-then-dequantized keys
//! and values where mlx-lm has none: tests/data/reference/kv_quant.json) on the tiny models of
//! every attention family, through the single-stream generator and the batching engine; rows of
//! a batch equal to single streams; prefix-cache hits from RAM and disk equal to cold prefills,
//! quantized blocks never serving a full-precision engine and stored smaller; and the bytes a
//! token's keys and values take, measured, against the theory.

mod common;

use std::path::Path;

use common::engine::{run, start, start_with};
use fastmlx::engine::EngineConfig;
use fastmlx::fixtures::synthetic;
use fastmlx::generate::{generate, GenerateRequest};
use fastmlx::model::{load_model, load_model_with, Arch, KvFormat, KvQuant, LoadOptions, LoadedModel, WeightFormat};
use fastmlx::sampling::SamplingParams;

fn format(bits: i32, group_size: i32, start: i32) -> KvFormat {
    KvFormat { quant: Some(KvQuant { bits, group_size }), start }
}

fn case_format(case: &serde_json::Value) -> KvFormat {
    let int = |name: &str| case[name].as_i64().unwrap() as i32;
    format(int("bits"), int("group_size"), int("start"))
}

/// A tiny model allowed a context long enough for the long cases (300 + 300 tokens).
fn tiny(arch: Arch, seed: u64) -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), arch, seed, None).unwrap();
    common::edit_config(dir.path(), |c| c["max_position_embeddings"] = 2048.into());
    let model = load_model(dir.path(), &common::backend()).unwrap();
    (dir, model)
}

/// Greedy tokens of the single-stream generator with keys and values in `kv_format`.
fn greedy_in(model: &LoadedModel, prompt: &[u32], max_tokens: usize, kv_format: KvFormat) -> Vec<u32> {
    let request = GenerateRequest {
        prompt_ids: prompt.to_vec(),
        params: SamplingParams::greedy(),
        max_tokens,
        stop: vec![],
        ignore_eos: true,
        kv_format,
    };
    generate(model, &request, |_| {}).unwrap().tokens
}

fn engine_in(dir: &Path, kv_format: KvFormat) -> fastmlx::engine::EngineHandle {
    start(dir, EngineConfig { kv_format, prefix_cache_bytes: 0, ..Default::default() })
}

#[test]
fn greedy_tokens_match_the_reference_for_every_attention_family() {
    let _mlx = common::mlx_lock();
    let reference = common::read_json("tests/data/reference/kv_quant.json");
    let seed = reference["seed"].as_u64().unwrap();
    let sets = [("prompt_ids", "cases"), ("long_prompt_ids", "long_cases")];
    for (prompt, cases) in sets {
        let prompt = common::ids(&reference[prompt]);
        for case in reference[cases].as_array().unwrap() {
            let arch = Arch::from_model_type(case["arch"].as_str().unwrap()).unwrap();
            let (dir, model) = tiny(arch, seed);
            let expected = common::ids(&case["output_ids"]);
            let kv = case_format(case);
            let label = format!("{arch:?} {kv:?} (reference: {})", case["reference"]);
            let got = greedy_in(&model, &prompt, expected.len(), kv);
            assert_eq!(got, expected, "{label}: the generator's tokens");
            // The engine on the short cases: its prefill is cut where quantization starts, as
            // the generator's is.
            if cases == "cases" {
                drop(model);
                let engine = engine_in(dir.path(), kv);
                assert_eq!(run(&engine, &prompt, expected.len()).tokens, expected, "{label}: the engine's tokens");
                engine.shutdown();
            }
        }
    }
}

/// Rows of different lengths decoded together, quantized from their first token: each gives
/// what it gives alone (quantization is per token and head, so padding and batch neighbours do
/// not change a row's numbers). Windowed, sinks and hybrid families included.
#[test]
fn rows_of_a_quantized_batch_answer_as_single_streams() {
    let _mlx = common::mlx_lock();
    let kv = format(4, 32, 0);
    for arch in [Arch::Llama, Arch::Gemma3, Arch::GptOss, Arch::Qwen35] {
        let (dir, model) = tiny(arch, 3);
        let prompts: Vec<Vec<u32>> =
            [9usize, 23, 40].iter().map(|&n| (0..n).map(|j| ((j * 31 + n * 7) % 200 + 5) as u32).collect()).collect();
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy_in(&model, p, 16, kv)).collect();
        drop(model);
        let engine = engine_in(dir.path(), kv);
        let streams: Vec<_> = prompts.iter().map(|p| engine.submit(common::engine::request(p, 16)).unwrap()).collect();
        let mut metrics = engine.metrics();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut biggest = 0;
        while std::time::Instant::now() < deadline && biggest < 3 {
            biggest = biggest.max(metrics.borrow_and_update().batch_size);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(biggest, 3, "{arch:?}: the rows decoded together");
        for ((stream, expected), prompt) in streams.into_iter().zip(&alone).zip(&prompts) {
            let got = common::collect(stream).tokens;
            assert_eq!(&got, expected, "{arch:?}: a {}-token prompt in a batch", prompt.len());
        }
        engine.shutdown();
    }
}

fn tokens(seed: usize, len: usize) -> Vec<u32> {
    (0..len).map(|j| ((seed * 131 + j * 17 + j * j) % (synthetic::VOCAB - 10) + 5) as u32).collect()
}

/// Bytes of the model's folder in the disk tier (each KV format has its own identity, so its own
/// folder under `cache`).
fn folders(cache: &Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut out: Vec<_> = std::fs::read_dir(cache)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| (e.path(), common::walk(&e.path()).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum()))
        .collect();
    out.sort();
    out
}

/// A conversation's turns on an engine with a prefix cache (RAM and disk) against a cold engine,
/// both quantized: hits from RAM, then from disk after a restart, answer as cold prefills; the
/// blocks are stored quantized (smaller than the full-precision engine's) and never serve an
/// engine of another format.
#[test]
fn prefix_cache_hits_from_ram_and_disk_answer_like_cold_prefills() {
    let _mlx = common::mlx_lock();
    // Gemma 3: windowed layers keep their window quantized; the start inside the first turn's
    // prompt (its first blocks are stored at full precision, the later ones quantized).
    for (arch, kv) in [(Arch::Llama, format(8, 32, 0)), (Arch::Gemma3, format(4, 32, 100))] {
        let dir = tempfile::tempdir().unwrap();
        synthetic::write_tiny_model(dir.path(), arch, 11, None).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let warm_config = || EngineConfig { kv_format: kv, ..common::disk_config(cache.path()) };
        let cold = start(dir.path(), EngineConfig { kv_format: kv, prefill_chunk: 48, ..Default::default() });
        let warm = start(dir.path(), warm_config());
        let turn1 = [tokens(1, 150), tokens(2, 9)].concat();
        let a1 = run(&warm, &turn1, 12);
        assert_eq!(a1.tokens, run(&cold, &turn1, 12).tokens, "{arch:?}: cold");
        let turn2 = [turn1.clone(), a1.tokens.clone(), tokens(3, 7)].concat();
        let a2 = run(&warm, &turn2, 10);
        assert_eq!(a2.finish.usage.cached_tokens, turn1.len() + a1.tokens.len() - 1, "{arch:?}: a RAM hit");
        assert_eq!(a2.tokens, run(&cold, &turn2, 10).tokens, "{arch:?}: a RAM hit answers as a cold prefill");
        // An edit before the start: only blocks held at full precision may serve it.
        let mut edited = turn1.clone();
        edited[80] = edited[80] % 200 + 7;
        let e = run(&warm, &edited, 8);
        assert_eq!(e.tokens, run(&cold, &edited, 8).tokens, "{arch:?}: a short hit answers as a cold prefill");
        let ram = common::engine::wait_idle(&warm).prefix_cache_bytes;
        warm.shutdown();

        // After a restart, the next turn comes from the disk tier.
        let turn3 = [turn2.clone(), a2.tokens.clone(), tokens(4, 5)].concat();
        let again = start(dir.path(), warm_config());
        let a3 = run(&again, &turn3, 8);
        assert_eq!(a3.finish.usage.cached_tokens, turn2.len() + a2.tokens.len() - 1, "{arch:?}: a disk hit");
        assert_eq!(a3.tokens, run(&cold, &turn3, 8).tokens, "{arch:?}: a disk hit answers as a cold prefill");
        assert!(common::engine::wait_idle(&again).prefix_cache_disk_hits > 0);
        again.shutdown();
        cold.shutdown();

        // A full-precision engine on the same folder finds none of those blocks, and stores its own.
        let full = start(dir.path(), common::disk_config(cache.path()));
        let f = run(&full, &turn1, 12);
        assert_eq!(f.finish.usage.cached_tokens, 0, "{arch:?}: quantized blocks never serve full precision");
        let full_ram = common::engine::wait_idle(&full).prefix_cache_bytes;
        full.shutdown();
        let other =
            start(dir.path(), EngineConfig { kv_format: format(8, 32, 7), ..common::disk_config(cache.path()) });
        assert_eq!(run(&other, &turn1, 4).finish.usage.cached_tokens, 0, "{arch:?}: another start is another format");
        other.shutdown();
        // Stored quantized: smaller in RAM and on disk than the same sequences at full precision
        // (f32 keys: 4x; windowed layers and the full-precision blocks before a start less so).
        assert!(ram > 0 && full_ram > 0);
        let folders = folders(cache.path());
        assert_eq!(folders.len(), 3, "one folder per format: {folders:?}");
        eprintln!(
            "{arch:?} {kv:?}: RAM tier {ram} bytes quantized after three turns, {full_ram} at full precision after one"
        );
    }
}

/// The engine refuses a group size that does not divide the model's heads, with the reason.
#[test]
fn a_format_the_heads_cannot_take_is_refused_at_load() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), Arch::Llama, 1, None).unwrap();
    let path = dir.path().to_path_buf();
    let config = EngineConfig { kv_format: format(8, 64, 0), ..Default::default() };
    let error = fastmlx::engine::EngineHandle::start(config, move || load_model(&path, &fastmlx::mlx::Backend::init()))
        .err()
        .expect("refused");
    assert!(error.to_string().contains("does not divide the model's head size 32"), "{error}");
    assert!(KvFormat::from_settings(3, 64, 0).is_err() && KvFormat::from_settings(8, 48, 0).is_err());
    assert!(KvFormat::from_settings(8, 64, -1).is_err());
    assert_eq!(KvFormat::from_settings(0, 64, 0).unwrap(), KvFormat::FULL);
}

/// Keys and values per token on SmolLM2 (30 layers, 3 KV heads of 64, f32 here), measured as
/// what MLX allocates for a 1,023-token prompt's caches: at 8 bits within 10 % of the theory
/// (packed words plus a scale and a bias per group), at least 3x smaller than f32 and 1.7x smaller
/// than bf16 would be; at 4 bits smaller again.
#[test]
fn kv_bytes_per_token_are_what_the_format_says() {
    let _mlx = common::mlx_lock();
    let model = load_model(&common::smollm2_gguf(), &common::backend()).unwrap();
    let t = &model.transformer;
    let (layers, heads, dim) = (t.config.kv_cache_layers(), t.config.num_kv_heads, t.config.head_dim);
    let prompt: Vec<u32> = (0..1023).map(|i| (i * 7 % 40000 + 100) as u32).collect();
    let measure = |kv: KvFormat| {
        fastmlx::mlx::give_back();
        let before = fastmlx::mlx::memory_stats().active;
        let mut cache = t.new_cache_in(kv);
        let hidden = t.forward_hidden(&mlx_rs::Array::from_slice(&prompt, &[1, 1023]), &mut cache).unwrap();
        hidden.eval().unwrap();
        drop(hidden);
        let held = fastmlx::mlx::memory_stats().active - before;
        // Buffers grow in steps of 256: 1,023 tokens fill 1,024 columns.
        let columns = cache[0].contents().unwrap().map(|(k, _)| k.dim(2)).unwrap() + 1;
        assert_eq!(columns, 1024);
        held as f64 / columns as f64
    };
    let f32_token = (layers * 2 * heads * dim * 4) as f64;
    let bf16_token = f32_token / 2.0;
    let full = measure(KvFormat::FULL);
    let theory = |bits: i32| (layers * 2 * heads * KvQuant { bits, group_size: 64 }.vector_bytes(dim, 4)) as f64;
    let (q8, q4) = (measure(format(8, 64, 0)), measure(format(4, 64, 0)));
    eprintln!(
        "KV bytes per token (SmolLM2, f32 compute): full {full:.0} (theory {f32_token:.0}), 8-bit {q8:.0} (theory {:.0}), \
         4-bit {q4:.0} (theory {:.0})",
        theory(8),
        theory(4)
    );
    assert!((full / f32_token - 1.0).abs() < 0.1, "the full-precision measure itself: {full} vs {f32_token}");
    assert!((q8 / theory(8) - 1.0).abs() < 0.1, "8-bit: {q8} vs {}", theory(8));
    assert!((q4 / theory(4) - 1.0).abs() < 0.1, "4-bit: {q4} vs {}", theory(4));
    assert!(f32_token / q8 >= 3.0, "8-bit against f32: {:.2}x", f32_token / q8);
    // bf16 compute keeps bf16 scales and biases: 64 + 2 x 2 bytes per 64 elements.
    let q8_bf16 = (layers * 2 * heads * KvQuant { bits: 8, group_size: 64 }.vector_bytes(dim, 2)) as f64;
    assert!(bf16_token / q8_bf16 >= 1.7, "8-bit against bf16: {:.2}x", bf16_token / q8_bf16);
    assert!(q4 < 0.6 * q8, "4-bit against 8-bit: {q4} vs {q8}");
}

/// SmolLM2's 4-bit MLX export (a real model's numbers) against mlx-lm's `QuantizedKVCache` on the
/// same folder, at 8 and 4 bits from the first token: the generator, and the engine at 8 bits.
#[test]
fn smollm2_quantized_matches_mlx_lm() {
    let _mlx = common::mlx_lock();
    let reference = common::read_json("tests/data/reference/kv_quant_smollm2.json");
    let dir = common::setup_file(".cache/models/SmolLM2-135M-Instruct-mlx-4bit");
    let packed = LoadOptions { weights: WeightFormat::Packed };
    let model = load_model_with(&dir, &common::backend(), &packed).unwrap();
    let prompt = common::ids(&reference["prompt_ids"]);
    for case in reference["cases"].as_array().unwrap() {
        let kv = case_format(case);
        let expected = common::ids(&case["output_ids"]);
        assert_eq!(greedy_in(&model, &prompt, expected.len(), kv), expected, "{kv:?}");
    }
    drop(model);
    let case = &reference["cases"][0];
    let engine = start_with(&dir, EngineConfig { kv_format: case_format(case), ..Default::default() }, packed);
    let expected = common::ids(&case["output_ids"]);
    assert_eq!(run(&engine, &prompt, expected.len()).tokens, expected, "the engine");
    engine.shutdown();
}
