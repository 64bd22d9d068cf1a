//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), what Claude
//! Code speaks with a local base URL. `claude-*` model ids go to a local model through the
//! aliases (by default the model served now). Errors are Anthropic's envelope (`dialect_errors`).

mod request;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::blocks::{fold, Block, BlockEvent, BlockKind, Blocks, Content};
use super::chat::outcome::with_server_timing;
use super::chat::stream::AnswerEvent;
use super::chat::structured::ToolMode;
use super::chat::{render, serve, start, StartedChat};
use super::dialect_errors::{envelope, Dialect};
use super::extract::ApiJson;
use super::priority::HeaderPriority;
use super::sse::named_events;
use super::{ApiError, AppState};
use crate::engine::{Finish, FinishReason};

pub async fn messages(
    State(state): State<AppState>,
    HeaderPriority(header): HeaderPriority,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let (chat, mut common) = request::to_chat(&body, false)?;
    common.header_priority = header;
    // `thinking.display: "omitted"`: thinking blocks come back without their text (as Anthropic's
    // do; there is no signature to keep here).
    let omit_thinking = body.pointer("/thinking/display").and_then(Value::as_str) == Some("omitted");
    let shown = move |event: &BlockEvent| {
        !(omit_thinking && matches!(event, BlockEvent::Delta { content: Content::Thinking, .. }))
    };
    let requested = common.model.clone().unwrap_or_default();
    let StartedChat { answer, mode, prompt_tokens, .. } = start(&state, &chat, &common).await?;
    let id = format!("msg_{:024x}", (answer.id() as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ now_nanos());
    let (mut blocks, first_blocks) = Blocks::start(&mode);

    if !common.streaming() {
        let done = answer.collect().await?;
        let content: Vec<Value> =
            fold(blocks.whole(first_blocks, done.pieces).into_iter().filter(shown).collect::<Vec<_>>())
                .iter()
                .map(content_block)
                .collect();
        let (stop_reason, stop_sequence) = stop_reason(&done.finish, content.iter().any(|b| b["type"] == "tool_use"));
        let response = Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": requested,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage(done.finish.usage),
        }))
        .into_response();
        return Ok(with_server_timing(response, &done.finish));
    }

    let start_message = json!({
        "type": "message_start",
        "message": {
            "id": id, "type": "message", "role": "assistant", "model": requested, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": usage(crate::engine::Usage { prompt_tokens, ..Default::default() }),
        }
    });
    let mut first = vec![("message_start", start_message), ("ping", json!({"type": "ping"}))];
    first.extend(first_blocks.into_iter().map(block_event));
    let mut any_call = matches!(mode, ToolMode::Named(_));
    let sse = named_events(answer, first, move |event| match event {
        AnswerEvent::Pieces { pieces, .. } => {
            let events = blocks.push(pieces);
            any_call |= events.iter().any(|e| matches!(e, BlockEvent::Start { kind: BlockKind::ToolCall { .. }, .. }));
            events.into_iter().filter(shown).map(block_event).collect()
        }
        AnswerEvent::Failed(error) => vec![("error", envelope(Dialect::Anthropic, &error))],
        AnswerEvent::Done { rest, finish } => {
            let mut events = blocks.push(rest);
            events.extend(blocks.finish());
            any_call |= events.iter().any(|e| matches!(e, BlockEvent::Start { kind: BlockKind::ToolCall { .. }, .. }));
            let (stop_reason, stop_sequence) = stop_reason(&finish, any_call);
            let mut out: Vec<(&'static str, Value)> = events.into_iter().filter(shown).map(block_event).collect();
            out.push((
                "message_delta",
                json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": usage(finish.usage),
                }),
            ));
            out.push(("message_stop", json!({"type": "message_stop"})));
            out
        }
    });
    Ok(sse.into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, as the model's chat template makes it.
pub async fn count_tokens(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    let (chat, common) = request::to_chat(&body, true)?;
    let model = serve(&state, common.model.as_deref()).await?;
    let fetched = crate::server::chat::with_fetched_images(&state, &chat).await?;
    let rendered = render(&model, fetched.as_ref().unwrap_or(&chat), &state.config)?;
    Ok(Json(json!({"input_tokens": rendered.prompt_ids.len()})))
}

/// Anthropic counts cached input apart: `input_tokens` are the ones processed, and the three
/// input counts add up to the prompt. Every prompt is cached automatically as it is processed
/// (there is no separate, billed cache write), so nothing is reported as cache creation.
fn usage(u: crate::engine::Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    })
}

fn stop_reason(finish: &Finish, calls: bool) -> (&'static str, Option<String>) {
    match (finish.reason, &finish.stop) {
        (FinishReason::Length, _) => ("max_tokens", None),
        (_, Some(stop)) => ("stop_sequence", Some(stop.clone())),
        _ if calls => ("tool_use", None),
        _ => ("end_turn", None),
    }
}

/// Anthropic's tool-use ids start `toolu_`.
fn tool_use_id(id: &str) -> String {
    format!("toolu_{}", id.strip_prefix("call_").unwrap_or(id))
}

fn content_block(block: &Block) -> Value {
    match &block.kind {
        BlockKind::Text => json!({"type": "text", "text": block.text}),
        BlockKind::Thinking => json!({"type": "thinking", "thinking": block.text, "signature": ""}),
        BlockKind::ToolCall { id, name } => {
            let input = serde_json::from_str::<Value>(&block.text).unwrap_or_else(|_| json!({}));
            json!({"type": "tool_use", "id": tool_use_id(id), "name": name, "input": input})
        }
    }
}

/// One block event as Anthropic's stream event.
fn block_event(event: BlockEvent) -> (&'static str, Value) {
    match event {
        BlockEvent::Start { index, kind } => {
            let block = match &kind {
                BlockKind::Text => json!({"type": "text", "text": ""}),
                BlockKind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                BlockKind::ToolCall { id, name } => {
                    json!({"type": "tool_use", "id": tool_use_id(id), "name": name, "input": {}})
                }
            };
            ("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": block}))
        }
        BlockEvent::Delta { index, content, text } => {
            let delta = match content {
                Content::Text => json!({"type": "text_delta", "text": text}),
                Content::Thinking => json!({"type": "thinking_delta", "thinking": text}),
                Content::Arguments => json!({"type": "input_json_delta", "partial_json": text}),
            };
            ("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}))
        }
        BlockEvent::Stop { index } => ("content_block_stop", json!({"type": "content_block_stop", "index": index})),
    }
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}
