//! Tiny random-weight models of every architecture: shapes, KV-cache consistency, and greedy
//! output equal to mlx-lm's on the same weights (tests/data/reference/tiny_models.json).

mod common;

use fastmlx::fixtures::synthetic;
use fastmlx::model::config::QuantSpec;
use fastmlx::model::{load_model, load_model_with, Arch, LoadOptions, LoadedModel, WeightFormat};
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

/// A tiny model; quantized ones keep their weights packed (MLX's quantized kernels, as mlx-lm).
fn tiny(arch: Arch, seed: u64, bits: Option<i32>) -> (tempfile::TempDir, LoadedModel) {
    tiny_with(arch, seed, bits, &[])
}

/// [`tiny`] written with `make-test-model`'s extra flags (`--per-expert`, `--wrapped`).
fn tiny_with(arch: Arch, seed: u64, bits: Option<i32>, flags: &[&str]) -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    let mode = flags.iter().position(|f| *f == "--mode").map_or("affine", |i| flags[i + 1]);
    let options = synthetic::TinyOptions {
        quant: bits.map(|bits| synthetic::quant_spec(mode, bits).unwrap()),
        per_expert: flags.contains(&"--per-expert"),
        wrapped: flags.contains(&"--wrapped"),
        moe: flags.contains(&"--moe"),
        mtp: false,
    };
    synthetic::write_tiny_model_with(dir.path(), arch, seed, &options).unwrap();
    let model =
        load_model_with(dir.path(), &common::backend(), &LoadOptions { weights: WeightFormat::Packed }).unwrap();
    (dir, model)
}

fn to_vec(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

#[test]
fn greedy_output_matches_mlx_lm_for_every_architecture() {
    let _mlx = common::mlx_lock();
    let reference = common::read_json("tests/data/reference/tiny_models.json");
    let prompt = common::ids(&reference["prompt_ids"]);
    let seed = reference["seed"].as_u64().unwrap();
    let cases = reference["cases"].as_array().unwrap();
    let archs: Vec<&str> = cases.iter().map(|c| c["arch"].as_str().unwrap()).collect();
    for arch in Arch::ALL {
        assert!(archs.contains(&arch.model_type()), "no reference for {arch:?}");
    }
    for case in cases {
        let arch = Arch::from_model_type(case["arch"].as_str().unwrap()).unwrap();
        let bits = case["bits"].as_i64().map(|b| b as i32);
        let flags: Vec<&str> =
            case["flags"].as_array().map(|f| f.iter().filter_map(|x| x.as_str()).collect()).unwrap_or_default();
        let (_dir, model) = tiny_with(arch, seed, bits, &flags);
        let expected = common::ids(&case["output_ids"]);
        let got = common::greedy(&model, prompt.clone(), expected.len()).tokens;
        assert_eq!(got, expected, "{}: greedy tokens differ from mlx-lm", case["name"]);
    }
}

#[test]
fn logits_have_the_vocabulary_shape_and_compute_dtype() {
    let _mlx = common::mlx_lock();
    for arch in Arch::ALL {
        let (_dir, model) = tiny(arch, 1, None);
        let mut cache = model.transformer.new_cache();
        let ids = Array::from_slice(&[1u32, 2, 3, 4, 5], &[1, 5]);
        let logits = model.transformer.forward(&ids, &mut cache).unwrap();
        assert_eq!(logits.shape(), &[1, 5, synthetic::VOCAB as i32], "{arch:?}");
        assert_eq!(logits.dtype(), Dtype::Float32, "{arch:?}: x86 CPU computes in f32");
        assert_eq!(cache[0].offset(), 5);
        assert!(to_vec(&logits).iter().all(|x| x.is_finite()), "{arch:?}");
    }
}

/// One forward pass over N tokens gives the same logits as N single-token steps through the
/// KV cache (and as a prefill of a few, then steps), for every architecture, dense and 4-bit.
#[test]
fn one_forward_equals_cached_steps() {
    let _mlx = common::mlx_lock();
    let tokens: Vec<u32> = (0..20).map(|i| (i * 37 % 250) as u32).collect();
    let n = tokens.len() as i32;
    let quantized = [(Arch::Llama, Some(4)), (Arch::Qwen3Moe, Some(4)), (Arch::Mixtral, Some(8))];
    for (arch, bits) in Arch::ALL.iter().map(|a| (*a, None)).chain(quantized) {
        let (_dir, model) = tiny(arch, 3, bits);
        let t = &model.transformer;
        let full = t.forward(&Array::from_slice(&tokens, &[1, n]), &mut t.new_cache()).unwrap();

        let mut cache = t.new_cache();
        let prefill = 7;
        let first = t.forward(&Array::from_slice(&tokens[..prefill], &[1, prefill as i32]), &mut cache).unwrap();
        let mut rows = vec![to_vec(&first)];
        for &tok in &tokens[prefill..] {
            rows.push(to_vec(&t.forward(&Array::from_slice(&[tok], &[1, 1]), &mut cache).unwrap()));
        }
        let stepped: Vec<f32> = rows.concat();
        let full = to_vec(&full);
        assert_eq!(full.len(), stepped.len());
        let worst = full.iter().zip(&stepped).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-3, "{arch:?} {bits:?}: cached steps differ from one pass by {worst}");
        // and the last row really is position-dependent (the test compares something)
        let last = to_vec(&full_last_row(t, &tokens));
        assert_ne!(last, to_vec(&full_last_row(t, &tokens[1..])), "{arch:?}");
    }
}

fn full_last_row(t: &fastmlx::model::Transformer, tokens: &[u32]) -> Array {
    let logits = t.forward(&Array::from_slice(tokens, &[1, tokens.len() as i32]), &mut t.new_cache()).unwrap();
    logits.try_index((0, -1)).unwrap()
}

#[test]
fn quantized_tiny_model_keeps_its_weights_packed() {
    let _mlx = common::mlx_lock();
    let (dir, model) = tiny(Arch::Qwen3, 5, Some(4));
    let (_dense_dir, dense) = tiny(Arch::Qwen3, 5, None);
    // 4-bit weights take far less disk than f32 ones.
    let size = |d: &std::path::Path| std::fs::metadata(d.join("model.safetensors")).unwrap().len();
    assert!(size(dir.path()) * 3 < size(_dense_dir.path()));
    // Both still compute the same thing approximately (4-bit is close to the f32 model).
    let ids = Array::from_slice(&[10u32, 20, 30], &[1, 3]);
    let q = to_vec(&model.transformer.forward(&ids, &mut model.transformer.new_cache()).unwrap());
    let d = to_vec(&dense.transformer.forward(&ids, &mut dense.transformer.new_cache()).unwrap());
    let corr = correlation(&q, &d);
    assert!(corr > 0.9, "4-bit logits correlate {corr} with f32");
}

fn correlation(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().map(|&x| x as f64).sum::<f64>() / n, b.iter().map(|&x| x as f64).sum::<f64>() / n);
    let cov: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 - ma) * (y as f64 - mb)).sum();
    let va: f64 = a.iter().map(|&x| (x as f64 - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|&y| (y as f64 - mb).powi(2)).sum();
    cov / (va.sqrt() * vb.sqrt())
}

fn rewrite_weights(dir: &std::path::Path, edit: impl FnOnce(&mut std::collections::HashMap<String, Array>)) {
    let file = dir.join("model.safetensors");
    let mut tensors = Array::load_safetensors(&file).unwrap();
    // MLX reads lazily: bring everything in before the file is overwritten.
    mlx_rs::transforms::eval(tensors.values()).unwrap();
    edit(&mut tensors);
    Array::save_safetensors(tensors, None, &file).unwrap();
}

fn logits_of(model: &LoadedModel, ids: &[u32]) -> Vec<f32> {
    let t = &model.transformer;
    to_vec(&t.forward(&Array::from_slice(ids, &[1, ids.len() as i32]), &mut t.new_cache()).unwrap())
}

#[test]
fn bf16_checkpoint_loads_and_computes_in_the_device_dtype() {
    let _mlx = common::mlx_lock();
    let (f32_dir, f32_model) = tiny(Arch::Mistral, 11, None);
    let bf16_dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(bf16_dir.path(), Arch::Mistral, 11, None).unwrap();
    rewrite_weights(bf16_dir.path(), |t| {
        for v in t.values_mut() {
            *v = v.as_dtype(Dtype::Bfloat16).unwrap();
        }
    });
    common::edit_config(bf16_dir.path(), |c| c["torch_dtype"] = "bfloat16".into());
    let bf16 = load_model(bf16_dir.path(), &common::backend()).unwrap();
    let expected = if common::backend().gpu { Dtype::Bfloat16 } else { Dtype::Float32 };
    assert_eq!(bf16.transformer.dtype, expected);
    let ids = [5u32, 17, 99, 200];
    let corr = correlation(&logits_of(&bf16, &ids), &logits_of(&f32_model, &ids));
    assert!(corr > 0.99, "bf16 weights give logits correlating {corr} with f32");
    drop(f32_dir);
}

/// MLX checkpoints may quantize some layers differently ("quantization": {"lm_head": {...}}).
#[test]
fn per_layer_quantization_override() {
    let _mlx = common::mlx_lock();
    let (_dir4, four_bit) = tiny(Arch::Llama, 13, Some(4));
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), Arch::Llama, 13, Some(QuantSpec::affine(64, 4))).unwrap();
    rewrite_weights(dir.path(), |t| {
        let w =
            mlx_rs::ops::dequantize(&t["lm_head.weight"], &t["lm_head.scales"], &t["lm_head.biases"], 64, 4).unwrap();
        let (w, s, b) = mlx_rs::ops::quantize(&w, 64, 8).unwrap();
        t.insert("lm_head.weight".into(), w);
        t.insert("lm_head.scales".into(), s);
        t.insert("lm_head.biases".into(), b);
    });
    // Without an override the head's bits are read from its tensors (as mlx-lm does)...
    let inferred =
        load_model_with(dir.path(), &common::backend(), &LoadOptions { weights: WeightFormat::Packed }).unwrap();
    // ...and an override that contradicts them is a shape error naming the layer.
    common::edit_config(dir.path(), |c| {
        c["quantization"]["lm_head"] = serde_json::json!({"group_size": 64, "bits": 4})
    });
    let err = load_model_with(dir.path(), &common::backend(), &LoadOptions { weights: WeightFormat::Packed })
        .err()
        .expect("must not load");
    assert!(err.to_string().contains("lm_head"), "{err}");
    common::edit_config(dir.path(), |c| {
        c["quantization"]["lm_head"] = serde_json::json!({"group_size": 64, "bits": 8});
        c["quantization_config"] = c["quantization"].clone();
    });
    let mixed =
        load_model_with(dir.path(), &common::backend(), &LoadOptions { weights: WeightFormat::Packed }).unwrap();
    let ids = [3u32, 1, 4, 1, 5];
    let corr = correlation(&logits_of(&mixed, &ids), &logits_of(&four_bit, &ids));
    assert!(corr > 0.99, "an 8-bit head on 4-bit weights: correlation {corr}");
    assert_eq!(logits_of(&inferred, &ids), logits_of(&mixed, &ids), "read from the tensors or named: one model");
}

/// On a CPU, quantized weights are expanded to f32 by default (MLX's CPU quantized matmul is
/// slow and single-threaded); expanded or packed, the model computes the same function.
#[test]
fn quantized_weights_expand_on_cpu_and_match_the_packed_model() {
    let _mlx = common::mlx_lock();
    let (dir, packed) = tiny(Arch::Llama, 17, Some(8));
    let auto = load_model(dir.path(), &common::backend()).unwrap();
    let packed_bytes = packed.weights_bytes;
    if !common::backend().gpu {
        assert!(auto.weights_bytes > 3 * packed_bytes, "expanded: {} vs packed {packed_bytes}", auto.weights_bytes);
    }
    let ids = [9u32, 8, 7, 6, 5];
    let (a, b) = (logits_of(&auto, &ids), logits_of(&packed, &ids));
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert!(worst < 1e-3, "expanded and packed weights differ by {worst}");
}
