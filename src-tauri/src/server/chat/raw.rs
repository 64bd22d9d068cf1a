//! A raw prompt (no chat template; special tokens in it, such as FIM markers, are honoured) or
//! a fill-in-the-middle prompt made from a prefix and a suffix: what `/v1/completions` and
//! Ollama's `raw`/`suffix` generate submit.

use super::fim;
use super::params::CommonParams;
use super::stream::AnswerStream;
use crate::constrain::Grammar;
use crate::engine::ModelInfo;
use crate::server::{ApiError, AppState};
use std::sync::Arc;

/// The prompt of a raw request.
pub enum RawPrompt<'a> {
    Text(&'a str),
    Tokens(Vec<u32>),
    /// Fill in the middle between `prefix` and `suffix`, in the model's own markers.
    Fim {
        prefix: &'a str,
        suffix: &'a str,
    },
}

/// A raw generation under way.
pub struct StartedRaw {
    /// The served model's id.
    pub model: String,
    pub info: ModelInfo,
    pub answer: AnswerStream,
}

/// Why a raw prompt cannot be made.
pub enum RawError {
    /// The model has no fill-in-the-middle tokens (each dialect words this its own way).
    NoFim,
    Api(ApiError),
}

impl From<ApiError> for RawError {
    fn from(e: ApiError) -> RawError {
        RawError::Api(e)
    }
}

/// Serves the model (loading it if needed), tokenizes the prompt and submits it.
pub async fn start(
    state: &AppState,
    model: Option<&str>,
    prompt: RawPrompt<'_>,
    common: &CommonParams,
    logprobs: Option<usize>,
    grammar: Option<Arc<Grammar>>,
) -> Result<StartedRaw, RawError> {
    let served = state.models.serve(model).await.map_err(ApiError::from)?;
    let info = served.engine.model_info().clone();
    let encode = |text: &str| info.tokenizer.encode(text, true, true).map_err(|e| ApiError::internal(e.to_string()));
    let ids = match prompt {
        RawPrompt::Text(text) => encode(text)?,
        RawPrompt::Tokens(ids) => ids,
        RawPrompt::Fim { prefix, suffix } => {
            encode(&fim::prompt(&info.tokenizer, prefix, suffix).ok_or(RawError::NoFim)?)?
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty").into());
    }
    let mut request = common.to_request(state, &info, ids, logprobs)?;
    request.grammar = grammar;
    let stream = super::stream::started(served.engine.submit(request).map_err(ApiError::from)?).await?;
    Ok(StartedRaw { model: served.id, info, answer: AnswerStream::new(stream, None) })
}
