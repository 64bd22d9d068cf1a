//! `POST /v1/chat/completions`, streaming and not: the chat core's answer in OpenAI's shapes.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use super::types::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta, ChatLogprobs,
    FunctionCall, FunctionCallDelta, TokenLogprob, ToolCall, ToolCallDelta, TopLogprob,
};
use super::{finish_reason, to_json};
use crate::engine::{FinishReason, TokenLogprob as EngineLogprob};
use crate::server::chat::outcome::{with_server_timing, Whole};
use crate::server::chat::stream::AnswerEvent;
use crate::server::chat::structured::ToolMode;
use crate::server::chat::{call_id, start, ChatRequest, CommonParams, Piece, StartedChat, ToolCall as ParsedCall};
use crate::server::extract::{parse, ApiJson};
use crate::server::priority::HeaderPriority;
use crate::server::sse::stream_events;
use crate::server::{ApiError, AppState};
use crate::tokenizer::Tokenizer;

pub async fn completions(
    State(state): State<AppState>,
    HeaderPriority(header): HeaderPriority,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let request: ChatRequest = parse(&body)?;
    let mut common: CommonParams = parse(&body)?;
    common.header_priority = header;
    let StartedChat { model, answer, mode, tokenizer, logprobs, .. } = start(&state, &request, &common).await?;
    let id = format!("chatcmpl-{}", answer.id());
    let created = crate::server::unix_time();
    let forced = matches!(mode, ToolMode::Named(_));
    // A forced named call ends with "stop" (as OpenAI's); calls the model chose, with "tool_calls".
    let finish_of = move |reason: FinishReason, calls: bool| match reason {
        FinishReason::Stop if calls && !forced => "tool_calls",
        other => finish_reason(other),
    };

    if !common.streaming() {
        let done = answer.collect().await?;
        let logprobs = logprobs
            .map(|_| ChatLogprobs { content: done.logprobs.iter().map(|l| token_logprob(&tokenizer, l)).collect() });
        let answer = Whole::from_pieces(done.pieces, &mode);
        let finish = finish_of(done.finish.reason, !answer.calls.is_empty());
        let message = AssistantMessage {
            role: "assistant",
            content: answer.content,
            reasoning_content: (!answer.reasoning.is_empty()).then_some(answer.reasoning),
            tool_calls: (!answer.calls.is_empty())
                .then(|| answer.calls.into_iter().map(|c| tool_call(c, call_id())).collect()),
        };
        let response = Json(ChatCompletion {
            id,
            object: "chat.completion",
            created,
            model,
            choices: vec![ChatChoice { index: 0, message, logprobs, finish_reason: finish }],
            usage: done.finish.usage.into(),
            timings: (&done.finish).into(),
        })
        .into_response();
        return Ok(with_server_timing(response, &done.finish));
    }

    let include_usage = common.include_usage();
    let chunk = move |delta: ChatDelta, finish_reason: Option<&'static str>, logprobs: Option<ChatLogprobs>| {
        ChatCompletionChunk {
            id: id.clone(),
            object: "chat.completion.chunk",
            created,
            model: model.clone(),
            choices: vec![ChatChunkChoice { index: 0, delta, logprobs, finish_reason }],
            usage: None,
            timings: None,
        }
    };
    let mut first = vec![chunk(
        ChatDelta { role: Some("assistant"), content: Some(String::new()), ..Default::default() },
        None,
        None,
    )];
    // A named function: its call opens the stream, the arguments follow as they are generated.
    if let ToolMode::Named(name) = &mode {
        first.push(chunk(call_delta(0, Some(call_id()), Some(name.clone()), String::new()), None, None));
    }
    let want_logprobs = logprobs.is_some();
    let mut calls_sent = usize::from(forced);
    let deltas = move |pieces: Vec<Piece>, calls_sent: &mut usize| -> Vec<ChatDelta> {
        pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Text(t) => ChatDelta { content: Some(t), ..Default::default() },
                Piece::Reasoning(t) => ChatDelta { reasoning_content: Some(t), ..Default::default() },
                Piece::Arguments(t) => call_delta(0, None, None, t),
                Piece::Call(call) => {
                    *calls_sent += 1;
                    call_delta(*calls_sent - 1, Some(call_id()), Some(call.name), call.arguments)
                }
            })
            .collect()
    };
    let sse = stream_events(answer, first.iter().map(to_json).collect(), move |event| match event {
        AnswerEvent::Pieces { pieces, logprob } => {
            let lp = logprob
                .filter(|_| want_logprobs)
                .map(|l| ChatLogprobs { content: vec![token_logprob(&tokenizer, &l)] });
            let mut out: Vec<ChatCompletionChunk> =
                deltas(pieces, &mut calls_sent).into_iter().map(|d| chunk(d, None, None)).collect();
            if let Some(lp) = lp {
                match out.last_mut() {
                    Some(last) => last.choices[0].logprobs = Some(lp),
                    None => out.push(chunk(
                        ChatDelta { content: Some(String::new()), ..Default::default() },
                        None,
                        Some(lp),
                    )),
                }
            }
            out.iter().map(to_json).collect()
        }
        AnswerEvent::Failed(error) => vec![error.body()],
        AnswerEvent::Done { rest, finish } => {
            let mut out: Vec<ChatCompletionChunk> =
                deltas(rest, &mut calls_sent).into_iter().map(|d| chunk(d, None, None)).collect();
            let mut last = chunk(ChatDelta::default(), Some(finish_of(finish.reason, calls_sent > 0)), None);
            last.timings = Some((&finish).into());
            if include_usage {
                let usage = ChatCompletionChunk {
                    choices: Vec::new(),
                    usage: Some(finish.usage.into()),
                    timings: None,
                    ..last.clone()
                };
                out.extend([last, usage]);
            } else {
                out.push(last);
            }
            out.iter().map(to_json).collect()
        }
    });
    Ok(sse.into_response())
}

fn tool_call(call: ParsedCall, id: String) -> ToolCall {
    ToolCall { id, kind: "function", function: FunctionCall { name: call.name, arguments: call.arguments } }
}

/// A streamed tool-call fragment: the first of a call has its id and name.
fn call_delta(index: usize, id: Option<String>, name: Option<String>, arguments: String) -> ChatDelta {
    let kind = id.as_ref().map(|_| "function");
    let function = FunctionCallDelta { name, arguments: Some(arguments) };
    ChatDelta { tool_calls: Some(vec![ToolCallDelta { index, id, kind, function }]), ..Default::default() }
}

/// OpenAI's per-token logprob object.
fn token_logprob(tokenizer: &Tokenizer, l: &EngineLogprob) -> TokenLogprob {
    let top = |token: u32, logprob: f32| {
        let text = tokenizer.decode(&[token], false).unwrap_or_default();
        TopLogprob { bytes: tokenizer.token_bytes(token), token: text, logprob }
    };
    let chosen = top(l.token, l.logprob);
    TokenLogprob {
        token: chosen.token,
        logprob: chosen.logprob,
        bytes: chosen.bytes,
        top_logprobs: l.top.iter().map(|(t, lp)| top(*t, *lp)).collect(),
    }
}
