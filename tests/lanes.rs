//! The interactive lane: a high-priority request (autocomplete) pre-empts a long prompt's
//! prefill and reaches its first token first; a pre-empted request that is cancelled frees
//! what it held; clients set priorities with `priority` or `X-Priority`.

#![allow(clippy::await_holding_lock)]

mod common;

use std::time::{Duration, Instant};

use fastmlx::engine::{EngineConfig, EngineHandle, Event, FinishReason, Request, RequestStream};
use fastmlx::fixtures::synthetic;
use fastmlx::model::Arch;

fn start(dir: &std::path::Path) -> EngineHandle {
    // Small chunks and no prefix cache: a long prompt takes many steps to prefill.
    let config = EngineConfig { prefill_chunk: 16, itl_budget: 0.0, prefix_cache_bytes: 0, ..Default::default() };
    common::engine::start(dir, config)
}

fn request(seed: usize, len: usize, priority: i32) -> Request {
    let prompt = (0..len).map(|j| ((seed * 37 + j * 11) % 240 + 5) as u32).collect();
    Request { ignore_eos: true, priority, ..Request::new(prompt, 3) }
}

/// When the first token came, and how the request ended.
fn first_token(mut stream: RequestStream) -> (Instant, FinishReason) {
    let mut first = None;
    loop {
        match stream.blocking_recv().expect("a finish") {
            Event::Delta { .. } => {
                first.get_or_insert_with(Instant::now);
            }
            Event::Finish(f) => return (first.unwrap_or_else(Instant::now), f.reason),
        }
    }
}

#[test]
fn an_interactive_request_preempts_long_prefills() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), Arch::Llama, 3, None).unwrap();
    let engine = start(dir.path());
    let long: Vec<RequestStream> = (0..4).map(|i| engine.submit(request(i, 480, 0)).unwrap()).collect();
    let interactive = engine.submit(request(9, 12, fastmlx::engine::lanes::INTERACTIVE)).unwrap();
    let waiter = std::thread::spawn(move || first_token(interactive));
    let long: Vec<(Instant, FinishReason)> = long.into_iter().map(first_token).collect();
    let (interactive_first, reason) = waiter.join().unwrap();
    assert_eq!(reason, FinishReason::Length);
    for (i, (first, reason)) in long.iter().enumerate() {
        assert_eq!(*reason, FinishReason::Length);
        assert!(interactive_first < *first, "the interactive request's first token came after long prompt {i}'s");
    }
    engine.shutdown();
}

#[test]
fn a_preempted_request_cancelled_while_it_waits_frees_its_reservation() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), Arch::Qwen2, 3, None).unwrap();
    let engine = start(dir.path());
    // A full prefill group of long prompts (the newest is the one set aside for a better request).
    let mut long: Vec<RequestStream> = (0..8).map(|i| engine.submit(request(i, 490, 0)).unwrap()).collect();
    let mut metrics = engine.metrics();
    let deadline = Instant::now() + Duration::from_secs(30);
    while metrics.borrow_and_update().prompt_tokens_total < 64 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let interactive = engine.submit(request(20, 8, 10)).unwrap();
    let (_, reason) = first_token(interactive);
    assert_eq!(reason, FinishReason::Length);
    // The one set aside waits with its reservation; its caller leaves.
    drop(long.pop());
    for stream in long {
        assert_eq!(first_token(stream).1, FinishReason::Length);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = engine.snapshot();
        if m.running == 0 && m.queued == 0 && m.finished_total == 9 {
            assert_eq!(m.kv_reserved_bytes, 0, "the set-aside request gave back its reservation: {m:?}");
            assert_eq!(m.cancelled_total, 1);
            assert!(
                m.prompt_tokens_total < 9 * 490,
                "the cancelled prompt was not finished: {}",
                m.prompt_tokens_total
            );
            break;
        }
        assert!(Instant::now() < deadline, "{m:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    engine.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn priorities_come_from_the_field_or_the_header() {
    use axum::body::Body;
    use axum::http::{header, Request as HttpRequest, StatusCode};
    use common::api::*;
    use serde_json::{json, Value};
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let with = |uri: &str, priority: Option<&str>, body: Value| {
        let mut r =
            HttpRequest::post(uri).header(header::HOST, "localhost").header(header::CONTENT_TYPE, "application/json");
        if let Some(p) = priority {
            r = r.header("x-priority", p);
        }
        r.body(Body::from(body.to_string())).unwrap()
    };
    let chat = json!({"model": h.id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (status, _) = send(&h, with("/v1/chat/completions", Some("-3"), chat.clone())).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = send_json(&h, with("/v1/chat/completions", Some("soon"), chat.clone())).await;
    assert_eq!((status, body["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("X-Priority")), "{body}");
    let mut bad = chat.clone();
    bad["priority"] = json!(5000);
    let (status, body) = send_json(&h, with("/v1/chat/completions", None, bad)).await;
    assert_eq!((status, body["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("priority")), "{body}");
    let ollama = json!({"model": h.id, "prompt": "hi", "stream": false, "options": {"num_predict": 2}});
    let (status, body) = send_json(&h, with("/api/generate", Some("99999"), ollama)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains("X-Priority"), "Ollama's envelope: {body}");
    let anthropic = json!({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (status, body) = send_json(&h, with("/v1/messages", Some("x"), anthropic)).await;
    assert_eq!((status, body["type"].as_str()), (StatusCode::BAD_REQUEST, Some("error")), "{body}");
}
