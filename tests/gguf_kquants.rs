//! GGUF files in llama.cpp's K-quants (what most GGUF files on the Hub are): tiny Llama models
//! all Q4_K, all Q6_K, all Q2_K, and the mixes of Q4_K_M, Q5_K_M and Q3_K_M, and Q8_0 with Q4_0,
//! written by scripts/reference/make_kquant_gguf.py with gguf-py (random blocks), next to their
//! reference: the same model with every tensor dequantized by gguf-py (which follows ggml).
//! Expanded, the logits equal the reference's; packed (Q4_K, Q5_K, Q8_0 and Q4_0 as MLX 4-, 5-
//! and 8-bit exactly, Q6_K requantized to 6 bits, Q3_K to 4, Q2_K to 3), they stay within the
//! stated tolerance, at a fraction of the memory.

mod common;

use std::path::Path;

use fastmlx::model::{inspect, load_model_with, LoadOptions, LoadedModel, WeightFormat};
use mlx_rs::Array;

fn make_files() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::root().join(".cache/venv/bin/python"))
        .arg(common::root().join("scripts/reference/make_kquant_gguf.py"))
        .arg(dir.path())
        .output()
        .expect("the reference venv (scripts/setup.sh --test) runs the file writer");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir
}

fn load(path: &Path, weights: WeightFormat) -> LoadedModel {
    load_model_with(path, &common::backend(), &LoadOptions { weights }).unwrap()
}

fn logits(model: &LoadedModel, ids: &[u32]) -> Vec<f32> {
    let t = &model.transformer;
    let out = t.forward(&Array::from_slice(ids, &[1, ids.len() as i32]), &mut t.new_cache()).unwrap();
    let out = out.as_dtype(mlx_rs::Dtype::Float32).unwrap();
    out.eval().unwrap();
    out.as_slice::<f32>().to_vec()
}

/// (largest difference relative to the largest reference logit, correlation).
fn compare(got: &[f32], want: &[f32]) -> (f64, f64) {
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) as f64;
    let n = got.len() as f64;
    let (ma, mb) = (got.iter().map(|&x| x as f64).sum::<f64>() / n, want.iter().map(|&x| x as f64).sum::<f64>() / n);
    let cov: f64 = got.iter().zip(want).map(|(&a, &b)| (a as f64 - ma) * (b as f64 - mb)).sum();
    let va: f64 = got.iter().map(|&a| (a as f64 - ma).powi(2)).sum();
    let vb: f64 = want.iter().map(|&b| (b as f64 - mb).powi(2)).sum();
    (worst / scale, cov / (va.sqrt() * vb.sqrt()))
}

#[test]
fn k_quant_files_match_their_dequantized_reference() {
    let _mlx = common::mlx_lock();
    let dir = make_files();
    let ids: Vec<u32> = (0..24).map(|i| 100 + i * 1543 % 40_000).collect();
    // (file, worst logit difference packed (of the largest logit), correlation packed). Q4_K,
    // Q5_K, Q8_0 and Q4_0 are packed on their own grids: exact. Measured at seeds 7 and 8
    // (KQ_SEED): Q6_K 0.027-0.031 / 0.99963-0.99965, Q4_K_M 0.020-0.062 / 0.99919-0.99978,
    // Q5_K_M 0.134-0.256 / 0.9939-0.9994 (all of it Q6_K's 6-bit repacking: 0.022-0.029 with
    // 8 bits), Q3_K_M 0.075-0.112 / 0.9950-0.9974, Q2_K 0.048-0.049 / 0.99947.
    let cases = [
        ("q4_k", 1e-5, 0.999_999),
        ("q5_k", 1e-5, 0.999_999),
        ("q8_0", 1e-5, 0.999_999),
        ("q6_k", 0.06, 0.999),
        ("q4_k_m", 0.1, 0.998),
        ("q3_k_m", 0.15, 0.99),
        ("q2_k", 0.1, 0.999),
        ("q5_k_m", 0.35, 0.99),
    ];
    for (kind, packed_worst, packed_corr) in cases {
        let reference = load(&dir.path().join(format!("{kind}-f32.gguf")), WeightFormat::Dense);
        let want = logits(&reference, &ids);
        let file = dir.path().join(format!("{kind}.gguf"));

        let expanded = load(&file, WeightFormat::Dense);
        let (worst, _) = compare(&logits(&expanded, &ids), &want);
        assert!(worst < 1e-4, "{kind} expanded: {worst:e} from the dequantized reference");

        let packed = load(&file, WeightFormat::Packed);
        let (worst, corr) = compare(&logits(&packed, &ids), &want);
        eprintln!("{kind} packed: worst logit difference {:.4} of the largest, correlation {corr:.6}", worst);
        assert!(worst < packed_worst && corr > packed_corr, "{kind} packed: {worst} / {corr}");
        // Packed, far below the f32 reference's memory.
        assert!(packed.weights_bytes * 3 < reference.weights_bytes, "{kind}: {} bytes", packed.weights_bytes);
        // The inspector counts, without loading, the bytes the packed weights take.
        let summary = inspect(&file);
        assert_eq!(summary.unloadable_reason, None);
        assert_eq!(summary.loaded_bytes, Some(packed.weights_bytes as u64), "{kind}: the inspector's estimate");
    }
}

#[test]
fn types_not_read_are_refused_by_name() {
    let _mlx = common::mlx_lock();
    let dir = make_files();
    let file = dir.path().join("iq4_xs.gguf");
    let err = load_model_with(&file, &common::backend(), &LoadOptions::default()).err().expect("IQ4_XS is not read");
    let message = err.to_string();
    assert!(message.contains("type 23 (IQ or newer) tensors (") && message.contains(".weight)"), "{message}");
    assert!(message.contains("Q3_K") && message.contains("Q5_K"), "{message}");
    let reason = inspect(&file).unloadable_reason.unwrap_or_default();
    assert!(reason.contains("type 23"), "{reason}");
}

/// Mixture-of-experts GGUFs as llama.cpp writes them (`qwen3moe`, `qwen2moe`: stacked
/// `ffn_*_exps` experts in Q8_0, router, shared expert) give the logits of the same weights
/// read from a Hugging Face folder (dequantized), expanded and packed.
#[test]
fn moe_gguf_files_equal_their_folders() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny");
    fastmlx::fixtures::synthetic::write_tiny_model(&tiny, fastmlx::model::Arch::Llama, 0, None).unwrap();
    let out = std::process::Command::new(common::root().join(".cache/venv/bin/python"))
        .arg(common::root().join("scripts/reference/make_moe_gguf.py"))
        .args([&tiny, &dir.path().to_path_buf()])
        .output()
        .expect("the reference venv runs the file writer");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ids: Vec<u32> = (0..21).map(|i| 3 + i * 11 % 250).collect();
    for arch in ["qwen3moe", "qwen2moe"] {
        let file = dir.path().join(format!("{arch}.gguf"));
        let want = logits(&load(&dir.path().join(arch), WeightFormat::Dense), &ids);
        for weights in [WeightFormat::Dense, WeightFormat::Packed] {
            let model = load(&file, weights);
            let moe = model.transformer.config.moe.clone().expect("experts");
            assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size), (8, 4, 64), "{arch}");
            let (worst, _) = compare(&logits(&model, &ids), &want);
            assert!(worst < 1e-4, "{arch} {weights:?}: {worst:e} from the folder's logits");
        }
        assert_eq!(inspect(&file).unloadable_reason, None, "{arch}");
    }
}
