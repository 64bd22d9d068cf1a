//! Constrained decoding: the output must be JSON, JSON valid against a schema
//! (`response_format`, Ollama's `format`), or a tool call in the model's own format. A
//! [`Grammar`] (a schema or a Lark grammar) is compiled by llguidance against the model's
//! [`Vocabulary`]; [`TokenConstraint`] says which tokens may come next. Knows nothing of HTTP
//! or of the engine.

mod grammar;
mod json_layout;
mod token_constraint;
mod vocabulary;

pub use grammar::{Grammar, SchemaError};
pub use token_constraint::TokenConstraint;
pub use vocabulary::{Vocabulary, SPECIAL_MARKER};

#[cfg(test)]
mod tests;
