//! A checkpoint's multi-token-prediction head (`mtp.*`, Qwen3.5 dense and with experts):
//! loaded where the checkpoint ships it, it drafts what mlx-vlm 0.7.6's `qwen3_5_mtp` drafter
//! drafts on the same weights (reference: `scripts/reference/mtp_drafts.py`), from the model's
//! hidden states over a prompt; a conversion without it loads as before.

mod common;

use fastmlx::fixtures::synthetic;
use fastmlx::model::{load_model, Arch, KvCache, LoadedModel};
use mlx_rs::ops::indexing::{argmax_axis, TryIndexOp};
use mlx_rs::Array;

fn tiny(arch: Arch, moe: bool, mtp: bool, seed: u64) -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    let options = synthetic::TinyOptions { moe, mtp, ..Default::default() };
    synthetic::write_tiny_model_with(dir.path(), arch, seed, &options).unwrap();
    let model = load_model(dir.path(), &common::backend()).unwrap();
    (dir, model)
}

fn greedy(model: &LoadedModel, hidden: &Array) -> u32 {
    let logits = model.transformer.logits(hidden).unwrap();
    let token = argmax_axis(&logits, -1, None).unwrap();
    token.as_dtype(mlx_rs::Dtype::Uint32).unwrap().as_slice::<u32>().to_vec().pop().unwrap()
}

/// As the reference: the model over `prompt` gives its next token; the head takes the prompt
/// shifted by one (and that token) beside the model's hidden states, and its last output gives
/// the first draft; then each draft and the head's own output give the next, `block - 1` in all.
fn drafts(model: &LoadedModel, prompt: &[u32], block: usize) -> (u32, Vec<u32>) {
    let t = &model.transformer;
    let head = t.mtp.as_ref().expect("the checkpoint's head is loaded");
    let mut cache = t.new_cache();
    let ids = Array::from_slice(prompt, &[1, prompt.len() as i32]);
    let hidden = t.forward_hidden(&ids, &mut cache).unwrap();
    let next = greedy(model, &hidden.try_index((.., -1, ..)).unwrap());
    let shifted: Vec<u32> = prompt[1..].iter().copied().chain([next]).collect();
    let mut own = KvCache::new();
    let shifted = Array::from_slice(&shifted, &[1, prompt.len() as i32]);
    let out = head.forward(t, &shifted, &hidden, &mut own).unwrap();
    (next, draft_on(model, &mut own, &out, block - 1))
}

/// `count` greedy drafts from the head's output `out` (its last position), each draft beside
/// the head's own output giving the next.
fn draft_on(model: &LoadedModel, own: &mut KvCache, out: &Array, count: usize) -> Vec<u32> {
    let (t, head) = (&model.transformer, model.transformer.mtp.as_ref().unwrap());
    let mut last = out.try_index((.., -1.., ..)).unwrap();
    let mut drafted = vec![greedy(model, &last)];
    while drafted.len() < count {
        let token = Array::from_slice(&drafted[drafted.len() - 1..], &[1, 1]);
        last = head.forward(t, &token, &last, own).unwrap();
        drafted.push(greedy(model, &last));
    }
    drafted
}

#[test]
fn the_head_drafts_what_mlx_vlm_drafts() {
    let _mlx = common::mlx_lock();
    let reference = common::read_json("tests/data/reference/mtp_drafts.json");
    let prompt = common::ids(&reference["prompt_ids"]);
    let seed = reference["seed"].as_u64().unwrap();
    let block = reference["block"].as_u64().unwrap() as usize;
    for case in reference["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let moe = case["flags"].as_array().unwrap().iter().any(|f| f == "--moe");
        let (_dir, model) = tiny(Arch::Qwen35, moe, true, seed);
        let (next, drafted) = drafts(&model, &prompt, block);
        assert_eq!(next as u64, case["next_token"].as_u64().unwrap(), "{name}: the model's next token");
        assert_eq!(drafted, common::ids(&case["drafts"]), "{name}: the head's drafts differ from mlx-vlm's");
    }
}

#[test]
fn a_checkpoint_without_the_head_loads_as_before() {
    let _mlx = common::mlx_lock();
    // A conversion that dropped `mtp.*` (mlx-lm's do) while its config still counts the layer.
    let (dir, with) = tiny(Arch::Qwen35, false, true, 7);
    let weights = dir.path().join("model.safetensors");
    let arrays = Array::load_safetensors(&weights).unwrap();
    mlx_rs::transforms::eval(arrays.values()).unwrap();
    let kept: std::collections::HashMap<String, Array> =
        arrays.into_iter().filter(|(name, _)| !name.starts_with("mtp.")).collect();
    let metadata = std::collections::HashMap::from([("format".to_string(), "mlx".to_string())]);
    Array::save_safetensors(kept, &metadata, &weights).unwrap();
    let without = load_model(dir.path(), &common::backend()).unwrap();
    assert!(with.transformer.mtp.is_some() && without.transformer.mtp.is_none());
    // The head's weights count where it is loaded, once (they were once listed twice).
    let head: usize = with.transformer.mtp.as_ref().unwrap().arrays().iter().map(|a| a.nbytes()).sum();
    assert!(head > 0);
    assert_eq!(with.weights_bytes - without.weights_bytes, head, "the head's weights counted once");
    // The model itself is the same either way.
    let prompt: Vec<u32> = (5..40).collect();
    let ids = Array::from_slice(&prompt, &[1, prompt.len() as i32]);
    let logits = |m: &LoadedModel| {
        let out = m.transformer.forward(&ids, &mut m.transformer.new_cache()).unwrap();
        out.as_dtype(mlx_rs::Dtype::Float32).unwrap().as_slice::<f32>().to_vec()
    };
    assert_eq!(logits(&with), logits(&without));
}

#[test]
fn qwen3_next_loads_its_head_with_experts() {
    let _mlx = common::mlx_lock();
    // No reference runs Qwen3-Next's head (mlx-vlm 0.7.6 has no drafter for it): it loads with
    // its layer's experts and drafts tokens of the vocabulary.
    let (_dir, model) = tiny(Arch::Qwen3Next, false, true, 7);
    let prompt: Vec<u32> = (5..30).collect();
    let (_, drafted) = drafts(&model, &prompt, 4);
    assert_eq!(drafted.len(), 3);
    assert!(drafted.iter().all(|&t| (t as usize) < synthetic::VOCAB));
}

// --- The head drafting in the engine ------------------------------------------------------

use common::drafting::{same_answers, session, stop_inside};
use fastmlx::engine::speculative::{Mode, MtpDrafter, SpeculativeConfig};
use fastmlx::engine::{EngineConfig, FinishReason};

fn config(mode: Mode) -> EngineConfig {
    EngineConfig { speculative: SpeculativeConfig { mode, draft_tokens: 4 }, ..Default::default() }
}

/// The heads as tested: Qwen3.5 dense and with experts, Qwen3-Next.
const HEADS: [(&str, Arch, bool); 3] =
    [("qwen3_5", Arch::Qwen35, false), ("qwen3_5_moe", Arch::Qwen35, true), ("qwen3_next", Arch::Qwen3Next, false)];

#[test]
fn drafting_with_the_head_changes_no_output() {
    let _mlx = common::mlx_lock();
    for (name, arch, moe) in HEADS {
        let (dir, _) = tiny(arch, moe, true, 7);
        let plain = common::engine::start(dir.path(), config(Mode::Off));
        let (first, _) = session(&plain, None);
        let stop = stop_inside(&first[0]);
        let (want, _) = session(&plain, stop.as_deref());
        assert!(!plain.model_info().mtp_head, "{name}: the head drafts with drafting off");
        let plain_budget = plain.model_info().kv_budget_bytes;
        drop(plain);
        // `auto` drafts with the head where the checkpoint ships one.
        assert!(common::engine::start(dir.path(), config(Mode::Auto)).model_info().mtp_head);
        let drafting = common::engine::start(dir.path(), config(Mode::Mtp));
        assert!(drafting.model_info().mtp_head);
        // The head's keys and values share the KV budget (one layer beside the model's two).
        let budget = drafting.model_info().kv_budget_bytes;
        assert!(budget < plain_budget * 3 / 4, "{name}: KV budget {budget} with the head, {plain_budget} without");
        let m = same_answers(drafting, stop.as_deref(), &want, &format!("{name}, drafting with its head"));
        if let (Some(stop), Some(last)) = (&stop, want.last()) {
            assert_eq!(last.reason, FinishReason::Stop, "{name}: the stop string {stop:?} did not end it");
        }
        println!("{name:<12} drafted {:>4}, accepted {:>3}", m.draft_tokens_total, m.draft_accepted_total);
        // A random head's drafts are mostly rejected: what is checked is that they are many, and
        // that verifying them changes nothing.
        assert!(m.draft_tokens_total > 100, "{name}: the head drafted {}", m.draft_tokens_total);
    }
}

#[test]
fn mtp_mode_needs_a_head() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), Arch::Qwen35, 7, None).unwrap();
    let path = dir.path().to_path_buf();
    let err = fastmlx::engine::EngineHandle::start(config(Mode::Mtp), move || load_model(&path, &common::backend()))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("no multi-token-prediction head"), "{err}");
}

/// The head computed afresh: the model over `tokens[..end]` (all but the next input), the head
/// over the pairs from position `from` (its cache starting there), then greedy drafts.
fn fresh_drafts(model: &LoadedModel, tokens: &[u32], from: usize, end: usize, most: usize) -> Vec<u32> {
    let t = &model.transformer;
    let head = t.mtp.as_ref().unwrap();
    let ids = Array::from_slice(&tokens[..end - 1], &[1, end as i32 - 1]);
    let hidden = t.forward_hidden(&ids, &mut t.new_cache()).unwrap();
    let hidden = hidden.try_index((.., from as i32.., ..)).unwrap();
    let next = Array::from_slice(&tokens[from + 1..end], &[1, (end - from - 1) as i32]);
    let mut own = KvCache::new().starting_at(from as i32);
    let out = head.forward(t, &next, &hidden, &mut own).unwrap();
    draft_on(model, &mut own, &out, most)
}

/// The drafter fed as the engine feeds it (prompt chunks, then steps keeping one or several
/// positions, a gap where positions went unfed) proposes what the head computes afresh from the
/// row's tokens, every time: drafting leaves nothing in its cache.
#[test]
fn the_drafter_follows_the_rows_positions() {
    let _mlx = common::mlx_lock();
    let (_dir, model) = tiny(Arch::Qwen35, false, true, 7);
    let t = &model.transformer;
    let tokens: Vec<u32> = (0..48).map(|j| ((j * 37 + j * j) % 250 + 5) as u32).collect();
    let mut cache = t.new_cache();
    let mut drafter = MtpDrafter::default();
    let id = 1;
    // (positions the model runs next, whether the head is fed them): chunks of a prompt, decode
    // steps, verify steps that kept 3 and 2, positions not fed (the head starts again after).
    let pieces = [(16, true), (9, true), (1, true), (3, true), (1, true), (2, true), (4, false), (1, true), (3, true)];
    let (mut at, mut from) = (0, 0);
    for (n, fed) in pieces {
        let ids = Array::from_slice(&tokens[at..at + n], &[1, n as i32]);
        let hidden = t.forward_hidden(&ids, &mut cache).unwrap();
        if fed {
            drafter.feed(t, id, at, &tokens[at + 1..at + n + 1], &hidden, 0);
        } else {
            from = at + n;
        }
        at += n;
        if fed {
            let want = fresh_drafts(&model, &tokens, from, at + 1, 3);
            assert_eq!(drafter.propose(t, id, 3), want, "after {at} positions");
            assert_eq!(drafter.propose(t, id, 3), want, "drafting again after {at} positions");
        }
    }
    drafter.forget(id);
    assert_eq!(drafter.nbytes(), 0);
    assert!(drafter.propose(t, id, 3).is_empty());
}
