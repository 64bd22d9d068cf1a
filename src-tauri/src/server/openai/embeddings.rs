//! `POST /v1/embeddings`: a string, a list of strings, a list of token ids or a list of such
//! lists (LangChain's `OpenAIEmbeddings` sends ids; they are read as the model's own tokens, as
//! vLLM and llama.cpp read them); `float` or `base64` vectors (the openai SDK asks for base64 by
//! default: little-endian f32); `dimensions` for models trained for shorter vectors. Too long an
//! input is a 400 as on OpenAI, unless the request asks for `truncate` (an extension).

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::server::embeddings::{embed, EmbedParams, Inputs};
use crate::server::extract::ApiJson;
use crate::server::{ApiError, AppState};

#[derive(Deserialize)]
pub struct EmbeddingsRequest {
    #[serde(default)]
    model: Option<String>,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<i64>,
    /// Extension: cut inputs longer than the model takes instead of refusing them.
    #[serde(default)]
    truncate: bool,
    /// Extension: one of the model's named instructions (`query`, `document`).
    #[serde(default)]
    prompt_name: Option<String>,
}

pub async fn embeddings(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<EmbeddingsRequest>,
) -> Result<Json<Value>, ApiError> {
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format {other:?} is not one of \"float\", \"base64\""),
            ))
        }
    };
    let dimensions = match request.dimensions {
        None => None,
        Some(d) if d < 1 => return Err(ApiError::invalid("dimensions", "dimensions must be at least 1")),
        Some(d) => Some(d as usize),
    };
    let inputs = inputs(&request.input)?;
    let params =
        EmbedParams { truncate: request.truncate, dimensions, normalize: false, prompt_name: request.prompt_name };
    let embedded = embed(&state, request.model.as_deref(), inputs, params).await?;
    let data: Vec<Value> = embedded
        .vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 { json!(encode_base64(v)) } else { json!(v) };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": embedded.model,
        "usage": {"prompt_tokens": embedded.prompt_tokens, "total_tokens": embedded.prompt_tokens},
    })))
}

/// `input` in any of the shapes OpenAI takes.
pub fn inputs(input: &Value) -> Result<Inputs, ApiError> {
    let bad = || {
        ApiError::invalid(
            "input",
            "input must be a string, a list of strings, a list of token ids, or a list of lists of token ids",
        )
    };
    let token = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    let tokens = |list: &[Value]| list.iter().map(token).collect::<Option<Vec<u32>>>();
    match input {
        Value::String(s) => Ok(Inputs::Texts(vec![s.clone()])),
        Value::Array(list) if list.is_empty() => Err(ApiError::invalid("input", "input must not be empty")),
        Value::Array(list) if list.iter().all(Value::is_string) => {
            Ok(Inputs::Texts(list.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()))
        }
        Value::Array(list) if list.iter().all(Value::is_number) => {
            Ok(Inputs::Tokens(vec![tokens(list).ok_or_else(bad)?]))
        }
        Value::Array(list) if list.iter().all(Value::is_array) => list
            .iter()
            .map(|l| tokens(l.as_array().expect("an array")).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()
            .map(Inputs::Tokens),
        _ => Err(bad()),
    }
}

/// The vector as the openai SDK decodes it: little-endian f32, base64.
fn encode_base64(vector: &[f32]) -> String {
    let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
