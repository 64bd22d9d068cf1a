//! Hybrids (Qwen3-Next, Qwen3.5 dense and with experts, LFM2) in the engine: their Gated
//! DeltaNet and short-convolution layers carry a per-row state from chunk to chunk and step to step, so the
//! engine answers as mlx-lm does alone, in chunks and in a batch; the prefix cache resumes them
//! only where a snapshot of every state was kept (the end of a prompt, of a sequence, every
//! SNAPSHOT_TOKENS), and a hit (from RAM, or from disk after a restart) answers as a cold
//! prefill; a cancelled prefill frees its state.

mod common;

use std::path::Path;
use std::time::Duration;

use common::collect;
use common::engine::{request, run};
use fastmlx::engine::kv::prefix_cache::SNAPSHOT_TOKENS;
use fastmlx::engine::{EngineConfig, EngineHandle, Request};
use fastmlx::fixtures::synthetic;
use fastmlx::model::{load_model, Arch};

fn start(dir: &Path, prefix_cache_bytes: usize, prefill_chunk: usize) -> EngineHandle {
    common::engine::start(dir, EngineConfig { prefill_chunk, prefix_cache_bytes, ..Default::default() })
}

fn tokens(seed: usize, len: usize) -> Vec<u32> {
    (0..len).map(|j| ((seed * 131 + j * 17 + j * j) % (synthetic::VOCAB - 10) + 5) as u32).collect()
}

/// The hybrids as the reference file names them: (case, architecture, `--moe`).
const HYBRIDS: [(&str, Arch, bool); 6] = [
    ("qwen3_next", Arch::Qwen3Next, false),
    ("qwen3_5", Arch::Qwen35, false),
    ("qwen3_5_moe", Arch::Qwen35, true),
    ("lfm2", Arch::Lfm2, false),
    ("granitemoehybrid-moe", Arch::GraniteMoeHybrid, true),
    ("nemotron_h", Arch::NemotronH, false),
];

fn tiny(arch: Arch, moe: bool, seed: u64, context: usize) -> tempfile::TempDir {
    tiny_with(arch, synthetic::TinyOptions { moe, ..Default::default() }, seed, context)
}

fn tiny_with(arch: Arch, options: synthetic::TinyOptions, seed: u64, context: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model_with(dir.path(), arch, seed, &options).unwrap();
    let config = dir.path().join("config.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let text = if json.get("text_config").is_some() { &mut json["text_config"] } else { &mut json };
    text["max_position_embeddings"] = context.into();
    std::fs::write(&config, json.to_string()).unwrap();
    dir
}

#[test]
fn the_engine_answers_like_mlx_lm_in_chunks_and_in_a_batch() {
    let _mlx = common::mlx_lock();
    let reference = common::read_json("tests/data/reference/tiny_models.json");
    let prompt = common::ids(&reference["prompt_ids"]);
    let seed = reference["seed"].as_u64().unwrap();
    for &(name, arch, moe) in
        HYBRIDS.iter().chain(&[("lfm2_moe", Arch::Lfm2, true), ("granitemoehybrid", Arch::GraniteMoeHybrid, false)])
    {
        let case = reference["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).expect("a reference");
        let expected = common::ids(&case["output_ids"]);
        let dir = tiny(arch, moe, seed, 2048);
        // Chunks of 5: the convolution's inputs and the recurrence cross chunk edges.
        let engine = start(dir.path(), 0, 5);
        assert_eq!(run(&engine, &prompt, expected.len()).tokens, expected, "{name}: the engine differs from mlx-lm");
        // Rows of different lengths joining at different steps, leaving at different steps.
        let requests: Vec<(Vec<u32>, usize)> =
            (0..6).map(|i| (tokens(i, [90, 7, 150, 33, 1, 64][i]), 10 + i * 7)).collect();
        let singles: Vec<Vec<u32>> = requests.iter().map(|(p, n)| run(&engine, p, *n).tokens).collect();
        let mut streams = Vec::new();
        for (i, (p, n)) in requests.iter().enumerate() {
            streams.push(engine.submit(request(p, *n)).unwrap());
            if i % 2 == 1 {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        for (i, (stream, expected)) in streams.into_iter().zip(&singles).enumerate() {
            assert_eq!(&collect(stream).tokens, expected, "{name}: request {i} differs inside the batch");
        }
        let m = common::wait_idle_within(&engine, Duration::from_secs(30));
        assert_eq!((m.kv_reserved_bytes, m.kv_bytes), (0, 0), "{name}: every state is freed");
        engine.shutdown();
    }
}

/// Sequences longer than the Mamba-2 scan's chunk (256 positions): mlx-lm's tokens in one
/// prefill, and through the engine in chunks of 100 that end elsewhere than the scan's.
#[test]
fn long_sequences_carry_the_state_across_scan_chunks_like_mlx_lm() {
    let _mlx = common::mlx_lock();
    let reference = common::read_json("tests/data/reference/tiny_models.json");
    let prompt = common::ids(&reference["long_prompt_ids"]);
    let seed = reference["seed"].as_u64().unwrap();
    let long: Vec<&serde_json::Value> =
        reference["long_cases"].as_array().unwrap().iter().filter(|c| c["arch"] == "nemotron_h").collect();
    assert_eq!(long.len(), 1, "a long Mamba-2 case");
    let expected = common::ids(&long[0]["output_ids"]);
    let dir = tiny(Arch::NemotronH, false, seed, 2048);
    let model = load_model(dir.path(), &common::backend()).unwrap();
    assert_eq!(common::greedy(&model, prompt.clone(), expected.len()).tokens, expected, "one prefill");
    let engine = start(dir.path(), 0, 100);
    assert_eq!(run(&engine, &prompt, expected.len()).tokens, expected, "the engine, in chunks of 100");
    engine.shutdown();
}

#[test]
fn prefix_cache_hits_resume_from_snapshots_like_a_cold_prefill() {
    let _mlx = common::mlx_lock();
    for (name, arch, moe) in HYBRIDS {
        let dir = tiny(arch, moe, 11, 8192);
        let disk = tempfile::tempdir().unwrap();
        let warm_config = || common::disk_config(disk.path());
        let warm = common::engine::start(dir.path(), warm_config());
        let cold = start(dir.path(), 0, 48);
        let check_on = |engine: &EngineHandle, p: &[u32], n: usize, what: &str| {
            let w = run(engine, p, n);
            assert_eq!(w.tokens, run(&cold, p, n).tokens, "{name}: {what} changed the answer");
            (w.finish.usage.cached_tokens, w.tokens)
        };
        let check = |p: &[u32], n: usize, what: &str| check_on(&warm, p, n, what);
        let turn1 = tokens(1, 150);
        let (cached, a1) = check(&turn1, 12, "a cold prompt");
        assert_eq!(cached, 0, "{name}");
        // The next turn, straight after: the conversation's kept state.
        let turn2 = [turn1.clone(), a1.clone(), tokens(2, 9)].concat();
        let (cached, a2) = check(&turn2, 10, "the next turn");
        assert_eq!(cached, turn1.len() + a1.len() - 1, "{name}: through the answer");
        // Another conversation in between (the kept state goes), then the third turn: from the
        // blocks and the snapshot the second turn's sequence left.
        let _ = run(&warm, &tokens(3, 20), 3);
        let turn3 = [turn2.clone(), a2.clone(), tokens(4, 6)].concat();
        let (cached, a3) = check(&turn3, 8, "a hit from blocks");
        assert_eq!(cached, turn2.len() + a2.len() - 1, "{name}: resumed at the second turn's snapshot");
        // The same prompt again: the last snapshot before its last token is where turn 2 ended.
        let (cached, _) = check(&turn3, 8, "a repeated prompt");
        assert_eq!(cached, turn2.len() + a2.len() - 1, "{name}: not mid-block, where no state was kept");
        // A prompt longer than SNAPSHOT_TOKENS, and another one sharing its start: the state
        // kept at SNAPSHOT_TOKENS serves the second. (Once per kind of recurrence: the two
        // Qwen3.5 cases share Qwen3-Next's layers, and these prompts are the test's slowest.)
        let long = tokens(5, SNAPSHOT_TOKENS + 150);
        let other = [long[..SNAPSHOT_TOKENS + 70].to_vec(), tokens(6, 12)].concat();
        let long_too = matches!(arch, Arch::Qwen3Next | Arch::Lfm2 | Arch::NemotronH);
        if long_too {
            let _ = check(&long, 2, "a long prompt");
            let (cached, _) = check(&other, 4, "a hit at a prefill snapshot");
            assert_eq!(cached, SNAPSHOT_TOKENS, "{name}");
        }
        let m = common::wait_idle_within(&warm, Duration::from_secs(30));
        assert!(m.prefix_cache_hits >= 3 + long_too as u64 && m.prefix_cache_bytes > 0, "{name}: {m:?}");
        assert!(m.prefix_cache_disk_enabled && m.prefix_cache_disk_blocks > 0, "{name}: {m:?}");
        warm.shutdown();
        // After a restart, from disk: the snapshots the files keep.
        let restarted = common::engine::start(dir.path(), warm_config());
        // First (nothing read back yet): a prompt that goes on along the third turn's whole
        // blocks (its answer's first tokens) past where that prompt ended, then elsewhere. It
        // resumes at the state kept where the third turn's prompt ended, a partial block the walk
        // along whole blocks goes past.
        let branch = [turn3.clone(), a3[..5].to_vec(), tokens(8, 20)].concat();
        assert!(branch.len() / 64 > turn3.len() / 64, "the branch goes on past a whole block");
        let (cached, _) = check_on(&restarted, &branch, 4, "a hit at a passed snapshot from disk");
        assert_eq!(cached, turn3.len(), "{name}: the third turn's prompt-end snapshot, from disk");
        let (cached, _) = check_on(&restarted, &turn3, 8, "a hit from disk");
        assert_eq!(cached, turn2.len() + a2.len() - 1, "{name}: the second turn's snapshot, from disk");
        if long_too {
            let (cached, _) = check_on(&restarted, &other, 4, "a hit at a prefill snapshot from disk");
            assert_eq!(cached, SNAPSHOT_TOKENS, "{name}");
        }
        let m = common::wait_idle_within(&restarted, Duration::from_secs(30));
        assert!(m.prefix_cache_disk_hits > 0, "{name}: {m:?}");
        restarted.shutdown();
        cold.shutdown();
    }
}

/// A chat's system prompt ends mid-block (`snapshot_at`): the prefill stops there and keeps the
/// state, so another conversation with the same system prompt resumes from it.
#[test]
fn a_state_kept_where_the_system_prompt_ends_serves_another_conversation() {
    let _mlx = common::mlx_lock();
    for (name, arch, moe) in HYBRIDS {
        let dir = tiny(arch, moe, 13, 4096);
        let warm = start(dir.path(), 1 << 30, 48);
        let cold = start(dir.path(), 0, 48);
        let system = tokens(9, 100);
        let first = [system.clone(), tokens(10, 40)].concat();
        let second = [system.clone(), tokens(11, 30)].concat();
        let with_end = |p: &[u32]| Request { snapshot_at: Some(system.len()), ..request(p, 6) };
        let _ = collect(warm.submit(with_end(&first)).unwrap());
        let hit = collect(warm.submit(with_end(&second)).unwrap());
        assert_eq!(hit.finish.usage.cached_tokens, system.len(), "{name}: resumed where the system prompt ends");
        assert_eq!(hit.tokens, run(&cold, &second, 6).tokens, "{name}: the resumed state answers as a cold one");
        warm.shutdown();
        cold.shutdown();
    }
}

#[test]
fn a_prefill_cancelled_midway_frees_its_state() {
    let _mlx = common::mlx_lock();
    let dir = tiny(Arch::Qwen3Next, false, 12, 4096);
    let engine = start(dir.path(), 1 << 30, 16);
    let prompt = tokens(8, 600);
    let stream = engine.submit(request(&prompt, 4)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while engine.metrics().borrow().prompt_tokens_total < 64 {
        assert!(std::time::Instant::now() < deadline, "the prefill never started");
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(stream);
    let m = common::wait_idle_within(&engine, Duration::from_secs(30));
    assert_eq!((m.kv_reserved_bytes, m.kv_bytes), (0, 0), "the cancelled row's state is gone");
    assert!(m.prompt_tokens_total < 600, "cancelled before the end: {m:?}");
    // What it stored is usable: the same prompt answers as a cold engine does.
    let cold = start(dir.path(), 0, 16);
    assert_eq!(run(&engine, &prompt, 4).tokens, run(&cold, &prompt, 4).tokens);
    engine.shutdown();
    cold.shutdown();
}

/// Checkpoints as Hugging Face publishes them load as their MLX conversions: convolutions
/// `[C, 1, K]`, the Qwen families' norms stored as `w` for `x * (1 + w)`, Qwen3.5's fused experts
/// under `model.language_model.`, Qwen3-Next's experts one by one (LFM2: its convolutions only);
/// the Qwen families' multi-token-prediction head (`mtp.*`) with them.
#[test]
fn hugging_face_layouts_load_as_their_mlx_conversions() {
    use mlx_rs::ops::indexing::TryIndexOp;
    use mlx_rs::Array;
    use std::collections::HashMap;
    let _mlx = common::mlx_lock();
    let layouts = [
        ("qwen3_5_moe", Arch::Qwen35, true),
        ("qwen3_next", Arch::Qwen3Next, false),
        ("lfm2", Arch::Lfm2, false),
        ("lfm2_moe", Arch::Lfm2, true),
    ];
    // LFM2's names for the projections, as Hugging Face publishes LFM2-MoE.
    let lfm2_name = |n: &str| n.replace("gate_proj.", "w1.").replace("up_proj.", "w3.").replace("down_proj.", "w2.");
    for (name, arch, moe) in layouts {
        let options = synthetic::TinyOptions { moe, mtp: arch != Arch::Lfm2, ..Default::default() };
        let mlx_dir = tiny_with(arch, options, 13, 2048);
        let raw_dir = tiny_with(arch, options, 13, 2048);
        let file = raw_dir.path().join("model.safetensors");
        let tensors = Array::load_safetensors(&file).unwrap();
        mlx_rs::transforms::eval(tensors.values()).unwrap();
        let mut raw: HashMap<String, Array> = HashMap::new();
        let one = Array::from_f32(1.0);
        for (key, value) in tensors {
            let plain = key.strip_prefix("language_model.").unwrap_or(&key).to_string();
            let renamed = match plain.strip_prefix("model.") {
                Some(rest) if arch == Arch::Qwen35 => format!("model.language_model.{rest}"),
                _ => plain.clone(),
            };
            let shifted_norm =
                ["input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight"]
                    .iter()
                    .any(|n| plain.ends_with(n))
                    || plain == "model.norm.weight"
                    || ["mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"]
                        .contains(&plain.as_str());
            if arch == Arch::Lfm2 && plain.contains(".switch_mlp.") {
                // One tensor per expert, `w1`/`w3`/`w2`.
                let (block, proj) = renamed.split_once(".switch_mlp.").unwrap();
                for e in 0..value.dim(0) {
                    raw.insert(format!("{block}.experts.{e}.{}", lfm2_name(proj)), value.try_index(e).unwrap());
                }
            } else if arch == Arch::Lfm2 && plain.contains(".feed_forward.") {
                raw.insert(lfm2_name(&renamed), value);
            } else if plain.ends_with("conv1d.weight") || plain.ends_with("conv.conv.weight") {
                raw.insert(renamed, value.swap_axes(1, 2).unwrap());
            } else if shifted_norm {
                raw.insert(renamed, value.subtract(&one).unwrap());
            } else if plain.contains(".switch_mlp.") && arch == Arch::Qwen3Next {
                // One tensor per expert.
                let (block, proj) = renamed.split_once(".switch_mlp.").unwrap();
                for e in 0..value.dim(0) {
                    raw.insert(format!("{block}.experts.{e}.{proj}"), value.try_index(e).unwrap());
                }
            } else if plain.contains(".switch_mlp.") {
                let (block, proj) = renamed.split_once(".switch_mlp.").unwrap();
                match proj {
                    "down_proj.weight" => {
                        raw.insert(format!("{block}.experts.down_proj"), value);
                    }
                    "gate_proj.weight" | "up_proj.weight" => {
                        raw.insert(format!("{block}.experts.{proj}"), value);
                    }
                    _ => panic!("{proj}"),
                }
            } else {
                raw.insert(renamed, value);
            }
        }
        // Qwen3.5: gate and up fused, gate rows first.
        let fused: Vec<String> = raw.keys().filter(|k| k.ends_with(".experts.gate_proj.weight")).cloned().collect();
        for gate_name in fused {
            let block = gate_name.trim_end_matches(".gate_proj.weight").to_string();
            let gate = raw.remove(&gate_name).unwrap();
            let up = raw.remove(&format!("{block}.up_proj.weight")).unwrap();
            raw.insert(format!("{block}.gate_up_proj"), mlx_rs::ops::concatenate(&[gate, up], -2).unwrap());
        }
        Array::save_safetensors(raw, None, &file).unwrap();
        let ids = [5u32, 17, 99, 200, 3, 44, 12];
        let logits = |dir: &Path| {
            let model = load_model(dir, &fastmlx::mlx::Backend::init()).unwrap();
            let t = &model.transformer;
            let ids = Array::from_slice(&ids, &[1, ids.len() as i32]);
            let hidden = t.forward_hidden(&ids, &mut t.new_cache()).unwrap();
            let mut out = t.logits(&hidden).unwrap();
            if let Some(head) = &t.mtp {
                // The head's predictions beside the model's.
                let drafts = head.forward(t, &ids, &hidden, &mut fastmlx::model::KvCache::new()).unwrap();
                out = mlx_rs::ops::concatenate(&[out, t.logits(&drafts).unwrap()], -1).unwrap();
            }
            out.eval().unwrap();
            out.as_slice::<f32>().to_vec()
        };
        let (a, b) = (logits(mlx_dir.path()), logits(raw_dir.path()));
        let heads = usize::from(options.mtp);
        assert_eq!(a.len(), ids.len() * synthetic::VOCAB * (1 + heads), "{name}: the head loads in both layouts");
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-4, "{name}: the Hugging Face layout's logits differ by {worst}");
    }
}
