//! Embedding models and rerankers against the reference (tests/data/reference/embeddings.json,
//! from scripts/reference/embeddings.py: mlx-embeddings' encoders and sentence-transformers'
//! modules): all-MiniLM-L6-v2's tokens and vectors for short, long (cut at 256), code, CJK and
//! emoji texts; the tiny encoders of each family, pooling mode, Dense and prompt handling
//! (NomicBERT's from tests/data/reference/nomic_bert.json, transformers' own model); the
//! tiny rerankers' pair tokens and scores; decoders as encoders (Qwen3-Embedding, EmbeddingGemma
//! with its bidirectional window, Qwen3-Reranker's yes/no judge); the batching engine's answers
//! equal to the model's.

mod common;

use std::path::Path;

use fastmlx::engine::embed::{BatchLimits, EmbedHandle, EmbedOutput, EmbedTask};
use fastmlx::fixtures::synthetic_decoder_encoder::{write_tiny_decoder_encoder, TINY_DECODER_MAX_SEQ};
use fastmlx::fixtures::synthetic_encoder::{encoder_variant, write_tiny_encoder};
use fastmlx::model::encoder::{decoder_role, DecoderRole, Embedder, EncodeError, EncodedText, EncoderKind};
use fastmlx::model::load::load_embedder;
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
    load_embedder(&dir, &common::backend()).unwrap()
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
    load_embedder(dir, &common::backend()).unwrap()
}

#[test]
fn tiny_encoders_of_each_family_and_pooling_equal_the_reference() {
    let _mlx = common::mlx_lock();
    check_tiny_cases(&reference());
}

/// NomicBERT's reference is transformers' own model (PyTorch), from scripts/reference/nomic_bert.py.
#[test]
fn tiny_nomic_bert_equals_transformers() {
    let _mlx = common::mlx_lock();
    let reference = common::read_json("tests/data/reference/nomic_bert.json");
    assert!(!reference["tiny"].as_array().unwrap().is_empty());
    check_tiny_cases(&reference);
}

fn check_tiny_cases(reference: &Value) {
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

/// The reference case's query paired with each of its documents, as the model's tokenizer pairs them.
fn encode_pairs(model: &Embedder, case: &Value) -> Vec<EncodedText> {
    let query = case["query"].as_str().unwrap();
    let documents = case["documents"].as_array().unwrap();
    documents.iter().map(|d| model.tokenizer.encode_pair(query, d.as_str().unwrap(), true).unwrap()).collect()
}

#[test]
fn tiny_rerankers_tokens_and_scores_equal_the_reference() {
    let _mlx = common::mlx_lock();
    let reference = reference();
    for case in reference["rerank"].as_array().unwrap() {
        let name = case["variant"].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let model = tiny(name, case["seed"].as_u64().unwrap(), dir.path());
        let pairs = encode_pairs(&model, case);
        // XLM-RoBERTa has one token type, ModernBERT none: their pairs are all type 0.
        let one_type = name.starts_with("xlmr") || name.starts_with("modernbert");
        for (i, pair) in pairs.iter().enumerate() {
            assert_eq!(pair.ids, common::ids(&case["ids"][i]), "{name}, pair {i}: tokens");
            if !one_type {
                assert_eq!(pair.type_ids, common::ids(&case["type_ids"][i]), "{name}, pair {i}: token types");
            }
        }
        let pairs: Vec<EncodedText> = if one_type {
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
    let engine = EmbedHandle::start(limits, move || load_embedder(&dir, &common::backend())).unwrap();
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

#[test]
fn decoder_embedders_equal_the_reference_batched_and_alone() {
    let _mlx = common::mlx_lock();
    let reference = reference();
    for case in reference["decoders"].as_array().unwrap() {
        let name = case["variant"].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_tiny_decoder_encoder(dir.path(), name, case["seed"].as_u64().unwrap()).unwrap();
        let model = load_embedder(dir.path(), &common::backend()).unwrap();
        assert_eq!(model.kind(), EncoderKind::Embedding, "{name}");
        assert!(model.matryoshka(), "{name}: trained for shorter vectors");
        assert_eq!(model.tokenizer.max_tokens, TINY_DECODER_MAX_SEQ, "{name}: sentence-transformers' limit");
        let rows: Vec<EncodedText> =
            case["rows"].as_array().unwrap().iter().map(|ids| EncodedText::from_ids(common::ids(ids))).collect();
        let want: Vec<Vec<f32>> = case["vectors"].as_array().unwrap().iter().map(floats).collect();
        // Padded in one batch (rows longer than the Gemma's window among them), and each alone.
        let batched = model.embed(&rows).unwrap();
        for (i, row) in rows.iter().enumerate() {
            assert_close(&batched[i], &want[i], &format!("{name}, row {i} in a batch"));
            let alone = model.embed(std::slice::from_ref(row)).unwrap();
            assert_close(&alone[0], &want[i], &format!("{name}, row {i} alone"));
        }
    }
    // Qwen3-Embedding's tokenizer closes each text with <|endoftext|>, the token it pools.
    let dir = tempfile::tempdir().unwrap();
    write_tiny_decoder_encoder(dir.path(), "qwen3-embedding", 1).unwrap();
    let model = load_embedder(dir.path(), &common::backend()).unwrap();
    let encoded = model.tokenizer.encode("", "Hello", true).unwrap();
    assert_eq!(encoded.ids, [72, 101, 108, 108, 111, 256]);
}

#[test]
fn judge_reranker_tokens_and_scores_equal_the_reference() {
    let _mlx = common::mlx_lock();
    let reference = reference();
    let case = &reference["judge"];
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join(case["folder"].as_str().unwrap());
    write_tiny_decoder_encoder(&folder, "qwen3-reranker", case["seed"].as_u64().unwrap()).unwrap();
    let model = load_embedder(&folder, &common::backend()).unwrap();
    assert_eq!(model.kind(), EncoderKind::Reranker);
    let pairs = encode_pairs(&model, case);
    for (i, pair) in pairs.iter().enumerate() {
        assert_eq!(pair.ids, common::ids(&case["ids"][i]), "pair {i}: the judge prompt's tokens");
    }
    let scores = model.score(&pairs).unwrap();
    let want = floats(&case["scores"]);
    for (got, want) in scores.iter().zip(&want) {
        assert!((got - want).abs() < 1e-4, "scores {scores:?}, want {want:?}");
    }
    // The same weights in a folder that does not say "reranker" are a chat model.
    let config: Value = serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap()).unwrap();
    assert_eq!(decoder_role(&folder, &config), Some(DecoderRole::YesNo));
    assert_eq!(decoder_role(dir.path(), &config), None);
}
