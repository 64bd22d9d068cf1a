//! FastMLX: a local LLM server for Apple Silicon on MLX.
//!
//! Layers, each knowing only those below it:
//! - [`mlx`]: device and dtype choice, memory figures;
//! - [`model`]: architectures, weights, KV cache, loading from folders and GGUF files;
//! - [`fixtures`]: tiny models written for the tests and `make-test-model`;
//! - [`tokenizer`]: tokenizers, chat templates, streaming detokenization;
//! - [`sampling`]: token choice and stop strings;
//! - [`constrain`]: JSON and JSON Schema grammars for constrained decoding;
//! - [`generate`]: one prompt to text, single stream (the reference path);
//! - [`engine`]: the continuous-batching engine serving every caller at once;
//! - [`server`]: the OpenAI-compatible HTTP API over the engine;
//! - [`desktop`]: the menu-bar app (Tauri), a thin shell over the server;
//! - [`cli`]: the `fastmlx` command line; [`config_file`]: its settings file.

pub mod cli;
pub mod cluster;
pub mod config_file;
pub mod constrain;
pub mod desktop;
pub mod engine;
pub mod fixtures;
pub mod generate;
pub mod mlx;
pub mod model;
pub mod sampling;
pub mod server;
pub mod store;
pub mod tokenizer;
