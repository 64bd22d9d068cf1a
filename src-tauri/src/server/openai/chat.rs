//! `POST /v1/chat/completions`, streaming and not.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::tool_calls::{Piece, ToolCall, ToolCallParser, ToolFormat};
use super::{closing_chunks, collect, finish_reason, now, stream_error, usage_json, CommonParams};
use crate::engine::{Event, TokenLogprob};
use crate::server::extract::{parse, ApiJson};
use crate::server::sse::stream_events;
use crate::server::{ApiError, AppState};
use crate::tokenizer::chat_template::RenderRequest;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub response_format: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
}

pub async fn completions(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response, ApiError> {
    let request: ChatRequest = parse(&body)?;
    let common: CommonParams = parse(&body)?;
    let info = state.engine.model_info().clone();
    let messages = normalize_messages(&request.messages, state.config.max_messages)?;
    if let Some(format) = &request.response_format {
        match format.get("type").and_then(Value::as_str) {
            None | Some("text") => {}
            Some(other) => {
                return Err(ApiError::invalid("response_format", format!("response_format {other:?} is not supported yet")))
            }
        }
    }
    let template = info
        .chat_template
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("this model has no chat template; use /v1/completions with a raw prompt"))?;
    // `tool_choice: "none"`: the model is not shown the tools. Otherwise they go into the
    // prompt and calls are parsed out of the answer in the template's own format.
    let tools_off = request.tool_choice.as_ref().and_then(Value::as_str) == Some("none");
    let tools = request.tools.as_deref().filter(|t| !t.is_empty() && !tools_off);
    let tool_format = tools.and_then(|_| ToolFormat::of_template(template.source()));
    let text = template
        .render(&RenderRequest { messages: &messages, tools, add_generation_prompt: true, ..Default::default() })
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let prompt_ids = info.tokenizer.encode(&text, false, true).map_err(|e| ApiError::internal(e.to_string()))?;
    let top = request.top_logprobs.unwrap_or(0) as usize;
    if top > 20 {
        return Err(ApiError::invalid("top_logprobs", "top_logprobs may be at most 20"));
    }
    let logprobs = request.logprobs.unwrap_or(false).then_some(top);
    let engine_request = common.to_request(&state, prompt_ids, logprobs)?;
    let stream = state.engine.submit(engine_request)?;
    let id = format!("chatcmpl-{}", stream.id);
    let model = state.model_id().to_string();
    let created = now();
    let tokenizer = info.tokenizer.clone();

    if !common.streaming() {
        let done = collect(stream).await?;
        let logprobs = logprobs.map(|_| json!({"content": done.logprobs.iter().map(|l| logprob_json(&tokenizer, l)).collect::<Vec<_>>()}));
        let (content, calls) = match tool_format {
            Some(format) => {
                let mut parser = ToolCallParser::new(format);
                let mut pieces = parser.push(&done.text);
                pieces.extend(parser.finish());
                split_pieces(pieces)
            }
            None => (done.text, Vec::new()),
        };
        let mut message = json!({"role": "assistant", "content": content});
        let mut finish = finish_reason(done.finish.reason);
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls.iter().enumerate().map(|(i, c)| tool_call_json(i, c, false)).collect());
            if content_is_empty(&message) {
                message["content"] = Value::Null;
            }
            finish = "tool_calls";
        }
        return Ok(Json(json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
            "usage": usage_json(&done.finish),
        }))
        .into_response());
    }

    let include_usage = common.include_usage();
    let chunk = move |delta: Value, finish: Option<&str>, logprobs: Option<Value>| {
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
    };
    let first = vec![chunk(json!({"role": "assistant", "content": ""}), None, None)];
    let want_logprobs = logprobs.is_some();
    let mut parser = tool_format.map(ToolCallParser::new);
    let mut calls_sent = 0;
    // Text and tool calls as delta chunks; calls stream as one fragment each (name and arguments).
    let deltas = |pieces: Vec<Piece>, calls_sent: &mut usize| -> Vec<Value> {
        pieces
            .into_iter()
            .filter_map(|piece| match piece {
                Piece::Text(t) if t.is_empty() => None,
                Piece::Text(t) => Some(json!({"content": t})),
                Piece::Call(call) => {
                    *calls_sent += 1;
                    Some(json!({"tool_calls": [tool_call_json(*calls_sent - 1, &call, true)]}))
                }
            })
            .collect()
    };
    let sse = stream_events(stream, first, move |event| match event {
        Event::Delta { text, logprob, .. } => {
            let lp = logprob.filter(|_| want_logprobs).map(|l| json!({"content": [logprob_json(&tokenizer, &l)]}));
            let pieces = match parser.as_mut() {
                Some(p) => p.push(&text),
                None => vec![Piece::Text(text)],
            };
            let mut out: Vec<Value> = deltas(pieces, &mut calls_sent).into_iter().map(|d| chunk(d, None, None)).collect();
            if let Some(lp) = lp {
                match out.last_mut() {
                    Some(last) => last["choices"][0]["logprobs"] = lp,
                    None => out.push(chunk(json!({"content": ""}), None, Some(lp))),
                }
            }
            out
        }
        Event::Finish(finish) => {
            if let Some(error) = stream_error(&finish) {
                return vec![error];
            }
            let rest = parser.as_mut().map(ToolCallParser::finish).unwrap_or_default();
            let mut out: Vec<Value> = deltas(rest, &mut calls_sent).into_iter().map(|d| chunk(d, None, None)).collect();
            let reason = if calls_sent > 0 { "tool_calls" } else { finish_reason(finish.reason) };
            out.extend(closing_chunks(chunk(json!({}), Some(reason), None), &finish, include_usage));
            out
        }
    });
    Ok(sse.into_response())
}

/// Text pieces joined, and the calls.
fn split_pieces(pieces: Vec<Piece>) -> (String, Vec<ToolCall>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => text.push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    (text.trim().to_string(), calls)
}

fn content_is_empty(message: &Value) -> bool {
    message["content"].as_str().is_none_or(str::is_empty)
}

/// OpenAI's tool call object (with its `index` when streamed).
fn tool_call_json(index: usize, call: &ToolCall, streaming: bool) -> Value {
    let mut value = json!({"id": call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments}});
    if streaming {
        value["index"] = json!(index);
    }
    value
}

/// `call_` and 9 alphanumerics (Mistral's templates insist on 9).
fn call_id() -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = crate::sampling::Rng::from_entropy();
    let id: String = (0..9).map(|_| CHARS[(rng.next_u64() % CHARS.len() as u64) as usize] as char).collect();
    format!("call_{id}")
}

/// Messages as the chat template expects them: `content` as one string (text parts joined),
/// `developer` as `system`, tool-call arguments as objects (what the templates `tojson`).
/// Anything malformed is a 400 naming the message.
pub fn normalize_messages(messages: &[Value], max: usize) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    if messages.len() > max {
        return Err(ApiError::invalid("messages", format!("at most {max} messages are allowed")));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let param = format!("messages[{i}]");
            let mut m = m.as_object().cloned().ok_or_else(|| ApiError::invalid(&param, format!("{param} must be an object")))?;
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(&param, format!("{param}.role must be a string")))?;
            let role = match role {
                "system" | "user" | "assistant" | "tool" => role.to_string(),
                "developer" => "system".to_string(),
                other => return Err(ApiError::invalid(&param, format!("{param}.role {other:?} is not one of system, user, assistant, tool"))),
            };
            m.insert("role".into(), Value::String(role));
            let content = match m.get("content") {
                None | Some(Value::Null) => Value::Null,
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(Value::Array(parts)) => Value::String(join_text_parts(parts, &param)?),
                Some(_) => return Err(ApiError::invalid(&param, format!("{param}.content must be a string or a list of text parts"))),
            };
            m.insert("content".into(), content);
            if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
                for call in calls.iter_mut() {
                    let args = call.pointer("/function/arguments").and_then(Value::as_str).map(str::to_string);
                    if let Some(parsed) = args.and_then(|a| serde_json::from_str::<Value>(&a).ok()) {
                        call["function"]["arguments"] = parsed;
                    }
                }
            }
            Ok(Value::Object(m))
        })
        .collect()
}

fn join_text_parts(parts: &[Value], param: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for part in parts {
        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => text.push_str(t),
            (Some(kind), _) => return Err(ApiError::invalid(param, format!("{param}: content parts of type {kind:?} are not supported"))),
            _ => return Err(ApiError::invalid(param, format!("{param}: each content part needs a type"))),
        }
    }
    Ok(text)
}

/// OpenAI's per-token logprob object.
fn logprob_json(tokenizer: &Tokenizer, l: &TokenLogprob) -> Value {
    let entry = |token: u32, logprob: f32| {
        let text = tokenizer.decode(&[token], false).unwrap_or_default();
        json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
    };
    let mut value = entry(l.token, l.logprob);
    value["top_logprobs"] = Value::Array(l.top.iter().map(|(t, lp)| entry(*t, *lp)).collect());
    value
}
