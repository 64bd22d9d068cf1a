//! `POST /v1/chat/completions`, streaming and not.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::answer::{AnswerParser, Piece};
use super::reasoning::ReasoningSplitter;
use super::structured::{answer_shape, ToolMode};
use super::tool_calls::ToolCall;
use super::{closing_chunks, collect, finish_reason, now, stream_error, usage_json, CommonParams};
use crate::engine::{Event, FinishReason, TokenLogprob};
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
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    /// Extra chat-template variables (vLLM's name), e.g. `{"enable_thinking": false}` for Qwen 3.
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

pub async fn completions(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response, ApiError> {
    let request: ChatRequest = parse(&body)?;
    let common: CommonParams = parse(&body)?;
    let info = state.engine.model_info().clone();
    let messages = normalize_messages(&request.messages, state.config.max_messages)?;
    let template = info
        .chat_template
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("this model has no chat template; use /v1/completions with a raw prompt"))?;
    let messages = if template.source().contains("tool_calls") { messages } else { inline_tool_calls(messages) };
    let shape = answer_shape(
        request.tools.as_deref(),
        request.tool_choice.as_ref(),
        request.parallel_tool_calls,
        request.response_format.as_ref(),
        template.source(),
    )?;
    let render = RenderRequest {
        messages: &messages,
        tools: shape.prompt_tools,
        add_generation_prompt: true,
        extra: request.chat_template_kwargs.clone().unwrap_or_default(),
    };
    let text = template.render(&render).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let prompt_ids = info.tokenizer.encode(&text, false, true).map_err(|e| ApiError::internal(e.to_string()))?;
    let top = request.top_logprobs.unwrap_or(0) as usize;
    if top > 20 {
        return Err(ApiError::invalid("top_logprobs", "top_logprobs may be at most 20"));
    }
    let logprobs = request.logprobs.unwrap_or(false).then_some(top);
    let mut engine_request = common.to_request(&state, prompt_ids, logprobs)?;
    if let ToolMode::Auto(format) = shape.mode {
        engine_request.special_text_tokens = format.marker_tokens().iter().filter_map(|t| info.tokenizer.token_to_id(t)).collect();
    }
    // A grammar decides the whole answer; a think block would break it.
    let reasoning = || if shape.grammar.is_some() { None } else { ReasoningSplitter::for_template(template.source(), &text) };
    let mut parser = AnswerParser::new(&shape.mode, reasoning());
    engine_request.grammar = shape.grammar.clone();
    let stream = state.engine.submit(engine_request)?;
    let id = format!("chatcmpl-{}", stream.id);
    let model = state.model_id().to_string();
    let created = now();
    let tokenizer = info.tokenizer.clone();
    let forced_name = match &shape.mode {
        ToolMode::Named(name) => Some(name.clone()),
        _ => None,
    };
    let finish_of = move |reason: FinishReason, calls: bool| match reason {
        FinishReason::Stop if calls && forced_name.is_none() => "tool_calls",
        other => finish_reason(other),
    };

    if !common.streaming() {
        let done = collect(stream).await?;
        let logprobs = logprobs.map(|_| json!({"content": done.logprobs.iter().map(|l| logprob_json(&tokenizer, l)).collect::<Vec<_>>()}));
        let mut pieces = parser.push(&done.text);
        pieces.extend(parser.finish());
        let answer = Answer::from_pieces(pieces, &shape.mode);
        let mut message = json!({"role": "assistant", "content": answer.content});
        if !answer.reasoning.is_empty() {
            message["reasoning_content"] = json!(answer.reasoning);
        }
        if !answer.calls.is_empty() {
            message["tool_calls"] = Value::Array(answer.calls.iter().enumerate().map(|(i, c)| tool_call_json(i, c, &call_id(), false)).collect());
        }
        let finish = finish_of(done.finish.reason, !answer.calls.is_empty());
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
    let mut first = vec![chunk(json!({"role": "assistant", "content": ""}), None, None)];
    // A named function: its call opens the stream, the arguments follow as they are generated.
    let forced_id = call_id();
    if let ToolMode::Named(name) = &shape.mode {
        let head = ToolCall { name: name.clone(), arguments: String::new() };
        first.push(chunk(json!({"tool_calls": [tool_call_json(0, &head, &forced_id, true)]}), None, None));
    }
    let want_logprobs = logprobs.is_some();
    let mut calls_sent = usize::from(matches!(shape.mode, ToolMode::Named(_)));
    let deltas = move |pieces: Vec<Piece>, calls_sent: &mut usize| -> Vec<Value> {
        pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Text(t) => json!({"content": t}),
                Piece::Reasoning(t) => json!({"reasoning_content": t}),
                Piece::Arguments(t) => json!({"tool_calls": [{"index": 0, "function": {"arguments": t}}]}),
                Piece::Call(call) => {
                    *calls_sent += 1;
                    json!({"tool_calls": [tool_call_json(*calls_sent - 1, &call, &call_id(), true)]})
                }
            })
            .collect()
    };
    let sse = stream_events(stream, first, move |event| match event {
        Event::Delta { text, logprob, .. } => {
            let lp = logprob.filter(|_| want_logprobs).map(|l| json!({"content": [logprob_json(&tokenizer, &l)]}));
            let mut out: Vec<Value> = deltas(parser.push(&text), &mut calls_sent).into_iter().map(|d| chunk(d, None, None)).collect();
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
            let mut out: Vec<Value> = deltas(parser.finish(), &mut calls_sent).into_iter().map(|d| chunk(d, None, None)).collect();
            let reason = finish_of(finish.reason, calls_sent > 0);
            out.extend(closing_chunks(chunk(json!({}), Some(reason), None), &finish, include_usage));
            out
        }
    });
    Ok(sse.into_response())
}

/// A whole answer: text, reasoning and calls.
struct Answer {
    content: Value,
    reasoning: String,
    calls: Vec<ToolCall>,
}

impl Answer {
    fn from_pieces(pieces: Vec<Piece>, mode: &ToolMode) -> Answer {
        let (mut text, mut reasoning, mut arguments, mut calls) = (String::new(), String::new(), String::new(), Vec::new());
        for piece in pieces {
            match piece {
                Piece::Text(t) => text.push_str(&t),
                Piece::Reasoning(t) => reasoning.push_str(&t),
                Piece::Arguments(t) => arguments.push_str(&t),
                Piece::Call(c) => calls.push(c),
            }
        }
        if let ToolMode::Named(name) = mode {
            calls.push(ToolCall { name: name.clone(), arguments });
        }
        // With calls, surrounding whitespace is noise and an empty content is null (OpenAI's shape).
        let content = if calls.is_empty() {
            Value::String(text)
        } else if text.trim().is_empty() {
            Value::Null
        } else {
            Value::String(text.trim().to_string())
        };
        Answer { content, reasoning, calls }
    }
}

/// OpenAI's tool call object (with its `index` when streamed).
fn tool_call_json(index: usize, call: &ToolCall, id: &str, streaming: bool) -> Value {
    let mut value = json!({"id": id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}});
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

/// For templates that know nothing of tool calls: an assistant turn's calls become its text (the
/// JSON list `tool_choice: "required"` has the model write), so that the model sees what it
/// called before the `tool` turns that answer it.
fn inline_tool_calls(messages: Vec<Value>) -> Vec<Value> {
    messages
        .into_iter()
        .map(|mut m| {
            let Some(Value::Array(calls)) = m.get("tool_calls").cloned() else { return m };
            let listed: Vec<Value> = calls
                .iter()
                .map(|c| json!({"name": c.pointer("/function/name").cloned().unwrap_or(Value::Null), "arguments": c.pointer("/function/arguments").cloned().unwrap_or(json!({}))}))
                .collect();
            let text = m.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
            let calls_text = Value::Array(listed).to_string();
            m["content"] = Value::String(if text.is_empty() { calls_text } else { format!("{text}\n{calls_text}") });
            m.as_object_mut().map(|o| o.remove("tool_calls"));
            m
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
