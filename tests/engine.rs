//! The continuous-batching engine: batch equals single, cancellation, limits, errors,
//! priorities, chunked prefill and a soak test.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::engine::{start, wait_idle};
use fastmlx::engine::{EngineConfig, EngineHandle, Event, Finish, FinishReason, Request, RequestStream, SubmitError};
use fastmlx::fixtures::synthetic;
use fastmlx::model::{load_model, Arch};
use fastmlx::sampling::SamplingParams;

struct Outcome {
    tokens: Vec<u32>,
    text: String,
    finish: Finish,
    events_after_finish: usize,
}

fn collect(mut stream: RequestStream) -> Outcome {
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut finish = None;
    let mut events_after_finish = 0;
    while let Some(event) = stream.blocking_recv() {
        if finish.is_some() {
            events_after_finish += 1;
            continue;
        }
        match event {
            Event::Delta { text: t, token, .. } => {
                tokens.push(token);
                text.push_str(&t);
            }
            Event::Finish(f) => finish = Some(f),
        }
    }
    Outcome { tokens, text, finish: finish.expect("exactly one finish event"), events_after_finish }
}

fn tiny_model(arch: Arch) -> tempfile::TempDir {
    tiny_variant(arch, &synthetic::TinyOptions::default())
}

fn tiny_variant(arch: Arch, options: &synthetic::TinyOptions) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model_with(dir.path(), arch, 21, options).unwrap();
    dir
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    let mut r = Request::new(prompt, max_tokens);
    r.ignore_eos = true;
    r
}

/// Prompts of different lengths (1 to 45 tokens) and output lengths.
fn mixed_requests(n: usize) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let len = 1 + (i * 11) % 45;
            let prompt = (0..len).map(|j| ((i * 31 + j * 7) % 250) as u32).collect();
            greedy(prompt, 4 + (i * 5) % 17)
        })
        .collect()
}

/// Every request alone, then all of them joining a running batch at different steps.
fn assert_batch_equals_single(engine: &EngineHandle, requests: &[Request]) {
    let alone: Vec<Vec<u32>> = requests.iter().map(|r| collect(engine.submit(r.clone()).unwrap()).tokens).collect();
    let mut streams: Vec<(usize, RequestStream)> = Vec::new();
    let mut outcomes: HashMap<usize, Outcome> = HashMap::new();
    for (i, request) in requests.iter().enumerate() {
        streams.push((i, engine.submit(request.clone()).unwrap()));
        if i % 3 == 2 {
            // Let the batch run a few steps before the next ones join.
            let (j, first) = streams.remove(0);
            outcomes.insert(j, collect(first));
        }
    }
    for (j, s) in streams {
        outcomes.insert(j, collect(s));
    }
    for (i, expected) in alone.iter().enumerate() {
        let got = &outcomes[&i];
        assert_eq!(got.finish.reason, FinishReason::Length);
        assert_eq!(
            &got.tokens,
            expected,
            "request {i} (prompt {} tokens) differs inside the batch",
            requests[i].prompt_ids.len()
        );
    }
}

#[test]
fn batch_equals_single_for_every_architecture() {
    let _mlx = common::mlx_lock();
    for (arch, options) in synthetic::engine_variants() {
        let dir = tiny_variant(arch, &options);
        let engine = start(dir.path(), EngineConfig { prefill_chunk: 16, ..Default::default() });
        assert_batch_equals_single(&engine, &mixed_requests(10));
        let m = wait_idle(&engine);
        assert_eq!((m.kv_reserved_bytes, m.kv_bytes), (0, 0));
        engine.shutdown();
    }
}

#[test]
fn batch_equals_single_on_smollm2() {
    let _mlx = common::mlx_lock();
    let engine = start(&common::smollm2_gguf(), EngineConfig::default());
    let requests: Vec<Request> = (0..8)
        .map(|i| {
            let prompt = (0..(3 + i * 9)).map(|j| 100 + ((i * 131 + j * 17) % 5000) as u32).collect();
            greedy(prompt, 4 + i * 2)
        })
        .collect();
    assert_batch_equals_single(&engine, &requests);
    engine.shutdown();
}

#[test]
fn batch_size_follows_the_running_requests() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Llama);
    let engine = start(dir.path(), EngineConfig::default());
    let streams: Vec<RequestStream> = (0..6).map(|i| engine.submit(greedy(vec![1 + i, 2, 3], 40)).unwrap()).collect();
    let mut metrics = engine.metrics();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut biggest = 0;
    while Instant::now() < deadline && biggest < 6 {
        biggest = biggest.max(metrics.borrow_and_update().batch_size);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(biggest, 6, "six requests decoded together");
    for s in streams {
        assert_eq!(collect(s).tokens.len(), 40);
    }
    let m = wait_idle(&engine);
    assert_eq!((m.running, m.queued, m.kv_tokens), (0, 0, 0));
    assert!(m.generated_tokens_total >= 240 && m.finished_total == 6, "{m:?}");
}

#[test]
fn dropping_the_stream_cancels_and_frees_the_row() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Qwen3);
    let engine = start(dir.path(), EngineConfig::default());
    let mut doomed = engine.submit(greedy(vec![5; 20], 10_000)).unwrap();
    let survivor = engine.submit(greedy(vec![7; 10], 60)).unwrap();
    for _ in 0..3 {
        assert!(matches!(doomed.blocking_recv(), Some(Event::Delta { .. })));
    }
    drop(doomed);
    let outcome = collect(survivor);
    assert_eq!(outcome.tokens.len(), 60, "the other request is undisturbed");
    let m = wait_idle(&engine);
    assert_eq!((m.kv_reserved_bytes, m.kv_bytes), (0, 0), "{m:?}");
    assert_eq!(m.cancelled_total, 1);
    assert!(m.generated_tokens_total < 1000, "the cancelled request stopped early: {m:?}");
}

#[test]
fn full_queue_answers_busy_at_once() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Llama);
    let engine = start(dir.path(), EngineConfig { max_batch: 1, max_queue: 2, ..Default::default() });
    let mut running = engine.submit(greedy(vec![1, 2, 3], 10_000)).unwrap();
    assert!(matches!(running.blocking_recv(), Some(Event::Delta { .. })), "the first request is running");
    let waiting: Vec<RequestStream> = (0..2).map(|_| engine.submit(greedy(vec![4, 5], 3)).unwrap()).collect();
    let started = Instant::now();
    match engine.submit(greedy(vec![6], 3)) {
        Err(SubmitError::Busy { queued }) => assert_eq!(queued, 2),
        other => panic!("expected Busy, got {:?}", other.map(|s| s.id)),
    }
    assert!(started.elapsed() < Duration::from_millis(100), "busy is answered without waiting");
    drop(running);
    for w in waiting {
        assert_eq!(collect(w).tokens.len(), 3);
    }
    assert!(engine.submit(greedy(vec![6], 3)).is_ok(), "room again");
}

#[test]
fn invalid_requests_are_refused_at_submit() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Phi3);
    let engine = start(dir.path(), EngineConfig { kv_budget_bytes: Some(256 << 10), ..Default::default() });
    let ctx = engine.model_info().context_length;
    assert!(
        matches!(engine.submit(greedy(vec![1; ctx], 1)), Err(SubmitError::PromptTooLong { limit, .. }) if limit == ctx)
    );
    assert!(matches!(engine.submit(greedy(vec![], 1)), Err(SubmitError::Invalid(_))));
    assert!(
        matches!(engine.submit(greedy(vec![100_000], 1)), Err(SubmitError::Invalid(m)) if m.contains("vocabulary"))
    );
    let mut bad = greedy(vec![1], 1);
    bad.params = SamplingParams { top_p: 2.0, ..Default::default() };
    assert!(matches!(engine.submit(bad), Err(SubmitError::Invalid(m)) if m.contains("top_p")));
    // A prompt whose KV alone exceeds a 256 KiB budget is refused with the figures; a request
    // whose output would (400 tokens in all) is admitted on a horizon and ends at the budget.
    let per_token = engine.model_info().kv_bytes_per_token;
    let too_long = (256 << 10) / per_token + 1;
    assert!(too_long < ctx);
    assert!(
        matches!(engine.submit(greedy(vec![1; too_long], 1)), Err(SubmitError::TooLarge { needed, budget, .. }) if needed > budget)
    );
    assert!(400 * per_token > 256 << 10);
    assert!(engine.submit(greedy(vec![1; 10], 390)).is_ok());
    engine.shutdown();
    assert!(matches!(engine.submit(greedy(vec![1], 1)), Err(SubmitError::ShutDown)));
}

#[test]
fn stop_strings_max_tokens_and_eos_on_smollm2() {
    let _mlx = common::mlx_lock();
    let gguf = common::smollm2_gguf();
    let model = load_model(&gguf, &common::backend()).unwrap();
    let text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let prompt = model.tokenizer.encode(text, false, true).unwrap();
    drop(model);
    let engine = start(&gguf, EngineConfig::default());
    let request = |max_tokens: usize, stop: &[&str]| {
        let mut r = Request::new(prompt.clone(), max_tokens);
        r.stop = stop.iter().map(|s| s.to_string()).collect();
        r
    };
    let eos = collect(engine.submit(request(40, &[])).unwrap());
    assert_eq!(eos.finish.reason, FinishReason::Stop);
    assert_eq!(eos.finish.stop, None);
    assert!(eos.text.contains("Paris") && !eos.text.contains("<|im_end|>"), "{:?}", eos.text);
    assert_eq!(eos.finish.usage.completion_tokens, eos.tokens.len());
    assert_eq!(eos.finish.usage.prompt_tokens, prompt.len());

    let stopped = collect(engine.submit(request(40, &["of Fr"])).unwrap());
    assert_eq!((stopped.finish.reason, stopped.finish.stop.as_deref()), (FinishReason::Stop, Some("of Fr")));
    assert!(eos.text.starts_with(&stopped.text) && !stopped.text.contains("of"), "{:?}", stopped.text);

    let short = collect(engine.submit(request(3, &[])).unwrap());
    assert_eq!((short.finish.reason, short.tokens.len()), (FinishReason::Length, 3));
    assert!(eos.text.starts_with(&short.text));

    let mut with_logprobs = request(5, &[]);
    with_logprobs.logprobs = Some(3);
    let mut stream = engine.submit(with_logprobs).unwrap();
    while let Some(event) = stream.blocking_recv() {
        if let Event::Delta { token, logprob: Some(lp), .. } = event {
            assert_eq!(lp.token, token);
            assert_eq!(lp.top.len(), 3);
            assert_eq!(lp.top[0].0, token, "greedy picks the most likely token");
            assert!(lp.logprob <= 0.0 && (lp.logprob - lp.top[0].1).abs() < 1e-5);
        }
    }
}

#[test]
fn an_error_in_one_request_does_not_disturb_the_others() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Mistral);
    let requests = mixed_requests(6);
    let alone = {
        let engine = start(dir.path(), EngineConfig::default());
        requests.iter().map(|r| collect(engine.submit(r.clone()).unwrap()).tokens).collect::<Vec<_>>()
    };
    let fault: fastmlx::engine::FaultInjector =
        std::sync::Arc::new(
            |id, generated| if id == 3 && generated == 2 { Err("injected failure".into()) } else { Ok(()) },
        );
    let engine = start(dir.path(), EngineConfig { fault_injector: Some(fault), ..Default::default() });
    let streams: Vec<RequestStream> = requests.iter().map(|r| engine.submit(r.clone()).unwrap()).collect();
    for (i, stream) in streams.into_iter().enumerate() {
        let id = stream.id;
        let outcome = collect(stream);
        assert_eq!(outcome.events_after_finish, 0);
        if id == 3 {
            assert_eq!(outcome.finish.reason, FinishReason::Error);
            assert_eq!(outcome.finish.error.as_deref(), Some("injected failure"));
        } else {
            assert_eq!(outcome.tokens, alone[i], "request {i} disturbed by another's failure");
        }
    }
    assert_eq!(engine.snapshot().errors_total, 1);
}

#[test]
fn higher_priority_starts_first() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Llama);
    let engine = start(dir.path(), EngineConfig { max_batch: 1, ..Default::default() });
    let mut blocker = engine.submit(greedy(vec![1, 2], 30)).unwrap();
    assert!(matches!(blocker.blocking_recv(), Some(Event::Delta { .. })));
    let low = engine.submit(greedy(vec![3, 4], 2)).unwrap();
    let mut urgent = greedy(vec![5, 6], 2);
    urgent.priority = 10;
    let high = engine.submit(urgent).unwrap();
    drop(blocker);
    let (low, high) = (collect(low), collect(high));
    assert!(high.finish.timings.queue < low.finish.timings.queue, "the urgent request waited less");
}

/// A long prompt is prefilled in chunks between decode steps: running rows keep streaming.
#[test]
fn a_long_prompt_does_not_freeze_running_streams() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Qwen2);
    let engine = start(dir.path(), EngineConfig { prefill_chunk: 16, ..Default::default() });
    let mut running = engine.submit(greedy(vec![9, 8, 7], 400)).unwrap();
    assert!(matches!(running.blocking_recv(), Some(Event::Delta { .. })));
    let mut long = engine.submit(greedy((0..480).map(|i| i % 250).collect(), 1)).unwrap();
    // 480 prompt tokens at 16 per step: ~30 steps of prefill, each with a decode step for the
    // running row first.
    let mut tokens_meanwhile = 0;
    loop {
        match long.try_recv_now() {
            Some(Event::Finish(_)) => break,
            Some(_) => {}
            None => {
                if let Some(Event::Delta { .. }) = running.blocking_recv() {
                    tokens_meanwhile += 1;
                }
            }
        }
    }
    assert!(tokens_meanwhile >= 20, "the running stream got only {tokens_meanwhile} tokens during the long prefill");
}

#[test]
fn shutdown_cancels_everything_cleanly() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Llama);
    let engine = start(dir.path(), EngineConfig { max_batch: 2, ..Default::default() });
    let streams: Vec<RequestStream> = (0..5).map(|i| engine.submit(greedy(vec![i + 1; 4], 5000)).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(50));
    engine.shutdown();
    for s in streams {
        let outcome = collect(s);
        assert_eq!(outcome.finish.reason, FinishReason::Cancelled);
    }
}

/// Hundreds of requests with random lengths, joins and cancellations: none lost, each finished
/// exactly once, and memory back where it started.
#[test]
fn soak() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Qwen3);
    let engine = start(dir.path(), EngineConfig { max_batch: 12, prefill_chunk: 64, ..Default::default() });
    let _ = collect(engine.submit(greedy(vec![1, 2, 3], 4)).unwrap()); // warm-up
    let baseline = engine.snapshot().mlx_active_bytes;
    let mut rng = fastmlx::sampling::Rng::seeded(2024);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let engine = engine.clone();
            let seed = rng.next_u64();
            std::thread::spawn(move || {
                let mut rng = fastmlx::sampling::Rng::seeded(seed);
                let (mut finished, mut cancelled) = (0, 0);
                for i in 0..75 {
                    let len = 1 + (rng.next_u64() % 60) as usize;
                    let prompt = (0..len).map(|_| (rng.next_u64() % 250) as u32).collect();
                    let mut request = greedy(prompt, 1 + (rng.next_u64() % 30) as usize);
                    request.params.temperature = if i % 2 == 0 { 0.0 } else { 0.8 };
                    request.ignore_eos = i % 3 != 0;
                    let mut stream = loop {
                        match engine.submit(request.clone()) {
                            Ok(s) => break s,
                            Err(SubmitError::Busy { .. }) => std::thread::sleep(Duration::from_millis(2)),
                            Err(e) => panic!("thread {t}: {e}"),
                        }
                    };
                    if rng.next_u64().is_multiple_of(5) {
                        // Cancel after a few events (or before any).
                        for _ in 0..(rng.next_u64() % 4) {
                            stream.blocking_recv();
                        }
                        drop(stream);
                        cancelled += 1;
                    } else {
                        let outcome = collect(stream);
                        assert_eq!(outcome.events_after_finish, 0);
                        assert!(matches!(outcome.finish.reason, FinishReason::Stop | FinishReason::Length));
                        assert_eq!(outcome.finish.usage.completion_tokens, outcome.tokens.len());
                        finished += 1;
                    }
                    if rng.next_u64().is_multiple_of(4) {
                        std::thread::sleep(Duration::from_millis(rng.next_u64() % 5));
                    }
                }
                (finished, cancelled)
            })
        })
        .collect();
    let (mut finished, mut cancelled) = (0, 0);
    for t in threads {
        let (f, c) = t.join().unwrap();
        finished += f;
        cancelled += c;
    }
    assert_eq!(finished + cancelled, 300);
    let m = wait_idle(&engine);
    assert_eq!(m.requests_total, 301);
    assert_eq!(m.finished_total, 301, "every request ended exactly once: {m:?}");
    assert_eq!((m.kv_reserved_bytes, m.kv_bytes, m.kv_tokens), (0, 0, 0), "{m:?}");
    assert!(m.cancelled_total <= cancelled as u64, "{m:?}");
    // What is left is the prefix cache (finished sequences kept for their next turn; MLX rounds
    // each of its many small arrays up to its allocation size)...
    assert!(
        m.mlx_active_bytes <= baseline + m.prefix_cache_bytes / 4 * 5 + (1 << 20),
        "MLX memory beyond the prefix cache's {} bytes: {} -> {}",
        m.prefix_cache_bytes,
        baseline,
        m.mlx_active_bytes
    );
    // ...and without it, memory is back where it started.
    engine.clear_prefix_cache();
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.snapshot().prefix_cache_bytes > 0 {
        assert!(Instant::now() < deadline, "the prefix cache was not cleared");
        std::thread::sleep(Duration::from_millis(5));
    }
    let active = engine.snapshot().mlx_active_bytes;
    assert!(active <= baseline + (1 << 20), "MLX memory did not return to its starting level: {baseline} -> {active}");
}

#[test]
fn context_cap_limits_prompt_and_output() {
    let _mlx = common::mlx_lock();
    let dir = tiny_model(Arch::Llama);
    let engine = start(dir.path(), EngineConfig { max_context: Some(40), ..Default::default() });
    assert_eq!(engine.model_info().context_length, 40);
    assert!(matches!(engine.submit(greedy(vec![1; 40], 1)), Err(SubmitError::PromptTooLong { limit: 40, .. })));
    let outcome = collect(engine.submit(greedy(vec![1; 30], 100)).unwrap());
    assert_eq!((outcome.finish.reason, outcome.tokens.len()), (FinishReason::Length, 10), "output stops at the cap");
}

/// Prompts of very different lengths prefilled together in one batch (and a long prompt
/// joining a running batch) give the tokens each gives alone; no prefix cache, so every prompt
/// is really prefilled.
#[test]
fn batched_prefill_equals_one_at_a_time_for_every_architecture() {
    let _mlx = common::mlx_lock();
    for (arch, options) in synthetic::engine_variants() {
        let dir = tiny_variant(arch, &options);
        let engine = start(dir.path(), EngineConfig { prefill_chunk: 40, prefix_cache_bytes: 0, ..Default::default() });
        let lengths = [3usize, 150, 17, 64, 1, 90, 33, 120, 9, 200];
        let requests: Vec<Request> = lengths
            .iter()
            .enumerate()
            .map(|(i, &len)| greedy((0..len).map(|j| ((i * 53 + j * 13) % 240 + 5) as u32).collect(), 6 + i % 4))
            .collect();
        let alone: Vec<Vec<u32>> = requests.iter().map(|r| collect(engine.submit(r.clone()).unwrap()).tokens).collect();
        // All at once (prefilled together), then a long one joining the running batch.
        let streams: Vec<RequestStream> = requests[..9].iter().map(|r| engine.submit(r.clone()).unwrap()).collect();
        let mut outcomes: Vec<Outcome> = Vec::new();
        let mut streams = streams.into_iter();
        let first = streams.next().unwrap();
        let late = engine.submit(requests[9].clone()).unwrap();
        outcomes.push(collect(first));
        outcomes.extend(streams.map(collect));
        outcomes.push(collect(late));
        for (i, (got, want)) in outcomes.iter().zip(&alone).enumerate() {
            assert_eq!(
                &got.tokens, want,
                "{arch:?}: request {i} ({} prompt tokens) differs when prefilled in a batch",
                lengths[i]
            );
        }
        let m = wait_idle(&engine);
        assert_eq!((m.kv_reserved_bytes, m.kv_bytes), (0, 0), "{arch:?}");
        engine.shutdown();
    }
}

/// Rows joining a batch one at a time, together from another batch, or by adopting a batch, hold
/// the same keys and values; rows leaving keep the others intact, and the next step writes
/// after every row's last token.
#[test]
fn batch_cache_rows_keep_their_contents_however_they_join() {
    use fastmlx::model::{BatchKvCache, KvCache, LayerCache};
    use mlx_rs::ops::indexing::TryIndexOp;
    use mlx_rs::Array;

    /// A row's keys and values, flattened.
    type Contents = Option<(Vec<f32>, Vec<f32>)>;
    let (heads, dim) = (2, 3);
    let row = |len: i32, seed: f32| -> (KvCache, Contents) {
        let mut cache = KvCache::new();
        if len == 0 {
            return (cache, None);
        }
        let n = (heads * len * dim) as usize;
        let k: Vec<f32> = (0..n).map(|i| seed + i as f32).collect();
        let v: Vec<f32> = (0..n).map(|i| -seed - i as f32).collect();
        let shape = [1, heads, len, dim];
        cache.update(&Array::from_slice(&k, &shape), &Array::from_slice(&v, &shape)).unwrap();
        (cache, Some((k, v)))
    };
    let contents = |batch: &BatchKvCache, r: usize| -> Contents {
        let (k, v) = batch.row_contents(r).unwrap()?;
        let flat = |a: Array| a.flatten(None, None).unwrap().as_slice::<f32>().to_vec();
        Some((flat(k.dense().unwrap()), flat(v.dense().unwrap())))
    };
    let rows: Vec<_> = [(5, 100.0), (0, 200.0), (9, 300.0), (2, 400.0)].iter().map(|&(l, s)| row(l, s)).collect();

    let mut one_by_one = BatchKvCache::new();
    for (cache, _) in &rows {
        one_by_one.push_row(cache).unwrap();
    }
    // Rows 1..3 prefilled together elsewhere, joining after row 0 in another order.
    let mut elsewhere = BatchKvCache::new();
    for (cache, _) in &rows[1..] {
        elsewhere.push_row(cache).unwrap();
    }
    let mut together = BatchKvCache::new();
    together.push_row(&rows[0].0).unwrap();
    together.push_rows_of(&elsewhere, &[2, 0, 1]).unwrap();
    let mut adopted = BatchKvCache::new();
    adopted.push_rows_of(&elsewhere, &[0, 1, 2]).unwrap();

    for (r, (_, expected)) in rows.iter().enumerate() {
        assert_eq!(contents(&one_by_one, r), *expected, "row {r} joined one at a time");
    }
    for (r, source) in [0, 3, 1, 2].into_iter().enumerate() {
        assert_eq!(contents(&together, r), rows[source].1, "row {r} joined together");
    }
    for r in 0..3 {
        assert_eq!(contents(&adopted, r), rows[r + 1].1, "row {r} of an adopted batch");
    }
    assert_eq!(one_by_one.lengths(), vec![5, 0, 9, 2]);
    assert_eq!(together.lengths(), vec![5, 2, 0, 9]);

    // The longest row leaves: the shared padding goes, the others keep their contents.
    one_by_one.retain(&[3, 0, 1]).unwrap();
    assert_eq!(one_by_one.lengths(), vec![2, 5, 0]);
    assert_eq!(one_by_one.width(), 5);
    for (r, source) in [3, 0, 1].into_iter().enumerate() {
        assert_eq!(contents(&one_by_one, r), rows[source].1, "row {r} after others left");
    }
    // A step appends one token to every row, right after its last one.
    let shape = [3, heads, 1, dim];
    let step: Vec<f32> = (0..3 * heads * dim).map(|i| 1000.0 + i as f32).collect();
    let step = Array::from_slice(&step, &shape);
    one_by_one.update(&step, &step).unwrap();
    assert_eq!(one_by_one.lengths(), vec![3, 6, 1]);
    for r in 0..3 {
        let (k, _) = one_by_one.row_contents(r).unwrap().unwrap();
        let last = k.dense().unwrap().try_index((.., .., -1.., ..)).unwrap().flatten(None, None).unwrap();
        let expected = step.try_index((r as i32..r as i32 + 1, .., .., ..)).unwrap().flatten(None, None).unwrap();
        assert_eq!(last.as_slice::<f32>(), expected.as_slice::<f32>(), "row {r}'s new token");
    }
}

#[test]
fn batch_cache_rows_that_share_a_segment_hold_only_their_own_part() {
    use fastmlx::model::cache::AttentionMask;
    use fastmlx::model::cache::SharedKv;
    use fastmlx::model::{BatchKvCache, KvCache, KvTensor, LayerCache, Positions};
    use mlx_rs::ops::concatenate;
    use mlx_rs::Array;

    let (heads, dim) = (2, 3);
    let block = |len: i32, seed: f32| -> (Array, Array) {
        let n = (heads * len * dim) as usize;
        let shape = [1, heads, len, dim];
        let k: Vec<f32> = (0..n).map(|i| seed + i as f32).collect();
        let v: Vec<f32> = (0..n).map(|i| -seed - i as f32).collect();
        (Array::from_slice(&k, &shape), Array::from_slice(&v, &shape))
    };
    let cache_of = |k: &Array, v: &Array| {
        let mut c = KvCache::new();
        c.update(k, v).unwrap();
        c
    };
    let flat = |a: &Array| a.flatten(None, None).unwrap().as_slice::<f32>().to_vec();
    let joined = |a: &Array, b: &Array| flat(&concatenate(&[a.clone(), b.clone()], 2).unwrap());
    let (sk, sv) = block(4, 10.0);
    let shared = SharedKv { id: 7, keys: KvTensor::Dense(sk.clone()), values: KvTensor::Dense(sv.clone()) };
    // Row 0 holds the shared tokens itself, then 3 of its own; row 1 is another sequence; row 2
    // follows the segment with 2 tokens of its own.
    let (ak, av) = block(3, 100.0);
    let a = cache_of(
        &concatenate(&[sk.clone(), ak.clone()], 2).unwrap(),
        &concatenate(&[sv.clone(), av.clone()], 2).unwrap(),
    );
    let (ck, cv) = block(5, 200.0);
    let (bk, bv) = block(2, 300.0);
    let mut batch = BatchKvCache::new();
    batch.push_rows(&[&a, &cache_of(&ck, &cv)]).unwrap();
    assert!(batch.push_rows_with(&[(&cache_of(&bk, &bv), true)]).is_err(), "no segment set yet");
    batch.set_shared(&shared).unwrap();
    batch.push_rows_with(&[(&cache_of(&bk, &bv), true)]).unwrap();
    assert_eq!(batch.lengths(), vec![7, 5, 6]);
    assert_eq!(batch.width(), 7);
    let (k2, v2) = batch.row_contents(2).unwrap().unwrap();
    let (k2, v2) = (k2.dense().unwrap(), v2.dense().unwrap());
    assert_eq!((flat(&k2), flat(&v2)), (joined(&sk, &bk), joined(&sv, &bv)), "the segment, then its own");

    // Row 0 drops its copy: same sequence, the buffers only as wide as the longest own part.
    let before = batch.clone();
    assert!(batch.share_rows(&shared, &[2]).is_err(), "a row that already follows it");
    assert_eq!(batch.lengths(), before.lengths(), "all or nothing");
    batch.share_rows(&shared, &[0]).unwrap();
    assert_eq!(batch.lengths(), vec![7, 5, 6]);
    assert_eq!(batch.width(), 5, "the shared columns are gone from the buffers");
    assert_eq!(batch.held_tokens(), 3 + 5 + 2 + 4, "the segment counted once");
    let (k0, v0) = batch.row_contents(0).unwrap().unwrap();
    let (k0, v0) = (k0.dense().unwrap(), v0.dense().unwrap());
    assert_eq!((flat(&k0), flat(&v0)), (joined(&sk, &ak), joined(&sv, &av)));
    let (k1, _) = batch.row_contents(1).unwrap().unwrap();
    assert_eq!(flat(&k1.dense().unwrap()), flat(&ck));

    // Positions and masks: rows 0 and 2 see the segment, row 1 does not.
    match batch.positions().unwrap() {
        Positions::Rows { offsets, max } => {
            assert_eq!((offsets.as_slice::<i32>().to_vec(), max), (vec![7, 5, 6], 7));
        }
        Positions::Scalar(_) => panic!("rows at different positions"),
    }
    match batch.mask(1, None).unwrap() {
        AttentionMask::Shared { prefix: Some(prefix), .. } => {
            assert_eq!(prefix.as_slice::<bool>().to_vec(), vec![true, false, true]);
        }
        _ => panic!("a mask over the segment and the own keys"),
    }
    assert_eq!(batch.shared().map(|s| s.id), Some(7));

    // The rows that follow it leave: the segment goes with them.
    batch.retain(&[1]).unwrap();
    assert!(batch.shared().is_none());
    assert!(matches!(batch.mask(1, None).unwrap(), AttentionMask::None));
    let (k1, _) = batch.row_contents(0).unwrap().unwrap();
    assert_eq!(flat(&k1.dense().unwrap()), flat(&ck));
}
