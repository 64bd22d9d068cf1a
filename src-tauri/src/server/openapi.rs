//! The OpenAPI description of the HTTP API, generated from the request and response types the
//! handlers use. `fastmlx openapi` prints it; `docs/openapi.json` is that output, checked in,
//! and a test keeps the two equal.

use serde::{Deserialize, Serialize};
use utoipa::openapi::path::{OperationBuilder, ParameterBuilder, ParameterIn, PathItemBuilder};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::{
    ContentBuilder, HttpMethod, OpenApi, OpenApiBuilder, PathsBuilder, Ref, ResponseBuilder, ResponsesBuilder,
};
use utoipa::{OpenApi as _, ToSchema};

use super::chat::{ChatRequest, CommonParams};
use super::error::ErrorBody;
use super::openai::completions::CompletionRequest;
use super::openai::types::*;

/// `POST /v1/chat/completions` body: the chat fields and the sampling fields.
#[derive(Deserialize, ToSchema)]
#[allow(dead_code)]
struct ChatCompletionRequest {
    #[serde(flatten)]
    chat: ChatRequest,
    #[serde(flatten)]
    common: CommonParams,
}

/// `POST /v1/completions` body.
#[derive(Deserialize, ToSchema)]
#[allow(dead_code)]
struct TextCompletionRequest {
    #[serde(flatten)]
    completion: CompletionRequest,
    #[serde(flatten)]
    common: CommonParams,
}

/// `input` of `POST /v1/embeddings`: token ids are the model's own.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/embeddings` body (`server/openai/embeddings.rs`).
#[derive(Deserialize, ToSchema)]
#[allow(dead_code)]
struct EmbeddingRequest {
    /// An embedding model's id (default: the one loaded last).
    model: Option<String>,
    input: EmbeddingInput,
    /// `float` (default) or `base64` (little-endian f32).
    encoding_format: Option<String>,
    /// Shorter vectors, for models trained for them (Matryoshka); refused for others.
    dimensions: Option<u32>,
    /// Extension: cut inputs longer than the model takes (default: refuse them, 400).
    truncate: Option<bool>,
    /// Extension: one of the model's named instructions (`query`, `document`).
    prompt_name: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct Embedding {
    /// Always `embedding`.
    object: String,
    index: u32,
    embedding: EmbeddingVector,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct EmbeddingUsage {
    prompt_tokens: u64,
    total_tokens: u64,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct EmbeddingList {
    /// Always `list`.
    object: String,
    data: Vec<Embedding>,
    model: String,
    usage: EmbeddingUsage,
}

#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum RerankDocument {
    Text(String),
    Object { text: String },
}

/// `POST /v1/rerank` (and `/rerank`) body, as Jina's and Cohere's (`server/rerank.rs`).
#[derive(Deserialize, ToSchema)]
#[allow(dead_code)]
struct RerankRequest {
    /// A reranker's id (default: the one loaded last).
    model: Option<String>,
    query: String,
    documents: Vec<RerankDocument>,
    /// The best this many (default: all).
    top_n: Option<u32>,
    /// Each result's document text (default: true).
    return_documents: Option<bool>,
    /// Cut inputs longer than the model takes (default: true).
    truncate: Option<bool>,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct RerankText {
    text: String,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct RerankResult {
    /// The document's place in the request.
    index: u32,
    /// In [0, 1]: the reranker's sigmoid.
    relevance_score: f32,
    document: Option<RerankText>,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct RerankList {
    /// Always `list`.
    object: String,
    model: String,
    /// Most relevant first.
    results: Vec<RerankResult>,
    usage: EmbeddingUsage,
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "FastMLX",
        description = "OpenAI-compatible API of a local LLM server on MLX. Errors, also mid-stream, are `ErrorBody`."
    ),
    components(schemas(
        ChatCompletionRequest,
        TextCompletionRequest,
        ChatCompletion,
        ChatCompletionChunk,
        Completion,
        ModelList,
        Model,
        ErrorBody,
        Health,
        EmbeddingRequest,
        EmbeddingList,
        RerankRequest,
        RerankList
    ))
)]
struct Components;

fn schema(name: &str) -> Ref {
    Ref::from_schema_name(name)
}

fn json_body(name: &str) -> utoipa::openapi::Content {
    ContentBuilder::new().schema(Some(schema(name))).build()
}

fn error_responses(builder: ResponsesBuilder, codes: &[(&str, &str)]) -> ResponsesBuilder {
    codes.iter().fold(builder, |b, (code, why)| {
        b.response(*code, ResponseBuilder::new().description(*why).content("application/json", json_body("ErrorBody")))
    })
}

/// A generation endpoint: JSON body in, JSON or (with `stream: true`) SSE out.
fn generation(summary: &str, request: &str, response: &str, chunk: &str) -> utoipa::openapi::path::Operation {
    let ok = ResponseBuilder::new()
        .description(
            "The whole answer; with `stream: true` server-sent events, one chunk per `data:` line, then `data: [DONE]`",
        )
        .content("application/json", json_body(response))
        .content("text/event-stream", json_body(chunk));
    let responses = error_responses(
        ResponsesBuilder::new().response("200", ok),
        &[
            ("400", "Invalid request (the `param` names the field)"),
            ("401", "Missing or wrong API key"),
            ("404", "Unknown model"),
            ("413", "Body or request too large"),
            ("429", "The queue is full (Retry-After)"),
            ("500", "Generation failed"),
            ("503", "Shutting down"),
        ],
    );
    post_operation(summary, request, responses)
}

/// A POST with a required JSON body.
fn post_operation(summary: &str, request: &str, responses: ResponsesBuilder) -> utoipa::openapi::path::Operation {
    OperationBuilder::new()
        .summary(Some(summary))
        .request_body(Some(
            RequestBodyBuilder::new()
                .content("application/json", json_body(request))
                .required(Some(utoipa::openapi::Required::True))
                .build(),
        ))
        .responses(responses.build())
        .build()
}

/// A JSON request and a JSON answer (embeddings, rerank).
fn post_json(summary: &str, request: &str, response: &str) -> utoipa::openapi::path::Operation {
    let ok = ResponseBuilder::new().description("OK").content("application/json", json_body(response));
    let responses = error_responses(
        ResponsesBuilder::new().response("200", ok),
        &[
            ("400", "Invalid request (the `param` names the field); a model of another kind"),
            ("401", "Missing or wrong API key"),
            ("404", "Unknown model"),
            ("413", "Body too large"),
            ("429", "The queue is full"),
            ("503", "Not enough memory to load the model, or shutting down"),
        ],
    );
    post_operation(summary, request, responses)
}

fn get_json(summary: &str, response: &str, errors: &[(&str, &str)]) -> utoipa::openapi::path::Operation {
    let ok = ResponseBuilder::new().description("OK").content("application/json", json_body(response));
    OperationBuilder::new()
        .summary(Some(summary))
        .responses(error_responses(ResponsesBuilder::new().response("200", ok), errors).build())
        .build()
}

pub fn document() -> OpenApi {
    let model_id = ParameterBuilder::new()
        .name("id")
        .parameter_in(ParameterIn::Path)
        .required(utoipa::openapi::Required::True)
        .schema(Some(utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::Type::String)))
        .build();
    let mut get_model =
        get_json("A local model, loaded or loadable on demand", "Model", &[("404", "No local model has this id")]);
    get_model.parameters = Some(vec![model_id]);
    let metrics = OperationBuilder::new()
        .summary(Some("Engine metrics in Prometheus text format"))
        .responses(
            ResponsesBuilder::new()
                .response(
                    "200",
                    ResponseBuilder::new()
                        .description("Prometheus exposition format")
                        .content("text/plain", ContentBuilder::new().build()),
                )
                .build(),
        )
        .build();
    let paths = PathsBuilder::new()
        .path(
            "/v1/chat/completions",
            PathItemBuilder::new()
                .operation(
                    HttpMethod::Post,
                    generation("Chat completion", "ChatCompletionRequest", "ChatCompletion", "ChatCompletionChunk"),
                )
                .build(),
        )
        .path(
            "/v1/completions",
            PathItemBuilder::new()
                .operation(
                    HttpMethod::Post,
                    generation("Text completion of a raw prompt", "TextCompletionRequest", "Completion", "Completion"),
                )
                .build(),
        )
        .path(
            "/v1/embeddings",
            PathItemBuilder::new()
                .operation(HttpMethod::Post, post_json("Vectors of texts", "EmbeddingRequest", "EmbeddingList"))
                .build(),
        )
        .path(
            "/v1/rerank",
            PathItemBuilder::new()
                .operation(
                    HttpMethod::Post,
                    post_json("Documents ordered by relevance to a query", "RerankRequest", "RerankList"),
                )
                .build(),
        )
        .path(
            "/v1/models",
            PathItemBuilder::new().operation(HttpMethod::Get, get_json("The served models", "ModelList", &[])).build(),
        )
        .path("/v1/models/{id}", PathItemBuilder::new().operation(HttpMethod::Get, get_model).build())
        .path(
            "/health",
            PathItemBuilder::new()
                .operation(HttpMethod::Get, get_json("Liveness, and the served model", "Health", &[]))
                .build(),
        )
        .path("/metrics", PathItemBuilder::new().operation(HttpMethod::Get, metrics).build())
        .build();
    let mut doc = OpenApiBuilder::from(Components::openapi()).paths(paths).build();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

/// The document as pretty JSON, as checked in.
pub fn document_json() -> String {
    document().to_pretty_json().expect("the OpenAPI document serializes") + "\n"
}

#[cfg(test)]
mod tests {
    #[test]
    fn checked_in_document_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == super::document_json(),
            "docs/openapi.json is stale: run `cargo run -- openapi > docs/openapi.json`"
        );
    }
}
