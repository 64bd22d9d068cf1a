//! DeepSeek-V3.1 (and V3.2's and R1-0528's templates): the calls of a turn between
//! `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each
//! `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`, all of them special tokens
//! of DeepSeek's vocabulary. Arguments are JSON, as vLLM's `deepseek_v31` parser reads them.

use super::lark::{json_rule, lark_string, marker, text_marker, CallSyntax};
use super::paired::PairedCalls;
use super::{CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};
use crate::server::chat::piece::ToolCall;

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    template.contains(CALLS_BEGIN).then(|| Box::new(DeepSeek) as Box<dyn ChatFormat>)
}

pub(super) struct DeepSeek;

impl ChatFormat for DeepSeek {
    fn name(&self) -> &'static str {
        "deepseek"
    }

    fn markers(&self) -> &'static [&'static str] {
        &[CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP]
    }

    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(PairedCalls::new(CALLS_BEGIN, CALLS_END, |body, _, _| parse_calls(body), schemas))
    }

    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.forced(spec, Some(SEP))))
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
                "{} {} {} {} {}",
                marker(spec, CALL_BEGIN),
                lark_string(&f.name),
                marker(spec, SEP),
                json_rule(&f.parameters)?,
                marker(spec, CALL_END)
            ))
        })
        .collect::<Result<Vec<String>, SchemaError>>()?;
    let call = format!("({})", calls.join(" | "));
    let more = if spec.parallel { format!("{call}*") } else { String::new() };
    Ok(CallSyntax {
        open_lark: marker(spec, CALLS_BEGIN),
        open_text: text_marker(spec, CALLS_BEGIN),
        body: format!("{call} {more} {}", marker(spec, CALLS_END)),
        separator: None,
        rules: String::new(),
    })
}

/// Every complete `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{..}<｜tool▁call▁end｜>` of a section.
fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find(CALL_BEGIN) {
        let after = &rest[at + CALL_BEGIN.len()..];
        let Some(end) = after.find(CALL_END) else { break };
        let (name, arguments) = after[..end].split_once(SEP)?;
        let arguments: serde_json::Value = serde_json::from_str(arguments.trim()).ok()?;
        calls.push(ToolCall { name: name.trim().to_string(), arguments: arguments.to_string() });
        rest = &after[end + CALL_END.len()..];
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;
    use crate::server::chat::piece::Piece;

    #[test]
    fn a_section_of_calls_reads_as_calls() {
        let text = "I will check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        // Cut inside markers (on character boundaries, as a detokenizer streams).
        let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).filter(|i| [16, 30, 95].contains(&(i / 4))).collect();
        let (a, b) = (cuts[0], cuts[cuts.len() - 1]);
        let out = read(&DeepSeek, &[&text[..a], &text[a..b], &text[b..]]);
        assert_eq!(
            out,
            vec![Piece::Text("I will check.".into()), call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]
        );
        let broken = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{not json<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(read(&DeepSeek, &[broken]), vec![Piece::Text(broken.into())], "what is not a call stays text");
    }
}
