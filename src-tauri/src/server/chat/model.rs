//! The model a chat request is for: served by the store (loaded now if it is not, which may
//! unload idle models to make room), with its engine's description and its chat format.

use std::sync::Arc;

use super::format::ModelFormat;
use crate::engine::ModelInfo;
use crate::server::{ApiError, AppState};
use crate::store::Served;

pub struct ChatModel {
    pub served: Served,
    pub info: ModelInfo,
    /// Its output format (resolved once per loaded model); plain for a model with no template.
    pub format: Arc<ModelFormat>,
}

/// The model `requested` names (aliases and `:latest` resolved; none: the model served now),
/// loading it if it is not loaded.
pub async fn serve(state: &AppState, requested: Option<&str>) -> Result<ChatModel, ApiError> {
    let served = state.models.serve(state.resolve_model(requested).as_deref()).await?;
    let info = served.engine.model_info().clone();
    let format = match &info.chat_template {
        Some(template) => state.formats.of(template),
        None => Arc::new(ModelFormat::plain()),
    };
    Ok(ChatModel { served, info, format })
}
