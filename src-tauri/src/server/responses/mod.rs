//! OpenAI's Responses API, stateless (`POST /v1/responses`), what Codex CLI speaks. The answer's
//! blocks become output items (reasoning, message, function_call, custom_tool_call) with the
//! API's streaming events; nothing is stored, so `GET /v1/responses/{id}` is a clear 404.

mod request;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::blocks::{BlockEvent, BlockKind, Blocks, Content};
use super::chat::outcome::with_server_timing;
use super::chat::stream::AnswerEvent;
use super::chat::{start, StartedChat};
use super::extract::ApiJson;
use super::priority::HeaderPriority;
use super::sse::named_events;
use super::unix_time as now;
use super::{ApiError, AppState};
use crate::engine::{Finish, FinishReason};

pub async fn create(
    State(state): State<AppState>,
    HeaderPriority(header): HeaderPriority,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let (chat, mut common, offered) = request::to_chat(&body)?;
    common.header_priority = header;
    let StartedChat { model, answer, mode, .. } = start(&state, &chat, &common).await?;
    let (mut blocks, first_blocks) = Blocks::start(&mode);
    let mut response =
        ResponseBuilder::new(format!("resp_{:016x}{:08x}", answer.id(), now() as u32), model, &body, offered);

    if !common.streaming() {
        let done = answer.collect().await?;
        for event in blocks.whole(first_blocks, done.pieces) {
            response.apply(event);
        }
        return Ok(with_server_timing(Json(response.finished(&done.finish)).into_response(), &done.finish));
    }

    let snapshot = response.snapshot("in_progress");
    let mut first = vec![
        response.event("response.created", json!({"response": snapshot.clone()})),
        response.event("response.in_progress", json!({"response": snapshot})),
    ];
    for event in first_blocks {
        first.extend(response.apply(event));
    }
    let sse = named_events(answer, first, move |event| match event {
        AnswerEvent::Pieces { pieces, .. } => blocks.push(pieces).into_iter().flat_map(|e| response.apply(e)).collect(),
        AnswerEvent::Failed(error) => {
            let mut failed = response.snapshot("failed");
            failed["error"] = json!({"code": "server_error", "message": error.message});
            vec![response.event("response.failed", json!({"response": failed}))]
        }
        AnswerEvent::Done { rest, finish } => {
            let mut events = blocks.push(rest);
            events.extend(blocks.finish());
            let mut out: Vec<(&'static str, Value)> = events.into_iter().flat_map(|e| response.apply(e)).collect();
            let last = response.finished(&finish);
            let name = if last["status"] == "completed" { "response.completed" } else { "response.incomplete" };
            out.push(response.event(name, json!({"response": last})));
            out
        }
    });
    Ok(sse.into_response())
}

/// Nothing is stored, so nothing can be fetched.
pub async fn retrieve(Path(id): Path<String>) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("response {id:?} not found: this server stores no responses (it answers each request on its own)"),
    )
}

/// The response object as its items arrive, and the stream events that tell of them.
struct ResponseBuilder {
    id: String,
    model: String,
    created_at: u64,
    /// Request fields echoed back, as the API does.
    echo: Value,
    items: Vec<Value>,
    sequence: u64,
    /// Tools offered under another name or shape, by the name the model saw.
    offered: request::OfferedTools,
    /// A custom tool call's arguments as the model writes them (its input is read out at the end).
    custom_arguments: std::collections::HashMap<usize, String>,
}

impl ResponseBuilder {
    fn new(id: String, model: String, body: &Value, offered: request::OfferedTools) -> ResponseBuilder {
        let field = |k: &str| body.get(k).cloned().unwrap_or(Value::Null);
        let echo = json!({
            "instructions": field("instructions"),
            "max_output_tokens": field("max_output_tokens"),
            "metadata": body.get("metadata").cloned().unwrap_or_else(|| json!({})),
            "parallel_tool_calls": body.get("parallel_tool_calls").cloned().unwrap_or(json!(true)),
            "temperature": field("temperature"),
            "top_p": field("top_p"),
            "tool_choice": body.get("tool_choice").cloned().unwrap_or(json!("auto")),
            "tools": body.get("tools").cloned().unwrap_or_else(|| json!([])),
            "text": body.get("text").cloned().unwrap_or_else(|| json!({"format": {"type": "text"}})),
            "reasoning": body.get("reasoning").cloned().unwrap_or_else(|| json!({"effort": null, "summary": null})),
            "user": field("user"),
        });
        ResponseBuilder {
            id,
            model,
            created_at: now(),
            echo,
            items: Vec::new(),
            sequence: 0,
            offered,
            custom_arguments: Default::default(),
        }
    }

    /// An event with its type and sequence number.
    fn event(&mut self, name: &'static str, mut payload: Value) -> (&'static str, Value) {
        payload["type"] = json!(name);
        payload["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (name, payload)
    }

    fn snapshot(&self, status: &str) -> Value {
        let mut response = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": self.items,
            "error": null,
            "incomplete_details": null,
            "previous_response_id": null,
            "store": false,
            "truncation": "disabled",
            "usage": null,
        });
        if let (Some(r), Some(echo)) = (response.as_object_mut(), self.echo.as_object()) {
            r.extend(echo.clone());
        }
        response
    }

    fn finished(&self, finish: &Finish) -> Value {
        let incomplete = finish.reason == FinishReason::Length;
        let mut response = self.snapshot(if incomplete { "incomplete" } else { "completed" });
        if incomplete {
            response["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        let (input, output) = (finish.usage.prompt_tokens, finish.usage.completion_tokens);
        response["usage"] = json!({
            "input_tokens": input,
            "input_tokens_details": {"cached_tokens": finish.usage.cached_tokens},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output,
        });
        response
    }

    /// Applies a block event to the items; returns the stream events it makes.
    fn apply(&mut self, event: BlockEvent) -> Vec<(&'static str, Value)> {
        match event {
            BlockEvent::Start { index, kind } => {
                let suffix = format!("{}_{index}", &self.id["resp_".len()..]);
                let item = match kind {
                    BlockKind::Text => {
                        json!({"type": "message", "id": format!("msg_{suffix}"), "status": "in_progress", "role": "assistant", "content": []})
                    }
                    BlockKind::Thinking => {
                        json!({"type": "reasoning", "id": format!("rs_{suffix}"), "summary": [], "content": []})
                    }
                    BlockKind::ToolCall { id, name } => {
                        let tool = self.offered.get(&name);
                        let own = tool.map_or(name.as_str(), |t| t.name.as_str());
                        let mut item = if tool.is_some_and(|t| t.custom) {
                            self.custom_arguments.insert(index, String::new());
                            json!({"type": "custom_tool_call", "id": format!("ctc_{suffix}"), "call_id": id, "name": own, "input": ""})
                        } else {
                            json!({"type": "function_call", "id": format!("fc_{suffix}"), "call_id": id, "name": own, "arguments": "", "status": "in_progress"})
                        };
                        // A tool of a namespace: its own name, and the namespace beside it.
                        if let Some(namespace) = tool.and_then(|t| t.namespace.as_ref()) {
                            item["namespace"] = json!(namespace);
                        }
                        item
                    }
                };
                self.items.push(item.clone());
                let mut out =
                    vec![self.event("response.output_item.added", json!({"output_index": index, "item": item}))];
                let item_id = self.items[index]["id"].clone();
                match self.items[index]["type"].as_str() {
                    Some("message") => {
                        let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
                        self.items[index]["content"] = json!([part.clone()]);
                        out.push(self.event(
                            "response.content_part.added",
                            json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
                        ));
                    }
                    Some("reasoning") => self.items[index]["content"] = json!([{"type": "reasoning_text", "text": ""}]),
                    _ => {}
                }
                out
            }
            BlockEvent::Delta { index, content, text } => {
                let item_id = self.items[index]["id"].clone();
                let payload = json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": text});
                match content {
                    Content::Text => {
                        append(&mut self.items[index]["content"][0]["text"], &text);
                        let mut p = payload;
                        p["logprobs"] = json!([]);
                        vec![self.event("response.output_text.delta", p)]
                    }
                    Content::Thinking => {
                        append(&mut self.items[index]["content"][0]["text"], &text);
                        vec![self.event("response.reasoning_text.delta", payload)]
                    }
                    Content::Arguments if self.custom_arguments.contains_key(&index) => {
                        // Its input is a JSON string inside them: told whole at the end.
                        self.custom_arguments.entry(index).or_default().push_str(&text);
                        Vec::new()
                    }
                    Content::Arguments => {
                        append(&mut self.items[index]["arguments"], &text);
                        let mut p = payload;
                        p.as_object_mut().map(|o| o.remove("content_index"));
                        vec![self.event("response.function_call_arguments.delta", p)]
                    }
                }
            }
            BlockEvent::Stop { index } => {
                let item_id = self.items[index]["id"].clone();
                let mut out = Vec::new();
                match self.items[index]["type"].as_str().unwrap_or_default() {
                    "message" => {
                        let part = self.items[index]["content"][0].clone();
                        let text = part["text"].clone();
                        out.push(self.event("response.output_text.done", json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": []})));
                        out.push(self.event(
                            "response.content_part.done",
                            json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
                        ));
                    }
                    "reasoning" => {
                        let text = self.items[index]["content"][0]["text"].clone();
                        out.push(self.event(
                            "response.reasoning_text.done",
                            json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
                        ));
                    }
                    "custom_tool_call" => {
                        let input = custom_input(&self.custom_arguments.remove(&index).unwrap_or_default());
                        self.items[index]["input"] = json!(input);
                        out.push(self.event(
                            "response.custom_tool_call_input.delta",
                            json!({"item_id": item_id, "output_index": index, "delta": input}),
                        ));
                        out.push(self.event(
                            "response.custom_tool_call_input.done",
                            json!({"item_id": item_id, "output_index": index, "input": input}),
                        ));
                    }
                    _ => {
                        let (arguments, name) =
                            (self.items[index]["arguments"].clone(), self.items[index]["name"].clone());
                        out.push(self.event(
                            "response.function_call_arguments.done",
                            json!({"item_id": item_id, "output_index": index, "arguments": arguments, "name": name}),
                        ));
                    }
                }
                if self.items[index].get("status").is_some() {
                    self.items[index]["status"] = json!("completed");
                }
                let item = self.items[index].clone();
                out.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
                out
            }
        }
    }
}

/// A custom tool's input from the arguments the model wrote for it: the `input` string, or the
/// one string it wrote under another name, or a bare JSON string; arguments cut short (by
/// `max_output_tokens`) give the input written so far; failing all that, the text itself.
fn custom_input(arguments: &str) -> String {
    let parsed = serde_json::from_str::<Value>(arguments)
        .or_else(|_| serde_json::from_str::<Value>(&format!("{}\"}}", arguments.trim_end())));
    let fields = match parsed {
        Ok(Value::Object(fields)) => fields,
        Ok(Value::String(input)) => return input,
        _ => return arguments.to_string(),
    };
    let strings: Vec<&str> = fields.values().filter_map(Value::as_str).collect();
    match (fields.get(request::CUSTOM_INPUT).and_then(Value::as_str), strings.as_slice()) {
        (Some(input), _) => input.to_string(),
        (None, [only]) if fields.len() == 1 => only.to_string(),
        _ => arguments.to_string(),
    }
}

fn append(slot: &mut Value, text: &str) {
    let mut s = slot.as_str().unwrap_or_default().to_string();
    s.push_str(text);
    *slot = Value::String(s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Timings, Usage};

    #[test]
    fn a_custom_tool_call_is_told_with_its_input() {
        let offered = request::OfferedTools::from([(
            "apply_patch".to_string(),
            request::Offered { namespace: None, name: "apply_patch".into(), custom: true },
        )]);
        let mut r = ResponseBuilder::new("resp_1".into(), "m".into(), &json!({}), offered);
        let mut events = Vec::new();
        let call = BlockKind::ToolCall { id: "call_1".into(), name: "apply_patch".into() };
        for e in [
            BlockEvent::Start { index: 0, kind: call },
            BlockEvent::Delta { index: 0, content: Content::Arguments, text: r#"{"input": "*** Begin"#.into() },
            BlockEvent::Delta { index: 0, content: Content::Arguments, text: r#" Patch\n"}"#.into() },
            BlockEvent::Stop { index: 0 },
        ] {
            events.extend(r.apply(e));
        }
        let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "response.output_item.added",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "response.output_item.done"
            ]
        );
        let item = &events[3].1["item"];
        assert_eq!(
            item,
            &json!({"type": "custom_tool_call", "id": "ctc_1_0", "call_id": "call_1", "name": "apply_patch", "input": "*** Begin Patch\n"})
        );
        assert_eq!(events[2].1["input"], "*** Begin Patch\n");
        // What a model may write instead of `input`.
        assert_eq!(custom_input(r#"{"patch": "x"}"#), "x");
        assert_eq!(custom_input("*** Begin Patch"), "*** Begin Patch");
        assert_eq!(custom_input(r#"{"a": "x", "b": "y"}"#), r#"{"a": "x", "b": "y"}"#);
        assert_eq!(custom_input(r#""*** Begin Patch""#), "*** Begin Patch");
        // A custom tool of a namespace: its own name, and the namespace beside it.
        let offered = request::OfferedTools::from([(
            "ids.code".to_string(),
            request::Offered { namespace: Some("ids".into()), name: "code".into(), custom: true },
        )]);
        let mut r = ResponseBuilder::new("resp_2".into(), "m".into(), &json!({}), offered);
        let started = r.apply(BlockEvent::Start {
            index: 0,
            kind: BlockKind::ToolCall { id: "c".into(), name: "ids.code".into() },
        });
        let item = &started[0].1["item"];
        assert_eq!(
            (item["type"].as_str(), item["name"].as_str(), item["namespace"].as_str()),
            (Some("custom_tool_call"), Some("code"), Some("ids"))
        );
        assert_eq!(custom_input(r#"{"input": "*** Begin\nPa"#), "*** Begin\nPa", "cut short");
    }

    #[test]
    fn events_build_the_items() {
        let mut r = ResponseBuilder::new("resp_1".into(), "m".into(), &json!({}), Default::default());
        let mut names = Vec::new();
        let events = vec![
            BlockEvent::Start { index: 0, kind: BlockKind::Text },
            BlockEvent::Delta { index: 0, content: Content::Text, text: "Hi".into() },
            BlockEvent::Delta { index: 0, content: Content::Text, text: "!".into() },
            BlockEvent::Stop { index: 0 },
            BlockEvent::Start { index: 1, kind: BlockKind::ToolCall { id: "call_1".into(), name: "w".into() } },
            BlockEvent::Delta { index: 1, content: Content::Arguments, text: "{}".into() },
            BlockEvent::Stop { index: 1 },
        ];
        for e in events {
            names.extend(r.apply(e).into_iter().map(|(n, p)| (n, p["sequence_number"].as_u64().unwrap())));
        }
        let sequence: Vec<u64> = names.iter().map(|(_, s)| *s).collect();
        assert_eq!(sequence, (0..names.len() as u64).collect::<Vec<_>>());
        assert_eq!(names.iter().filter(|(n, _)| *n == "response.output_item.done").count(), 2);
        let finish = Finish {
            reason: FinishReason::Stop,
            stop: None,
            error: None,
            usage: Usage { prompt_tokens: 3, completion_tokens: 4, cached_tokens: 0 },
            timings: Timings::default(),
        };
        let done = r.finished(&finish);
        assert_eq!(done["output"][0]["content"][0]["text"], "Hi!");
        assert_eq!(done["output"][1]["arguments"], "{}");
        assert_eq!(done["output"][1]["status"], "completed");
        assert_eq!((done["status"].as_str(), done["usage"]["total_tokens"].as_u64()), (Some("completed"), Some(7)));
    }
}
