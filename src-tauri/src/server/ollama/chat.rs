//! `POST /api/chat` and `POST /api/generate`: Ollama's requests run as the server's chat or raw
//! completions; answers stream as NDJSON (Ollama's default) or come whole, with Ollama's
//! counts and durations in nanoseconds.

use std::time::{Duration, Instant, SystemTime};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::params::{apply_keep_alive, keep_alive, model_name, named, nanos, options, timestamp, Fallback};
use crate::engine::{Finish, FinishReason};
use crate::server::chat::format::ModelFormat;
use crate::server::chat::images::{bare_base64_url, text_or_parts};
use crate::server::chat::outcome::{text_beside_calls, with_server_timing};
use crate::server::chat::raw::{self, RawError, RawPrompt};
use crate::server::chat::stream::{AnswerEvent, AnswerStream};
use crate::server::chat::structured::{answer_shape, ShapeContext, ShapeRequest};
use crate::server::chat::{start, ChatRequest, Piece};
use crate::server::dialect_errors::{envelope, Dialect};
use crate::server::extract::ApiJson;
use crate::server::priority::HeaderPriority;
use crate::server::sse::{frames, ndjson};
use crate::server::{ApiError, AppState};
use crate::store::ResidencyError;

pub async fn chat(
    State(state): State<AppState>,
    HeaderPriority(header): HeaderPriority,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let began = Instant::now();
    let (name, id) = model_name(&state, &body, Fallback::Served)?;
    let keep = keep_alive(&body)?;
    let streaming = body.get("stream").and_then(Value::as_bool).unwrap_or(true);
    let messages = match body.get("messages") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(m)) => m.clone(),
        Some(_) => return Err(ApiError::invalid("messages", "messages must be a list")),
    };
    if messages.is_empty() {
        return load_or_unload(&state, &name, &id, keep, Kind::Chat).await;
    }
    let request = ChatRequest {
        messages: to_openai_messages(&messages)?,
        tools: tools(&body)?,
        response_format: response_format(body.get("format"))?,
        chat_template_kwargs: think_kwargs(&body)?,
        reasoning_effort: think_level(&body),
        ..Default::default()
    };
    let mut common = options(&body)?.to_common(&id, streaming)?;
    common.header_priority = header;
    let started = start(&state, &request, &common).await.map_err(|e| named(e, &name, &id))?;
    apply_keep_alive(&state, &started.model, keep);
    let render = Render { name, kind: Kind::Chat, began, load: began.elapsed() };
    respond(render, started.answer, streaming).await
}

pub async fn generate(
    State(state): State<AppState>,
    HeaderPriority(header): HeaderPriority,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let began = Instant::now();
    let (name, id) = model_name(&state, &body, Fallback::Served)?;
    let keep = keep_alive(&body)?;
    let streaming = body.get("stream").and_then(Value::as_bool).unwrap_or(true);
    let text_field = |key: &str| -> Result<String, ApiError> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(ApiError::invalid(key, format!("{key} must be a string"))),
        }
    };
    let (prompt, suffix, system) = (text_field("prompt")?, text_field("suffix")?, text_field("system")?);
    let images = images_of(body.get("images"), "images")?;
    if !text_field("template")?.is_empty() {
        return Err(ApiError::invalid(
            "template",
            "a custom Go template is not supported; the model's own chat template is used (or send raw: true)",
        ));
    }
    if body.get("context").and_then(Value::as_array).is_some_and(|c| !c.is_empty()) {
        return Err(ApiError::invalid(
            "context",
            "context (deprecated) is not supported; send the conversation to /api/chat",
        ));
    }
    if prompt.is_empty() && suffix.is_empty() {
        return load_or_unload(&state, &name, &id, keep, Kind::Generate).await;
    }
    let mut common = options(&body)?.to_common(&id, streaming)?;
    common.header_priority = header;
    let raw = body.get("raw").and_then(Value::as_bool).unwrap_or(false);
    if (raw || !suffix.is_empty()) && !images.is_empty() {
        return Err(ApiError::invalid("images", "images need the chat template: not with raw or suffix"));
    }
    if raw || !suffix.is_empty() {
        common.fill_in_the_middle = !suffix.is_empty();
        let prompt = if suffix.is_empty() {
            RawPrompt::Text(&prompt)
        } else {
            RawPrompt::Fim { prefix: &prompt, suffix: &suffix }
        };
        // `format` holds for raw prompts too: the grammar alone decides the shape.
        let format = response_format(body.get("format"))?;
        let request = ShapeRequest {
            tools: None,
            tool_choice: None,
            parallel_tool_calls: None,
            response_format: format.as_ref(),
        };
        let context = ShapeContext { format: &ModelFormat::plain(), special: &|_| None, strict_tools: false };
        let grammar = answer_shape(request, &context)?.grammar;
        let started = raw::start(&state, Some(&id), prompt, &common, None, grammar).await.map_err(|e| match e {
            RawError::NoFim => ApiError::invalid(
                "suffix",
                format!("{name} does not support insert: its vocabulary has no fill-in-the-middle tokens"),
            ),
            RawError::Api(e) => named(e, &name, &id),
        })?;
        apply_keep_alive(&state, &started.model, keep);
        let render = Render { name, kind: Kind::Generate, began, load: began.elapsed() };
        return respond(render, started.answer, streaming).await;
    }
    let mut messages = Vec::new();
    if !system.is_empty() {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(json!({"role": "user", "content": images_then(images, &prompt)}));
    let request = ChatRequest {
        messages,
        response_format: response_format(body.get("format"))?,
        chat_template_kwargs: think_kwargs(&body)?,
        reasoning_effort: think_level(&body),
        ..Default::default()
    };
    let started = start(&state, &request, &common).await.map_err(|e| named(e, &name, &id))?;
    apply_keep_alive(&state, &started.model, keep);
    let render = Render { name, kind: Kind::Generate, began, load: began.elapsed() };
    respond(render, started.answer, streaming).await
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Generate,
}

/// An empty request loads the model (or, with `keep_alive: 0`, unloads it), as in Ollama.
async fn load_or_unload(
    state: &AppState,
    name: &str,
    id: &str,
    keep: Option<Option<Duration>>,
    kind: Kind,
) -> Result<Response, ApiError> {
    let unload = keep == Some(Some(Duration::ZERO));
    if unload {
        match state.models.unload(id).await {
            Ok(()) | Err(ResidencyError::NotLoaded(_)) => {}
            Err(e) => return Err(named(e.into(), name, id)),
        }
    } else {
        let served = state.models.load(id, None).await.map_err(|e| named(e.into(), name, id))?;
        apply_keep_alive(state, &served.id, keep);
    }
    let mut answer = json!({"model": name, "created_at": timestamp(SystemTime::now()), "done": true, "done_reason": if unload { "unload" } else { "load" }});
    match kind {
        Kind::Chat => answer["message"] = json!({"role": "assistant", "content": ""}),
        Kind::Generate => answer["response"] = json!(""),
    }
    Ok(Json(answer).into_response())
}

/// A message's content with its images first, then its text (how the vision models' own examples
/// put them); the text alone when there are none.
fn images_then(images: Vec<Value>, text: &str) -> Value {
    let mut parts = images;
    parts.push(json!({"type": "text", "text": text}));
    text_or_parts(parts)
}

/// A message's (or `/api/generate`'s) `images`: bare base64 strings, as the chat core's image
/// parts (their type read from their bytes).
fn images_of(images: Option<&Value>, param: &str) -> Result<Vec<Value>, ApiError> {
    match images {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let data = v
                    .as_str()
                    .ok_or_else(|| ApiError::invalid(param, format!("{param}[{i}] must be a base64 string")))?;
                Ok(json!({"type": "image_url", "image_url": {"url": bare_base64_url(data)}}))
            })
            .collect(),
        Some(_) => Err(ApiError::invalid(param, format!("{param} must be a list of base64 strings"))),
    }
}

/// Ollama's messages as OpenAI's: tool-call arguments (objects) as JSON text with ids the
/// following `tool` messages answer in order; `tool_name` as the tool message's name.
fn to_openai_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    let mut pending_ids: std::collections::VecDeque<String> = Default::default();
    for (i, m) in messages.iter().enumerate() {
        let param = format!("messages[{i}]");
        let mut m: Map<String, Value> =
            m.as_object().cloned().ok_or_else(|| ApiError::invalid(&param, format!("{param} must be an object")))?;
        let images = images_of(m.get("images"), &format!("{param}.images"))?;
        m.remove("images");
        if !images.is_empty() {
            let text = m.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
            m.insert("content".into(), images_then(images, &text));
        }
        // Earlier thinking is not shown to the model again (as Ollama's templates do).
        m.remove("thinking");
        if let Some(Value::Array(calls)) = m.remove("tool_calls") {
            // A new turn of calls: results still unanswered from an earlier one do not pair with it.
            pending_ids.clear();
            let mut converted = Vec::new();
            for (j, call) in calls.iter().enumerate() {
                let function = call
                    .get("function")
                    .ok_or_else(|| ApiError::invalid(&param, format!("{param}.tool_calls[{j}] needs a function")))?;
                let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
                let arguments = match function.get("arguments") {
                    None | Some(Value::Null) => "{}".to_string(),
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                };
                let id = call.get("id").and_then(Value::as_str).map_or_else(|| format!("call_{i}_{j}"), str::to_string);
                pending_ids.push_back(id.clone());
                converted
                    .push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}));
            }
            m.insert("tool_calls".into(), Value::Array(converted));
        }
        if m.get("role").and_then(Value::as_str) == Some("tool") {
            if !m.contains_key("tool_call_id") {
                m.insert("tool_call_id".into(), json!(pending_ids.pop_front().unwrap_or_else(|| format!("call_{i}"))));
            }
            if let Some(name) = m.remove("tool_name") {
                m.entry("name").or_insert(name);
            }
        }
        out.push(Value::Object(m));
    }
    Ok(out)
}

fn tools(body: &Value) -> Result<Option<Vec<Value>>, ApiError> {
    match body.get("tools") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(tools)) => Ok(Some(tools.clone())),
        Some(_) => Err(ApiError::invalid("tools", "tools must be a list")),
    }
}

/// `format`: `"json"` or a JSON Schema, enforced by constrained decoding.
fn response_format(format: Option<&Value>) -> Result<Option<Value>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(json!({"type": "json_object"}))),
        Some(schema @ Value::Object(_)) => {
            Ok(Some(json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}})))
        }
        Some(_) => Err(ApiError::invalid("format", "format must be \"json\" or a JSON Schema object")),
    }
}

/// `think`: on or off for templates that have the switch (Qwen 3's `enable_thinking`).
fn think_kwargs(body: &Value) -> Result<Option<Map<String, Value>>, ApiError> {
    let on = match body.get("think") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Bool(b)) => *b,
        Some(Value::String(level)) if ["low", "medium", "high"].contains(&level.as_str()) => true,
        Some(_) => {
            return Err(ApiError::invalid("think", "think must be true, false, \"low\", \"medium\" or \"high\""))
        }
    };
    Ok(Some(Map::from_iter([("enable_thinking".to_string(), Value::Bool(on))])))
}

/// `think: "low" | "medium" | "high"`: the reasoning effort (gpt-oss's levels).
fn think_level(body: &Value) -> Option<String> {
    body.get("think").and_then(Value::as_str).map(str::to_string)
}

/// Renders the answer in Ollama's shapes.
struct Render {
    /// The name the client asked for, echoed back as Ollama does.
    name: String,
    kind: Kind,
    began: Instant,
    load: Duration,
}

/// What a piece of the answer adds to a message.
#[derive(Default)]
struct Part {
    content: String,
    thinking: String,
    calls: Vec<Value>,
}

impl Part {
    fn add(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Text(t) | Piece::Arguments(t) => self.content.push_str(&t),
                Piece::Reasoning(t) => self.thinking.push_str(&t),
                Piece::Call(call) => {
                    let arguments =
                        serde_json::from_str::<Value>(&call.arguments).unwrap_or(Value::String(call.arguments));
                    self.calls.push(json!({"function": {"name": call.name, "arguments": arguments}}));
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.content.is_empty() && self.thinking.is_empty() && self.calls.is_empty()
    }
}

impl Render {
    fn line(&self, part: Part, done: bool) -> Value {
        let mut line = json!({"model": self.name, "created_at": timestamp(SystemTime::now())});
        match self.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": part.content});
                if !part.thinking.is_empty() {
                    message["thinking"] = json!(part.thinking);
                }
                if !part.calls.is_empty() {
                    message["tool_calls"] = json!(part.calls);
                }
                line["message"] = message;
            }
            Kind::Generate => {
                line["response"] = json!(part.content);
                if !part.thinking.is_empty() {
                    line["thinking"] = json!(part.thinking);
                }
            }
        }
        line["done"] = json!(done);
        line
    }

    /// The last line: why it ended, and the counts and durations.
    fn done(&self, part: Part, finish: &Finish) -> Value {
        let mut line = self.line(part, true);
        // Tool calls end with "stop" too in Ollama.
        let reason = if finish.reason == FinishReason::Length { "length" } else { "stop" };
        let fields = json!({
            "done_reason": reason,
            "total_duration": nanos(self.began.elapsed()),
            "load_duration": nanos(self.load),
            // Only the prompt tokens actually evaluated, as Ollama counts them (cached ones are not).
            "prompt_eval_count": finish.usage.prompt_tokens - finish.usage.cached_tokens.min(finish.usage.prompt_tokens),
            "prompt_eval_duration": nanos(finish.timings.prefill),
            "eval_count": finish.usage.completion_tokens,
            "eval_duration": nanos(finish.timings.decode),
        });
        if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), fields) {
            line.extend(fields);
        }
        line
    }
}

async fn respond(render: Render, answer: AnswerStream, streaming: bool) -> Result<Response, ApiError> {
    if !streaming {
        let done = answer.collect().await?;
        let mut part = Part::default();
        part.add(done.pieces);
        if !part.calls.is_empty() {
            part.content = text_beside_calls(&part.content).unwrap_or_default();
        }
        return Ok(with_server_timing(Json(render.done(part, &done.finish)).into_response(), &done.finish));
    }
    let lines = frames(
        answer,
        Vec::new(),
        move |event| match event {
            AnswerEvent::Pieces { pieces, .. } => {
                let mut part = Part::default();
                part.add(pieces);
                if part.is_empty() {
                    Vec::new()
                } else {
                    vec![render.line(part, false)]
                }
            }
            AnswerEvent::Failed(error) => vec![envelope(Dialect::Ollama, &error)],
            // What the parser held back goes into the last line.
            AnswerEvent::Done { rest, finish } => {
                let mut part = Part::default();
                part.add(rest);
                vec![render.done(part, &finish)]
            }
        },
        Vec::new(),
    );
    Ok(ndjson(lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_with_calls_and_tool_answers() {
        let messages = vec![
            json!({"role": "user", "content": "weather?"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": {"city": "Oslo"}}}]}),
            json!({"role": "tool", "content": "sunny", "tool_name": "w"}),
        ];
        let out = to_openai_messages(&messages).unwrap();
        assert_eq!(out[1]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
        assert_eq!(out[2]["tool_call_id"], out[1]["tool_calls"][0]["id"]);
        assert_eq!(out[2]["name"], "w");
        let images = vec![json!({"role": "user", "content": "x", "images": ["aGk="]})];
        let converted = to_openai_messages(&images).unwrap();
        assert_eq!(
            converted[0]["content"],
            json!([{"type": "image_url", "image_url": {"url": "data:;base64,aGk="}}, {"type": "text", "text": "x"}])
        );
        let not_text = vec![json!({"role": "user", "content": "x", "images": [7]})];
        assert_eq!(to_openai_messages(&not_text).unwrap_err().param.as_deref(), Some("messages[0].images"));
    }

    #[test]
    fn parsed_calls_become_ollama_tool_calls_with_object_arguments() {
        use crate::server::chat::ToolCall;
        let mut part = Part::default();
        part.add(vec![
            Piece::Reasoning("hm".into()),
            Piece::Call(ToolCall { name: "w".into(), arguments: "{\"city\":\"Oslo\"}".into() }),
        ]);
        let render = Render { name: "qwen3:8b".into(), kind: Kind::Chat, began: Instant::now(), load: Duration::ZERO };
        let line = render.line(part, false);
        assert_eq!(line["model"], "qwen3:8b");
        assert_eq!(line["message"]["thinking"], "hm");
        assert_eq!(line["message"]["tool_calls"], json!([{"function": {"name": "w", "arguments": {"city": "Oslo"}}}]));
        assert_eq!(line["done"], false);
    }

    #[test]
    fn formats_and_think() {
        assert_eq!(response_format(Some(&json!("json"))).unwrap(), Some(json!({"type": "json_object"})));
        assert_eq!(response_format(Some(&json!({"type": "object"}))).unwrap().unwrap()["type"], "json_schema");
        assert!(response_format(Some(&json!(3))).is_err());
        assert_eq!(think_kwargs(&json!({"think": false})).unwrap().unwrap()["enable_thinking"], false);
        assert!(think_kwargs(&json!({"think": "lots"})).is_err());
    }
}
