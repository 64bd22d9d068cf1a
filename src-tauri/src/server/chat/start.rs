//! A chat request started: its model served, its prompt rendered, its answer's parser made and
//! the generation submitted to the model's engine.

use std::sync::Arc;

use super::answer::AnswerParser;
use super::format::parameter_schemas;
use super::model::{serve, ChatModel};
use super::params::CommonParams;
use super::prompt::{render, template_kwargs, turn_boundary, ChatRequest, RenderedChat};
use super::stream::AnswerStream;
use super::structured::ToolMode;
use crate::server::{ApiError, AppState};
use crate::tokenizer::Tokenizer;

/// A chat generation under way, with what a dialect needs to render it.
pub struct StartedChat {
    /// The served model's id.
    pub model: String,
    /// The answer as it streams: text, reasoning and tool calls, then its end.
    pub answer: AnswerStream,
    pub mode: ToolMode,
    pub tokenizer: Arc<Tokenizer>,
    /// `Some(top)` when per-token log-probabilities were asked for.
    pub logprobs: Option<usize>,
    pub prompt_tokens: usize,
}

/// Serves the model (loading it if needed), renders and tokenizes the prompt, and submits it.
pub async fn start(state: &AppState, request: &ChatRequest, common: &CommonParams) -> Result<StartedChat, ApiError> {
    let model = serve(state, common.model.as_deref()).await?;
    let fetched = with_fetched_images(state, request).await?;
    let request = fetched.as_ref().unwrap_or(request);
    let RenderedChat { text, prompt_ids, shape, message_starts, snapshot_at, images } =
        render(&model, request, &state.config)?;
    let ChatModel { served, info, format } = model;
    let template = info.chat_template.as_ref().expect("rendered with a template");
    let prompt_tokens = prompt_ids.len();
    let top = request.top_logprobs.unwrap_or(0) as usize;
    if top > 20 {
        return Err(ApiError::invalid("top_logprobs", "top_logprobs may be at most 20"));
    }
    let logprobs = request.logprobs.unwrap_or(false).then_some(top);
    let mut engine_request = common.to_request(state, &info, prompt_ids, logprobs)?;
    let schemas = parameter_schemas(request.tools.as_deref().unwrap_or_default());
    let (parser, markers) = AnswerParser::for_answer(&format, &shape, schemas, &text);
    engine_request.special_text_tokens = markers.iter().filter_map(|t| info.tokenizer.token_to_id(t)).collect();
    engine_request.grammar = shape.grammar.clone();
    engine_request.prompt_parts = message_starts;
    engine_request.snapshot_at = snapshot_at;
    engine_request.images = images;
    engine_request.turn_boundary = turn_boundary(template, &info.tokenizer, template_kwargs(request)?);
    let stream = super::stream::started(served.engine.submit(engine_request)?).await?;
    Ok(StartedChat {
        model: served.id,
        answer: AnswerStream::new(stream, Some(parser)),
        mode: shape.mode,
        tokenizer: info.tokenizer.clone(),
        logprobs,
        prompt_tokens,
    })
}

/// `request` with its `http(s)` image URLs fetched, when the server fetches them and it has any.
pub async fn with_fetched_images(state: &AppState, request: &ChatRequest) -> Result<Option<ChatRequest>, ApiError> {
    if !state.config.fetch_image_urls {
        return Ok(None);
    }
    let messages = super::fetch_images::inline_image_urls(&request.messages).await?;
    Ok(messages.map(|messages| ChatRequest { messages, ..request.clone() }))
}

/// `call_` and 9 alphanumerics (Mistral's templates insist on 9).
pub fn call_id() -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = crate::sampling::Rng::from_entropy();
    let id: String = (0..9).map(|_| CHARS[(rng.next_u64() % CHARS.len() as u64) as usize] as char).collect();
    format!("call_{id}")
}
