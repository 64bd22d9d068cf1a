//! The model store: models on disk (FastMLX's own folder, the Hugging Face cache, LM Studio's
//! folder), downloads from the Hugging Face Hub, and which models are loaded. The CLI, the admin
//! HTTP API and the desktop UI all go through it. Knows nothing of HTTP serving.

mod catalog;
mod discover;
pub mod download;
pub mod fit;
pub mod hub;
mod hub_shape;
mod human;
mod layout;
pub mod model_info;
mod model_kv;
mod pull;
mod quant_label;
pub mod recommended;
mod residency;
pub mod select;

pub use catalog::{Catalog, CatalogError};
pub use discover::{LocalModel, Source, MANIFEST};
pub use hub_shape::{HubShape, HubShapes};
pub use human::human_bytes;
pub use layout::StorePaths;
pub use model_kv::ModelKv;
pub use pull::{PullRequest, PullState, PullStatus, PullWatch, Pulls};
pub use residency::{
    estimated_weights_bytes, Awaited, LoadedStatus, Residency, ResidencyConfig, ResidencyError, Served,
};
