//! Hostile input, every dialect: malformed, huge, deeply nested, wrongly typed and path-like
//! requests each get a clear 4xx in their dialect's envelope, quickly, and the server goes on
//! answering; then random JSON thrown at every route (a property test) never gets a 5xx that
//! is not documented, a panic or a hang.

#![allow(clippy::await_holding_lock)]

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use common::api::*;
use fastmlx::engine::EngineConfig;
use fastmlx::server::ServerConfig;
use serde_json::{json, Value};

/// Every answer must come within this (the tiny model generates its few tokens in far less).
const LIMIT: Duration = Duration::from_secs(20);

fn raw(method: Method, uri: &str, body: impl Into<String>) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.into()))
        .unwrap()
}

/// `depth` arrays nested in one another.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A JSON Schema of `depth` objects nested through one property each.
fn deep_schema(depth: usize) -> Value {
    let mut schema = json!({"type": "string"});
    for _ in 0..depth {
        schema = json!({"type": "object", "properties": {"a": schema}, "required": ["a"]});
    }
    schema
}

fn messages() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

/// (what, method, uri, body): each must be answered with a 4xx.
fn cases(id: &str) -> Vec<(String, Method, &'static str, String)> {
    let chat = |extra: Value| {
        let mut body = json!({"model": id, "messages": messages(), "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body.to_string()
    };
    let schema_format = |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let many_stops: Vec<String> = (0..100_000).map(|i| format!("s{i}")).collect();
    let long_name = "m".repeat(100_000);
    let mut cases: Vec<(String, Method, &'static str, String)> = Vec::new();
    let mut add =
        |what: &str, method: Method, uri: &'static str, body: String| cases.push((what.to_string(), method, uri, body));
    let post = Method::POST;
    for uri in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/api/chat",
        "/api/generate",
        "/api/show",
        "/api/pull",
        "/admin/load",
        "/admin/pull",
        "/admin/settings",
    ] {
        add("deep nesting", post.clone(), uri, format!("{{\"messages\": {}}}", nested(100_000)));
        add("not JSON", post.clone(), uri, "{\"model\": ".into());
        add("NaN literal", post.clone(), uri, "{\"model\": \"m\", \"temperature\": NaN}".into());
        add("a list, not an object", post.clone(), uri, "[1, 2, 3]".into());
        add("lone surrogate", post.clone(), uri, "{\"model\": \"\\ud800\", \"prompt\": \"\\udfff\"}".into());
    }
    // OpenAI chat: numbers and every field family with the wrong type.
    add(
        "Infinity literal",
        post.clone(),
        "/v1/chat/completions",
        format!("{{\"messages\": {}, \"max_tokens\": Infinity}}", messages()),
    );
    add("huge max_tokens", post.clone(), "/v1/chat/completions", chat(json!({"max_tokens": 1e300})));
    add(
        "u64 overflow",
        post.clone(),
        "/v1/chat/completions",
        format!("{{\"messages\": {}, \"max_tokens\": 184467440737095516150}}", messages()),
    );
    add(
        "astronomical max_tokens",
        post.clone(),
        "/v1/chat/completions",
        chat(json!({"max_tokens": 9_000_000_000_000_000u64})),
    );
    add("negative max_tokens", post.clone(), "/v1/chat/completions", chat(json!({"max_tokens": -5})));
    add("temperature overflows f32", post.clone(), "/v1/chat/completions", chat(json!({"temperature": 1e39})));
    add("100,000 stop strings", post.clone(), "/v1/chat/completions", chat(json!({"stop": many_stops})));
    add("messages as text", post.clone(), "/v1/chat/completions", chat(json!({"messages": "hi"})));
    add("a message that is a number", post.clone(), "/v1/chat/completions", chat(json!({"messages": [1]})));
    add(
        "content as an object",
        post.clone(),
        "/v1/chat/completions",
        chat(json!({"messages": [{"role": "user", "content": {"a": 1}}]})),
    );
    add(
        "role as a number",
        post.clone(),
        "/v1/chat/completions",
        chat(json!({"messages": [{"role": 5, "content": "x"}]})),
    );
    add("tools as text", post.clone(), "/v1/chat/completions", chat(json!({"tools": "x"})));
    add("tool_choice as a number", post.clone(), "/v1/chat/completions", chat(json!({"tools": [], "tool_choice": 5})));
    add("response_format as a list", post.clone(), "/v1/chat/completions", chat(json!({"response_format": []})));
    add("stop as a number", post.clone(), "/v1/chat/completions", chat(json!({"stop": 5})));
    add("logit_bias with a word key", post.clone(), "/v1/chat/completions", chat(json!({"logit_bias": {"abc": 1}})));
    add("logit_bias out of range", post.clone(), "/v1/chat/completions", chat(json!({"logit_bias": {"1": 1e9}})));
    add("stream as text", post.clone(), "/v1/chat/completions", chat(json!({"stream": "yes"})));
    add("top_p zero", post.clone(), "/v1/chat/completions", chat(json!({"top_p": 0})));
    add("seed as text", post.clone(), "/v1/chat/completions", chat(json!({"seed": "x"})));
    add("n = 2", post.clone(), "/v1/chat/completions", chat(json!({"n": 2})));
    add(
        "deeply nested schema",
        post.clone(),
        "/v1/chat/completions",
        chat(json!({"response_format": schema_format(deep_schema(70))})),
    );
    add(
        "$ref to the root",
        post.clone(),
        "/v1/chat/completions",
        chat(json!({"response_format": schema_format(json!({"$ref": "#"}))})),
    );
    add(
        "$ref loop under anyOf",
        post.clone(),
        "/v1/chat/completions",
        chat(json!({"response_format": schema_format(json!({"anyOf": [{"$ref": "#"}, {"$ref": "#/anyOf/0"}]}))})),
    );
    add(
        "dangling $ref",
        post.clone(),
        "/v1/chat/completions",
        chat(json!({"response_format": schema_format(json!({"$ref": "#/$defs/none"}))})),
    );
    let wide: serde_json::Map<String, Value> = (0..5000)
        .map(|i| (format!("p{i}"), json!({"enum": (0..50).map(|j| format!("v{j}")).collect::<Vec<_>>()})))
        .collect();
    add(
        "a schema whose grammar would explode",
        post.clone(),
        "/v1/chat/completions",
        chat(
            json!({"response_format": schema_format(json!({"type": "object", "properties": wide, "required": ["p0"]}))}),
        ),
    );
    add("a very long model name", post.clone(), "/v1/chat/completions", chat(json!({"model": long_name})));
    add("a path as a model", post.clone(), "/v1/chat/completions", chat(json!({"model": "../../../../etc/passwd"})));
    add(
        "a URL as a model",
        post.clone(),
        "/v1/chat/completions",
        chat(json!({"model": "http://evil.example/model.gguf"})),
    );
    add(
        "a file URL as a model",
        post.clone(),
        "/v1/completions",
        json!({"model": "file:///etc/passwd", "prompt": "hi"}).to_string(),
    );
    add(
        "token ids out of the vocabulary",
        post.clone(),
        "/v1/completions",
        json!({"prompt": [4_000_000_000u64], "max_tokens": 2}).to_string(),
    );
    add("negative token limit", post.clone(), "/v1/completions", json!({"prompt": "hi", "max_tokens": -1}).to_string());
    add("an empty prompt", post.clone(), "/v1/completions", json!({"prompt": ""}).to_string());
    // Anthropic.
    add(
        "max_tokens negative",
        post.clone(),
        "/v1/messages",
        json!({"model": "claude-x", "messages": messages(), "max_tokens": -1}).to_string(),
    );
    add(
        "max_tokens as a float",
        post.clone(),
        "/v1/messages",
        json!({"model": "claude-x", "messages": messages(), "max_tokens": 1e300}).to_string(),
    );
    add(
        "system as a number",
        post.clone(),
        "/v1/messages",
        json!({"model": "claude-x", "messages": messages(), "max_tokens": 4, "system": 5}).to_string(),
    );
    add(
        "content blocks of no type",
        post.clone(),
        "/v1/messages",
        json!({"model": "claude-x", "messages": [{"role": "user", "content": [{"text": "x"}]}], "max_tokens": 4})
            .to_string(),
    );
    add("100,000 stop sequences", post.clone(), "/v1/messages", json!({"model": "claude-x", "messages": messages(), "max_tokens": 4, "stop_sequences": (0..100_000).map(|i| i.to_string()).collect::<Vec<_>>()}).to_string());
    // Responses.
    add("input as a number", post.clone(), "/v1/responses", json!({"input": 5}).to_string());
    add(
        "negative max_output_tokens",
        post.clone(),
        "/v1/responses",
        json!({"input": "hi", "max_output_tokens": -3}).to_string(),
    );
    add(
        "tools of an unknown type",
        post.clone(),
        "/v1/responses",
        json!({"input": "hi", "tools": [{"type": 7}]}).to_string(),
    );
    // Ollama.
    add(
        "options as a list",
        post.clone(),
        "/api/chat",
        json!({"model": id, "messages": messages(), "options": []}).to_string(),
    );
    add(
        "num_predict as text",
        post.clone(),
        "/api/generate",
        json!({"model": id, "prompt": "hi", "options": {"num_predict": "lots"}}).to_string(),
    );
    add("keep_alive NaN", post.clone(), "/api/generate", json!({"model": id, "keep_alive": "NaN"}).to_string());
    add(
        "keep_alive huge exponent",
        post.clone(),
        "/api/generate",
        json!({"model": id, "keep_alive": "1e400"}).to_string(),
    );
    add("a path in show", post.clone(), "/api/show", json!({"model": "/etc/passwd"}).to_string());
    add("a long name in show", post.clone(), "/api/show", json!({"model": "x".repeat(100_000)}).to_string());
    add(
        "a URL to pull",
        post.clone(),
        "/api/pull",
        json!({"model": "http://evil.example/../../x", "stream": false}).to_string(),
    );
    add("a path to pull", post.clone(), "/api/pull", json!({"model": "../../etc", "stream": false}).to_string());
    add(
        "a format that is a number",
        post.clone(),
        "/api/chat",
        json!({"model": id, "messages": messages(), "format": 5}).to_string(),
    );
    // Admin.
    add("pull of a path", post.clone(), "/admin/pull", json!({"repo": "../../etc/passwd"}).to_string());
    add("pull of a URL", post.clone(), "/admin/pull", json!({"repo": "https://evil.example/a/b"}).to_string());
    add("load of a path", post.clone(), "/admin/load", json!({"model": "/etc/passwd"}).to_string());
    add("settings with wrong types", post.clone(), "/admin/settings", json!({"max_batch": "many"}).to_string());
    add("settings with a huge number", post.clone(), "/admin/settings", json!({"max_batch": 1e300}).to_string());
    add("delete of a path", Method::DELETE, "/admin/models/..%2F..%2Fetc%2Fpasswd", String::new());
    cases
}

/// The error message in whichever envelope the dialect uses.
fn error_message(uri: &str, body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    let message = if uri.starts_with("/api/") {
        v["error"].as_str()
    } else if uri.starts_with("/v1/messages") {
        (v["type"] == "error").then(|| v["error"]["message"].as_str()).flatten()
    } else {
        v["error"]["message"].as_str()
    };
    message.map(str::to_string)
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_requests_get_clear_errors_and_the_server_stays_up() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let cases = cases(&h.id);
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for (what, method, uri, body) in cases {
        let began = Instant::now();
        let (status, answer) = tokio::time::timeout(LIMIT, send(&h, raw(method.clone(), uri, body)))
            .await
            .unwrap_or_else(|_| panic!("{what} at {uri}: no answer in {LIMIT:?}"));
        assert!(status.is_client_error(), "{what} at {uri}: {status} {}", &answer[..answer.len().min(300)]);
        let message = error_message(uri, &answer).unwrap_or_else(|| {
            panic!("{what} at {uri}: not the dialect's envelope: {}", &answer[..answer.len().min(300)])
        });
        assert!(!message.is_empty() && message.len() < 4096, "{what} at {uri}: message of {} bytes", message.len());
        assert!(began.elapsed() < LIMIT, "{what} at {uri}");
    }
    // Still serving.
    let (status, body) = send_json(&h, post("/v1/chat/completions", chat(json!({"model": h.id})))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Header values with control characters never reach a handler: the HTTP layer refuses the
/// request (400), and the server answers the next one.
#[tokio::test(flavor = "multi_thread")]
async fn control_characters_in_headers_over_a_real_socket() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let running = serve_on_a_socket(&h).await;
    let address = running.address;
    let exchange = |request: Vec<u8>| async move { raw_exchange(address, &request, LIMIT).await };
    for header_line in
        [&b"X-Evil: a\x01b"[..], b"Authorization: Bearer \x00key", b"Origin: http://a\x7fb", b"Host: local\x1bhost"]
    {
        let mut request = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n".to_vec();
        request.extend_from_slice(header_line);
        request.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        let answer = exchange(request).await;
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
            "{:?}: {answer}",
            String::from_utf8_lossy(header_line)
        );
    }
    // Non-ASCII (obs-text) in an Origin is no origin anyone trusts.
    let answer = exchange(
        b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nOrigin: http://\xffevil\r\nConnection: close\r\n\r\n".to_vec(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let answer = exchange(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".to_vec()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    running.stop().await.unwrap();
}

mod random_json {
    use super::*;
    use proptest::prelude::*;

    /// Field names the routes read, so random bodies reach past the first check.
    const KEYS: &[&str] = &[
        "model",
        "messages",
        "prompt",
        "input",
        "max_tokens",
        "max_output_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "stream",
        "tools",
        "tool_choice",
        "response_format",
        "format",
        "options",
        "keep_alive",
        "system",
        "role",
        "content",
        "suffix",
        "logprobs",
        "seed",
        "name",
        "repo",
        "type",
        "text",
        "logit_bias",
        "n",
        "think",
        "raw",
        "instructions",
        "stop_sequences",
        "num_predict",
        "json_schema",
        "schema",
    ];
    const ROUTES: &[&str] = &[
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/api/chat",
        "/api/generate",
        "/api/show",
        "/api/embed",
        "/admin/load",
        "/admin/unload",
        "/admin/settings",
    ];

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|f| json!(f)),
            prop_oneof![
                Just("user".to_string()),
                Just("assistant".to_string()),
                Just("tiny-qwen2".to_string()),
                ".{0,12}"
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..6)
                    .prop_map(|pairs| Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
            ]
        })
    }

    fn request() -> impl Strategy<Value = (&'static str, Value)> {
        let body = prop::collection::vec((prop::sample::select(KEYS), json_value()), 0..8)
            .prop_map(|pairs| Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()));
        (prop::sample::select(ROUTES), body)
    }

    #[test]
    fn random_json_never_breaks_a_route() {
        let _mlx = common::mlx_lock();
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        // Generations are kept short: random bodies that are valid requests still finish fast.
        let h = runtime
            .block_on(harness(EngineConfig::default(), ServerConfig { max_tokens_limit: 8, ..Default::default() }));
        let cases = std::env::var("FASTMLX_FUZZ_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(3000);
        let config = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
        proptest!(config, |((uri, body) in request())| {
            let (status, answer) = runtime
                .block_on(async { tokio::time::timeout(LIMIT, send(&h, raw(Method::POST, uri, body.to_string()))).await })
                .unwrap_or_else(|_| panic!("{uri} hung on {body}"));
            // Documented 5xx: 503 when a model cannot be loaded for room (none here).
            prop_assert!(status.as_u16() < 500, "{} {} on {}: {}", uri, status, body, answer);
            if status.is_client_error() {
                prop_assert!(error_message(uri, &answer).is_some(), "{} {}: not the dialect's envelope: {}", uri, status, answer);
            }
        });
        // The model is still there and answers.
        let (status, body) =
            runtime.block_on(send_json(&h, post("/v1/chat/completions", chat(json!({"model": h.id})))));
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}
