//! Hermes style (Qwen 2.5/3, Qwen3-Next and most tool-tuned models): each call a JSON object in
//! `<tool_call>..</tool_call>`, possibly several, possibly after some text:
//! `<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>`.

use super::lark::{call_objects, json_rule, lark_string, CallSyntax};
use super::paired::PairedCalls;
use super::{call_from_value, CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};
use crate::server::chat::piece::ToolCall;

pub(super) const OPEN: &str = "<tool_call>";
pub(super) const CLOSE: &str = "</tool_call>";

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    template.contains(OPEN).then(|| Box::new(Hermes) as Box<dyn ChatFormat>)
}

pub(super) struct Hermes;

impl ChatFormat for Hermes {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn markers(&self) -> &'static [&'static str] {
        &[]
    }

    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(PairedCalls::new(OPEN, CLOSE, |body, _, _| parse_call(body).map(|c| vec![c]), schemas))
    }

    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.forced(spec, Some("\"arguments\""))))
    }

    fn strict_calls(&self, spec: &CallSpec) -> Option<Result<Grammar, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.strict(spec)))
    }
}

fn syntax(spec: &CallSpec) -> Result<CallSyntax, SchemaError> {
    Ok(CallSyntax {
        open_lark: lark_string(OPEN),
        open_text: Some(OPEN.into()),
        body: format!(
            "{} {} {}",
            lark_string("\n"),
            json_rule(&call_objects(spec.functions, "arguments"))?,
            lark_string("\n</tool_call>")
        ),
        separator: Some(lark_string("\n")),
        rules: String::new(),
    })
}

/// `{"name": .., "arguments" | "parameters": {..} | "<json text>"}`.
fn parse_call(text: &str) -> Option<ToolCall> {
    call_from_value(&serde_json::from_str(text.trim()).ok()?)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;
    use crate::server::chat::piece::Piece;

    #[test]
    fn calls_split_across_tokens() {
        let out = read(
            &Hermes,
            &[
                "Let me check.",
                "<tool",
                "_call>\n{\"name\": \"get_",
                "weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_",
                "call>",
            ],
        );
        assert_eq!(out, vec![Piece::Text("Let me check.".into()), call("get_weather", r#"{"city":"Paris"}"#)]);
    }

    #[test]
    fn several_calls_and_plain_text() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>";
        assert_eq!(read(&Hermes, &[text]), vec![call("a", "{}"), call("b", r#"{"x": 1}"#)]);
        assert_eq!(read(&Hermes, &["a < b ", "and <tool"]), vec![Piece::Text("a < b and <tool".into())]);
    }

    #[test]
    fn a_broken_call_stays_text() {
        let out = read(&Hermes, &["<tool_call>{not json</tool_call>"]);
        assert_eq!(out, vec![Piece::Text("<tool_call>{not json</tool_call>".into())]);
        let out = read(&Hermes, &["<tool_call>{\"name\": \"a\""]);
        assert_eq!(out, vec![Piece::Text("<tool_call>{\"name\": \"a\"".into())]);
    }
}
