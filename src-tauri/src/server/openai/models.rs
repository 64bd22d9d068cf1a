//! `GET /v1/models` and `GET /v1/models/{id}`.

use axum::extract::{Path, State};
use axum::Json;

use super::types::{Model, ModelList};
use crate::server::{ApiError, AppState};

fn model(state: &AppState) -> Model {
    Model { id: state.model_id().to_string(), object: "model", created: state.created, owned_by: "fastmlx" }
}

pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList { object: "list", data: vec![model(&state)] })
}

pub async fn get_one(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Model>, ApiError> {
    if id == state.model_id() {
        Ok(Json(model(&state)))
    } else {
        Err(ApiError::model_not_found(&id))
    }
}
