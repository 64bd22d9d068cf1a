//! Speculative decoding (prompt lookup, drafts verified in the batch): for every architecture's
//! tiny model, greedy and seeded sampled output are the same with drafting on (forced, so every
//! step that has a proposal drafts) and off, for one request and for rows of a batch that
//! accept different numbers of drafted tokens (realigned each step); a stop string inside an
//! accepted run ends it where plain decoding does; a next turn restored from blocks stored while
//! drafting continues as without. The hybrids (Gated DeltaNet, short convolutions) included:
//! their recurrent state is taken back to the last accepted token. Sampled tokens with drafts
//! follow the model's distribution (a chi-square test that rejects two broken acceptance rules).

mod common;

use common::drafting::{answer, bytes, greedy, same_answers, session, stop_inside, PROMPTS};
use fastmlx::engine::speculative::{Mode, SpeculativeConfig};
use fastmlx::engine::{EngineConfig, EngineHandle, Event, FinishReason, Request};
use fastmlx::fixtures::synthetic;

fn engine(dir: &std::path::Path, mode: Mode) -> EngineHandle {
    let speculative = SpeculativeConfig { mode, draft_tokens: 6 };
    common::engine::start(dir, EngineConfig { speculative, ..Default::default() })
}

#[test]
fn drafting_changes_no_output_on_any_architecture() {
    let _mlx = common::mlx_lock();
    let (mut drafted, mut accepted, mut stops, mut hybrid_drafted) = (0, 0, 0, 0);
    for (arch, options) in synthetic::engine_variants() {
        let dir = tempfile::tempdir().unwrap();
        synthetic::write_tiny_model_with(dir.path(), arch, 7, &options).unwrap();
        let name = format!("{}{}", arch.model_type(), if options.moe { " (moe)" } else { "" });

        let plain = engine(dir.path(), Mode::Off);
        let (first, _) = session(&plain, None);
        let stop = stop_inside(&first[0]);
        let (want, off) = session(&plain, stop.as_deref());
        drop(plain);
        assert_eq!(off.draft_tokens_total, 0, "{name}: drafted with speculative decoding off");

        let on = same_answers(engine(dir.path(), Mode::Ngram), stop.as_deref(), &want, &format!("{name}, drafting"));
        println!(
            "{name:<20} drafted {:>4}, accepted {:>4}, verify steps {:>3}",
            on.draft_tokens_total, on.draft_accepted_total, on.verify_steps_total
        );
        // A random tiny model need not copy what it is shown: the hybrids' own check is below.
        if arch.is_hybrid() {
            hybrid_drafted += on.draft_tokens_total;
        } else {
            assert!(on.draft_tokens_total > 0, "{name}: nothing was drafted");
        }
        drafted += on.draft_tokens_total;
        accepted += on.draft_accepted_total;
        if let (Some(stop), Some(last)) = (&stop, want.last()) {
            assert_eq!(last.reason, FinishReason::Stop, "{name}: the stop string {stop:?} did not end it");
            stops += 1;
        }
    }
    println!("all: drafted {drafted}, accepted {accepted}; stop strings checked on {stops} models");
    // Accepted runs happened (else the realignment of rows keeping several columns is untested).
    assert!(accepted > 50, "only {accepted} drafted tokens were accepted");
    assert!(stops > 3, "the stop-string case ran on {stops} models only");
    assert!(hybrid_drafted > 0, "no hybrid drafted");
}

use fastmlx::model::{load_model, BatchKvCache, KvCache, LayerCache};
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

/// Logits `[rows, vocab]` of the last position.
fn last_logits(t: &fastmlx::model::Transformer, ids: &Array, cache: &mut [impl LayerCache]) -> Vec<f32> {
    let hidden = t.forward_hidden(ids, cache).unwrap();
    let last = hidden.try_index((.., ids.dim(1) - 1, ..)).unwrap();
    let logits = t.logits(&last).unwrap().as_dtype(mlx_rs::Dtype::Float32).unwrap();
    mlx_rs::transforms::eval([&logits]).unwrap();
    logits.as_slice::<f32>().to_vec()
}

/// The caches' side of a verify step, on every architecture: two rows of different lengths
/// check four positions each and keep 3 and 1 of them; the next step's logits equal those of
/// each row fed only the tokens it kept (attention realigned, recurrent states taken back).
#[test]
fn a_verify_step_keeps_only_what_each_row_accepted() {
    let _mlx = common::mlx_lock();
    let backend = common::backend();
    let prompts: [Vec<u32>; 2] = [bytes("let x = 1; let y = 2;"), bytes("fn f() {}")];
    let steps: [Vec<u32>; 2] = [bytes("abcd"), bytes("wxyz")];
    let kept = [3usize, 1];
    let next = [bytes("Q"), bytes("R")];
    for (arch, options) in synthetic::engine_variants() {
        let dir = tempfile::tempdir().unwrap();
        synthetic::write_tiny_model_with(dir.path(), arch, 7, &options).unwrap();
        let t = &load_model(dir.path(), &backend).unwrap().transformer;
        let layers = t.config.kv_cache_layers();
        // Each row alone, fed only what it keeps: the reference.
        let want: Vec<Vec<f32>> = (0..2)
            .map(|r| {
                let mut caches: Vec<KvCache> = (0..layers).map(|_| KvCache::new()).collect();
                let mut ids = prompts[r].clone();
                ids.extend(&steps[r][..kept[r]]);
                last_logits(t, &Array::from_slice(&ids, &[1, ids.len() as i32]), &mut caches);
                last_logits(t, &Array::from_slice(&next[r], &[1, 1]), &mut caches)
            })
            .collect();
        // The rows in a batch: four positions checked, 3 and 1 kept, then one more step.
        let singles: Vec<Vec<KvCache>> = (0..2)
            .map(|r| {
                let mut caches: Vec<KvCache> = (0..layers).map(|_| KvCache::new()).collect();
                last_logits(t, &Array::from_slice(&prompts[r], &[1, prompts[r].len() as i32]), &mut caches);
                caches
            })
            .collect();
        let mut batch: Vec<BatchKvCache> = (0..layers).map(|_| BatchKvCache::new()).collect();
        for (l, layer) in batch.iter_mut().enumerate() {
            layer.push_rows(&[&singles[0][l], &singles[1][l]]).unwrap();
        }
        batch.iter_mut().for_each(BatchKvCache::set_verifying);
        let ids: Vec<u32> = steps.concat();
        last_logits(t, &Array::from_slice(&ids, &[2, 4]), &mut batch);
        for layer in &mut batch {
            layer.keep_verified(4, &[kept[0] as i32, kept[1] as i32]).unwrap();
        }
        let got = last_logits(t, &Array::from_slice(&next.concat(), &[2, 1]), &mut batch);
        let vocab = got.len() / 2;
        for r in 0..2 {
            let worst = (0..vocab).map(|i| (got[r * vocab + i] - want[r][i]).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-3, "{}: row {r} differs by {worst} after keeping {} of 4", arch.model_type(), kept[r]);
        }
    }
}

/// A row held to a JSON schema drafts too (its prompt is full of the objects it must write):
/// the drafted tokens pass through the grammar's mask at every position, so the output is the
/// same with drafting on and off, and it is a document the schema allows.
#[test]
fn grammar_rows_emit_only_what_the_grammar_allows() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model_with(dir.path(), fastmlx::model::Arch::Qwen2, 7, &Default::default()).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "id": {"type": "integer"}},
        "required": ["name", "id"],
    });
    let grammar = std::sync::Arc::new(fastmlx::constrain::Grammar::from_schema(&schema).unwrap());
    let prompt = bytes(r#"{"name": "ab", "id": 1} {"name": "ab", "id": 2} {"name": "ab", "id": 3} {"name": "#);
    let run = |mode| {
        let engine = engine(dir.path(), mode);
        let mut request = Request::new(prompt.clone(), 256);
        request.grammar = Some(grammar.clone());
        let got = answer(&engine, request);
        (got, common::engine::wait_idle(&engine))
    };
    let (want, _) = run(Mode::Off);
    let (got, on) = run(Mode::Ngram);
    assert_eq!(got, want, "the constrained answer differs with drafting on");
    assert!(on.draft_tokens_total > 0, "nothing was drafted");
    let value: serde_json::Value = serde_json::from_str(&got.text).expect("a JSON document");
    assert!(value["name"].is_string() && value["id"].is_i64(), "{value}");
    println!("constrained: {:?}; drafted {}, accepted {}", got.text, on.draft_tokens_total, on.draft_accepted_total);
}

/// A caller that goes away while its row drafts: the row is dropped between steps with its
/// reservation, nothing is left running, and the next request is answered as a fresh engine
/// answers it.
#[test]
fn a_request_cancelled_while_drafting_frees_everything() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model_with(dir.path(), fastmlx::model::Arch::Qwen3, 7, &Default::default()).unwrap();
    let prompt = bytes(PROMPTS[2]);
    let drafting = engine(dir.path(), Mode::Ngram);
    let mut stream = drafting.submit(greedy(&prompt)).unwrap();
    for _ in 0..5 {
        assert!(matches!(stream.blocking_recv(), Some(Event::Delta { .. })));
    }
    drop(stream);
    let after = common::engine::wait_idle(&drafting);
    assert_eq!((after.cancelled_total, after.running, after.kv_reserved_bytes), (1, 0, 0), "{after:?}");
    assert!(after.draft_tokens_total > 0, "the cancelled row drafted");
    let again = answer(&drafting, greedy(&bytes(PROMPTS[3])));
    drop(drafting);
    let fresh = engine(dir.path(), Mode::Off);
    assert_eq!(again, answer(&fresh, greedy(&bytes(PROMPTS[3]))));
}

/// Sampling with drafts follows the model's distribution. On a tiny model, with a drafted token
/// `d` (the second likeliest next token, so it is both accepted and rejected often), the first
/// two tokens emitted are drawn 4,000 times by the engine's rule (`verify_row` over one
/// two-position verify forward, then a plain step where the draft was rejected) and compared with
/// the exact distribution p(t1) p(t2 | t1) by a chi-square test at the 0.1 % level. The same test
/// rejects "always accept the draft" and "keep the second position's logits after a rejected
/// draft", so it can fail.
#[test]
fn sampled_tokens_with_drafts_follow_the_models_distribution() {
    use fastmlx::engine::speculative::verify_row;
    use fastmlx::sampling::{Sampler, SamplingParams};
    use std::collections::HashMap;

    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), fastmlx::model::config::Arch::Llama, 3, None).unwrap();
    let model = load_model(dir.path(), &common::backend()).unwrap();
    let t = &model.transformer;
    let layers = t.config.kv_cache_layers();
    let after = |ids: &[u32]| {
        let mut cache: Vec<KvCache> = (0..layers).map(|_| KvCache::new()).collect();
        last_logits(t, &Array::from_slice(ids, &[1, ids.len() as i32]), &mut cache)
    };
    let softmax = |logits: &[f32]| {
        let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = logits.iter().map(|&l| f64::from(l - top).exp()).collect();
        let z: f64 = e.iter().sum();
        e.into_iter().map(|x| x / z).collect::<Vec<f64>>()
    };
    let prompt = bytes("the cat sat on the mat. the cat");
    let p0 = softmax(&after(&prompt));
    let mut order: Vec<u32> = (0..p0.len() as u32).collect();
    order.sort_by(|&a, &b| p0[b as usize].total_cmp(&p0[a as usize]));
    let d = order[1];
    assert!(p0[d as usize] > 0.05 && p0[d as usize] < 0.9, "a draft accepted only sometimes: p = {}", p0[d as usize]);

    // The verify step's logits: one forward over the prompt's last token and the draft, the
    // rest of the prompt cached, as the engine feeds a row.
    let mut cache: Vec<KvCache> = (0..layers).map(|_| KvCache::new()).collect();
    let (head, last) = prompt.split_at(prompt.len() - 1);
    last_logits(t, &Array::from_slice(head, &[1, head.len() as i32]), &mut cache);
    let step = Array::from_slice(&[last[0], d], &[1, 2]);
    let hidden = t.forward_hidden(&step, &mut cache).unwrap();
    let logits = t.logits(&hidden).unwrap().as_dtype(mlx_rs::Dtype::Float32).unwrap();
    mlx_rs::transforms::eval([&logits]).unwrap();
    let vocab = p0.len();
    let verify: Vec<Vec<f32>> = logits.as_slice::<f32>().chunks(vocab).map(<[f32]>::to_vec).collect();

    // The next token's logits after each first token (computed once each).
    let mut next: HashMap<u32, Vec<f32>> = HashMap::new();
    let mut next_logits =
        |t1: u32| next.entry(t1).or_insert_with(|| after(&[prompt.as_slice(), &[t1]].concat())).clone();

    const DRAWS: usize = 4000;
    let params = SamplingParams { temperature: 1.0, seed: Some(11), ..SamplingParams::default() };
    let mut engine_rule = HashMap::<(u32, u32), usize>::new();
    let mut always_accept = HashMap::<(u32, u32), usize>::new();
    let mut stale_logits = HashMap::<(u32, u32), usize>::new();
    let mut sampler = Sampler::new(params.clone());
    for _ in 0..DRAWS {
        let mut emitted = Vec::new();
        let mut positions = verify.clone();
        let (used, _) = verify_row(&[d], |i| {
            let token = sampler.sample(&mut positions[i], &[]).token;
            emitted.push(token);
            (token, true)
        });
        if used == 1 {
            // The draft was rejected: the next token comes from a plain step.
            emitted.push(sampler.sample(&mut next_logits(emitted[0]), &[]).token);
        }
        *engine_rule.entry((emitted[0], emitted[1])).or_default() += 1;
        let t2 = sampler.sample(&mut verify[1].clone(), &[]).token;
        *always_accept.entry((d, t2)).or_default() += 1;
        let t1 = sampler.sample(&mut verify[0].clone(), &[]).token;
        let t2 = sampler.sample(&mut verify[1].clone(), &[]).token;
        *stale_logits.entry((t1, t2)).or_default() += 1;
    }

    // Exact pair probabilities for every first token worth a bucket; the rest in one bucket.
    let mut buckets: Vec<((u32, u32), f64)> = Vec::new();
    for t1 in 0..vocab as u32 {
        if p0[t1 as usize] * DRAWS as f64 >= 5.0 {
            let p1 = softmax(&next_logits(t1));
            for (t2, &q) in p1.iter().enumerate() {
                let p = p0[t1 as usize] * q;
                if p * DRAWS as f64 >= 5.0 {
                    buckets.push(((t1, t2 as u32), p));
                }
            }
        }
    }
    let chi_square = |counts: &HashMap<(u32, u32), usize>| {
        let mut stat = 0.0;
        let (mut rest_expected, mut rest_seen) = (DRAWS as f64, DRAWS as f64);
        for (pair, p) in &buckets {
            let expected = p * DRAWS as f64;
            let seen = *counts.get(pair).unwrap_or(&0) as f64;
            stat += (seen - expected).powi(2) / expected;
            rest_expected -= expected;
            rest_seen -= seen;
        }
        stat + (rest_seen - rest_expected).powi(2) / rest_expected.max(1e-9)
    };
    // The 99.9th percentile of chi-square with `df` degrees of freedom (Wilson-Hilferty).
    let df = buckets.len() as f64;
    let critical = df * (1.0 - 2.0 / (9.0 * df) + 3.09 * (2.0 / (9.0 * df)).sqrt()).powi(3);
    let (fair, broken, stale) = (chi_square(&engine_rule), chi_square(&always_accept), chi_square(&stale_logits));
    println!(
        "{} buckets: chi-square {fair:.1} (engine), {broken:.1} (always accept), {stale:.1} (stale logits), \
         critical {critical:.1}",
        buckets.len()
    );
    assert!(buckets.len() >= 5, "too few buckets to test: {}", buckets.len());
    assert!(fair < critical, "drafting changed the distribution: chi-square {fair:.1} >= {critical:.1}");
    assert!(broken > critical, "the test cannot tell 'always accept' apart: {broken:.1} <= {critical:.1}");
    assert!(stale > critical, "the test cannot tell stale logits apart: {stale:.1} <= {critical:.1}");
}
