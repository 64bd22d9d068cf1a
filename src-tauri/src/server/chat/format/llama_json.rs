//! Llama 3.x JSON tool calling: the whole answer is `{"name": .., "parameters": {..}}`, maybe
//! after the special token `<|python_tag|>`, several calls separated by `;`. An answer that does
//! not start like one is text.

use serde_json::Value;

use super::lark::{call_objects, json_rule, lark_string};
use super::{call_from_value, CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};
use crate::server::chat::piece::{Piece, ToolCall};

const PYTHON_TAG: &str = "<|python_tag|>";

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    let llama = template.contains(PYTHON_TAG) || template.contains("\"parameters\"") || template.contains("ipython");
    llama.then(|| Box::new(LlamaJson) as Box<dyn ChatFormat>)
}

pub(super) struct LlamaJson;

impl ChatFormat for LlamaJson {
    fn name(&self) -> &'static str {
        "llama-json"
    }

    fn markers(&self) -> &'static [&'static str] {
        &[PYTHON_TAG]
    }

    fn reader(&self, _schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(Reader { pending: String::new(), in_call: false, at_start: true })
    }

    /// Llama 3.1-3.3 with custom tools: a bare JSON object, `parameters` for the arguments.
    /// (No strict form: a call is the whole answer, so there is no free text to allow.)
    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        let build = || -> Result<ForcedCalls, SchemaError> {
            let call = json_rule(&call_objects(spec.functions, "parameters"))?;
            let start = if spec.parallel { format!("call ({} call)*", lark_string("; ")) } else { "call".into() };
            let grammar = Grammar::from_lark(format!("start: {start}\ncall: {call}\n"), true)?;
            Ok(ForcedCalls { grammar, arguments_after: spec.named.then(|| "\"parameters\"".to_string()) })
        };
        Some(build())
    }
}

struct Reader {
    pending: String,
    in_call: bool,
    /// Whether the answer so far is all whitespace (a call may still start).
    at_start: bool,
}

impl CallReader for Reader {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        if self.at_start {
            let trimmed = self.pending.trim_start();
            if trimmed.is_empty() || PYTHON_TAG.starts_with(trimmed) && trimmed.len() < PYTHON_TAG.len() {
                return Vec::new();
            }
            self.at_start = false;
            if trimmed.starts_with('{') || trimmed.starts_with(PYTHON_TAG) {
                // Possibly a call: read to the end (a short JSON object) before deciding.
                self.in_call = true;
                return Vec::new();
            }
        }
        if self.in_call {
            return Vec::new();
        }
        vec![Piece::Text(std::mem::take(&mut self.pending))]
    }

    fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        if rest.is_empty() {
            return Vec::new();
        }
        let body = rest.trim_start().trim_start_matches(PYTHON_TAG);
        match self.in_call.then(|| parse_calls(body)).flatten() {
            Some(calls) => calls.into_iter().map(Piece::Call).collect(),
            None => vec![Piece::Text(body.to_string())],
        }
    }
}

/// One or more JSON calls separated by `;`.
fn parse_calls(text: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(|c: char| c == ';' || c.is_whitespace());
        if rest.is_empty() {
            break;
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        calls.push(call_from_value(&value)?);
        rest = &rest[values.byte_offset()..];
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;

    #[test]
    fn a_json_call_or_text() {
        let out = read(&LlamaJson, &[" {\"name\": \"get_weather\", ", "\"parameters\": {\"city\": \"Oslo\"}}"]);
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Oslo"}"#)]);
        assert_eq!(read(&LlamaJson, &["Hello", " there"]), vec![Piece::Text("Hello there".into())]);
        assert_eq!(read(&LlamaJson, &["{curly} words"]), vec![Piece::Text("{curly} words".into())]);
    }

    #[test]
    fn the_python_tag_and_several_calls() {
        let out = read(
            &LlamaJson,
            &[
                "<|python",
                "_tag|>",
                "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
            ],
        );
        assert_eq!(out, vec![call("a", r#"{"x":1}"#), call("b", "{}")]);
        let out = read(&LlamaJson, &["<|python_tag|>", "brave_search.call(query=\"x\")"]);
        assert_eq!(out, vec![Piece::Text("brave_search.call(query=\"x\")".into())]);
    }
}
