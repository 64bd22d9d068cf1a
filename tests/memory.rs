//! The memory governor against MLX's own peak counter and in the engine. The cost model: for
//! every architecture's tiny model (hybrids, windowed layers, experts included), at several
//! (rows, chunk, context) points, the predicted working memory of a prefill forward and of a
//! decode step is never below what MLX measured (what keeps the ceiling safe) and never above
//! 1.5 times it and half a MiB (how much it may waste). Then the engine under a ceiling and a
//! KV budget: parking, horizons, refusals, idle.

mod common;

use fastmlx::engine::memory::CostModel;
use fastmlx::fixtures::synthetic;
use fastmlx::mlx;
use fastmlx::model::{load_model, BatchKvCache, KvCache, LayerCache, Transformer};
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

/// Prompt ids for `rows` rows of `n` tokens, different per row.
fn ids(rows: usize, n: usize, salt: usize) -> Array {
    let ids: Vec<u32> =
        (0..rows * n).map(|j| ((j * 31 + salt * 7 + j / 3) % (synthetic::VOCAB - 10) + 5) as u32).collect();
    Array::from_slice(&ids, &[rows as i32, n as i32])
}

fn eval_with_states(outputs: &[&Array], caches: &[BatchKvCache]) {
    let states = caches.iter().flat_map(|c| c.states().iter());
    mlx_rs::transforms::eval(outputs.iter().copied().chain(states)).unwrap();
}

/// The caches of `rows` rows, row `r` holding `depth - 3r` tokens (rows of different lengths,
/// aligned on the right, as the engine's batches are), built as the engine builds them: each row's
/// cache on its own, then pushed into the batch. The rows are one prefill of the longest, cut
/// short (a recurrent state taken whole: its size does not depend on the tokens): a step's memory
/// depends on the buffers' shapes, not on what they hold, and a prefill for every row was most
/// of what this file's grid of points cost (24 rows of 1,200 tokens).
fn batch_at(t: &Transformer, rows: usize, depth: usize) -> Vec<BatchKvCache> {
    let layers = t.config.kv_cache_layers();
    let mut longest: Vec<KvCache> = (0..layers).map(|_| KvCache::new()).collect();
    if depth > 0 {
        let hidden = t.forward_hidden(&ids(1, depth, 0), &mut longest).unwrap();
        let states: Vec<&Array> = longest.iter().flat_map(|c| c.states().iter()).collect();
        mlx_rs::transforms::eval(std::iter::once(&hidden).chain(states)).unwrap();
    }
    let row = |len: i32| -> Vec<KvCache> {
        (0..layers)
            .map(|i| match (len, t.config.is_recurrent(i)) {
                (0, _) => KvCache::new(),
                (_, true) => KvCache::recurrent(longest[i].states().to_vec(), len),
                (_, false) => {
                    let mut cache = longest[i].clone();
                    cache.truncate(len);
                    cache
                }
            })
            .collect()
    };
    let singles: Vec<Vec<KvCache>> = (0..rows).map(|r| row(depth.saturating_sub(3 * r) as i32)).collect();
    let mut batch: Vec<BatchKvCache> = (0..layers).map(|_| BatchKvCache::new()).collect();
    for (i, layer) in batch.iter_mut().enumerate() {
        let row_caches: Vec<&KvCache> = singles.iter().map(|c| &c[i]).collect();
        layer.push_rows(&row_caches).unwrap();
    }
    mlx_rs::transforms::eval(batch.iter().flat_map(BatchKvCache::arrays)).unwrap();
    batch
}

/// A forward of `[rows, n]` on a batch whose longest row holds `depth` tokens: MLX's measured
/// working memory (its peak less what was held before) and the cost model's prediction.
fn measure(t: &Transformer, cost: &CostModel, rows: usize, n: usize, depth: usize) -> (usize, usize) {
    let mut caches = batch_at(t, rows, depth);
    let buffers = fastmlx::engine::memory::buffers_of(&caches);
    mlx::give_back();
    mlx::reset_peak_memory();
    let before = mlx::memory_stats().active;
    let hidden = t.forward_hidden(&ids(rows, n, 99), &mut caches).unwrap();
    let last = hidden.try_index((.., n as i32 - 1, ..)).unwrap();
    let logits = t.logits(&last).unwrap().as_dtype(Dtype::Float32).unwrap();
    eval_with_states(&[&hidden, &logits], &caches);
    let measured = mlx::memory_stats().peak.saturating_sub(before);
    let predicted =
        if n == 1 { cost.decode_bytes(rows, &buffers, 0) } else { cost.prefill_bytes(rows, n, &buffers, 0, rows) };
    (predicted, measured)
}

/// How far a prediction may exceed the peak: 1.5 times, and half a MiB on top. The allowance is
/// for the smallest steps (about 1 MB on the tiny models), where how far MLX's CPU worker lets a
/// hybrid's layers overlap decides a few hundred KB: Qwen3.5 at 1 row x 64 tokens measured 1.07
/// to 1.32 MB here and never above 1.07 MB in five readings on a CI machine, against a prediction
/// of 1.75 MB that must cover the overlap. On a real model's steps (hundreds of MB) it is nothing.
/// A prediction is wasteful past WASTE times the measured peak (and half a MiB, for the small
/// steps); most must be within it, none past GROSS_WASTE. Not every one within WASTE: how much of a
/// step MLX's worker has freed when the peak is read depends on timing, so one point's peak moves by
/// up to 1.7x between runs (Qwen2-MoE, 16 rows x 16 after 470: 2.8 to 4.9 MB in one run's five
/// readings; Qwen3.5 at the same point read 4.8 MB in one CI run, 6.6 MB in the next), and a
/// prediction that must cover the high readings sits past WASTE of a run of low ones.
const WASTE: f64 = 1.5;
const GROSS_WASTE: f64 = 2.0;
const WASTE_ALLOWANCE: usize = 512 << 10;
/// The share of points whose prediction must be within WASTE of the measured peak.
const WITHIN_WASTE: f64 = 0.95;

fn waste_bound(measured: usize, factor: f64) -> usize {
    (measured as f64 * factor) as usize + WASTE_ALLOWANCE
}

#[test]
fn predicted_step_memory_bounds_mlx_peak_for_every_architecture() {
    let _mlx = common::mlx_lock();
    let backend = common::backend();
    // (rows, tokens per row, tokens already cached); one token: a decode step.
    let points = [
        (1, 64, 0),
        (4, 48, 230),
        (8, 64, 0),
        (8, 128, 0),
        (8, 64, 384),
        (8, 64, 640),
        (2, 128, 900),
        (16, 16, 470),
        (24, 1, 1200),
        (64, 1, 400),
    ];
    let mut failures = Vec::new();
    let (mut within, mut all) = (0, 0);
    println!(
        "{:<28} {:>5} {:>5} {:>5} {:>12} {:>12} {:>6}",
        "model", "rows", "n", "depth", "predicted", "measured", "ratio"
    );
    // The hybrids with experts too: how MLX orders a hybrid's layers differs with them.
    let moe = synthetic::TinyOptions { moe: true, ..Default::default() };
    let variants = synthetic::engine_variants()
        .into_iter()
        .chain([(fastmlx::model::config::Arch::Qwen35, moe), (fastmlx::model::config::Arch::Lfm2, moe)]);
    for (arch, options) in variants {
        let dir = tempfile::tempdir().unwrap();
        synthetic::write_tiny_model_with(dir.path(), arch, 7, &options).unwrap();
        let model = load_model(dir.path(), &backend).unwrap();
        let t = &model.transformer;
        let act = if t.dtype == Dtype::Float32 { 4 } else { 2 };
        let cost = CostModel::new(&t.config, act, backend.gpu);
        let name = format!("{}{}", arch.model_type(), if options.moe { " (moe)" } else { "" });
        for &(rows, n, depth) in &points {
            let outside =
                |predicted: usize, low: usize, high: usize| predicted < low || predicted > waste_bound(high, WASTE);
            let (predicted, measured) = measure(t, &cost, rows, n, depth);
            // One reading can mislead both ways. MLX's CPU worker frees a step's buffers on its
            // own thread, so the peak varies from run to run (Qwen3.5, 1 row x 64 tokens: 1.07 to
            // 1.32 MB over 16 runs); and its peak counter is process-wide, so a stray allocation
            // elsewhere in the process moves one reading. Outside the bounds, five readings judge:
            // the prediction must cover all but the highest (a stray), and is wasteful only past
            // the waste bound of the highest (the peak it must be ready for).
            let (mut low, mut high) = (measured, measured);
            if outside(predicted, low, high) {
                let mut readings: Vec<usize> =
                    std::iter::once(measured).chain((0..4).map(|_| measure(t, &cost, rows, n, depth).1)).collect();
                readings.sort_unstable();
                println!("{name} at {rows} x {n} after {depth}: measured {readings:?}");
                (low, high) = (readings[3], readings[4]);
            }
            let measured = high;
            let ratio = predicted as f64 / measured.max(1) as f64;
            println!("{name:<28} {rows:>5} {n:>5} {depth:>5} {predicted:>12} {measured:>12} {ratio:>6.2}");
            all += 1;
            within += usize::from(predicted <= waste_bound(high, WASTE));
            if predicted < low || predicted > waste_bound(high, GROSS_WASTE) {
                failures.push(format!(
                    "{name} at {rows} rows x {n} tokens after {depth}: predicted {predicted}, measured {low} to {high}"
                ));
            }
        }
    }
    println!("{within} of {all} predictions within {WASTE}x of the measured peak");
    assert!(
        failures.is_empty(),
        "predictions outside [measured, {GROSS_WASTE} x measured + {WASTE_ALLOWANCE} B]:\n{}",
        failures.join("\n")
    );
    assert!(
        within as f64 >= WITHIN_WASTE * all as f64,
        "only {within} of {all} predictions within {WASTE} x measured + {WASTE_ALLOWANCE} B"
    );
}

// --- The governor in the engine -------------------------------------------------------------

use std::time::{Duration, Instant};

use common::engine::{request, start};
use common::{collect, wait_idle_within};
use fastmlx::engine::{EngineConfig, Event, FinishReason, RequestStream};
use fastmlx::model::config::Arch;

fn tiny(arch: Arch) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), arch, 11, None).unwrap();
    dir
}

/// A prompt of `n` tokens, different per `salt`.
fn prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|j| ((j * 13 + salt * 29 + j * j / 7) % (synthetic::VOCAB - 10) + 5) as u32).collect()
}

/// A fault injector that only slows every generated token by `ms` (a slow model, for timing).
fn slow_tokens(ms: u64) -> fastmlx::engine::FaultInjector {
    std::sync::Arc::new(move |_, _| {
        std::thread::sleep(Duration::from_millis(ms));
        Ok(())
    })
}

/// The tiny models' keys and values take 1 KiB a token (2 layers x 2 x 2 heads x 32 x f32).
const KV_PER_TOKEN: usize = 1 << 10;

#[test]
fn rows_parked_for_kv_memory_resume_with_the_same_greedy_output() {
    let _mlx = common::mlx_lock();
    let dir = tiny(Arch::Llama);
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(20 + 3 * i, i)).collect();
    let alone: Vec<Vec<u32>> = {
        let engine = start(dir.path(), EngineConfig::default());
        prompts.iter().map(|p| collect(engine.submit(request(p, 48)).unwrap()).tokens).collect()
    };
    // Room for 150 tokens: four rows start on a horizon of 8 (about 120 tokens), and cannot all
    // reach their 68-77 tokens at once.
    let config = EngineConfig {
        kv_budget_bytes: Some(150 * KV_PER_TOKEN),
        kv_reserve_ahead: 8,
        prefix_cache_bytes: 1 << 20,
        ..Default::default()
    };
    let engine = start(dir.path(), config);
    let streams: Vec<RequestStream> = prompts.iter().map(|p| engine.submit(request(p, 48)).unwrap()).collect();
    for (i, stream) in streams.into_iter().enumerate() {
        let outcome = collect(stream);
        assert_eq!(outcome.finish.reason, FinishReason::Length, "{:?}", outcome.finish);
        assert_eq!(outcome.tokens, alone[i], "request {i} changed by being parked");
        assert_eq!(outcome.finish.usage.prompt_tokens, prompts[i].len(), "usage counts the caller's prompt");
    }
    let m = wait_idle_within(&engine, Duration::from_secs(30));
    assert!(m.parked_total > 0, "the budget was meant to force parking: {m:?}");
    assert_eq!(m.kv_reserved_bytes, 0, "every reservation given back");
}

#[test]
fn a_billion_max_tokens_is_admitted_on_a_horizon_and_served_as_far_as_memory_goes() {
    let _mlx = common::mlx_lock();
    let dir = tiny(Arch::Llama);
    let config = EngineConfig { kv_budget_bytes: Some(160 * KV_PER_TOKEN), kv_reserve_ahead: 16, ..Default::default() };
    let engine = start(dir.path(), config);
    let capacity = engine.model_info().kv_capacity_tokens;
    assert_eq!(capacity, 160);
    let long = prompt(100, 1);
    let huge = engine.submit(request(&long, 1_000_000_000)).unwrap();
    // Another request is not shut out by it: it starts at once and finishes.
    let other = collect(engine.submit(request(&prompt(20, 2), 8)).unwrap());
    assert_eq!(other.finish.reason, FinishReason::Length);
    assert_eq!(other.tokens.len(), 8);
    let huge = collect(huge);
    assert_eq!(huge.finish.reason, FinishReason::Length, "{:?}", huge.finish);
    // Its sequence grew to what the KV budget holds, not refused and not a crash.
    assert_eq!(huge.tokens.len(), capacity - 100, "{:?}", huge.finish);
}

#[test]
fn a_request_that_cannot_start_in_time_is_refused_as_overloaded() {
    let _mlx = common::mlx_lock();
    let dir = tiny(Arch::Llama);
    // Slow steps: the first request holds the only row for seconds.
    let fault = slow_tokens(20);
    let config = EngineConfig {
        max_batch: 1,
        max_queue_wait: Some(Duration::from_millis(500)),
        fault_injector: Some(fault),
        ..Default::default()
    };
    let engine = start(dir.path(), config);
    let mut first = engine.submit(request(&prompt(10, 1), 200)).unwrap();
    assert!(matches!(first.blocking_recv(), Some(Event::Delta { .. })));
    let began = Instant::now();
    let late = collect(engine.submit(request(&prompt(10, 2), 4)).unwrap());
    assert_eq!(late.finish.reason, FinishReason::Overloaded, "{:?}", late.finish);
    assert!(late.tokens.is_empty());
    assert!(began.elapsed() >= Duration::from_millis(500), "refused only after its wait");
    let why = late.finish.error.unwrap_or_default();
    assert!(why.contains("waited") && why.contains("retry"), "{why}");
    // The running request was not disturbed.
    drop(first);
    let m = wait_idle_within(&engine, Duration::from_secs(30));
    assert_eq!(m.refused_waited_total, 1);
}

#[test]
fn an_idle_engine_gives_mlx_buffer_cache_back() {
    let _mlx = common::mlx_lock();
    let dir = tiny(Arch::Qwen2);
    let engine = start(dir.path(), EngineConfig::default());
    let streams: Vec<RequestStream> =
        (0..6).map(|i| engine.submit(request(&prompt(120 + i, i), 16)).unwrap()).collect();
    streams.into_iter().for_each(|s| assert_eq!(collect(s).finish.reason, FinishReason::Length));
    let mut metrics = engine.metrics();
    let deadline = Instant::now() + fastmlx::engine::memory::GIVE_BACK_AFTER + Duration::from_secs(10);
    loop {
        let m = metrics.borrow_and_update().clone();
        if m.running == 0 && m.mlx_cache_bytes == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "MLX's buffer cache still holds {} bytes when idle", m.mlx_cache_bytes);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A storm of long prompts under a ceiling just above what the process holds: the prefill
/// narrows (the full chunks' score matrices alone would take well over the headroom), what the
/// process holds never crosses the ceiling, and every request is answered.
#[test]
fn a_storm_of_long_prompts_stays_under_the_memory_ceiling() {
    let _mlx = common::mlx_lock();
    let dir = tiny(Arch::Llama);
    mlx::give_back();
    let base = fastmlx::engine::memory::Governor::held_now();
    let ceiling = base + (96 << 20);
    let limits = mlx::apply_limits(ceiling as u64, false);
    // Whole prompts in one chunk if memory allowed: 16 rows x 4 heads x 440 x 440 scores in f32,
    // twice, are 99 MB alone.
    // Slow tokens: the first request's token holds the engine while the storm queues, so that the
    // sixteen arrive together (tiny models' steps are otherwise quicker than the submissions).
    let fault: fastmlx::engine::FaultInjector = std::sync::Arc::new(|id, _| {
        // Ids count from 1: the first request's.
        if id == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(())
    });
    let config = EngineConfig {
        memory_ceiling: Some(ceiling),
        max_batch: 16,
        prefill_chunk: 16 * 512,
        itl_budget: 0.0,
        fault_injector: Some(fault),
        ..Default::default()
    };
    let engine = start(dir.path(), config);
    let first = engine.submit(request(&prompt(10, 99), 1)).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut highest = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                highest = highest.max(fastmlx::engine::memory::Governor::held_now());
                std::thread::sleep(Duration::from_millis(2));
            }
            highest
        })
    };
    let streams: Vec<RequestStream> =
        (0..16).map(|i| engine.submit(request(&prompt(440 + i, i), 8)).unwrap()).collect();
    for s in std::iter::once(first).chain(streams) {
        assert_eq!(collect(s).finish.reason, FinishReason::Length);
    }
    let m = wait_idle_within(&engine, Duration::from_secs(60));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let highest = sampler.join().unwrap();
    // Restore the process-wide limits for the other tests.
    mlx::apply_limits(mlx::default_ceiling(), false);
    println!(
        "ceiling {} MB (held before {} MB), highest held {} MB, narrowed {} deferred {}, limits {limits:?}",
        ceiling >> 20,
        base >> 20,
        highest >> 20,
        m.memory.narrowed,
        m.memory.deferred
    );
    assert!(m.memory.narrowed > 0, "the storm was meant to need narrowing: {:?}", m.memory);
    assert!(highest <= ceiling, "held {highest} bytes, over the ceiling of {ceiling}");
}

#[test]
fn requests_arriving_together_are_admitted_only_as_far_as_the_kv_budget_holds() {
    let _mlx = common::mlx_lock();
    let dir = tiny(Arch::Llama);
    // Slow tokens: the first request's one token holds the engine while the others queue, so
    // that they are all waiting when it is free again, with nothing running.
    let fault = slow_tokens(20);
    // Room for one 60-token prompt and its horizon, not two.
    let config = EngineConfig {
        kv_budget_bytes: Some(100 * KV_PER_TOKEN),
        kv_reserve_ahead: 16,
        prefix_cache_bytes: 0,
        fault_injector: Some(fault),
        ..Default::default()
    };
    let engine = start(dir.path(), config);
    let first = engine.submit(request(&prompt(10, 0), 1)).unwrap();
    let streams: Vec<RequestStream> = (1..5).map(|i| engine.submit(request(&prompt(60, i), 12)).unwrap()).collect();
    let (mut most_reserved, mut most_running) = (0, 0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let watching = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let m = engine.snapshot();
                most_reserved = most_reserved.max(m.kv_reserved_bytes);
                most_running = most_running.max(m.running);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let outcomes: Vec<_> = std::iter::once(first).chain(streams).map(collect).collect();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        watcher.join().unwrap();
        outcomes
    });
    for outcome in &watching {
        assert_eq!(outcome.finish.reason, FinishReason::Length, "{:?}", outcome.finish);
    }
    assert!(most_reserved <= 100 * KV_PER_TOKEN, "reserved {most_reserved} bytes past the budget");
    assert_eq!(most_running, 1, "one 60-token prompt at a time under this budget");
}
