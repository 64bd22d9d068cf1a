//! The dialect-neutral embedding and rerank core: the model a request names (loaded on demand,
//! refused when it is a chat model), its inputs tokenized and checked against the model's
//! limit (cut where the dialect says so), run on the model's engine, vectors shortened where
//! the model was trained for it. OpenAI's `/v1/embeddings`, Ollama's `/api/embed` and
//! `/api/embeddings`, and `/v1/rerank` are thin translations of it.

use std::time::{Duration, Instant};

use crate::engine::embed::{EmbedError, EmbedHandle, EmbedOutput, EmbedTask};
use crate::model::encoder::{l2_normalize_vec, truncate_vector, EncodeError, EncodedText};
use crate::model::ModelKind;
use crate::server::{ApiError, AppState};

/// Inputs per request at most (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// What to embed: texts, or token ids of the model's own vocabulary.
pub enum Inputs {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

impl Inputs {
    fn len(&self) -> usize {
        match self {
            Inputs::Texts(t) => t.len(),
            Inputs::Tokens(t) => t.len(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct EmbedParams {
    /// Cut inputs longer than the model takes (else a 400).
    pub truncate: bool,
    /// Shorter vectors (Matryoshka-trained models only).
    pub dimensions: Option<usize>,
    /// Make every vector unit-length (Ollama's `/api/embed` always does).
    pub normalize: bool,
    /// A named instruction of the model's (`query`, `document`); the model's default if none.
    pub prompt_name: Option<String>,
}

/// A request's vectors and what it cost.
pub struct Embedded {
    /// The model's id, as the API reports it.
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
    pub prompt_tokens: usize,
    pub load: Duration,
    pub total: Duration,
}

/// The embedding model `requested` (or the one loaded last).
async fn encoder(
    state: &AppState,
    requested: Option<&str>,
    kind: ModelKind,
) -> Result<(String, EmbedHandle), ApiError> {
    let id = state.resolve_model(requested);
    let served = state.models.serve_encoder(id.as_deref(), kind).await?;
    Ok((served.id, served.engine))
}

pub async fn embed(
    state: &AppState,
    requested: Option<&str>,
    inputs: Inputs,
    params: EmbedParams,
) -> Result<Embedded, ApiError> {
    let began = Instant::now();
    check_count(inputs.len(), "input")?;
    let (model, engine) = encoder(state, requested, ModelKind::Embedding).await?;
    let load = began.elapsed();
    let info = engine.info().clone();
    let dimensions = match params.dimensions {
        None => None,
        Some(d) if d == info.dimensions => None,
        Some(0) => return Err(ApiError::invalid("dimensions", "dimensions must be at least 1")),
        Some(d) if d > info.dimensions => {
            return Err(ApiError::invalid(
                "dimensions",
                format!("{model} makes vectors of {} dimensions; {d} is more", info.dimensions),
            ))
        }
        Some(d) if !info.matryoshka => {
            return Err(ApiError::invalid(
                "dimensions",
                format!(
                    "{model} was not trained for shorter vectors (Matryoshka); it makes {} dimensions, not {d}",
                    info.dimensions
                ),
            ))
        }
        Some(d) => Some(d),
    };
    let tokenizer = engine.tokenizer().clone();
    let (truncate, vocab) = (params.truncate, info.vocab_size);
    let prompt = match params.prompt_name.as_ref().or(info.default_prompt.as_ref()) {
        Some(name) if !info.prompts.contains_key(name) => {
            let known: Vec<&str> = info.prompts.keys().map(String::as_str).collect();
            return Err(ApiError::invalid(
                "prompt_name",
                format!("{model} has no prompt {name:?} (it has: {})", known.join(", ")),
            ));
        }
        Some(name) => info.prompts[name].clone(),
        None => String::new(),
    };
    let texts = tokio::task::spawn_blocking(move || -> Result<Vec<EncodedText>, ApiError> {
        match inputs {
            Inputs::Texts(texts) => texts
                .iter()
                .map(|t| tokenizer.encode(&prompt, t, truncate).map_err(|e| encode_error(e, "input")))
                .collect(),
            Inputs::Tokens(lists) => lists
                .into_iter()
                .map(|ids| {
                    if ids.is_empty() {
                        return Err(ApiError::invalid("input", "a list of token ids is empty"));
                    }
                    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                        return Err(ApiError::invalid(
                            "input",
                            format!("token id {bad} is not in the model's vocabulary ({vocab} tokens)"),
                        ));
                    }
                    tokenizer.check_ids(ids, truncate).map_err(|e| too_long(e.max, "input"))
                })
                .collect(),
        }
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    let prompt_tokens = texts.iter().map(EncodedText::len).sum();
    let EmbedOutput::Vectors(vectors) = engine.run(EmbedTask::Vectors, texts).await.map_err(engine_error)? else {
        return Err(ApiError::internal("the embedding engine answered with scores"));
    };
    let vectors = vectors
        .into_iter()
        .map(|v| {
            let v = match dimensions {
                Some(d) => truncate_vector(v, d, info.normalizes),
                None => v,
            };
            if params.normalize {
                l2_normalize_vec(v)
            } else {
                v
            }
        })
        .collect();
    Ok(Embedded { model, vectors, prompt_tokens, load, total: began.elapsed() })
}

/// A rerank's scores, one per document in the documents' order, and the tokens it read.
pub struct Ranked {
    pub model: String,
    pub scores: Vec<f32>,
    pub tokens: usize,
}

pub async fn rerank(
    state: &AppState,
    requested: Option<&str>,
    query: String,
    documents: Vec<String>,
    truncate: bool,
) -> Result<Ranked, ApiError> {
    check_count(documents.len(), "documents")?;
    let (model, engine) = encoder(state, requested, ModelKind::Reranker).await?;
    let tokenizer = engine.tokenizer().clone();
    let pairs = tokio::task::spawn_blocking(move || -> Result<Vec<EncodedText>, ApiError> {
        documents
            .iter()
            .map(|d| tokenizer.encode_pair(&query, d, truncate).map_err(|e| encode_error(e, "documents")))
            .collect()
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    let tokens = pairs.iter().map(EncodedText::len).sum();
    let EmbedOutput::Scores(scores) = engine.run(EmbedTask::Scores, pairs).await.map_err(engine_error)? else {
        return Err(ApiError::internal("the reranker answered with vectors"));
    };
    Ok(Ranked { model, scores, tokens })
}

fn check_count(n: usize, param: &str) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::invalid(param, format!("{param} must not be empty")));
    }
    if n > MAX_INPUTS {
        return Err(ApiError::invalid(param, format!("{param} has {n} entries; at most {MAX_INPUTS} per request")));
    }
    Ok(())
}

fn too_long(max: usize, param: &str) -> ApiError {
    ApiError {
        code: Some("context_length_exceeded"),
        ..ApiError::invalid(
            param,
            format!("an input is longer than the {max} tokens this model takes; shorten it or ask for truncation"),
        )
    }
}

fn encode_error(e: EncodeError, param: &str) -> ApiError {
    match e {
        EncodeError::TooLong(e) => too_long(e.max, param),
        EncodeError::Tokenizer(message) => ApiError::invalid(param, message),
    }
}

fn engine_error(e: EmbedError) -> ApiError {
    use axum::http::StatusCode;
    let message = e.to_string();
    match e {
        EmbedError::Busy(_) => ApiError {
            code: Some("server_busy"),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
        },
        EmbedError::ShutDown => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message),
        EmbedError::Model(_) => ApiError::internal(message),
    }
}
