//! The API's one error type, mapped to HTTP in one place: OpenAI's envelope
//! `{"error": {"message", "type", "param", "code"}}` with the right status, as a JSON response
//! or as an SSE event mid-stream.

use crate::engine::SubmitError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// A name from a request, quoted, as an error message shows it: cut short when it is long, so
/// a hostile 100 kB name is not echoed back whole.
pub fn shown(name: &str) -> String {
    const MAX: usize = 120;
    if name.chars().count() <= MAX {
        return format!("{name:?}");
    }
    let start: String = name.chars().take(MAX).collect();
    format!("{start:?}… ({} characters)", name.chars().count())
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: invalid_request_error, authentication_error, not_found_error, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    /// 400 about one parameter.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "a valid API key is required (Authorization: Bearer <key> or x-api-key)",
            )
        }
    }

    pub fn model_not_found(model: &str) -> ApiError {
        let model = shown(model);
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                format!(
                    "no model {model} on this machine (`fastmlx ls` lists them; `fastmlx pull <repo>` downloads one)"
                ),
            )
        }
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", format!("{what} not found"))
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        let detail =
            ErrorDetail { message: self.message.clone(), kind: self.kind, param: self.param.clone(), code: self.code };
        serde_json::to_value(ErrorBody { error: detail }).expect("errors serialize")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if matches!(self.status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        let message = e.to_string();
        match e {
            SubmitError::Busy { .. } => ApiError {
                code: Some("server_busy"),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            },
            SubmitError::PromptTooLong { .. } => ApiError {
                param: Some("messages".into()),
                code: Some("context_length_exceeded"),
                ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
            },
            SubmitError::TooLarge { .. } => ApiError {
                param: Some("messages".into()),
                ..ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", message)
            },
            SubmitError::Invalid(_) => ApiError::bad_request(message),
            SubmitError::ShutDown | SubmitError::Unavailable(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
            }
        }
    }
}

impl From<crate::store::ResidencyError> for ApiError {
    fn from(e: crate::store::ResidencyError) -> ApiError {
        use crate::store::{CatalogError, ResidencyError};
        let message = e.to_string();
        match e {
            ResidencyError::Catalog(CatalogError::NotFound(id)) => ApiError::model_not_found(&id),
            ResidencyError::Unloadable { .. }
            | ResidencyError::NoModel
            | ResidencyError::NoModelOfKind(_)
            | ResidencyError::WrongKind { .. } => {
                ApiError { param: Some("model".into()), ..ApiError::bad_request(message) }
            }
            ResidencyError::NotLoaded(_) => ApiError {
                param: Some("model".into()),
                ..ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
            },
            ResidencyError::Waiting { .. } => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message),
            ResidencyError::Pinned { .. } => ApiError {
                param: Some("model".into()),
                ..ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message)
            },
            ResidencyError::NoRoom { .. } => ApiError {
                code: Some("insufficient_memory"),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
            },
            ResidencyError::Catalog(_) | ResidencyError::LoadFailed { .. } => ApiError::internal(message),
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, `rate_limit_error`, `server_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request parameter at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

/// Every error, as a response body and as a mid-stream `data:` event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}
