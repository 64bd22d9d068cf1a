//! A model whose template knows no tool-call format (SmolLM2, Gemma 3): tools are still shown
//! to it when its template renders them, but nothing it writes is read as a call.

use super::{CallReader, ChatFormat, ParameterSchemas};
use crate::server::chat::piece::Piece;

pub(super) struct Plain;

impl ChatFormat for Plain {
    fn name(&self) -> &'static str {
        "plain"
    }

    fn markers(&self) -> &'static [&'static str] {
        &[]
    }

    fn writes_calls(&self) -> bool {
        false
    }

    fn reader(&self, _schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(Text)
    }
}

/// The answer as it comes.
struct Text;

impl CallReader for Text {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        vec![Piece::Text(text.to_string())]
    }

    fn finish(&mut self) -> Vec<Piece> {
        Vec::new()
    }
}
