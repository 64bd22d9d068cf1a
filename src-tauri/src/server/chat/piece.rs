//! The parts an answer is read into while it streams, whatever the model's format: text,
//! reasoning, complete tool calls, and the arguments of the one call a named `tool_choice`
//! forces. Every dialect renders these.

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI sends them as a string).
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Reasoning(String),
    /// A complete tool call.
    Call(ToolCall),
    /// More of the arguments of the one call a named `tool_choice` forces.
    Arguments(String),
}

impl Piece {
    /// A text, reasoning or arguments piece with nothing in it (dropped before rendering).
    pub fn is_empty(&self) -> bool {
        matches!(self, Piece::Text(t) | Piece::Reasoning(t) | Piece::Arguments(t) if t.is_empty())
    }
}
