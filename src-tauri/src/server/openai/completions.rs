//! `POST /v1/completions`: a raw prompt (special tokens in it, such as FIM markers, are
//! honoured; no chat template), streaming and not.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use super::types::{Completion, CompletionChoice, CompletionLogprobs, Usage};
use super::{finish_reason, to_json};
use crate::server::chat::outcome::with_server_timing;
use crate::server::chat::raw::{self, RawError, RawPrompt, StartedRaw};
use crate::server::chat::stream::AnswerEvent;
use crate::server::chat::{CommonParams, Piece};
use crate::server::extract::{parse, ApiJson};
use crate::server::priority::HeaderPriority;
use crate::server::sse::stream_events;
use crate::server::{ApiError, AppState};

/// `prompt`: text or token ids, alone or as a one-element list.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    /// Raw text (special tokens such as FIM markers are honoured; no chat template) or token ids.
    pub prompt: Prompt,
    /// Report this many alternatives per token (at most 5), in the legacy format.
    pub logprobs: Option<u32>,
    /// Text after the insertion point: the prompt and suffix become a fill-in-the-middle prompt in
    /// the model's own markers (a 400 for models without them).
    pub suffix: Option<String>,
    /// Not supported; `false` is accepted.
    pub echo: Option<bool>,
}

pub async fn completions(
    State(state): State<AppState>,
    HeaderPriority(header): HeaderPriority,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse(&body)?;
    let mut common: CommonParams = parse(&body)?;
    common.header_priority = header;
    if request.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    let top = request.logprobs.map(|n| n as usize);
    if top.is_some_and(|n| n > 5) {
        return Err(ApiError::invalid("logprobs", "logprobs may be at most 5"));
    }
    let suffix = request.suffix.as_deref().filter(|s| !s.is_empty());
    common.fill_in_the_middle = suffix.is_some();
    let prompt = match request.prompt {
        Prompt::Texts(mut v) if v.len() == 1 => Prompt::Text(v.remove(0)),
        Prompt::TokenLists(mut v) if v.len() == 1 => Prompt::Tokens(v.remove(0)),
        other => other,
    };
    let prompt = match (&prompt, suffix) {
        (Prompt::Text(t), Some(suffix)) => RawPrompt::Fim { prefix: t, suffix },
        (Prompt::Tokens(_), Some(_)) => return Err(ApiError::invalid("suffix", "suffix needs the prompt as text")),
        (Prompt::Text(t), None) => RawPrompt::Text(t),
        (Prompt::Tokens(ids), None) => RawPrompt::Tokens(ids.clone()),
        _ => return Err(ApiError::invalid("prompt", "exactly one prompt is supported per request")),
    };
    let model = state.resolve_model(common.model.as_deref());
    let StartedRaw { model, info, answer } =
        raw::start(&state, model.as_deref(), prompt, &common, top, None).await.map_err(|e| match e {
            RawError::NoFim => {
                ApiError::invalid("suffix", "this model has no fill-in-the-middle tokens, so suffix is not supported")
            }
            RawError::Api(e) => e,
        })?;
    let id = format!("cmpl-{}", answer.id());
    let created = crate::server::unix_time();
    let tokenizer = info.tokenizer.clone();
    let legacy_logprobs = move |entries: &[crate::engine::TokenLogprob]| {
        let token = |t: u32| tokenizer.decode(&[t], false).unwrap_or_default();
        CompletionLogprobs {
            tokens: entries.iter().map(|l| token(l.token)).collect(),
            token_logprobs: entries.iter().map(|l| l.logprob).collect(),
            top_logprobs: entries.iter().map(|l| l.top.iter().map(|(t, lp)| (token(*t), *lp)).collect()).collect(),
        }
    };
    let completion = move |text: String,
                           finish_reason: Option<&'static str>,
                           logprobs: Option<CompletionLogprobs>,
                           usage: Option<Usage>| Completion {
        id: id.clone(),
        object: "text_completion",
        created,
        model: model.clone(),
        choices: vec![CompletionChoice { index: 0, text, logprobs, finish_reason }],
        usage,
        timings: None,
    };

    if !common.streaming() {
        let done = answer.collect().await?;
        let logprobs = top.map(|_| legacy_logprobs(&done.logprobs));
        let reason = finish_reason(done.finish.reason);
        let mut whole = completion(done.text(), Some(reason), logprobs, Some(done.finish.usage.into()));
        whole.timings = Some((&done.finish).into());
        return Ok(with_server_timing(Json(whole).into_response(), &done.finish));
    }

    let include_usage = common.include_usage();
    let sse = stream_events(answer, Vec::new(), move |event| match event {
        AnswerEvent::Pieces { pieces, logprob } => {
            let text: String =
                pieces.into_iter().filter_map(|p| if let Piece::Text(t) = p { Some(t) } else { None }).collect();
            let lp = top.and(logprob).map(|l| legacy_logprobs(std::slice::from_ref(&l)));
            if text.is_empty() && lp.is_none() {
                return Vec::new();
            }
            vec![to_json(&completion(text, None, lp, None))]
        }
        AnswerEvent::Failed(error) => vec![error.body()],
        // A raw answer holds nothing back.
        AnswerEvent::Done { finish, .. } => {
            let mut last = completion(String::new(), Some(finish_reason(finish.reason)), None, None);
            last.timings = Some((&finish).into());
            let mut out = vec![to_json(&last)];
            if include_usage {
                let usage = Completion { choices: Vec::new(), usage: Some(finish.usage.into()), timings: None, ..last };
                out.push(to_json(&usage));
            }
            out
        }
    });
    Ok(sse.into_response())
}
