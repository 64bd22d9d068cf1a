//! A draft model (`--draft-model`) proposing tokens for the batch: on every architecture's tiny
//! model, the answers (alone, batched, seeded sampling, a next turn, a stop string inside a
//! draft) are the same as without drafting, both with a draft model that proposes what the
//! model writes (the model itself: its drafts are accepted, so rows keep several columns and
//! the draft's own cache is trimmed to what was accepted) and with one that proposes other
//! tokens (another random model: rejected drafts change nothing but speed).
//! The draft batch itself, driven directly: whatever each row accepts (none, some, all of its
//! draft), rows leaving and a long prompt joining in chunks, every proposal is the greedy
//! continuation the draft model computes alone from the row's tokens. A draft model with another
//! tokenizer is refused at load; a request cancelled while drafting frees everything.

mod common;

use std::path::Path;

use common::drafting::{answer, bytes, greedy, same_answers, session, stop_inside, PROMPTS};
use fastmlx::engine::speculative::{Mode, SpeculativeConfig};
use fastmlx::engine::{EngineConfig, EngineHandle, Event, FinishReason};
use fastmlx::fixtures::synthetic;
use fastmlx::mlx::Backend;
use fastmlx::model::{load_model, Arch};

fn config(mode: Mode) -> EngineConfig {
    EngineConfig { speculative: SpeculativeConfig { mode, draft_tokens: 6 }, ..Default::default() }
}

fn engine_with_draft(target: &Path, draft: &Path, mode: Mode) -> Result<EngineHandle, String> {
    let (target, draft) = (target.to_path_buf(), draft.to_path_buf());
    EngineHandle::start_with_draft(
        config(mode),
        move || load_model(&target, &Backend::init()),
        Some(Box::new(move || load_model(&draft, &Backend::init()))),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn a_draft_model_changes_no_output_on_any_architecture() {
    let _mlx = common::mlx_lock();
    let mut wrong_models = 0;
    for (arch, options) in synthetic::engine_variants() {
        let (dir, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        synthetic::write_tiny_model_with(dir.path(), arch, 7, &options).unwrap();
        synthetic::write_tiny_model_with(other.path(), arch, 8, &options).unwrap();
        let name = format!("{}{}", arch.model_type(), if options.moe { " (moe)" } else { "" });

        let plain = common::engine::start(dir.path(), config(Mode::Off));
        let (first, _) = session(&plain, None);
        let stop = stop_inside(&first[0]);
        let (want, _) = session(&plain, stop.as_deref());
        drop(plain);

        let itself = engine_with_draft(dir.path(), dir.path(), Mode::Draft).unwrap();
        assert!(itself.model_info().draft_model.is_some(), "{name}: no draft model in the model's info");
        let same = same_answers(itself, stop.as_deref(), &want, &format!("{name}, the model drafting for itself"));
        if let (Some(stop), Some(last)) = (&stop, want.last()) {
            assert_eq!(last.reason, FinishReason::Stop, "{name}: the stop string {stop:?} did not end it");
        }
        let rate = |m: &fastmlx::engine::Metrics| m.draft_accepted_total as f64 / m.draft_tokens_total.max(1) as f64;
        println!("{name:<20} itself: drafted {:>4}, accepted {:.2}", same.draft_tokens_total, rate(&same));
        assert!(same.draft_tokens_total > 100, "{name}: the draft model drafted {}", same.draft_tokens_total);
        // Greedy rows accept all of them; sampled rows (a third of the session) reject some, as
        // many as the tiny model's distribution is flat (the exact check is the next test).
        assert!(same.draft_accepted_total > 100, "{name}: {} accepted", same.draft_accepted_total);
        // Another model's drafts, almost all rejected: on a plain, a windowed and a hybrid model
        // (the rejection path is the same code on every architecture).
        if !matches!(arch, Arch::Llama | Arch::Gemma3 | Arch::Qwen35) || options.moe {
            continue;
        }
        let wrong = engine_with_draft(dir.path(), other.path(), Mode::Draft).unwrap();
        let other_metrics = same_answers(wrong, stop.as_deref(), &want, &format!("{name}, another model drafting"));
        println!(
            "{name:<20} another model: drafted {:>4}, accepted {:.2}",
            other_metrics.draft_tokens_total,
            rate(&other_metrics)
        );
        assert!(
            other_metrics.draft_tokens_total > 100,
            "{name}: another model drafted {}",
            other_metrics.draft_tokens_total
        );
        wrong_models += 1;
    }
    assert_eq!(wrong_models, 3, "another model drafted on {wrong_models} architectures");
}

#[test]
fn a_draft_model_with_another_tokenizer_is_refused() {
    let _mlx = common::mlx_lock();
    let (dir, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let arch = fastmlx::model::Arch::Qwen3;
    synthetic::write_tiny_model_with(dir.path(), arch, 7, &Default::default()).unwrap();
    synthetic::write_tiny_model_with(other.path(), arch, 8, &Default::default()).unwrap();
    // Two byte tokens trade ids: the same vocabulary size, another tokenizer.
    let path = other.path().join("tokenizer.json");
    let mut tokenizer: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = (vocab["a"].clone(), vocab["b"].clone());
    vocab.insert("a".into(), b.clone());
    vocab.insert("b".into(), a.clone());
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    let error = engine_with_draft(dir.path(), other.path(), Mode::Auto).err().expect("refused");
    let first = a.as_u64().unwrap().min(b.as_u64().unwrap());
    assert!(error.contains(&format!("token {first} ")) && error.contains("must use the model's tokenizer"), "{error}");
}

#[test]
fn a_request_cancelled_while_drafting_frees_everything() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model_with(dir.path(), fastmlx::model::Arch::Qwen3, 7, &Default::default()).unwrap();
    let drafting = engine_with_draft(dir.path(), dir.path(), Mode::Draft).unwrap();
    let mut stream = drafting.submit(greedy(&bytes(PROMPTS[2]))).unwrap();
    for _ in 0..5 {
        assert!(matches!(stream.blocking_recv(), Some(Event::Delta { .. })));
    }
    drop(stream);
    let after = common::engine::wait_idle(&drafting);
    assert_eq!((after.cancelled_total, after.running, after.kv_reserved_bytes), (1, 0, 0), "{after:?}");
    let again = answer(&drafting, greedy(&bytes(PROMPTS[3])));
    let drafted = common::engine::wait_idle(&drafting);
    assert!(drafted.draft_tokens_total > 0, "nothing was drafted");
    drop(drafting);
    let fresh = common::engine::start(dir.path(), config(Mode::Off));
    assert_eq!(again, answer(&fresh, greedy(&bytes(PROMPTS[3]))));
}

/// The draft model's greedy continuation of `tokens`, `most` tokens, computed alone.
fn alone(t: &fastmlx::model::Transformer, tokens: &[u32], most: usize) -> Vec<u32> {
    use mlx_rs::ops::indexing::{argmax_axis, TryIndexOp};
    let mut cache = t.new_cache();
    let mut ids = mlx_rs::Array::from_slice(tokens, &[1, tokens.len() as i32]);
    let mut out = Vec::new();
    for _ in 0..most {
        let logits = t.forward(&ids, &mut cache).unwrap();
        let next = argmax_axis(logits.try_index((.., -1, ..)).unwrap(), -1, None).unwrap();
        let next = next.as_dtype(mlx_rs::Dtype::Uint32).unwrap();
        mlx_rs::transforms::eval([&next]).unwrap();
        out.push(next.as_slice::<u32>()[0]);
        ids = mlx_rs::Array::from_slice(&out[out.len() - 1..], &[1, 1]);
    }
    out
}

#[test]
fn the_draft_batch_proposes_what_the_draft_model_computes_alone() {
    use fastmlx::engine::memory::{CostModel, Governor};
    use fastmlx::engine::speculative::{DraftModel, Want, CATCH_UP};
    let _mlx = common::mlx_lock();
    let mut rng = 7u64;
    let mut roll = |n: usize| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) as usize % n
    };
    for (arch, options) in synthetic::engine_variants() {
        let dir = tempfile::tempdir().unwrap();
        synthetic::write_tiny_model_with(dir.path(), arch, 7, &options).unwrap();
        let model = load_model(dir.path(), &common::backend()).unwrap();
        let reference = load_model(dir.path(), &common::backend()).unwrap();
        let t = &reference.transformer;
        let governor = Governor::new(usize::MAX / 4, CostModel::new(&t.config, 4, false));
        let mut draft = DraftModel::new(model, t.config.vocab_size, false);
        let name = arch.model_type();
        // Three rows; the third's prompt needs two catch-up chunks; row 1 leaves half-way.
        let long: Vec<u32> = (0..CATCH_UP + 40).map(|i| 97 + (i % 23) as u32).collect();
        let mut rows: Vec<(u64, Vec<u32>)> = vec![(1, bytes(PROMPTS[0])), (2, bytes(PROMPTS[1])), (3, long)];
        let (mut checked, mut partial) = (0, 0);
        for round in 0..10 {
            if round == 5 {
                rows.remove(1);
            }
            let most = [4, 2, 3];
            let want: Vec<Want> =
                rows.iter().enumerate().map(|(i, (id, tokens))| Want { id: *id, tokens, most: most[i] }).collect();
            let drafts = draft.propose(&want, &governor);
            let mut accepted = Vec::new();
            for (i, (id, tokens)) in rows.iter_mut().enumerate() {
                let proposal = &drafts[i];
                if !proposal.is_empty() {
                    assert_eq!(proposal, &alone(t, tokens, proposal.len()), "{name}: row {id}, round {round}");
                    assert_eq!(proposal.len(), most[i], "{name}: row {id}, round {round}: a short draft");
                    checked += 1;
                }
                // The model keeps some of the draft (none, part, all), then a token of its own
                // that is not the next drafted one.
                let a = roll(proposal.len() + 1);
                partial += usize::from(a > 0 && a < proposal.len());
                tokens.extend(&proposal[..a]);
                let own = (32 + roll(90)) as u32;
                tokens.push(if proposal.get(a) == Some(&own) { own + 1 } else { own });
                accepted.push((*id, a));
            }
            draft.verified(&accepted);
        }
        println!("{name:<20} {checked} proposals checked, {partial} partly accepted");
        // Row 3 drafts once caught up (after two steps), rows 1 and 2 from the first.
        assert!(checked >= 20, "{name}: only {checked} proposals");
    }
}
