//! Models: architectures, the shared transformer, and loading from disk.

pub mod arch;
pub mod batch_cache;
pub mod cache;
pub mod config;
pub mod error;
pub mod kv_cache;
pub mod layers;
pub mod load;
pub mod scripted;
pub mod synthetic;
mod synthetic_gemma4;
mod synthetic_hybrid;
pub mod transformer;
pub mod weights;

pub use batch_cache::BatchKvCache;
pub use cache::{LayerCache, Positions};
pub use config::{Arch, ModelConfig};
pub use error::ModelError;
pub use kv_cache::{KvCache, KvFootprint};
pub use load::{inspect, load_model, load_model_with, LoadOptions, LoadedModel, ModelSummary, WeightFormat};
pub use transformer::Transformer;
