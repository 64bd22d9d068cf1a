//! Kimi K2: the calls of a turn between `<|tool_calls_section_begin|>` and
//! `<|tool_calls_section_end|>`, each `<|tool_call_begin|>functions.name:index
//! <|tool_call_argument_begin|>{json}<|tool_call_end|>` (special tokens of Kimi's vocabulary; the
//! index counts the calls of the conversation). Arguments are JSON, or a Python literal as mlx-lm's
//! `kimi_k2` parser also reads.

use serde_json::Value;

use super::lark::{json_rule, lark_string, marker, text_marker, CallSyntax};
use super::paired::PairedCalls;
use super::{CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};
use crate::server::chat::piece::ToolCall;

const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const SECTION_END: &str = "<|tool_calls_section_end|>";
const CALL_BEGIN: &str = "<|tool_call_begin|>";
const ARGUMENTS: &str = "<|tool_call_argument_begin|>";
const CALL_END: &str = "<|tool_call_end|>";

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    template.contains(SECTION_BEGIN).then(|| Box::new(Kimi) as Box<dyn ChatFormat>)
}

pub(super) struct Kimi;

impl ChatFormat for Kimi {
    fn name(&self) -> &'static str {
        "kimi"
    }

    fn markers(&self) -> &'static [&'static str] {
        &[SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENTS, CALL_END]
    }

    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(PairedCalls::new(SECTION_BEGIN, SECTION_END, |body, _, _| parse_calls(body), schemas))
    }

    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.forced(spec, Some(ARGUMENTS))))
    }

    fn strict_calls(&self, spec: &CallSpec) -> Option<Result<Grammar, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.strict(spec)))
    }
}

fn syntax(spec: &CallSpec) -> Result<CallSyntax, SchemaError> {
    let calls = spec
        .functions
        .iter()
        .map(|f| {
            Ok(format!(
                "{} {} INDEX {} {} {}",
                marker(spec, CALL_BEGIN),
                lark_string(&format!("functions.{}:", f.name)),
                marker(spec, ARGUMENTS),
                json_rule(&f.parameters)?,
                marker(spec, CALL_END)
            ))
        })
        .collect::<Result<Vec<String>, SchemaError>>()?;
    let call = format!("({})", calls.join(" | "));
    let more = if spec.parallel { format!("{call}*") } else { String::new() };
    Ok(CallSyntax {
        open_lark: marker(spec, SECTION_BEGIN),
        open_text: text_marker(spec, SECTION_BEGIN),
        body: format!("{call} {more} {}", marker(spec, SECTION_END)),
        separator: None,
        rules: "INDEX: /[0-9]{1,4}/\n".into(),
    })
}

/// Every complete call of a section: `functions.name:0` (or a bare `name:0`), then its arguments.
fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find(CALL_BEGIN) {
        let after = &rest[at + CALL_BEGIN.len()..];
        let Some(end) = after.find(CALL_END) else { break };
        let (id, arguments) = after[..end].split_once(ARGUMENTS)?;
        let id = id.trim();
        let name = id.rsplit_once(':').map_or(id, |(name, _)| name);
        let name = name.strip_prefix("functions.").unwrap_or(name);
        calls.push(ToolCall { name: name.to_string(), arguments: arguments_of(arguments.trim())?.to_string() });
        rest = &after[end + CALL_END.len()..];
    }
    (!calls.is_empty()).then_some(calls)
}

/// JSON arguments, or Python's `True` / `False` / `None` and quotes where JSON has its own.
fn arguments_of(text: &str) -> Option<Value> {
    serde_json::from_str(text).ok().or_else(|| {
        let json = text.replace("True", "true").replace("False", "false").replace("None", "null").replace('\'', "\"");
        serde_json::from_str(&json).ok()
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;
    use crate::server::chat::piece::Piece;

    #[test]
    fn a_section_of_calls_reads_as_calls() {
        let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{'zone': 'UTC', 'dst': True}<|tool_call_end|><|tool_calls_section_end|>";
        let out = read(&Kimi, &[&text[..40], &text[40..]]);
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Paris"}"#), call("get_time", r#"{"zone":"UTC","dst":true}"#)]);
        let cut = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0";
        assert_eq!(read(&Kimi, &[cut]), vec![Piece::Text(cut.into())]);
    }
}
