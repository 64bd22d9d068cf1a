//! `fastmlx bench-grammar`: what constrained decoding costs per generated token, on the CPU.
//! A JSON answer of a schema is walked token by token; at each step the sampler's fast path
//! (its first choice checked alone) and the whole vocabulary's mask are timed. Run on the
//! model's vocabulary and on one grown to 150k tokens (Qwen's size) with tokens made of two of
//! its own, so the trie is as deep and as wide as a large vocabulary's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use serde_json::json;

use crate::constrain::{Grammar, TokenConstraint, Vocabulary, SPECIAL_MARKER};
use crate::mlx::Backend;
use crate::model::load_model_with;
use crate::sampling::Rng;

use super::bench_cmd::percentile;

#[derive(Args)]
pub struct BenchGrammarArgs {
    /// A model folder or .gguf file (its tokenizer) [default: SmolLM2-135M-Instruct]
    #[arg(long, short)]
    model: Option<PathBuf>,
    /// Timed walks of the answer.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// Grown vocabularies have this many tokens (Qwen2.5 / Qwen3: 151,665 in the tokenizer).
const LARGE_VOCABULARY: usize = 151_665;

pub fn run(args: BenchGrammarArgs) -> anyhow::Result<()> {
    let path = super::resolve_model_path(args.model.clone())?;
    let model = load_model_with(&path, &Backend::init(), &Default::default())?;
    let tokenizer = model.tokenizer.clone();
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,12}$"}, "maxItems": 8},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "zip"]},
        "score": {"type": "number", "multipleOf": 0.5}},
        "required": ["name", "email", "age", "tags", "address", "score"]});
    let answer = r#"{"name": "Ann Lee", "email": "ann.lee@example.com", "age": 41, "tags": ["admin", "ops", "night"], "address": {"street": "12 Rue de la Paix", "zip": "75002"}, "score": 8.5}"#;
    let ids = tokenizer.encode(answer, false, false)?;
    let grammar = Grammar::from_schema(&schema).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("answer: {} tokens of {} | {}", ids.len(), model.name, machine());
    let words = tokenizer.token_byte_table(SPECIAL_MARKER);
    for (label, words) in [("model vocabulary", words.clone()), ("grown to 150k", grown(words))] {
        let size = words.len();
        let started = Instant::now();
        let vocabulary = Arc::new(Vocabulary::new(words, &tokenizer.eos_ids).map_err(anyhow::Error::msg)?);
        let build_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        TokenConstraint::new(&grammar, vocabulary.clone()).map_err(anyhow::Error::msg)?;
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let (mut fast, mut mask, mut allowed) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..args.runs.max(1) {
            let mut constraint = TokenConstraint::new(&grammar, vocabulary.clone()).map_err(anyhow::Error::msg)?;
            let mut logits = vec![0.0f32; size];
            for &id in &ids {
                let t = Instant::now();
                assert!(constraint.allows(id), "the answer is valid");
                fast.push(t.elapsed().as_secs_f64() * 1e6);
                logits.fill(0.0);
                let t = Instant::now();
                allowed.push(constraint.mask(&mut logits) as f64);
                mask.push(t.elapsed().as_secs_f64() * 1e6);
                constraint.advance(id);
            }
        }
        println!(
            "{label:<17} {size:>7} tokens | trie {build_ms:>6.0} ms, schema {compile_ms:>5.1} ms | first choice p50 {:>6.1} µs p99 {:>7.1} µs | whole mask p50 {:>7.0} µs p99 {:>7.0} µs | allowed p50 {:>6.0}",
            percentile(&mut fast, 50.0),
            percentile(&mut fast, 99.0),
            percentile(&mut mask, 50.0),
            percentile(&mut mask, 99.0),
            percentile(&mut allowed, 50.0),
        );
    }
    Ok(())
}

/// The vocabulary grown to [`LARGE_VOCABULARY`] with tokens that join two of its text tokens.
fn grown(mut words: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let text: Vec<usize> =
        (0..words.len()).filter(|&i| words[i].first().is_some_and(|&b| b != SPECIAL_MARKER)).collect();
    let mut rng = Rng::seeded(1);
    let mut seen: std::collections::HashSet<Vec<u8>> = words.iter().cloned().collect();
    while words.len() < LARGE_VOCABULARY {
        let a = &words[text[(rng.next_u64() % text.len() as u64) as usize]];
        let b = &words[text[(rng.next_u64() % text.len() as u64) as usize]];
        let joined = [a.as_slice(), b.as_slice()].concat();
        if seen.insert(joined.clone()) {
            words.push(joined);
        }
    }
    words
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    format!(
        "{} {}, {} cores {cpu}",
        std::env::consts::OS,
        std::env::consts::ARCH,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )
}
