//! `GET /v1/models` and `GET /v1/models/{id}`: the loaded models, then every other local model
//! this build can load (a request naming one loads it).

use axum::extract::{Path, State};
use axum::Json;

use super::types::{Model, ModelList};
use crate::server::{ApiError, AppState};

fn model(id: &str, state: &AppState) -> Model {
    Model { id: id.to_string(), object: "model", created: state.created, owned_by: "fastmlx" }
}

fn ids(state: &AppState) -> Vec<String> {
    let mut ids: Vec<String> = state.models.loaded().into_iter().map(|m| m.id).collect();
    for local in state.models.catalog().list() {
        if local.summary.unloadable_reason.is_none() && !ids.contains(&local.id) {
            ids.push(local.id);
        }
    }
    ids
}

pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    let state2 = state.clone();
    let ids = tokio::task::spawn_blocking(move || ids(&state2)).await.unwrap_or_default();
    Json(ModelList { object: "list", data: ids.iter().map(|id| model(id, &state)).collect() })
}

pub async fn get_one(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Model>, ApiError> {
    let state2 = state.clone();
    let ids = tokio::task::spawn_blocking(move || ids(&state2)).await.unwrap_or_default();
    if ids.contains(&id) {
        Ok(Json(model(&id, &state)))
    } else {
        Err(ApiError::model_not_found(&id))
    }
}
