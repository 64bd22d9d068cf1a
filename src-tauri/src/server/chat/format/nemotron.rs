//! Nemotron-H and Nemotron Nano 2 (`<TOOLCALL>`): all of a turn's calls as one JSON list
//! between the markers, `<TOOLCALL>[{"name": "f", "arguments": {..}}, ..]</TOOLCALL>`. (Nemotron 3
//! writes Qwen's XML calls instead: its template is read as `qwen_xml`'s.)

use serde_json::json;

use super::lark::{call_objects, json_rule, marker, text_marker, CallSyntax};
use super::paired::PairedCalls;
use super::{parse_call_list, CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};

const OPEN: &str = "<TOOLCALL>";
const CLOSE: &str = "</TOOLCALL>";

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    template.contains(OPEN).then(|| Box::new(Nemotron) as Box<dyn ChatFormat>)
}

pub(super) struct Nemotron;

impl ChatFormat for Nemotron {
    fn name(&self) -> &'static str {
        "nemotron"
    }

    fn markers(&self) -> &'static [&'static str] {
        &[OPEN, CLOSE]
    }

    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(PairedCalls::new(OPEN, CLOSE, |body, _, _| parse_call_list(body), schemas))
    }

    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.forced(spec, Some("\"arguments\""))))
    }

    fn strict_calls(&self, spec: &CallSpec) -> Option<Result<Grammar, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.strict(spec)))
    }
}

/// One list holds every call (one call unless parallel calls are allowed).
fn syntax(spec: &CallSpec) -> Result<CallSyntax, SchemaError> {
    let mut list = json!({"type": "array", "items": call_objects(spec.functions, "arguments"), "minItems": 1});
    if !spec.parallel {
        list["maxItems"] = json!(1);
    }
    Ok(CallSyntax {
        open_lark: marker(spec, OPEN),
        open_text: text_marker(spec, OPEN),
        body: format!("{} {}", json_rule(&list)?, marker(spec, CLOSE)),
        separator: None,
        rules: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;
    use crate::server::chat::piece::Piece;

    #[test]
    fn a_list_of_calls_split_across_tokens() {
        let out = read(
            &Nemotron,
            &[
                "Checking both.\n<TOOL",
                "CALL>[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, ",
                "{\"name\": \"b\", \"arguments\": {}}]</TOOLCALL>",
            ],
        );
        assert_eq!(out, vec![Piece::Text("Checking both.\n".into()), call("a", r#"{"x":1}"#), call("b", "{}")]);
    }

    #[test]
    fn what_is_not_a_list_of_calls_stays_text() {
        let out = read(&Nemotron, &["<TOOLCALL>{\"name\": \"a\"}</TOOLCALL>"]);
        assert_eq!(out, vec![Piece::Text("<TOOLCALL>{\"name\": \"a\"}</TOOLCALL>".into())]);
        let out = read(&Nemotron, &["<TOOLCALL>[]</TOOLCALL>"]);
        assert_eq!(out, vec![Piece::Text("<TOOLCALL>[]</TOOLCALL>".into())]);
        // Cut off by the length limit inside the list: text, as the model left it.
        let out = read(&Nemotron, &["<TOOLCALL>[{\"name\": \"a\", \"argu"]);
        assert_eq!(out, vec![Piece::Text("<TOOLCALL>[{\"name\": \"a\", \"argu".into())]);
    }
}
