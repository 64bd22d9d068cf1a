//! Models: architectures, the shared transformer, and loading from disk.

pub mod arch;
pub mod cache;
pub mod checkpoint;
pub mod config;
pub mod encoder;
pub mod error;
pub mod json;
mod kernels;
pub mod layers;
pub mod load;
pub mod transformer;
pub mod vision;
pub mod weights;

pub use cache::{BatchKvCache, KvCache, KvFootprint, KvFormat, KvQuant, KvTensor, LayerCache, Positions};
pub use config::{Arch, ModelConfig};
pub use error::ModelError;
pub use load::{
    build_unread, config_from_json, inspect, load_model, load_model_split, load_model_with, read_config, LoadOptions,
    LoadedModel, ModelKind, ModelSummary, WeightFormat,
};
pub use transformer::{Stage, SumClock, Transformer};
