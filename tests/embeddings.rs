//! Embedding models and rerankers against the reference (tests/data/reference/embeddings.json,
//! from scripts/reference/embeddings.py: mlx-embeddings' encoders and sentence-transformers'
//! modules): all-MiniLM-L6-v2's tokens and vectors for short, long (cut at 256), code, CJK and
//! emoji texts; the tiny encoders of each family, pooling mode, Dense and prompt handling; the
//! tiny rerankers' pair tokens and scores; the batching engine's answers equal to the model's.

mod common;

use std::path::Path;

use fastmlx::engine::embed::{BatchLimits, EmbedHandle, EmbedOutput, EmbedTask};
use fastmlx::fixtures::synthetic_encoder::{encoder_variant, write_tiny_encoder};
use fastmlx::model::encoder::{Embedder, EncodeError, EncodedText};
use serde_json::Value;

fn reference() -> Value {
    common::read_json("tests/data/reference/embeddings.json")
}

fn floats(value: &Value) -> Vec<f32> {
    value.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// Same direction (cosine ≥ 0.9999) and the same length within 0.1 %: vectors that are not
/// normalised must match in size too.
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: dimensions");
    let c = cosine(got, want);
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let ratio = norm(got) / norm(want);
    assert!(c >= 0.9999 && (ratio - 1.0).abs() < 1e-3, "{what}: cosine {c}, length ratio {ratio}");
}

fn minilm() -> Embedder {
    let dir = common::setup_file(".cache/models/all-MiniLM-L6-v2");
    Embedder::load(&dir, &common::backend()).unwrap()
}

#[test]
fn minilm_tokens_and_vectors_equal_the_reference() {
    let _mlx = common::mlx_lock();
    let reference = reference();
    let want = &reference["minilm"];
    let model = minilm();
    assert_eq!(model.tokenizer.max_tokens, 256, "sentence-transformers' max_seq_length, not tokenizer.json's 128");
    assert_eq!(model.dimensions(), 384);
    let texts: Vec<&str> = want["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let encoded: Vec<EncodedText> = texts.iter().map(|t| model.tokenizer.encode("", t, true).unwrap()).collect();
    for (i, e) in encoded.iter().enumerate() {
        assert_eq!(e.ids, common::ids(&want["ids"][i]), "text {i}: tokens");
    }
    assert_eq!(encoded[1].len(), 256, "the long text is cut at 256 tokens");
    // All in one padded batch, and each alone: the padding changes nothing.
    let batched = model.embed(&encoded).unwrap();
    for (i, e) in encoded.iter().enumerate() {
        let want = floats(&want["vectors"][i]);
        assert_close(&batched[i], &want, &format!("text {i} in a batch"));
        let alone = model.embed(std::slice::from_ref(e)).unwrap();
        assert_close(&alone[0], &want, &format!("text {i} alone"));
    }
    // Not cut when the caller says so: an error, not a silent truncation.
    match model.tokenizer.encode("", texts[1], false) {
        Err(EncodeError::TooLong(e)) => assert_eq!(e.max, 256),
        other => panic!("expected TooLong, got {other:?}"),
    }
}

fn tiny(name: &str, seed: u64, dir: &Path) -> Embedder {
    write_tiny_encoder(dir, &encoder_variant(name).unwrap(), seed).unwrap();
    Embedder::load(dir, &common::backend()).unwrap()
}

#[test]
fn tiny_encoders_of_each_family_and_pooling_equal_the_reference() {
    let _mlx = common::mlx_lock();
    let reference = reference();
    for case in reference["tiny"].as_array().unwrap() {
        let name = case["variant"].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let model = tiny(name, case["seed"].as_u64().unwrap(), dir.path());
        let rows: Vec<EncodedText> = case["rows"]
            .as_array()
            .unwrap()
            .iter()
            .zip(case["prompt_lens"].as_array().unwrap())
            .map(|(ids, prompt)| EncodedText {
                prompt_len: prompt.as_u64().unwrap() as usize,
                ..EncodedText::from_ids(common::ids(ids))
            })
            .collect();
        let got = model.embed(&rows).unwrap();
        for (i, want) in case["vectors"].as_array().unwrap().iter().enumerate() {
            assert_close(&got[i], &floats(want), &format!("{name}, row {i}"));
        }
    }
}

#[test]
fn tiny_rerankers_tokens_and_scores_equal_the_reference() {
    let _mlx = common::mlx_lock();
    let reference = reference();
    for case in reference["rerank"].as_array().unwrap() {
        let name = case["variant"].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let model = tiny(name, case["seed"].as_u64().unwrap(), dir.path());
        let query = case["query"].as_str().unwrap();
        let pairs: Vec<EncodedText> = case["documents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| model.tokenizer.encode_pair(query, d.as_str().unwrap(), true).unwrap())
            .collect();
        let roberta = name.starts_with("xlmr");
        for (i, pair) in pairs.iter().enumerate() {
            assert_eq!(pair.ids, common::ids(&case["ids"][i]), "{name}, pair {i}: tokens");
            if !roberta {
                assert_eq!(pair.type_ids, common::ids(&case["type_ids"][i]), "{name}, pair {i}: token types");
            }
        }
        // XLM-RoBERTa has one token type: its pairs are all type 0.
        let pairs: Vec<EncodedText> = if roberta {
            pairs.into_iter().map(|p| EncodedText { type_ids: vec![0; p.ids.len()], ..p }).collect()
        } else {
            pairs
        };
        let scores = model.score(&pairs).unwrap();
        let want = floats(&case["scores"]);
        for (got, want) in scores.iter().zip(&want) {
            assert!((got - want).abs() < 1e-4, "{name}: scores {scores:?}, want {want:?}");
        }
        let order = |s: &[f32]| {
            let mut o: Vec<usize> = (0..s.len()).collect();
            o.sort_by(|a, b| s[*b].total_cmp(&s[*a]));
            o
        };
        assert_eq!(order(&scores), order(&want), "{name}: ranking");
    }
}

#[test]
fn the_engine_batches_requests_and_answers_each_with_its_own_vectors() {
    let _mlx = common::mlx_lock();
    let dir = common::setup_file(".cache/models/all-MiniLM-L6-v2");
    let direct = minilm();
    let texts =
        ["a", "the cat sat on the mat", "fn main() {}", "机器学习", "🦀 rust", "short", "a longer sentence here"];
    let encode = |t: &&str| direct.tokenizer.encode("", t, true).unwrap();
    let want: Vec<Vec<f32>> = texts.iter().map(|t| direct.embed(&[encode(t)]).unwrap().remove(0)).collect();
    // Batches of at most 2 rows: three requests' texts are interleaved across several batches.
    let limits = BatchLimits { max_rows: 2, ..BatchLimits::default() };
    let engine = EmbedHandle::start(limits, move || Embedder::load(&dir, &common::backend())).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let requests = [&texts[..3], &texts[3..4], &texts[4..]];
    let answers = runtime.block_on(async {
        let runs = requests.iter().map(|r| engine.run(EmbedTask::Vectors, r.iter().map(encode).collect()));
        futures_util::future::join_all(runs).await
    });
    let mut i = 0;
    for answer in answers {
        let EmbedOutput::Vectors(vectors) = answer.unwrap() else { panic!("vectors") };
        for v in vectors {
            assert_close(&v, &want[i], &format!("text {i} through the engine"));
            i += 1;
        }
    }
    assert_eq!(i, texts.len());
    assert_eq!(engine.open_requests(), 0);
    // A reranker's task on an embedding model: an error for that request, and the engine serves on.
    let wrong = runtime.block_on(engine.run(EmbedTask::Scores, vec![encode(&"a")]));
    assert!(wrong.is_err());
    let again = runtime.block_on(engine.run(EmbedTask::Vectors, vec![encode(&"a")])).unwrap();
    assert_eq!(again, EmbedOutput::Vectors(vec![want[0].clone()]));
    engine.shutdown();
}
