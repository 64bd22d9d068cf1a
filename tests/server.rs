//! The HTTP API's router (`app()` + oneshot requests) on a tiny model: every endpoint, the
//! streaming format, and every error path answering in OpenAI's envelope.

// Each test holds the MLX lock for its whole body, awaits included: that is the point.
#![allow(clippy::await_holding_lock)]

mod common;

use common::api::*;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use fastmlx::engine::EngineConfig;
use fastmlx::fixtures::synthetic;
use fastmlx::model::Arch;
use fastmlx::server::{app, ServerConfig};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

#[tokio::test(flavor = "multi_thread")]
async fn health_and_models() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let id = h.id.clone();
    let (status, body) = send_json(&h, get("/health")).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (status, body) = send_json(&h, get("/v1/models")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], id.as_str());
    assert_eq!(body["data"][0]["object"], "model");
    assert!(body["data"][0]["created"].as_u64().is_some() && body["data"][0]["owned_by"].is_string());
    let (status, body) = send_json(&h, get(&format!("/v1/models/{id}"))).await;
    assert_eq!((status, body["id"].as_str()), (StatusCode::OK, Some(id.as_str())));
    let (status, body) = send_json(&h, get("/v1/models/gpt-4o")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("model_not_found")));
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_completion_non_streaming() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let (status, body) =
        send_json(&h, post("/v1/chat/completions", chat(json!({"logprobs": true, "top_logprobs": 2})))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    assert!(matches!(choice["finish_reason"].as_str(), Some("stop" | "length")));
    let usage = &body["usage"];
    let (p, c, t) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
        usage["total_tokens"].as_u64().unwrap(),
    );
    assert!(p > 0 && c > 0 && c <= 8 && t == p + c, "{usage}");
    let lp = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(lp.len() as u64, c);
    assert_eq!(lp[0]["top_logprobs"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_completion_streaming_with_usage() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let request = chat(json!({"stream": true, "stream_options": {"include_usage": true}, "max_tokens": 6}));
    let response = app(h.state.clone()).oneshot(post("/v1/chat/completions", request)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/event-stream"));
    let body = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "the first delta carries the role");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
    }
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0 && usage["usage"]["total_tokens"].as_u64().is_some());
    // Same text as the non-streaming answer (greedy).
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    let (_, whole) = send_json(&h, post("/v1/chat/completions", chat(json!({"max_tokens": 6})))).await;
    assert_eq!(streamed, whole["choices"][0]["message"]["content"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn text_completion_honours_special_tokens_and_streams() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    // "<|im_start|>" is one special token in the tiny model's vocabulary: 1 + 3 bytes.
    let body = json!({"prompt": "<|im_start|>abc", "max_tokens": 4, "temperature": 0}).to_string();
    let (status, json) = send_json(&h, post("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["object"], "text_completion");
    assert_eq!(json["usage"]["prompt_tokens"], 4);
    assert_eq!(json["usage"]["completion_tokens"], 4);
    let body = json!({"prompt": [257, 97], "max_tokens": 3, "stream": true, "temperature": 0}).to_string();
    let (status, text) = send(&h, post("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread")]
async fn ignore_eos_generates_past_the_end_token() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    // The end token (258) made certain: alone it ends the answer at once; ignored, it does not.
    let ask = |ignore: bool| {
        let body = json!({"prompt": "abc", "max_tokens": 5, "temperature": 0, "logit_bias": {"258": 100},
                          "ignore_eos": ignore});
        post("/v1/completions", body.to_string())
    };
    let (status, json) = send_json(&h, ask(false)).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(
        (json["choices"][0]["finish_reason"].as_str(), json["usage"]["completion_tokens"].as_u64()),
        (Some("stop"), Some(1))
    );
    let (status, json) = send_json(&h, ask(true)).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(
        (json["choices"][0]["finish_reason"].as_str(), json["usage"]["completion_tokens"].as_u64()),
        (Some("length"), Some(5))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_the_openai_envelope() {
    let _mlx = common::mlx_lock();
    let h = harness(EngineConfig::default(), ServerConfig { max_body_bytes: 64 << 10, ..Default::default() }).await;
    let id = h.id.clone();
    let long_prompt: Vec<u32> = vec![5; 600];
    let cases: Vec<(&str, Request<Body>, StatusCode, Option<&str>)> = vec![
        ("malformed JSON", post("/v1/chat/completions", "{\"messages\": ["), StatusCode::BAD_REQUEST, None),
        ("not JSON at all", post("/v1/chat/completions", "hello"), StatusCode::BAD_REQUEST, None),
        (
            "wrong type",
            post("/v1/chat/completions", chat(json!({"temperature": "hot"}))),
            StatusCode::BAD_REQUEST,
            Some("temperature"),
        ),
        (
            "huge value",
            post("/v1/chat/completions", chat(json!({"max_tokens": 1e30}))),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        (
            "too many tokens",
            post("/v1/chat/completions", chat(json!({"max_tokens": 10_000_000}))),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        (
            "negative tokens",
            post("/v1/chat/completions", chat(json!({"max_tokens": -1}))),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        ("invalid UTF-8", post("/v1/chat/completions", vec![b'{', 0xff, 0xfe, b'}']), StatusCode::BAD_REQUEST, None),
        (
            "unknown model",
            post("/v1/chat/completions", chat(json!({"model": "gpt-4o"}))),
            StatusCode::NOT_FOUND,
            Some("model"),
        ),
        (
            "empty messages",
            post("/v1/chat/completions", json!({"messages": []}).to_string()),
            StatusCode::BAD_REQUEST,
            Some("messages"),
        ),
        (
            "missing messages",
            post("/v1/chat/completions", json!({"model": id}).to_string()),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "bad role",
            post("/v1/chat/completions", json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string()),
            StatusCode::BAD_REQUEST,
            Some("messages[0]"),
        ),
        (
            "image part",
            post(
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
                    .to_string(),
            ),
            StatusCode::BAD_REQUEST,
            Some("messages[0].content[0]"),
        ),
        ("n = 2", post("/v1/chat/completions", chat(json!({"n": 2}))), StatusCode::BAD_REQUEST, Some("n")),
        (
            "top_p out of range",
            post("/v1/chat/completions", chat(json!({"top_p": 3}))),
            StatusCode::BAD_REQUEST,
            Some("top_p"),
        ),
        (
            "logit_bias on no token",
            post("/v1/chat/completions", chat(json!({"logit_bias": {"999999": 5}}))),
            StatusCode::BAD_REQUEST,
            Some("logit_bias"),
        ),
        (
            "logit_bias too big",
            post("/v1/chat/completions", chat(json!({"logit_bias": {"3": 500}}))),
            StatusCode::BAD_REQUEST,
            Some("logit_bias"),
        ),
        (
            "bad response_format",
            post(
                "/v1/chat/completions",
                chat(
                    json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "not": {"const": "x"}}}}}),
                ),
            ),
            StatusCode::BAD_REQUEST,
            Some("response_format"),
        ),
        (
            "tool_choice without tools",
            post("/v1/chat/completions", chat(json!({"tool_choice": "required"}))),
            StatusCode::BAD_REQUEST,
            Some("tool_choice"),
        ),
        (
            "too many stops",
            post("/v1/chat/completions", chat(json!({"stop": vec!["x"; 40]}))),
            StatusCode::BAD_REQUEST,
            Some("stop"),
        ),
        (
            "prompt too long",
            post("/v1/completions", json!({"prompt": long_prompt}).to_string()),
            StatusCode::BAD_REQUEST,
            Some("messages"),
        ),
        (
            "token outside vocabulary",
            post("/v1/completions", json!({"prompt": [1, 99999]}).to_string()),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "body too large",
            post("/v1/completions", json!({"prompt": "x".repeat(100_000)}).to_string()),
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
        ),
        ("unknown route", get("/v1/nothing"), StatusCode::NOT_FOUND, None),
    ];
    for (label, request, status, param) in cases {
        let (got, body) = send(&h, request).await;
        assert_eq!(got, status, "{label}: {body}");
        let json: Value =
            serde_json::from_str(&body).unwrap_or_else(|_| panic!("{label}: not our JSON envelope: {body}"));
        let error = &json["error"];
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{label}: {body}");
        assert!(error["type"].is_string(), "{label}: {body}");
        if let Some(param) = param {
            assert_eq!(error["param"].as_str(), Some(param), "{label}: {body}");
        }
    }
    // The engine is still serving after all that.
    let (status, _) = send_json(&h, post("/v1/chat/completions", chat(json!({})))).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn host_allow_list_and_api_key() {
    let _mlx = common::mlx_lock();
    let h =
        harness(EngineConfig::default(), ServerConfig { api_key: Some("s3cret".into()), ..Default::default() }).await;
    let with = |host: &str, auth: Option<(&str, &str)>| {
        let mut r = Request::get("/v1/models").header(header::HOST, host);
        if let Some((k, v)) = auth {
            r = r.header(k, v);
        }
        r.body(Body::empty()).unwrap()
    };
    let (status, body) = send_json(&h, with("evil.example:8080", Some(("authorization", "Bearer s3cret")))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "DNS rebinding: {body}");
    let (status, body) = send_json(&h, with("localhost:8080", None)).await;
    assert_eq!((status, body["error"]["type"].as_str()), (StatusCode::UNAUTHORIZED, Some("authentication_error")));
    let (status, _) = send_json(&h, with("localhost:8080", Some(("authorization", "Bearer wrong")))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send_json(&h, with("localhost:8080", Some(("authorization", "Bearer s3cret")))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send_json(&h, with("[::1]:8080", Some(("x-api-key", "s3cret")))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send_json(&h, with("localhost", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Health checks need no key.
    let (status, _) = send_json(&h, get("/health")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn busy_engine_answers_429() {
    let _mlx = common::mlx_lock();
    let h = harness(EngineConfig { max_batch: 1, max_queue: 1, ..Default::default() }, ServerConfig::default()).await;
    let long = || post("/v1/completions", json!({"prompt": "ab", "max_tokens": 5000, "stream": true}).to_string());
    let first = app(h.state.clone()).oneshot(long()).await.unwrap();
    let mut first_body = first.into_body();
    // Running.
    let _ = first_body.frame().await;
    // Queued: a stream's headers are sent once it starts (so that a refusal can still be a 503).
    let second = tokio::spawn(app(h.state.clone()).oneshot(long()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.engine.snapshot().queued == 0 {
        assert!(Instant::now() < deadline, "the second request never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, body) = send_json(&h, long()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "server_busy");
    second.abort();
    drop(first_body);
}

#[tokio::test(flavor = "multi_thread")]
async fn client_disconnect_cancels_the_generation() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let request = post("/v1/chat/completions", chat(json!({"stream": true, "max_tokens": 10_000})));
    let response = app(h.state.clone()).oneshot(request).await.unwrap();
    let mut body = response.into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body); // the client goes away
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = h.engine.snapshot();
        if m.cancelled_total == 1 && m.running == 0 {
            // The tiny model's window (512) would allow ~500 tokens; it stopped long before.
            assert!(m.generated_tokens_total < 100, "stopped early: {m:?}");
            break;
        }
        assert!(Instant::now() < deadline, "not cancelled: {m:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_metrics() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let _ = send_json(&h, post("/v1/chat/completions", chat(json!({})))).await;
    let (status, text) = send(&h, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("# TYPE fastmlx_requests_total counter"));
    let line = text.lines().find(|l| l.starts_with("fastmlx_requests_total{")).unwrap();
    assert_eq!(line, format!("fastmlx_requests_total{{model=\"{}\"}} 1", h.id));
    // Latency histograms: cumulative buckets ending in +Inf, which counts the finished request.
    assert!(text.contains("# TYPE fastmlx_time_to_first_token_seconds histogram"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let inf = format!("fastmlx_time_to_first_token_seconds_bucket{{model=\"{}\",le=\"+Inf\"}} 1", h.id);
    loop {
        let (_, text) = send(&h, get("/metrics")).await;
        if text.lines().any(|l| l == inf) {
            assert!(text.contains(&format!("fastmlx_prefill_seconds_count{{model=\"{}\"}} 1", h.id)), "{text}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The server keeps a sample of the live metrics a second, for a Live page opened later.
#[tokio::test(flavor = "multi_thread")]
async fn the_live_history_is_kept_by_the_server() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let running = serve_on_a_socket(&h).await;
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let answer = raw_exchange(
        running.address,
        b"GET /admin/metrics/history HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        REQUEST_LIMIT,
    )
    .await;
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let samples = body["samples"].as_array().unwrap();
    assert!(samples.len() >= 2, "{body}");
    assert_eq!(samples[0]["models"][0]["id"], h.id.as_str());
    assert!(samples[0].get("recent").is_none(), "samples leave the recent requests out");
    assert!(samples[1]["time_ms"].as_u64() > samples[0]["time_ms"].as_u64());
    running.stop().await.unwrap();
}

/// Where the time went: a `Server-Timing` header on whole answers (every dialect) and a
/// llama.cpp-style `timings` object in OpenAI's answers (the last streamed chunk).
#[tokio::test(flavor = "multi_thread")]
async fn timings_in_headers_and_answers() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    for (uri, body) in [
        ("/v1/chat/completions", chat(json!({}))),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 3}).to_string()),
        (
            "/v1/messages",
            json!({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).to_string(),
        ),
        ("/v1/responses", json!({"input": "hi", "max_output_tokens": 3}).to_string()),
        (
            "/api/generate",
            json!({"model": h.id, "prompt": "hi", "stream": false, "options": {"num_predict": 3}}).to_string(),
        ),
    ] {
        let response = tower::ServiceExt::oneshot(app(h.state.clone()), post(uri, body)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{uri}");
        let timing =
            response.headers().get("server-timing").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        for part in ["queue;dur=", "restore;dur=", "prefill;dur=", "ttft;dur=", "decode;dur="] {
            assert!(timing.contains(part), "{uri}: {timing}");
        }
    }
    let (_, answer) = send_json(&h, post("/v1/chat/completions", chat(json!({"max_tokens": 4})))).await;
    let t = &answer["timings"];
    assert_eq!(t["predicted_n"], answer["usage"]["completion_tokens"]);
    assert_eq!(
        t["prompt_n"].as_u64().unwrap() + t["cache_n"].as_u64().unwrap(),
        answer["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert!(t["ttft_ms"].as_f64().unwrap() > 0.0 && t["prefill_chunks"].as_u64().is_some(), "{t}");
    let (_, text) = send(&h, post("/v1/chat/completions", chat(json!({"stream": true})))).await;
    let chunks: Vec<Value> =
        sse_data(&text).iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    let with_timings: Vec<&Value> = chunks.iter().filter(|c| c.get("timings").is_some()).collect();
    assert_eq!(with_timings.len(), 1, "one chunk carries the timings");
    assert!(with_timings[0]["choices"][0]["finish_reason"].is_string(), "the last one");
}

/// A model whose template takes tools (Qwen 2.5's): tool definitions, an assistant tool call
/// (arguments as a JSON string, as OpenAI clients send them) and a `role: tool` result render
/// and run, streaming or not; `tool_choice: "none"` leaves the tools out of the prompt.
#[tokio::test(flavor = "multi_thread")]
async fn tools_round_trip_renders_with_a_tool_template() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("models/tiny-qwen2");
    synthetic::write_tiny_model(&model, Arch::Qwen2, 5, None).unwrap();
    let template = std::fs::read_to_string(common::root().join("tests/data/chat_templates/qwen2.5.jinja")).unwrap();
    let config_path = model.join("tokenizer_config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["chat_template"] = Value::String(template);
    std::fs::write(&config_path, config.to_string()).unwrap();
    // Byte-level tokens make the tool prompt long: give the tiny model a longer window.
    let model_config = model.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&model_config).unwrap()).unwrap();
    c["max_position_embeddings"] = json!(4096);
    std::fs::write(&model_config, c.to_string()).unwrap();
    let h = harness_in(dir, EngineConfig::default(), ServerConfig::default()).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc123def", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc123def", "content": "18 C, sunny"},
    ]);
    let prompt_tokens = |body: &Value| body["usage"]["prompt_tokens"].as_u64().unwrap();
    let request = |extra: Value| {
        let mut body = json!({"messages": messages, "tools": tools, "max_tokens": 4, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        post("/v1/chat/completions", body.to_string())
    };
    let (status, with_tools) = send_json(&h, request(json!({"tool_choice": "auto"}))).await;
    assert_eq!(status, StatusCode::OK, "{with_tools}");
    let (status, without) = send_json(&h, request(json!({"tool_choice": "none"}))).await;
    assert_eq!(status, StatusCode::OK, "{without}");
    assert!(
        prompt_tokens(&with_tools) > prompt_tokens(&without) + 50,
        "the tool definitions are in the prompt only with tools on"
    );
    let (status, text) = send(&h, request(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sse_data(&text).last().map(String::as_str), Some("[DONE]"));
}

/// A random model wants nothing in particular: every answer it gives under a JSON Schema
/// is still a valid document, streamed or not.
#[tokio::test(flavor = "multi_thread")]
async fn json_schema_answers_of_a_random_model_validate() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let schema = json!({"type": "object", "properties": {
        "mood": {"enum": ["happy", "sad"]}, "n": {"type": "integer", "minimum": -5, "maximum": 300},
        "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["a", "b", null]}, "maxItems": 2}},
        "required": ["mood", "n", "ok"], "additionalProperties": false});
    let validator = jsonschema::validator_for(&schema).unwrap();
    for seed in 0..6 {
        let stream = seed % 2 == 1;
        let body = chat(json!({"temperature": 1.0, "seed": seed, "max_tokens": 300, "stream": stream,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}));
        let (status, text) = send(&h, post("/v1/chat/completions", body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let (content, finish) = if stream {
            let chunks: Vec<Value> =
                sse_data(&text).iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
            let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
            (content, chunks.last().unwrap()["choices"][0]["finish_reason"].clone())
        } else {
            let body: Value = serde_json::from_str(&text).unwrap();
            (
                body["choices"][0]["message"]["content"].as_str().unwrap().to_string(),
                body["choices"][0]["finish_reason"].clone(),
            )
        };
        assert_eq!(finish, json!("stop"), "seed {seed}: {content:?}");
        let value: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("seed {seed}: {content:?}: {e}"));
        assert!(validator.is_valid(&value), "seed {seed}: {content}");
    }
}

/// The keywords llguidance enforces (`pattern`, `format`, `multipleOf`, number bounds,
/// `uniqueItems` over a few values, a recursive `$ref`): a random model's sampled answers, for
/// several seeds, validate with formats checked.
#[tokio::test(flavor = "multi_thread")]
async fn schema_keywords_hold_for_a_random_model() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let schema = json!({"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "when": {"type": "string", "format": "date-time"},
        "contact": {"type": "string", "format": "email", "maxLength": 30},
        "id": {"type": "string", "format": "uuid"},
        "seats": {"type": "integer", "minimum": 2, "maximum": 12, "multipleOf": 2},
        "ratio": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": true},
        "tree": {"$ref": "#/$defs/node"}},
        "required": ["code", "when", "contact", "id", "seats", "ratio", "tags", "tree"],
        "$defs": {"node": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                  "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1}}, "required": ["n"]}}});
    let validator = jsonschema::options().should_validate_formats(true).build(&schema).unwrap();
    let mut complete = 0;
    for seed in 0..6 {
        let body = chat(json!({"temperature": 1.0, "seed": seed, "max_tokens": 1000,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}}));
        let (status, text) = send(&h, post("/v1/chat/completions", body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        let content = body["choices"][0]["message"]["content"].as_str().unwrap();
        if body["choices"][0]["finish_reason"] != "stop" {
            continue;
        }
        complete += 1;
        let value: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("seed {seed}: {content:?}: {e}"));
        assert!(validator.is_valid(&value), "seed {seed}: {content}");
    }
    assert!(complete >= 3, "only {complete} of 6 answers ended within 1000 tokens");
}

#[tokio::test(flavor = "multi_thread")]
async fn forced_tool_calls_from_a_random_model() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let tools = json!([
        {"type": "function", "function": {"name": "set_light", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}},
        {"type": "function", "function": {"name": "get_time"}}]);
    let (status, body) = send_json(
        &h,
        post(
            "/v1/chat/completions",
            chat(json!({"tools": tools, "tool_choice": "required", "temperature": 1.0, "seed": 3, "max_tokens": 200})),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    assert!(choice["message"]["content"].is_null());
    for call in choice["message"]["tool_calls"].as_array().unwrap() {
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        match call["function"]["name"].as_str().unwrap() {
            "set_light" => assert!(args["on"].is_boolean(), "{args}"),
            "get_time" => assert!(args.is_object()),
            other => panic!("no such tool {other}"),
        }
    }
    let named = json!({"type": "function", "function": {"name": "set_light"}});
    let (status, text) = send(&h, post("/v1/chat/completions", chat(json!({"tools": tools, "tool_choice": named, "stream": true, "temperature": 1.0, "seed": 4, "max_tokens": 200})))).await;
    assert_eq!(status, StatusCode::OK);
    let chunks: Vec<Value> =
        sse_data(&text).iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0)).collect();
    assert_eq!(calls[0]["function"]["name"], "set_light");
    let args: String = calls.iter().filter_map(|c| c["function"]["arguments"].as_str()).collect();
    assert!(serde_json::from_str::<Value>(&args).unwrap()["on"].is_boolean(), "{args}");
}

/// The admin API over the models folder: list, load another model (a chat request naming it
/// works at once), status, unload, and delete refused for models FastMLX did not download.
#[tokio::test(flavor = "multi_thread")]
async fn admin_lists_loads_unloads_and_guards_deletes() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(&dir.path().join("models/tiny-llama"), Arch::Llama, 2, None).unwrap();
    let h = harness_in(dir, EngineConfig::default(), ServerConfig::default()).await;
    let (status, list) = send_json(&h, get("/admin/models")).await;
    assert_eq!(status, StatusCode::OK);
    let entries: Vec<(&str, bool)> =
        list.as_array().unwrap().iter().map(|m| (m["id"].as_str().unwrap(), m["loaded"].as_bool().unwrap())).collect();
    assert_eq!(entries, vec![("tiny-llama", false), ("tiny-qwen2", true)]);
    assert_eq!(list[0]["architecture"], "llama");
    assert_eq!(list[0]["source"], "fastmlx");

    // A request naming a local model that is not loaded loads it.
    let (status, body) = send_json(&h, post("/v1/chat/completions", chat(json!({"model": "tiny-llama"})))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["model"], "tiny-llama");
    let (_, models) = send_json(&h, get("/v1/models")).await;
    assert_eq!(models["data"].as_array().unwrap().len(), 2);
    let (_, health) = send_json(&h, get("/health")).await;
    assert_eq!(health["loaded"], json!(["tiny-llama", "tiny-qwen2"]));

    let (status, body) = send_json(&h, post("/admin/unload", json!({"model": "tiny-llama"}).to_string())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, st) = send_json(&h, get("/admin/status")).await;
    assert_eq!(st["loaded"].as_array().unwrap().len(), 1);
    assert!(st["memory_budget_bytes"].as_u64().unwrap() > 0);
    let (status, body) =
        send_json(&h, post("/admin/load", json!({"model": "tiny-llama", "keep_alive": 60}).to_string())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["id"], "tiny-llama");
    assert_eq!(body["expires_in_secs"], 60);

    let (status, body) = send_json(&h, post("/admin/load", json!({"model": "nope"}).to_string())).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("model_not_found")));
    let (status, body) = send_json(&h, post("/admin/unload", json!({"model": "nope"}).to_string())).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = send_json(&h, delete("/admin/models/tiny-llama", None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "not downloaded by FastMLX: {body}");
    let (status, _) = send_json(&h, delete("/admin/models/tiny-llama?force=true", None)).await;
    assert_eq!(status, StatusCode::OK);
    let (_, list) = send_json(&h, get("/admin/models")).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "deleted, and unloaded first");
    let (status, body) = send_json(&h, post("/admin/pull", json!({"repo": "../etc"}).to_string())).await;
    assert_eq!((status, body["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("repo")));
}

/// The live stream: an event at once with the loaded model's figures, and the recent requests
/// with their timings once some have finished.
#[tokio::test(flavor = "multi_thread")]
async fn live_metrics_stream_and_recent_requests() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let (status, _) = send_json(&h, post("/v1/chat/completions", chat(json!({"max_tokens": 5})))).await;
    assert_eq!(status, StatusCode::OK);
    let response = app(h.state.clone()).oneshot(get("/admin/metrics/stream")).await.unwrap();
    assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut body = response.into_body();
    // The engine publishes a finished request's figures just after its answer: the first event
    // may predate them; a later one (the stream republishes on every change) has them.
    let mut event = Value::Null;
    for _ in 0..50 {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .unwrap();
        let Ok(data) = frame.into_data() else { continue };
        let text = String::from_utf8_lossy(&data).to_string();
        let Some(json) = text.trim().strip_prefix("data: ") else { continue };
        event = serde_json::from_str(json).unwrap();
        if !event["recent"][0].is_null() {
            break;
        }
    }
    assert_eq!(event["models"][0]["id"], h.id.as_str());
    assert_eq!(event["models"][0]["requests_total"], 1);
    let recent = &event["recent"][0];
    assert_eq!(
        (recent["model"].as_str(), recent["completion_tokens"].as_u64(), recent["reason"].as_str()),
        (Some(h.id.as_str()), Some(5), Some("length"))
    );
    assert!(recent["ttft_ms"].as_f64().unwrap() > 0.0 && recent["tokens_per_sec"].as_f64().unwrap() > 0.0, "{recent}");
    assert!(event["mlx_active_bytes"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn settings_change_while_serving() {
    let _mlx = common::mlx_lock();
    let config_dir = tempfile::tempdir().unwrap();
    let config_file = config_dir.path().join("config.toml");
    std::fs::write(&config_file, "port = 9000\n").unwrap();
    let h = harness(
        EngineConfig::default(),
        ServerConfig { settings_file: Some(config_file.clone()), ..Default::default() },
    )
    .await;
    let (status, s) = send_json(&h, get("/admin/settings")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (s["max_batch"].as_u64(), s["keep_alive_secs"].is_null(), s["api_key_set"].as_bool()),
        (Some(32), true, Some(false))
    );
    let (status, s) =
        send_json(&h, post("/admin/settings", json!({"max_batch": 4, "keep_alive_secs": 90}).to_string())).await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!((s["max_batch"].as_u64(), s["keep_alive_secs"].as_u64()), (Some(4), Some(90)));
    let (_, st) = send_json(&h, get("/admin/status")).await;
    assert_eq!(st["loaded"][0]["expires_in_secs"], 90, "the keep-alive applies to loaded models at once");
    let mut saved = fastmlx::config_file::parse(&std::fs::read_to_string(&config_file).unwrap()).unwrap();
    saved.sort();
    let names: Vec<(&str, &str)> =
        saved.iter().map(|(k, v)| (k.as_str(), v.as_str())).filter(|(k, _)| *k != "FASTMLX_MEMORY_BUDGET_MB").collect();
    assert_eq!(
        names,
        [("FASTMLX_KEEP_ALIVE", "90"), ("FASTMLX_MAX_BATCH", "4"), ("FASTMLX_PORT", "9000")],
        "saved for the next start, other keys kept"
    );
    let (status, _) = send_json(&h, post("/admin/settings", json!({"keep_alive_secs": null}).to_string())).await;
    assert_eq!(status, StatusCode::OK);
    let (_, s) = send_json(&h, get("/admin/settings")).await;
    assert!(s["keep_alive_secs"].is_null() && s["max_batch"] == 4);
    // KV-cache quantization, for the models loaded from now on, server-wide and per model.
    assert_eq!(
        (s["kv_bits"].as_i64(), s["kv_group_size"].as_i64(), s["kv_start"].as_i64()),
        (Some(0), Some(64), Some(0))
    );
    let change = json!({"kv_bits": 8, "kv_start": 2048, "model_kv": ["big-coder=4/32", "small=off"]});
    let (status, s) = send_json(&h, post("/admin/settings", change.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!((s["kv_bits"].as_i64(), s["kv_start"].as_i64()), (Some(8), Some(2048)));
    assert_eq!(s["model_kv"], json!(["big-coder=4/32/0", "small=off"]));
    let saved = fastmlx::config_file::parse(&std::fs::read_to_string(&config_file).unwrap()).unwrap();
    let value = |key: &str| saved.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    assert_eq!(value("FASTMLX_KV_BITS").as_deref(), Some("8"));
    assert_eq!(value("FASTMLX_KV_START").as_deref(), Some("2048"));
    assert_eq!(value("FASTMLX_MODEL_KV").as_deref(), Some("big-coder=4/32/0,small=off"));
    for (bad, param) in [
        (json!({"kv_bits": 3}), "kv_bits"),
        (json!({"kv_group_size": 48}), "kv_bits"),
        (json!({"model_kv": ["x=5"]}), "model_kv"),
        (json!({"max_batch": 0}), "max_batch"),
        (json!({"memory_budget_mb": 1}), "memory_budget_mb"),
        (json!({"colour": "red"}), ""),
    ] {
        let (status, body) = send_json(&h, post("/admin/settings", bad.to_string())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        if !param.is_empty() {
            assert_eq!(body["error"]["param"], param);
        }
    }
}

/// The built UI (scripts/setup.sh builds ui/) is served at /ui/ without an API key.
#[tokio::test(flavor = "multi_thread")]
async fn ui_is_served_without_a_key() {
    let _mlx = common::mlx_lock();
    let h = harness(EngineConfig::default(), ServerConfig { api_key: Some("k".into()), ..Default::default() }).await;
    let response = app(h.state.clone()).oneshot(get("/ui")).await.unwrap();
    assert_eq!(response.headers()[header::LOCATION], "/ui/");
    let response = app(h.state.clone()).oneshot(get("/ui/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "run scripts/setup.sh to build ui/dist");
    assert!(response.headers()[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/html"));
    let html = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let asset = html
        .split("src=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a script tag")
        .trim_start_matches("./")
        .to_string();
    let response = app(h.state.clone()).oneshot(get(&format!("/ui/{asset}"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{asset}");
    let (status, _) = send(&h, get("/admin/settings")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the API behind it still needs the key");
}

/// A request that waits past `--max-queue-wait` without starting is answered 503 with
/// `Retry-After`, before any stream begins, in each dialect's own envelope.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_waits_too_long_gets_503_with_retry_after_in_every_dialect() {
    let _mlx = common::mlx_lock();
    // Slow steps: the first request holds the only row for seconds.
    let fault: fastmlx::engine::FaultInjector = std::sync::Arc::new(|_, _| {
        std::thread::sleep(Duration::from_millis(20));
        Ok(())
    });
    let engine_config = EngineConfig {
        max_batch: 1,
        max_queue_wait: Some(Duration::from_millis(300)),
        fault_injector: Some(fault),
        ..Default::default()
    };
    let h = harness(engine_config, ServerConfig::default()).await;
    let blocker = h.engine.submit(fastmlx::engine::Request::new(vec![5, 6, 7], 400)).unwrap();
    let model = h.id.clone();
    let message = json!([{"role": "user", "content": "hello"}]);
    let cases = [
        ("/v1/chat/completions", json!({"model": model, "messages": message, "stream": true})),
        ("/v1/messages", json!({"model": model, "messages": message, "max_tokens": 4, "stream": true})),
        ("/api/chat", json!({"model": model, "messages": message})),
        ("/v1/responses", json!({"model": model, "input": "hello"})),
    ];
    for (path, body) in cases {
        let response = app(h.state.clone()).oneshot(post(path, body.to_string())).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert!(response.headers().get(header::RETRY_AFTER).is_some(), "{path}: no Retry-After");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{path}: not JSON ({e})"));
        let message = match path {
            "/v1/messages" => {
                assert_eq!(body["type"], "error", "{body}");
                assert_eq!(body["error"]["type"], "overloaded_error", "{body}");
                body["error"]["message"].as_str()
            }
            "/api/chat" => body["error"].as_str(),
            _ => {
                assert_eq!(body["error"]["code"], "server_overloaded", "{body}");
                body["error"]["message"].as_str()
            }
        };
        assert!(message.is_some_and(|m| m.contains("waited")), "{path}: {body}");
    }
    drop(blocker);
}
