//! `GET /v1/models` and `GET /v1/models/{id}`.

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use crate::server::{ApiError, AppState};

fn model_json(state: &AppState) -> Value {
    json!({"id": state.model_id(), "object": "model", "created": state.created, "owned_by": "fastmlx"})
}

pub async fn list(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_json(&state)]}))
}

pub async fn get_one(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if id == state.model_id() {
        Ok(Json(model_json(&state)))
    } else {
        Err(ApiError::model_not_found(&id))
    }
}
