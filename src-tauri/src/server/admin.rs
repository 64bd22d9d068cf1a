//! `/admin/...`: the model store over HTTP, for the desktop UI and scripts. Same security as the
//! rest of the API (Host allow-list, API key). List, search the Hub, pull (progress as
//! server-sent events), cancel, delete, load, unload, status.

use std::collections::HashSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::extract::{parse, ApiJson, ApiQuery};
use super::{ApiError, AppState};
use crate::engine::memory::ServingPlan;
use crate::store::fit::hub_estimate;
use crate::store::hub::SearchHit;
use crate::store::model_info::{self, ModelInfo};
use crate::store::recommended::{ForThisMachine, RecommendedList};
use crate::store::{CatalogError, LocalModel, PullRequest, PullStatus, PullWatch};

#[derive(Serialize)]
struct ModelEntry {
    #[serde(flatten)]
    model: LocalModel,
    loaded: bool,
    /// What it serves under the server's ceiling: context for four requests at once, the badge.
    plan: Option<ServingPlan>,
}

pub async fn list(State(state): State<AppState>) -> Json<Vec<Value>> {
    let loaded: Vec<String> = state.models.loaded().into_iter().map(|m| m.id).collect();
    let residency = state.models.clone();
    let entries = tokio::task::spawn_blocking(move || {
        residency
            .local_models()
            .into_iter()
            .map(|m| ModelEntry { loaded: loaded.contains(&m.id), plan: residency.plan_for(&m), model: m })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    Json(entries.into_iter().map(|e| json!(e)).collect())
}

pub async fn status(State(state): State<AppState>) -> Json<Value> {
    let memory = crate::mlx::memory_stats();
    Json(json!({
        "loaded": state.models.loaded(),
        // A model split across a cluster that is forming (or forming again after a fault).
        "waiting": state.models.awaited(),
        "memory_budget_bytes": state.models.memory_budget(),
        "machine_memory_bytes": crate::mlx::total_memory_bytes(),
        "mlx_active_bytes": memory.active,
        "mlx_cache_bytes": memory.cache,
        "pulls": state.pulls.list(),
    }))
}

#[derive(Deserialize)]
struct ModelRequest {
    model: String,
    /// Seconds without requests before it unloads (default: the server's setting).
    keep_alive: Option<u64>,
}

pub async fn load(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Json<Value>, ApiError> {
    let request: ModelRequest = parse(&body)?;
    // Any kind: an embedding model or reranker loads beside the chat model.
    state.models.load_any(&request.model, request.keep_alive.map(Duration::from_secs)).await?;
    let status = state.models.loaded().into_iter().find(|m| m.id == request.model);
    Ok(Json(json!(status)))
}

pub async fn unload(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Json<Value>, ApiError> {
    let request: ModelRequest = parse(&body)?;
    state.models.unload(&request.model).await?;
    Ok(Json(json!({"unloaded": request.model})))
}

/// Rank 0 of a cluster: take the machines it serves without that are back in now (it starts
/// again across them, answering 503 while the model loads), rather than when it is idle or never
/// (`--take-back asked`).
pub async fn take_back(State(state): State<AppState>) -> Result<(StatusCode, Json<Value>), ApiError> {
    match state.models.ask_take_back() {
        Ok(machines) => Ok((StatusCode::ACCEPTED, Json(json!({"taking_back": machines})))),
        Err(why) => Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", why)),
    }
}

#[derive(Deserialize)]
pub struct DeleteQuery {
    #[serde(default)]
    force: bool,
}

pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> Result<Json<Value>, ApiError> {
    if state.models.loaded().iter().any(|m| m.id == id) {
        state.models.unload(&id).await?;
    }
    let catalog = state.models.catalog().clone();
    let id2 = id.clone();
    let removed = tokio::task::spawn_blocking(move || catalog.delete(&id2, q.force))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    match removed {
        Ok(path) => Ok(Json(json!({"deleted": id, "path": path}))),
        Err(CatalogError::NotFound(id)) => Err(ApiError::model_not_found(&id)),
        Err(e @ CatalogError::NotOwned { .. }) => {
            Err(ApiError::new(StatusCode::FORBIDDEN, "permission_error", e.to_string()))
        }
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

#[derive(Deserialize)]
pub struct SearchQuery {
    q: String,
    limit: Option<usize>,
    /// Every library, not only MLX models.
    #[serde(default)]
    all: bool,
}

#[derive(Serialize)]
pub struct SearchResult {
    #[serde(flatten)]
    hit: SearchHit,
    /// Memory it would take here, if the Hub reports its size.
    memory_needed_bytes: Option<u64>,
    /// "fits", "tight" or "too big" under the server's memory ceiling: from `plan` when there
    /// is one, else from the size alone.
    fit: Option<&'static str>,
    /// Its `config.json`'s model type, when the Hub has the file.
    model_type: Option<String>,
    /// Why FastMLX cannot load it, when its config says so.
    unsupported: Option<String>,
    /// What it would serve here (as for a model on disk), from its config and size.
    plan: Option<ServingPlan>,
}

pub async fn search(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<SearchQuery>,
) -> Result<Json<Vec<SearchResult>>, ApiError> {
    let limit = q.limit.unwrap_or(20).clamp(1, 100);
    let hits = state.pulls.hub().search(&q.q, limit, !q.all).await.map_err(hub_error)?;
    let shapes = state.hub_shapes.of(state.pulls.hub(), &hits).await;
    let ceiling = state.models.memory_budget();
    let max_batch = state.models.config().engine.max_batch;
    let results = hits
        .into_iter()
        .zip(shapes)
        .map(|(hit, shape)| {
            let estimate = hub_estimate(hit.storage_bytes, shape.as_deref(), ceiling, max_batch);
            SearchResult {
                memory_needed_bytes: estimate.needed,
                fit: estimate.fit,
                model_type: shape.as_ref().and_then(|s| s.model_type.clone()),
                unsupported: shape.as_ref().and_then(|s| s.config.as_ref().err().cloned()),
                plan: estimate.plan,
                hit,
            }
        })
        .collect();
    Ok(Json(results))
}

#[derive(Deserialize)]
pub struct RecommendedQuery {
    /// Plan for a Mac with this much memory instead of this one ("what would fit if I bought..."):
    /// its usable share, as FastMLX's default ceiling would take it there.
    machine_gb: Option<u32>,
}

/// The most memory a Mac is asked about: 512 GB is the largest Mac Studio; twice that leaves room.
const MAX_MACHINE_GB: u32 = 1024;

/// Discover's opening list: the recommended models, with what each would take and serve on
/// this machine (or a Mac with `machine_gb`), and which are on disk already. Read at each request
/// (a list named by `FASTMLX_RECOMMENDED` can be edited while the server runs); needs no network.
pub async fn recommended(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<RecommendedQuery>,
) -> Result<Json<ForThisMachine>, ApiError> {
    let ceiling = match query.machine_gb {
        Some(gb @ 1..=MAX_MACHINE_GB) => Some(crate::mlx::usable_share(u64::from(gb) << 30)),
        Some(gb) => {
            return Err(ApiError::invalid(
                "machine_gb",
                format!("machine_gb must be between 1 and {MAX_MACHINE_GB} (GB of memory), not {gb}"),
            ))
        }
        None => None,
    };
    let residency = state.models.clone();
    tokio::task::spawn_blocking(move || {
        let list = RecommendedList::from_env().map_err(ApiError::internal)?;
        let local: HashSet<String> = residency.local_models().into_iter().map(|m| m.id).collect();
        let max_batch = residency.config().engine.max_batch;
        let ceiling = ceiling.unwrap_or_else(|| residency.memory_budget());
        Ok(Json(list.for_this_machine(ceiling, max_batch, &local)))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
}

#[derive(Deserialize)]
pub struct InfoQuery {
    /// A model on disk (its catalog id)...
    id: Option<String>,
    /// ...or a repo on the Hub.
    repo: Option<String>,
}

/// A model's page: its card, config summary, files and what it takes and serves here.
pub async fn model_info(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<InfoQuery>,
) -> Result<Json<ModelInfo>, ApiError> {
    match (q.id, q.repo) {
        (Some(id), None) => {
            let residency = state.models.clone();
            tokio::task::spawn_blocking(move || {
                let model = residency.find_local(&id).map_err(|_| ApiError::model_not_found(&id))?;
                let plan = residency.plan_for(&model);
                Ok(Json(model_info::local(&model, plan)))
            })
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
        }
        (None, Some(repo)) => {
            if !is_repo_id(&repo) {
                return Err(ApiError::invalid(
                    "repo",
                    "repo must be a Hugging Face id like mlx-community/Qwen3-4B-4bit",
                ));
            }
            let (ceiling, max_batch) = (state.models.memory_budget(), state.models.config().engine.max_batch);
            let info = model_info::hub(state.pulls.hub(), &repo, ceiling, max_batch).await.map_err(hub_error)?;
            Ok(Json(info))
        }
        _ => Err(ApiError::invalid("id", "give id (a model on disk) or repo (a Hub repo), one of the two")),
    }
}

/// `org/name`, neither part empty nor a path step.
fn is_repo_id(repo: &str) -> bool {
    repo.split('/').count() == 2 && !repo.split('/').any(|p| p.is_empty() || p == "." || p == "..")
}

/// Whether the Hub can be reached from here (Discover tells an offline user that downloading
/// needs a connection, and still shows the list).
pub async fn hub_status(State(state): State<AppState>) -> Json<Value> {
    let hub = state.pulls.hub();
    let reached = hub.reachable(Duration::from_secs(4)).await;
    Json(json!({"endpoint": hub.endpoint(), "reachable": reached.is_ok(), "error": reached.err()}))
}

#[derive(Deserialize)]
struct PullBody {
    repo: String,
    revision: Option<String>,
    gguf: Option<String>,
}

/// Starts (or joins) a pull and streams its status until it ends. Leaving the stream does not
/// cancel the download: `POST /admin/pull/cancel` does.
pub async fn pull(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response, ApiError> {
    let body: PullBody = parse(&body)?;
    if !is_repo_id(&body.repo) {
        return Err(ApiError::invalid(
            "repo",
            "repo must be a Hugging Face id like mlx-community/Qwen2.5-0.5B-Instruct-4bit",
        ));
    }
    let watch = state.pulls.start(PullRequest {
        repo: body.repo,
        revision: body.revision.unwrap_or_else(|| "main".into()),
        gguf: body.gguf,
    });
    Ok(Sse::new(pull_events(watch))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(5)).text("keepalive"))
        .into_response())
}

/// A status event at most every 250 ms while it runs, then the final one.
fn pull_events(watch: PullWatch) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures_util::stream::unfold(Some(watch), |watch| async move {
        let mut watch = watch?;
        let status: PullStatus = watch.status();
        let event = SseEvent::default().data(serde_json::to_string(&status).unwrap_or_default());
        if status.state.is_finished() {
            return Some((Ok(event), None));
        }
        tokio::select! {
            _ = watch.state.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        Some((Ok(event), Some(watch)))
    })
}

pub async fn cancel_pull(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    let body: PullBody = parse(&body)?;
    if state.pulls.cancel(&body.repo) {
        Ok(Json(json!({"cancelled": body.repo})))
    } else {
        Err(ApiError::new(StatusCode::NOT_FOUND, "not_found_error", format!("no pull of {} is running", body.repo)))
    }
}

pub async fn pulls(State(state): State<AppState>) -> Json<Vec<PullStatus>> {
    Json(state.pulls.list())
}

fn hub_error(e: crate::store::hub::HubError) -> ApiError {
    use crate::store::hub::HubError;
    let status = match e {
        HubError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
        HubError::Forbidden { .. } => StatusCode::FORBIDDEN,
        HubError::NotFound { .. } => StatusCode::NOT_FOUND,
        HubError::Selection { .. } | HubError::BadEndpoint { .. } => StatusCode::BAD_REQUEST,
        HubError::DiskFull { .. } => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::BAD_GATEWAY,
    };
    ApiError::new(status, "hub_error", e.to_string())
}
