//! Layers with an attention window (Mistral's, Gemma 3's and 4's local layers, gpt-oss's
//! sliding layers) keep only their window: over sequences far longer than it, greedy output
//! follows mlx-lm's (whose rotating caches do the same) token for token, up to float ties, the
//! windowed caches stay bounded, and in the engine a batch, a chunked prefill, a prefix-cache
//! hit (in RAM and after a restart, from disk) all answer as one cold sequence does.

mod common;

use std::time::Duration;

use common::collect;
use common::engine::{request, run, start};
use fastmlx::engine::{EngineConfig, EngineHandle};
use fastmlx::fixtures::synthetic;
use fastmlx::model::cache::window_columns;
use fastmlx::model::{load_model, Arch, KvCache, LoadedModel};
use mlx_rs::ops::indexing::{argmax_axis, TryIndexOp};
use mlx_rs::Array;

struct Case {
    name: String,
    arch: Arch,
    expected: Vec<u32>,
}

/// The long-sequence references of `tests/data/reference/tiny_models.json` (mlx-lm 0.32.2).
fn cases() -> (u64, Vec<u32>, Vec<Case>) {
    let reference = common::read_json("tests/data/reference/tiny_models.json");
    // (The hybrids' long cases are about their recurrences: tests/hybrid_models.rs.)
    let cases = reference["long_cases"]
        .as_array()
        .expect("long cases")
        .iter()
        .filter(|c| !Arch::from_model_type(c["arch"].as_str().unwrap()).unwrap().is_hybrid())
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            arch: Arch::from_model_type(c["arch"].as_str().unwrap()).unwrap(),
            expected: common::ids(&c["output_ids"]),
        })
        .collect();
    (reference["seed"].as_u64().unwrap(), common::ids(&reference["long_prompt_ids"]), cases)
}

/// The case's tiny model, allowed a context long enough for the engine to serve the sequences
/// (the window, not the context, is what these tests are about).
fn tiny(arch: Arch, seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), arch, seed, None).unwrap();
    let config = dir.path().join("config.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    json["max_position_embeddings"] = 2048.into();
    std::fs::write(&config, json.to_string()).unwrap();
    dir
}

/// Logits this close to the largest are a tie: the same additions in another order (one CPU's
/// kernels against another's) may pick either. Seen: gemma4_text's 244th answer token, 27 and
/// 102 at 12.4965925 and 12.4965878 in mlx-lm, 4.7e-6 apart; real differences are whole units.
const TIE: f32 = 1e-4;

/// Follows the reference's answer token by token (each step fed the reference's token), and
/// checks that at every step the reference's token is this model's pick or ties with it.
/// Returns this model's picks.
fn follow_reference(model: &LoadedModel, prompt: &[u32], expected: &[u32], name: &str) -> Vec<u32> {
    let mut cache = model.transformer.new_cache();
    let mut input = prompt.to_vec();
    let mut picks = Vec::with_capacity(expected.len());
    for (i, &want) in expected.iter().enumerate() {
        let ids = Array::from_slice(&input, &[1, input.len() as i32]);
        let logits = model.transformer.forward(&ids, &mut cache).unwrap();
        let last = logits.try_index((0, -1, ..)).unwrap().as_dtype(mlx_rs::Dtype::Float32).unwrap();
        last.eval().unwrap();
        let values = last.as_slice::<f32>();
        let (pick, best) = values.iter().enumerate().fold((0, f32::MIN), |m, (t, &v)| if v > m.1 { (t, v) } else { m });
        assert!(
            values[want as usize] >= best - TIE,
            "{name}: answer token {i}: mlx-lm's {want} scores {} here, the pick {pick} {best}",
            values[want as usize]
        );
        picks.push(pick as u32);
        input = vec![want];
    }
    picks
}

fn next_token(model: &LoadedModel, ids: &[u32], cache: &mut [KvCache]) -> u32 {
    let input = Array::from_slice(ids, &[1, ids.len() as i32]);
    let logits = model.transformer.forward(&input, cache).unwrap();
    let last = logits.try_index((.., -1, ..)).unwrap();
    let best = argmax_axis(&last, -1, None).unwrap();
    best.eval().unwrap();
    best.as_slice::<u32>()[0]
}

#[test]
fn long_sequences_match_mlx_lm_and_windowed_caches_stay_bounded() {
    let _mlx = common::mlx_lock();
    let (seed, prompt, cases) = cases();
    assert!(cases.len() >= 4, "a long case per family with windowed layers");
    for case in &cases {
        let dir = tiny(case.arch, seed);
        let model = load_model(dir.path(), &common::backend()).unwrap();
        let picks = follow_reference(&model, &prompt, &case.expected, &case.name);
        let ties = picks.iter().zip(&case.expected).filter(|(a, b)| a != b).count();
        assert!(ties <= 2, "{}: {ties} steps only tie with mlx-lm's token", case.name);

        // The same sequence in chunks of 100 (a chunked prefill crossing the drops): past the
        // prompt, each chunk's last logits give the reference's next token.
        let windows = model.transformer.cache_windows();
        let window = windows.iter().flatten().copied().next().expect("a windowed layer");
        let sequence = [prompt.clone(), case.expected.clone()].concat();
        let mut cache = model.transformer.new_cache();
        for end in (100..sequence.len()).step_by(100) {
            let next = next_token(&model, &sequence[end - 100..end], &mut cache);
            if end >= prompt.len() {
                assert_eq!(next, sequence[end], "{}: chunked prefill to {end} tokens", case.name);
            }
        }
        let held = (sequence.len() - 1) / 100 * 100;
        for (layer, (c, w)) in cache.iter().zip(&windows).enumerate() {
            assert_eq!(c.len() as usize, held, "{}: layer {layer} knows where it is", case.name);
            match w {
                Some(_) => assert!(
                    c.start() > 0 && (c.offset() as usize) <= window_columns(window) && c.nbytes() > 0,
                    "{}: windowed layer {layer} holds {} of {held} tokens",
                    case.name,
                    c.offset()
                ),
                None => assert_eq!((c.start(), c.offset() as usize), (0, held), "{}: full layer {layer}", case.name),
            }
        }
    }
}

#[test]
fn the_engine_answers_long_sequences_like_mlx_lm_alone_and_in_a_batch() {
    let _mlx = common::mlx_lock();
    let (seed, prompt, cases) = cases();
    for case in &cases {
        let dir = tiny(case.arch, seed);
        // What one sequence generates directly: mlx-lm's answer, or where a step ties (see
        // `follow_reference`, which checks it) the other token and what follows from it.
        let direct = {
            let model = load_model(dir.path(), &common::backend()).unwrap();
            common::greedy(&model, prompt.clone(), case.expected.len()).tokens
        };
        let engine = start(dir.path(), EngineConfig { prefill_chunk: 48, ..Default::default() });
        // Alone: chunks of 48 and a 300-token answer, the windowed layers dropping keys in both.
        let alone = run(&engine, &prompt, case.expected.len());
        assert_eq!(alone.tokens, direct, "{}: the engine differs from one sequence generated directly", case.name);
        // Rows of different lengths joining a running batch at different steps: each is
        // padded and drops keys at its own positions, and answers as it does alone.
        let requests: Vec<(Vec<u32>, usize)> = (0..6)
            .map(|i| {
                let len = [300, 40, 220, 7, 130, 410][i];
                let p: Vec<u32> = (0..len).map(|j| ((i * 53 + j * 29 + j * j / 7) % 250) as u32).collect();
                (p, [120, 260, 90, 350, 200, 60][i])
            })
            .collect();
        let singles: Vec<Vec<u32>> = requests.iter().map(|(p, n)| run(&engine, p, *n).tokens).collect();
        let mut streams = Vec::new();
        for (i, (p, n)) in requests.iter().enumerate() {
            streams.push(engine.submit(request(p, *n)).unwrap());
            if i % 2 == 1 {
                std::thread::sleep(Duration::from_millis(150));
            }
        }
        for (i, (stream, expected)) in streams.into_iter().zip(&singles).enumerate() {
            assert_eq!(&collect(stream).tokens, expected, "{}: request {i} differs inside the batch", case.name);
        }
        let m = common::wait_idle_within(&engine, Duration::from_secs(30));
        assert_eq!((m.kv_reserved_bytes, m.kv_bytes), (0, 0), "{}", case.name);
        engine.shutdown();
    }
}

#[test]
fn prefix_cache_hits_resume_windowed_layers_like_a_cold_prefill() {
    let _mlx = common::mlx_lock();
    let (seed, prompt, cases) = cases();
    for case in &cases {
        let dir = tiny(case.arch, seed);
        let disk = tempfile::tempdir().unwrap();
        let warm_config = || common::disk_config(disk.path());
        let cold = start(dir.path(), EngineConfig { prefill_chunk: 48, prefix_cache_bytes: 0, ..Default::default() });
        let warm = start(dir.path(), warm_config());
        let check = |engine: &EngineHandle, p: &[u32], n: usize, what: &str| {
            let w = run(engine, p, n);
            assert_eq!(w.tokens, run(&cold, p, n).tokens, "{}: {what} changed the answer", case.name);
            w.finish.usage.cached_tokens
        };
        // A long first turn whose answer outgrows the window: its blocks are stored as the
        // steps complete them, before the windowed layers drop their keys.
        let a1 = run(&warm, &prompt, 300);
        let turn2 = [prompt.clone(), a1.tokens.clone(), vec![17, 4, 99, 23, 8]].concat();
        let through_answer = prompt.len() + a1.tokens.len() - 1;
        assert_eq!(check(&warm, &turn2, 40, "the next turn"), through_answer, "{}", case.name);
        // Another conversation after it (the kept buffers are gone): blocks only, resumed in
        // the middle of a block far past the window.
        let other = [prompt[..250].to_vec(), vec![3, 1, 4, 1, 5, 9, 2, 6]].concat();
        let _ = run(&warm, &[7, 7, 7, 7], 2);
        assert_eq!(check(&warm, &other, 30, "a hit mid-prompt"), 250, "{}", case.name);
        let again = [turn2.clone(), vec![11, 12]].concat();
        let hit = check(&warm, &again, 20, "a third turn");
        assert!(hit >= turn2.len() - 1, "{}: {hit} of {}", case.name, turn2.len());
        warm.shutdown();
        // After a restart, from disk.
        let restarted = start(dir.path(), warm_config());
        let hit = check(&restarted, &again, 20, "a hit from disk");
        assert!(hit >= turn2.len() - 1, "{}: {hit} from disk", case.name);
        let m = common::wait_idle_within(&restarted, Duration::from_secs(30));
        assert!(m.prefix_cache_disk_hits > 0, "{}: {m:?}", case.name);
        restarted.shutdown();
        cold.shutdown();
    }
}
