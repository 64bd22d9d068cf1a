//! The Ollama, Anthropic Messages and OpenAI Responses dialects through the router, on a tiny
//! model: every field the clients in `clients.md` parse, the streaming shapes, tool calls, and
//! bad input answered in each dialect's own error envelope.

#![allow(clippy::await_holding_lock)]

mod common;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::api::*;
use fastmlx::engine::EngineConfig;
use fastmlx::server::ServerConfig;
use serde_json::{json, Value};

/// NDJSON lines as JSON.
fn ndjson(body: &str) -> Vec<Value> {
    body.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))).collect()
}

/// `(event, data)` pairs of a named-event SSE body.
fn sse_events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in body.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((name.clone(), serde_json::from_str(d).unwrap_or_else(|e| panic!("bad data ({e}): {d}"))));
        }
    }
    out
}

const SCHEMA: &str = r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["city", "days"]}"#;

fn weather_schema() -> Value {
    serde_json::from_str(SCHEMA).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn ollama_listing_and_show() {
    let _mlx = common::mlx_lock();
    let h = harness(EngineConfig::default(), ServerConfig::default()).await;
    let (status, body) = send(&h, get("/")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "Ollama is running"));
    // Ollama's clients send `Accept: */*` (or nothing); a browser asks for HTML and gets the UI.
    let ollama_client =
        Request::get("/").header(header::HOST, "localhost").header(header::ACCEPT, "*/*").body(Body::empty()).unwrap();
    assert_eq!(send(&h, ollama_client).await, (StatusCode::OK, "Ollama is running".to_string()));
    let browser = Request::get("/")
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::ACCEPT, "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
        .body(Body::empty())
        .unwrap();
    let response = tower::ServiceExt::oneshot(fastmlx::server::app(h.state.clone()), browser).await.unwrap();
    assert!(response.status().is_redirection(), "{}", response.status());
    assert_eq!(response.headers()[header::LOCATION], "/ui/");
    let (_, version) = send_json(&h, get("/api/version")).await;
    let parts: Vec<u32> = version["version"].as_str().unwrap().split('.').map(|p| p.parse().unwrap()).collect();
    assert!(parts >= vec![0, 6, 4], "Copilot needs 0.6.4 or later: {version}");

    let (status, tags) = send_json(&h, get("/api/tags")).await;
    assert_eq!(status, StatusCode::OK);
    let entry = &tags["models"][0];
    assert_eq!((entry["name"].as_str(), entry["model"].as_str()), (Some(h.id.as_str()), Some(h.id.as_str())));
    assert!(entry["size"].as_u64().unwrap() > 0);
    assert_eq!(entry["digest"].as_str().unwrap().len(), 64);
    assert!(chrono_like(entry["modified_at"].as_str().unwrap()));
    let details = &entry["details"];
    for key in ["parent_model", "format", "family", "parameter_size", "quantization_level"] {
        assert!(details[key].is_string(), "details.{key} must be a string: {details}");
    }
    assert_eq!((details["format"].as_str(), details["family"].as_str()), (Some("safetensors"), Some("qwen2")));
    assert_eq!(details["families"], json!(["qwen2"]));

    for key in ["model", "name"] {
        let (status, show) = send_json(&h, post("/api/show", json!({ key: h.id }).to_string())).await;
        assert_eq!(status, StatusCode::OK, "{show}");
        assert_eq!(show["capabilities"], json!(["completion"]), "the tiny template has no tools");
        assert_eq!(show["model_info"]["general.architecture"], "qwen2");
        assert!(show["model_info"]["qwen2.context_length"].as_u64().unwrap() > 0);
        assert!(show["template"].as_str().unwrap().contains("im_start"));
        assert!(show["details"]["family"].is_string() && show["parameters"].is_string());
    }
    let (status, error) = send_json(&h, post("/api/show", json!({"model": "llama3.2:3b"}).to_string())).await;
    assert_eq!(
        (status, error),
        (StatusCode::NOT_FOUND, json!({"error": "model \"llama3.2:3b\" not found, try pulling it first"}))
    );
    let (status, error) = send_json(&h, post("/api/show", "{not json")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"].as_str().unwrap().contains("not valid JSON"), "Ollama's envelope: {error}");

    let (_, ps) = send_json(&h, get("/api/ps")).await;
    let loaded = &ps["models"][0];
    assert_eq!(loaded["name"], h.id.as_str());
    assert!(loaded["size_vram"].as_u64().unwrap() > 0 && chrono_like(loaded["expires_at"].as_str().unwrap()));
}

/// `2026-11-29T10:00:00.123456789Z`-like.
fn chrono_like(s: &str) -> bool {
    s.len() >= 20 && s.as_bytes()[4] == b'-' && s.as_bytes()[10] == b'T'
}

#[tokio::test(flavor = "multi_thread")]
async fn ollama_chat_and_generate() {
    let _mlx = common::mlx_lock();
    let h = harness(EngineConfig::default(), ServerConfig::default()).await;
    let options = json!({"num_predict": 6, "temperature": 0, "seed": 1, "num_ctx": 2048});
    let request =
        json!({"model": h.id, "messages": [{"role": "user", "content": "hi"}], "stream": false, "options": options});
    let (status, whole) = send_json(&h, post("/api/chat", request.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    assert_eq!((whole["done"].as_bool(), whole["message"]["role"].as_str()), (Some(true), Some("assistant")));
    assert!(matches!(whole["done_reason"].as_str(), Some("stop" | "length")));
    let eval = whole["eval_count"].as_u64().unwrap();
    assert!((1..=6).contains(&eval) && whole["prompt_eval_count"].as_u64().unwrap() > 0);
    for key in ["total_duration", "load_duration", "prompt_eval_duration", "eval_duration"] {
        assert!(whole[key].as_u64().is_some(), "{key} in nanoseconds: {whole}");
    }

    // Streaming is Ollama's default: NDJSON, the same text, one last line with the counts.
    let mut streamed = request.clone();
    streamed.as_object_mut().unwrap().remove("stream");
    let response = app_response(&h, post("/api/chat", streamed.to_string())).await;
    assert_eq!(response.0, "application/x-ndjson");
    let lines = ndjson(&response.1);
    let (last, deltas) = lines.split_last().unwrap();
    assert!(deltas.iter().all(|l| l["done"] == false) && last["done"] == true);
    let text: String = lines.iter().map(|l| l["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(text, whole["message"]["content"].as_str().unwrap(), "greedy: the same answer streamed or not");
    assert_eq!(last["eval_count"], whole["eval_count"]);

    // `format` as a schema: constrained decoding makes valid JSON even from random weights.
    let formatted = json!({"model": h.id, "messages": [{"role": "user", "content": "weather"}], "stream": false, "format": weather_schema(), "options": {"num_predict": 200, "seed": 3}});
    let (status, answer) = send_json(&h, post("/api/chat", formatted.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let content: Value = serde_json::from_str(answer["message"]["content"].as_str().unwrap()).unwrap();
    assert!(content["city"].is_string() && (1..=9).contains(&content["days"].as_i64().unwrap()), "{content}");

    // generate: templated, raw, and a suffix this model cannot fill.
    let (status, generated) = send_json(
        &h,
        post(
            "/api/generate",
            json!({"model": h.id, "prompt": "Why?", "stream": false, "options": options}).to_string(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{generated}");
    assert!(generated["response"].is_string() && generated["done"] == true);
    let raw = json!({"model": h.id, "prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "raw": true, "options": options});
    let (_, raw_body) = app_response(&h, post("/api/generate", raw.to_string())).await;
    let raw_lines = ndjson(&raw_body);
    // Nine tokens with the special tokens kept whole (dozens if they were spelled out); fewer are
    // evaluated when the prefix cache holds the start of the prompt from the requests above.
    let evaluated = raw_lines.last().unwrap()["prompt_eval_count"].as_u64().unwrap();
    assert!((1..=9).contains(&evaluated), "the raw prompt's special tokens, as they are: {evaluated}");
    let (status, error) = send_json(
        &h,
        post(
            "/api/generate",
            json!({"model": h.id, "prompt": "def f(", "suffix": "return x", "stream": false}).to_string(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"].as_str().unwrap().contains("does not support insert"), "{error}");
    // OpenAI's legacy `suffix` takes the same fill-in-the-middle path.
    let (status, error) =
        send_json(&h, post("/v1/completions", json!({"prompt": "def f(", "suffix": "return x"}).to_string())).await;
    assert_eq!((status, error["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("suffix")), "{error}");

    // Bad input, in Ollama's envelope.
    for (bad, what) in [
        (
            json!({"model": h.id, "messages": [{"role": "user", "content": "x"}], "options": {"temperature": "hot"}}),
            "options.temperature",
        ),
        (json!({"model": h.id, "messages": [{"role": "user", "content": "x"}], "keep_alive": "soon"}), "keep_alive"),
        (
            json!({"model": h.id, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
            "the image is not PNG, JPEG, WebP or GIF",
        ),
        (json!({"model": h.id, "messages": [{"role": "user", "content": "x"}], "format": 7}), "format"),
        (json!({"messages": [{"role": "user", "content": "x"}]}), "model"),
    ] {
        let (status, error) = send_json(&h, post("/api/chat", bad.to_string())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        let message = error["error"].as_str().unwrap_or_else(|| panic!("not Ollama's envelope: {error}"));
        assert!(message.contains(what), "{message} should name {what}");
    }
    let (status, error) = send_json(
        &h,
        post("/api/chat", json!({"model": "qwen2.5:7b", "messages": [{"role": "user", "content": "x"}]}).to_string()),
    )
    .await;
    assert_eq!(
        (status, error["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("model \"qwen2.5:7b\" not found, try pulling it first"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ollama_keep_alive_and_aliases_drive_the_model_store() {
    let _mlx = common::mlx_lock();
    let config = ServerConfig { aliases: vec!["qwen2.5:7b=tiny-qwen2".parse().unwrap()], ..ServerConfig::default() };
    let h = harness(EngineConfig::default(), config).await;
    // An alias serves the local model under the name asked for.
    let request = json!({"model": "qwen2.5:7b", "messages": [{"role": "user", "content": "x"}], "stream": false, "options": {"num_predict": 2}, "keep_alive": 0});
    let (status, answer) = send_json(&h, post("/api/chat", request.to_string())).await;
    assert_eq!((status, answer["model"].as_str()), (StatusCode::OK, Some("qwen2.5:7b")), "{answer}");
    // keep_alive 0: unloaded as soon as it is idle (the engine reports idle just after the
    // answer; the reaper checks every 2 s in the server).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut unloaded = Vec::new();
    while unloaded.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        unloaded = h.state.models.unload_idle().await;
    }
    assert_eq!(unloaded, vec![h.id.clone()]);
    let (_, ps) = send_json(&h, get("/api/ps")).await;
    assert_eq!(ps["models"], json!([]));
    // An empty chat loads it again ("load"), with keep_alive 0 unloads it ("unload").
    let (_, loaded) = send_json(&h, post("/api/chat", json!({"model": h.id, "messages": []}).to_string())).await;
    assert_eq!((loaded["done"].as_bool(), loaded["done_reason"].as_str()), (Some(true), Some("load")));
    assert_eq!(h.state.models.loaded().len(), 1);
    let (_, unloaded) = send_json(&h, post("/api/generate", json!({"model": h.id, "keep_alive": 0}).to_string())).await;
    assert_eq!(unloaded["done_reason"], "unload");
    assert!(h.state.models.loaded().is_empty());
    // keep_alive -1: loaded for good.
    send_json(&h, post("/api/generate", json!({"model": h.id, "keep_alive": -1}).to_string())).await;
    assert_eq!(h.state.models.loaded()[0].expires_in_secs, None);
    // Delete refuses what FastMLX did not download; pull refuses library names.
    let (status, error) = send_json(&h, delete("/api/delete", Some(json!({"model": "nope"})))).await;
    assert_eq!(
        (status, error["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("model \"nope\" not found, try pulling it first"))
    );
    let (status, error) = send_json(&h, post("/api/pull", json!({"model": "llama3.2"}).to_string())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["error"].as_str().unwrap().contains("Hugging Face"), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_messages() {
    let _mlx = common::mlx_lock();
    let h = harness(EngineConfig::default(), ServerConfig::default()).await;
    let request = json!({"model": "claude-sonnet-4-5", "max_tokens": 6, "temperature": 0, "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]});
    let (status, message) = send_json(&h, post("/v1/messages", request.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{message}");
    assert_eq!(
        (message["type"].as_str(), message["role"].as_str(), message["model"].as_str()),
        (Some("message"), Some("assistant"), Some("claude-sonnet-4-5"))
    );
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    assert!(matches!(message["stop_reason"].as_str(), Some("end_turn" | "max_tokens")));
    let (input, output) =
        (message["usage"]["input_tokens"].as_u64().unwrap(), message["usage"]["output_tokens"].as_u64().unwrap());
    assert!(input > 0 && (1..=6).contains(&output));
    let text = message["content"][0]["text"].as_str().unwrap_or_default().to_string();

    // The stream's exact event sequence, and the same text.
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (_, body) = send(&h, post("/v1/messages", streamed.to_string())).await;
    let events = sse_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[..2], ["message_start", "ping"]);
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
    assert!(events.iter().all(|(n, d)| d["type"] == n.as_str()), "each data's type is its event name");
    if !text.is_empty() {
        assert_eq!(names[2], "content_block_start");
        assert_eq!(names[names.len() - 3], "content_block_stop");
    }
    let streamed_text: String = events.iter().filter_map(|(_, d)| d["delta"]["text"].as_str()).collect();
    assert_eq!(streamed_text, text);
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["usage"]["output_tokens"].as_u64(), Some(output));
    assert_eq!(events[0].1["message"]["usage"]["input_tokens"].as_u64(), Some(input));

    // A forced tool: one tool_use block whose input validates, streamed as input_json_delta.
    let tools = json!([{"name": "get_weather", "description": "Weather", "input_schema": weather_schema()}]);
    let forced = json!({"model": "claude-x", "max_tokens": 200, "messages": [{"role": "user", "content": "Oslo?"}], "tools": tools, "tool_choice": {"type": "tool", "name": "get_weather"}});
    let (status, called) = send_json(&h, post("/v1/messages", forced.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{called}");
    let block = called["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .cloned()
        .unwrap_or_else(|| panic!("{called}"));
    assert!(block["id"].as_str().unwrap().starts_with("toolu_") && block["name"] == "get_weather");
    assert!(block["input"]["city"].is_string() && block["input"]["days"].is_i64(), "{block}");
    let mut forced_stream = forced.clone();
    forced_stream["stream"] = json!(true);
    let (_, body) = send(&h, post("/v1/messages", forced_stream.to_string())).await;
    let events = sse_events(&body);
    let json_text: String = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    let streamed_input: Value = serde_json::from_str(&json_text).unwrap();
    assert!(streamed_input["city"].is_string(), "{streamed_input}");
    assert_eq!(events[2].1["content_block"]["type"], "tool_use");

    // The tool's answer goes back as a tool_result; the conversation continues.
    let round = json!({"model": "claude-x", "max_tokens": 4, "tools": tools, "messages": [
        {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": called["content"][0]["id"], "content": "sunny"}]}
    ]});
    let (status, answer) = send_json(&h, post("/v1/messages", round.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    // count_tokens counts the prompt the same request would have: system prompt included.
    let counted = json!({"model": "claude-x", "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]});
    let (status, count) = send_json(&h, post("/v1/messages/count_tokens", counted.to_string())).await;
    assert_eq!((status, count["input_tokens"].as_u64()), (StatusCode::OK, Some(input)));

    // Claude's own output ceiling (Claude Code sends 32000 and more) is capped to what fits in
    // this model's 512-token window, not refused; a final assistant message is a prefill the
    // answer continues (its text is in the prompt, not in the answer).
    let chat = [json!({"role": "user", "content": "hi"})];
    let prefilled = json!({"model": "claude-x", "max_tokens": 64000, "temperature": 0, "messages": [chat[0], {"role": "assistant", "content": "Hello there"}]});
    let (status, answer) = send_json(&h, post("/v1/messages", prefilled.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (prompt, output) =
        (answer["usage"]["input_tokens"].as_u64().unwrap(), answer["usage"]["output_tokens"].as_u64().unwrap());
    assert!(prompt + output <= 512, "{answer}");
    let (_, plain) =
        send_json(&h, post("/v1/messages/count_tokens", json!({"model": "claude-x", "messages": chat}).to_string()))
            .await;
    assert!(prompt > plain["input_tokens"].as_u64().unwrap(), "the prefill is part of the prompt");
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_errors_in_anthropic_shape() {
    let _mlx = common::mlx_lock();
    let h =
        harness(EngineConfig::default(), ServerConfig { api_key: Some("sk-local".into()), ..ServerConfig::default() })
            .await;
    let body =
        json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let (status, error) = send_json(&h, post("/v1/messages", body.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        (error["type"].as_str(), error["error"]["type"].as_str()),
        (Some("error"), Some("authentication_error"))
    );
    let keyed = |body: String| {
        Request::post("/v1/messages")
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-api-key", "sk-local")
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", "prompt-caching-2024-07-31")
            .body(Body::from(body))
            .unwrap()
    };
    let (status, ok) = send_json(&h, keyed(body)).await;
    assert_eq!(status, StatusCode::OK, "x-api-key and Anthropic's headers: {ok}");
    for (bad, param) in [
        (json!({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}), "max_tokens"),
        (
            json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            "messages[0].content[0].source.type: field required",
        ),
        (
            json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": "warm"}),
            "temperature",
        ),
        (json!({"model": "claude-x", "max_tokens": 5, "messages": "hi"}), "messages"),
    ] {
        let (status, error) = send_json(&h, keyed(bad.to_string())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        assert!(error["error"]["message"].as_str().unwrap().contains(param), "{error}");
    }
    let (status, error) = send_json(
        &h,
        keyed(
            json!({"model": "not-here", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}).to_string(),
        ),
    )
    .await;
    assert_eq!((status, error["error"]["type"].as_str()), (StatusCode::NOT_FOUND, Some("not_found_error")));
}

#[tokio::test(flavor = "multi_thread")]
async fn responses_api() {
    let _mlx = common::mlx_lock();
    let h = harness(EngineConfig::default(), ServerConfig::default()).await;
    let request = json!({"model": h.id, "instructions": "Be brief.", "input": "hi", "max_output_tokens": 6, "temperature": 0, "store": false});
    let (status, response) = send_json(&h, post("/v1/responses", request.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    assert_eq!((response["object"].as_str(), response["model"].as_str()), (Some("response"), Some(h.id.as_str())));
    assert!(matches!(response["status"].as_str(), Some("completed" | "incomplete")));
    let usage = &response["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap())
    );
    let text: String = response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .map(|i| i["content"][0]["text"].as_str().unwrap().to_string())
        .collect();

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (_, body) = send(&h, post("/v1/responses", streamed.to_string())).await;
    let events = sse_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[..2], ["response.created", "response.in_progress"]);
    assert!(matches!(*names.last().unwrap(), "response.completed" | "response.incomplete"));
    let sequence: Vec<u64> = events.iter().map(|(_, d)| d["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(sequence, (0..events.len() as u64).collect::<Vec<_>>(), "sequence numbers count up from 0");
    let deltas: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);

    // A forced function call, then its output sent back as an item.
    let tools = json!([{"type": "function", "name": "get_weather", "parameters": weather_schema()}]);
    let forced = json!({"model": h.id, "input": "Oslo?", "tools": tools, "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 200});
    let (status, called) = send_json(&h, post("/v1/responses", forced.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{called}");
    let call = called["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .cloned()
        .unwrap_or_else(|| panic!("{called}"));
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["city"].is_string(), "{arguments}");
    let round = json!({"model": h.id, "tools": tools, "max_output_tokens": 4, "input": [
        {"role": "user", "content": "Oslo?"}, call, {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    ]});
    let (status, answer) = send_json(&h, post("/v1/responses", round.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    // Nothing is stored: clear errors in OpenAI's envelope.
    for (bad, param) in [
        (json!({"input": "x", "previous_response_id": "resp_1"}), "previous_response_id"),
        (json!({"input": "x", "store": true}), "store"),
    ] {
        let (status, error) = send_json(&h, post("/v1/responses", bad.to_string())).await;
        assert_eq!((status, error["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some(param)), "{error}");
        assert!(error["error"]["message"].as_str().unwrap().contains("not supported"));
    }
    let (status, error) = send_json(&h, get("/v1/responses/resp_1")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error["error"]["message"].as_str().unwrap().contains("stores no responses"));
}

/// Claude Code's requests (captured from claude 2.1.332 with `ANTHROPIC_BASE_URL`):
/// `?beta=true` and its betas, three system blocks with cache control, a system entry among the
/// messages, `context_management`, adaptive thinking with `display: "omitted"`,
/// `output_config.effort`, Claude's own `max_tokens`, a `defer_loading` tool and a server tool.
#[tokio::test(flavor = "multi_thread")]
async fn messages_as_claude_code_sends_them() {
    let _mlx = common::mlx_lock();
    let h = harness(EngineConfig::default(), ServerConfig::default()).await;
    let system = json!([
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be concise.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]);
    let tools = json!([
        {"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object", "properties": {"command": {"type": "string", "maxLength": 20}}, "required": ["command"]}},
        {"name": "mcp__placeholder", "description": "Deferred.", "defer_loading": true, "input_schema": {"type": "object", "properties": {}}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
    ]);
    let body = |stream: bool, tool_choice: Value| {
        json!({"model": "claude-sonnet-4-6", "max_tokens": 32000, "stream": stream, "system": system, "tools": tools,
               "tool_choice": tool_choice,
               "messages": [{"role": "system", "content": "Today is Wednesday."},
                            {"role": "user", "content": [{"type": "text", "text": "List the files.", "cache_control": {"type": "ephemeral"}}]}],
               "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "medium"},
               "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
               "metadata": {"user_id": "user_1"}, "temperature": 1})
    };
    let with_betas = |body: Value| {
        let mut request = post("/v1/messages?beta=true", body.to_string());
        let betas = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,advanced-tool-use-2025-11-20";
        request.headers_mut().insert("anthropic-beta", betas.parse().unwrap());
        request.headers_mut().insert("anthropic-version", "2023-06-01".parse().unwrap());
        request
    };
    let (status, message) = send_json(&h, with_betas(body(false, json!({"type": "tool", "name": "Bash"})))).await;
    assert_eq!(status, StatusCode::OK, "{message}");
    let call = message["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").cloned().unwrap();
    assert_eq!(call["name"], "Bash", "{message}");
    assert!(message["content"].as_array().unwrap().iter().all(|b| b["type"] != "thinking" || b["thinking"] == ""));
    let (status, body_text) = send(&h, with_betas(body(true, json!({"type": "auto"})))).await;
    assert_eq!(status, StatusCode::OK, "{body_text}");
    assert!(body_text.contains("event: message_stop") && !body_text.contains("thinking_delta"), "{body_text}");
    // The server tool is left out: forcing it names a tool the model is not offered.
    let (status, error) = send_json(&h, with_betas(body(false, json!({"type": "tool", "name": "web_search"})))).await;
    assert_eq!((status, error["type"].as_str()), (StatusCode::BAD_REQUEST, Some("error")), "{error}");
}

/// Codex CLI's requests (captured from codex 0.171.0 against a custom provider): developer
/// messages instead of `instructions`, items with client-made ids, replayed reasoning with
/// `encrypted_content` and `content: null`, a `namespace` of function tools, the hosted
/// `web_search` tool, `include`, `reasoning.summary`, `prompt_cache_key`, `client_metadata`.
/// A call to a namespaced function comes back with `namespace` and its own `name`, and goes
/// round again as Codex sends it.
#[tokio::test(flavor = "multi_thread")]
async fn responses_as_codex_sends_them() {
    let _mlx = common::mlx_lock();
    let h = harness(EngineConfig::default(), ServerConfig::default()).await;
    let wait = json!({"type": "function", "name": "wait_agent", "description": "Wait for an agent.", "strict": false,
                      "parameters": {"type": "object", "properties": {"id": {"type": "string", "maxLength": 8}}, "required": ["id"]}});
    let tools = json!([
        {"type": "function", "name": "exec_command", "description": "Run a command.", "strict": false,
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for spawning and managing sub-agents.",
         "tools": [wait, {"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {}}}]},
        {"type": "web_search", "external_web_access": true}
    ]);
    let request = |input: Value, tool_choice: Value| {
        json!({"model": h.id, "stream": false, "input": input, "tools": tools, "tool_choice": tool_choice,
               "parallel_tool_calls": true, "reasoning": {"summary": "auto"}, "store": false,
               "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199-thread",
               "client_metadata": {"x-codex-window-id": "w1", "turn_id": "t1"}, "max_output_tokens": 200})
    };
    let developer = json!({"type": "message", "role": "developer", "id": "msg_c1", "content": [{"type": "input_text", "text": "You are Codex."}]});
    let user =
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Wait for agent a1."}]});
    let forced = request(
        json!([developer, user]),
        json!({"type": "function", "name": "wait_agent", "namespace": "multi_agent_v1"}),
    );
    let (status, called) = send_json(&h, post("/v1/responses", forced.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{called}");
    let call = called["output"].as_array().unwrap().iter().find(|i| i["type"] == "function_call").cloned().unwrap();
    assert_eq!(
        (call["namespace"].as_str(), call["name"].as_str()),
        (Some("multi_agent_v1"), Some("wait_agent")),
        "{call}"
    );
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["id"].is_string(), "{arguments}");
    // The next turn, as Codex sends it: reasoning replayed, the call, its output.
    let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Waiting."}],
                           "content": null, "encrypted_content": "ENC123"});
    let output = json!({"type": "function_call_output", "id": "fco_1", "call_id": call["call_id"], "output": "done"});
    let next = request(json!([developer, user, reasoning, call, output]), json!("auto"));
    let (status, answer) = send_json(&h, post("/v1/responses", next.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // Forcing the hosted tool is the one thing refused.
    let hosted = request(json!("Search the web."), json!({"type": "web_search"}));
    let (status, error) = send_json(&h, post("/v1/responses", hosted.to_string())).await;
    assert_eq!((status, error["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("tool_choice")), "{error}");
}

/// The agent tests' scripted model (`make-test-model --scripted hermes`, tests/agents): a call on
/// a new request, its answer once the call's result is back, through the Responses and Messages
/// dialects as Codex and Claude Code use them; and Claude Code's `HEAD /api/hello` answered.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_tests_scripted_model_calls_then_answers() {
    use fastmlx::fixtures::scripted;
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let template = std::fs::read_to_string(common::root().join("tests/agents/round_trip.jinja")).unwrap();
    let script = scripted::hermes_round_trip(&template, r#"{"name":"run","arguments":{"cmd":"echo hi"}}"#, "Done.");
    scripted::write_scripted_model(&dir.path().join("models/tiny-qwen2"), &script).unwrap();
    let h = harness_in(dir, EngineConfig::default(), ServerConfig::default()).await;
    let parameters = json!({"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]});

    let tool = json!({"type": "function", "name": "run", "parameters": parameters});
    let user = json!({"role": "user", "content": "Say hi."});
    let (status, first) =
        send_json(&h, post("/v1/responses", json!({"input": [user], "tools": [tool]}).to_string())).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let call = first["output"][0].clone();
    assert_eq!((call["type"].as_str(), call["name"].as_str()), (Some("function_call"), Some("run")), "{first}");
    assert_eq!(serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap(), json!({"cmd": "echo hi"}));
    let output = json!({"type": "function_call_output", "call_id": call["call_id"], "output": "hi"});
    let body = json!({"input": [user, call, output], "tools": [tool]});
    let (status, second) = send_json(&h, post("/v1/responses", body.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["output"][0]["content"][0]["text"], "Done.", "{second}");

    let tool = json!({"name": "run", "input_schema": parameters});
    let request =
        |messages: Value| json!({"model": "claude-x", "max_tokens": 100, "messages": messages, "tools": [tool]});
    let (status, first) = send_json(&h, post("/v1/messages?beta=true", request(json!([user])).to_string())).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let tool_use = first["content"][0].clone();
    assert_eq!((tool_use["type"].as_str(), &tool_use["input"]), (Some("tool_use"), &json!({"cmd": "echo hi"})));
    let result =
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "hi"}]});
    let messages = json!([user, {"role": "assistant", "content": [tool_use]}, result]);
    let (status, second) = send_json(&h, post("/v1/messages?beta=true", request(messages).to_string())).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["content"], json!([{"type": "text", "text": "Done."}]), "{second}");

    let hello = Request::head("/api/hello").body(Body::empty()).unwrap();
    assert_eq!(send(&h, hello).await.0, StatusCode::OK);
}

/// The content type and body of a response.
async fn app_response(h: &Harness, request: Request<Body>) -> (String, String) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let response = fastmlx::server::app(h.state.clone()).oneshot(request).await.unwrap();
    let content_type =
        response.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (content_type, String::from_utf8_lossy(&body).to_string())
}

/// A model whose vocabulary has StarCoder's fill-in-the-middle tokens (the tiny tokenizer's
/// byte tokens 1-3 renamed as added special tokens): `show` lists "insert", and a suffix becomes
/// a prefix-suffix-middle prompt, in Ollama's generate and in OpenAI's legacy completions.
#[tokio::test(flavor = "multi_thread")]
async fn suffix_fills_in_the_middle_with_the_models_markers() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("models").join("tiny-qwen2");
    fastmlx::fixtures::synthetic::write_tiny_model(&model, fastmlx::model::Arch::Qwen2, 5, None).unwrap();
    let path = model.join("tokenizer.json");
    let mut tokenizer: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (id, marker) in [(1, "<fim_prefix>"), (2, "<fim_suffix>"), (3, "<fim_middle>")] {
        let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
        let byte = vocab.iter().find(|(_, v)| v.as_u64() == Some(id)).map(|(k, _)| k.clone()).unwrap();
        vocab.remove(&byte);
        vocab.insert(marker.to_string(), json!(id));
        let added = json!({"id": id, "content": marker, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
        tokenizer["added_tokens"].as_array_mut().unwrap().push(added);
    }
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    let h = harness_in(dir, EngineConfig::default(), ServerConfig::default()).await;

    let (_, show) = send_json(&h, post("/api/show", json!({"model": h.id}).to_string())).await;
    assert_eq!(show["capabilities"], json!(["completion", "insert"]));
    let options = json!({"num_predict": 4, "temperature": 0});
    let (prefix, suffix) = ("def f(", "return x");
    let (status, filled) = send_json(
        &h,
        post(
            "/api/generate",
            json!({"model": h.id, "prompt": prefix, "suffix": suffix, "stream": false, "options": options}).to_string(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{filled}");
    // Byte-level tokens: one per byte, plus the three markers.
    let expected = (prefix.len() + suffix.len() + 3) as u64;
    assert_eq!(filled["prompt_eval_count"].as_u64(), Some(expected), "{filled}");
    let (status, completion) = send_json(
        &h,
        post(
            "/v1/completions",
            json!({"prompt": prefix, "suffix": suffix, "max_tokens": 4, "temperature": 0}).to_string(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(completion["usage"]["prompt_tokens"].as_u64(), Some(expected));
    assert_eq!(completion["choices"][0]["text"], filled["response"], "the same prompt, greedy: the same fill");
}

/// A generation cancelled under way (its model unloaded while it streams) ends with the
/// dialect's error, never with what a normal finish sends — in every dialect.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_stream_never_ends_as_a_normal_finish() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let _mlx = common::mlx_lock();
    let long = json!({"role": "user", "content": "hello"});
    let cases: Vec<(&str, Value)> = vec![
        ("/v1/chat/completions", json!({"messages": [long], "max_tokens": 4000, "temperature": 0, "stream": true})),
        ("/v1/completions", json!({"prompt": "hello", "max_tokens": 4000, "temperature": 0, "stream": true})),
        ("/v1/messages", json!({"model": "claude-x", "messages": [long], "max_tokens": 4000, "stream": true})),
        ("/v1/responses", json!({"input": "hello", "max_output_tokens": 4000, "stream": true})),
        ("/api/chat", json!({"messages": [long], "options": {"num_predict": 4000, "temperature": 0}})),
        ("/api/generate", json!({"prompt": "hello", "options": {"num_predict": 4000, "temperature": 0}})),
    ];
    for (uri, mut body) in cases {
        // Each token takes a few milliseconds, so the unload lands while the answer streams.
        let slow: fastmlx::engine::FaultInjector = std::sync::Arc::new(|_, _| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            Ok(())
        });
        let h =
            harness(EngineConfig { fault_injector: Some(slow), ..Default::default() }, ServerConfig::default()).await;
        if uri.starts_with("/api/") {
            body["model"] = json!(h.id);
        }
        let response = fastmlx::server::app(h.state.clone()).oneshot(post(uri, body.to_string())).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{uri}");
        let mut stream = response.into_body();
        let mut text = String::new();
        // Wait for some generated text (past the opening frames), then unload the model.
        while text.len() < 600 {
            let frame = stream.frame().await.unwrap_or_else(|| panic!("{uri}: ended early: {text}")).unwrap();
            if let Ok(data) = frame.into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
            }
        }
        h.state.models.unload(&h.id).await.unwrap();
        let rest = stream.collect().await.unwrap().to_bytes();
        text.push_str(&String::from_utf8_lossy(&rest));
        match uri {
            "/v1/chat/completions" | "/v1/completions" => {
                let data = sse_data(&text);
                assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{uri}: {text}");
                let frames: Vec<Value> =
                    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
                assert!(
                    frames.iter().all(|f| f["choices"][0]["finish_reason"].is_null()),
                    "{uri}: a finish_reason was sent: {text}"
                );
                let last = frames.last().unwrap();
                assert_eq!(last["error"]["type"], "server_error", "{uri}: {last}");
                assert!(last["error"]["message"].as_str().unwrap().contains("cancelled"), "{uri}: {last}");
            }
            "/v1/messages" => {
                let events = sse_events(&text);
                assert!(
                    events.iter().all(|(name, _)| name != "message_delta" && name != "message_stop"),
                    "{uri}: {text}"
                );
                let (name, data) = events.last().unwrap();
                assert_eq!((name.as_str(), data["type"].as_str()), ("error", Some("error")), "{uri}: {data}");
                assert_eq!(data["error"]["type"], "overloaded_error", "{uri}: {data}");
            }
            "/v1/responses" => {
                let events = sse_events(&text);
                assert!(
                    events.iter().all(|(name, _)| name != "response.completed" && name != "response.incomplete"),
                    "{uri}: {text}"
                );
                let (name, data) = events.last().unwrap();
                assert_eq!(name, "response.failed", "{uri}: {data}");
                assert_eq!(data["response"]["status"], "failed");
                assert!(data["response"]["error"]["message"].as_str().unwrap().contains("cancelled"), "{uri}: {data}");
            }
            _ => {
                let lines = ndjson(&text);
                assert!(lines.iter().all(|l| l["done"] != true), "{uri}: a done line was sent: {text}");
                let last = lines.last().unwrap();
                assert!(last["error"].as_str().unwrap().contains("cancelled"), "{uri}: {last}");
            }
        }
    }
}
