//! `POST /v1/completions`: a raw prompt (special tokens in it, such as FIM markers, are
//! honoured; no chat template), streaming and not.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{closing_chunks, collect, finish_reason, now, stream_error, usage_json, CommonParams};
use crate::engine::Event;
use crate::server::extract::{parse, ApiJson};
use crate::server::sse::stream_events;
use crate::server::{ApiError, AppState};

/// `prompt`: text or token ids, alone or as a one-element list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    pub logprobs: Option<u32>,
    pub suffix: Option<String>,
    pub echo: Option<bool>,
}

pub async fn completions(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse(&body)?;
    let common: CommonParams = parse(&body)?;
    let info = state.engine.model_info().clone();
    if request.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported; send a FIM prompt with the model's own markers"));
    }
    if request.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    let encode = |text: &str| info.tokenizer.encode(text, true, true).map_err(|e| ApiError::internal(e.to_string()));
    let prompt_ids = match request.prompt {
        Prompt::Text(t) => encode(&t)?,
        Prompt::Tokens(ids) => ids,
        Prompt::Texts(v) if v.len() == 1 => encode(&v[0])?,
        Prompt::TokenLists(mut v) if v.len() == 1 => v.remove(0),
        _ => return Err(ApiError::invalid("prompt", "exactly one prompt is supported per request")),
    };
    if prompt_ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    let top = request.logprobs.map(|n| n as usize);
    if top.is_some_and(|n| n > 5) {
        return Err(ApiError::invalid("logprobs", "logprobs may be at most 5"));
    }
    let engine_request = common.to_request(&state, prompt_ids, top)?;
    let stream = state.engine.submit(engine_request)?;
    let id = format!("cmpl-{}", stream.id);
    let model = state.model_id().to_string();
    let created = now();
    let tokenizer = info.tokenizer.clone();
    let logprobs_json = move |entries: &[crate::engine::TokenLogprob]| {
        let token = |t: u32| tokenizer.decode(&[t], false).unwrap_or_default();
        json!({
            "tokens": entries.iter().map(|l| token(l.token)).collect::<Vec<_>>(),
            "token_logprobs": entries.iter().map(|l| l.logprob).collect::<Vec<_>>(),
            "top_logprobs": entries.iter().map(|l| l.top.iter().map(|(t, lp)| (token(*t), json!(lp))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        })
    };

    if !common.streaming() {
        let done = collect(stream).await?;
        let logprobs = top.map(|_| logprobs_json(&done.logprobs));
        return Ok(Json(json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": done.text, "logprobs": logprobs, "finish_reason": finish_reason(done.finish.reason)}],
            "usage": usage_json(&done.finish),
        }))
        .into_response());
    }

    let include_usage = common.include_usage();
    let chunk = move |text: &str, finish: Option<&str>, logprobs: Option<Value>| {
        json!({"id": id, "object": "text_completion", "created": created, "model": model,
               "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]})
    };
    let sse = stream_events(stream, Vec::new(), move |event| match event {
        Event::Delta { text, logprob, .. } => {
            let lp = top.and(logprob).map(|l| logprobs_json(std::slice::from_ref(&l)));
            if text.is_empty() && lp.is_none() {
                return Vec::new();
            }
            vec![chunk(&text, None, lp)]
        }
        Event::Finish(finish) => {
            if let Some(error) = stream_error(&finish) {
                return vec![error];
            }
            closing_chunks(chunk("", Some(finish_reason(finish.reason)), None), &finish, include_usage)
        }
    });
    Ok(sse.into_response())
}
