//! `POST /v1/chat/completions`, streaming and not.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{collect, finish_reason, now, stream_error, usage_json, CommonParams};
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
    let text = template
        .render(&RenderRequest {
            messages: &messages,
            tools: request.tools.as_deref().filter(|t| !t.is_empty()),
            add_generation_prompt: true,
            ..Default::default()
        })
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
        return Ok(Json(json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": done.text},
                         "logprobs": logprobs, "finish_reason": finish_reason(done.finish.reason)}],
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
    let sse = stream_events(stream, first, move |event| match event {
        Event::Delta { text, logprob, .. } => {
            let lp = logprob.filter(|_| want_logprobs).map(|l| json!({"content": [logprob_json(&tokenizer, &l)]}));
            if text.is_empty() && lp.is_none() {
                return Vec::new();
            }
            vec![chunk(json!({"content": text}), None, lp)]
        }
        Event::Finish(finish) => {
            if let Some(error) = stream_error(&finish) {
                return vec![error];
            }
            let mut out = vec![chunk(json!({}), Some(finish_reason(finish.reason)), None)];
            if include_usage {
                let mut usage = chunk(json!({}), None, None);
                usage["choices"] = json!([]);
                usage["usage"] = usage_json(&finish);
                out.push(usage);
            }
            out
        }
    });
    Ok(sse.into_response())
}

/// Messages as the chat template expects them: `content` as one string (text parts joined),
/// `developer` as `system`. Anything else malformed is a 400 naming the message.
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
