//! Constrained decoding: the output must be JSON, or JSON valid against a schema
//! (`response_format`, forced tool calls). A [`Grammar`] compiled from the schema is matched byte
//! by byte ([`Matcher`]); [`TokenConstraint`] turns that into which tokens may come next.
//! Knows nothing of HTTP or of the engine.

mod grammar;
mod matcher;
mod token_constraint;

pub use grammar::{Grammar, SchemaError};
pub use matcher::Matcher;
pub use token_constraint::TokenConstraint;

#[cfg(test)]
mod tests;
