//! A JSON body extractor whose every failure (not JSON, wrong types, too large, not UTF-8)
//! is answered in the API's own error envelope, never axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", "the request body is too large")
            } else {
                ApiError::bad_request(format!("cannot read the request body: {rejection}"))
            }
        })?;
        if std::str::from_utf8(&bytes).is_err() {
            return Err(ApiError::bad_request("the request body is not valid UTF-8"));
        }
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        Ok(ApiJson(parse(&value)?))
    }
}

/// Reads `T` out of a JSON value; a wrong field is a 400 naming it (`param`).
pub fn parse<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = format!("invalid request: {}", e.into_inner());
        match path.as_str() {
            "." | "" => ApiError::bad_request(message),
            _ => ApiError::invalid(&path, format!("{path}: {message}")),
        }
    })
}

/// A query-string extractor answering a malformed query (`?machine_gb=lots`) in the API's error
/// envelope, as [`ApiJson`] does for bodies.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(ApiError::bad_request(format!("invalid query string: {}", rejection.body_text()))),
        }
    }
}
