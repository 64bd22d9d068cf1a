//! `GET /v1/models` and `GET /v1/models/{id}`: the loaded models, then every other local model
//! this build can load (a request naming one loads it).

use axum::extract::{Path, State};
use axum::Json;

use super::types::{Model, ModelList};
use crate::model::ModelKind;
use crate::server::{ApiError, AppState};

fn model((id, kind, vision): &(String, ModelKind, bool), state: &AppState) -> Model {
    Model {
        id: id.clone(),
        object: "model",
        created: state.created,
        owned_by: "fastmlx",
        kind: kind.as_str(),
        vision: *vision,
    }
}

/// The loaded models, then the loadable ones, each with its kind and whether it reads images.
fn ids(state: &AppState) -> Vec<(String, ModelKind, bool)> {
    let engines = state.models.engines();
    let sees = |id: &str| engines.iter().any(|s| s.id == id && s.engine.model_info().vision.is_some());
    let mut ids: Vec<(String, ModelKind, bool)> =
        state.models.loaded().into_iter().map(|m| (m.id.clone(), m.kind, sees(&m.id))).collect();
    for local in state.models.catalog().list() {
        if local.summary.unloadable_reason.is_none() && !ids.iter().any(|(id, _, _)| *id == local.id) {
            ids.push((local.id, local.summary.kind, local.summary.vision));
        }
    }
    ids
}

pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    let state2 = state.clone();
    let ids = tokio::task::spawn_blocking(move || ids(&state2)).await.unwrap_or_default();
    Json(ModelList { object: "list", data: ids.iter().map(|m| model(m, &state)).collect() })
}

pub async fn get_one(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Model>, ApiError> {
    let state2 = state.clone();
    let ids = tokio::task::spawn_blocking(move || ids(&state2)).await.unwrap_or_default();
    match ids.iter().find(|(i, _, _)| *i == id) {
        Some(found) => Ok(Json(model(found, &state))),
        None => Err(ApiError::model_not_found(&id)),
    }
}
