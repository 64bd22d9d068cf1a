//! FastMLX: a local LLM server for Apple Silicon on MLX.
//!
//! Layers, each knowing only those below it:
//! - [`mlx`]: device and dtype choice, memory figures;
//! - [`model`]: architectures, weights, KV cache, loading from folders and GGUF files;
//! - [`tokenizer`]: tokenizers, chat templates, streaming detokenization;
//! - [`sampling`]: token choice and stop strings;
//! - [`generate`]: one prompt to text, used by the CLI (the batching engine comes next);
//! - [`cli`]: the `fastmlx` command line.

pub mod cli;
pub mod generate;
pub mod mlx;
pub mod model;
pub mod sampling;
pub mod tokenizer;
