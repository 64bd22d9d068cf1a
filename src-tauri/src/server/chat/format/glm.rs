//! GLM-4.5, 4.6 and 4.7 (`glm4_moe`): each call between `<tool_call>` and `</tool_call>`, the
//! function's name first, then its arguments as key and value tags:
//! `<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>`.
//! A value is text where the tool's schema says string, else JSON (or a Python literal, as
//! mlx-lm's `glm47` parser reads it), else text. A call written as a JSON object reads too.
//! Forced and strict calls are held to this syntax (the tags by id where they are special
//! tokens of the vocabulary, as in GLM's).

use serde_json::{Map, Value};

use super::hermes::{CLOSE, OPEN};
use super::lark::{lark_string, marker, text_marker, CallSyntax};
use super::paired::PairedCalls;
use super::xml_calls::{call_rules, ArgumentTags, NL};
use super::{call_from_value, CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};
use crate::server::chat::piece::ToolCall;

const KEY: (&str, &str) = ("<arg_key>", "</arg_key>");
const VALUE: (&str, &str) = ("<arg_value>", "</arg_value>");

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    template.contains(KEY.0).then(|| Box::new(Glm) as Box<dyn ChatFormat>)
}

pub(super) struct Glm;

impl ChatFormat for Glm {
    fn name(&self) -> &'static str {
        "glm"
    }

    fn markers(&self) -> &'static [&'static str] {
        &[OPEN, CLOSE, KEY.0, KEY.1, VALUE.0, VALUE.1]
    }

    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(PairedCalls::new(OPEN, CLOSE, |body, schemas, _| parse_call(body, schemas).map(|c| vec![c]), schemas))
    }

    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.forced(spec, None)))
    }

    fn strict_calls(&self, spec: &CallSpec) -> Option<Result<Grammar, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.strict(spec)))
    }
}

/// The function's name right after `<tool_call>`, each argument a key tag and a value tag.
const TAGS: ArgumentTags = ArgumentTags {
    function: |_, name| lark_string(name),
    function_close: |_| String::new(),
    parameter: |spec, key| {
        format!("{} {} {} {NL} {}", marker(spec, KEY.0), lark_string(key), marker(spec, KEY.1), marker(spec, VALUE.0))
    },
    value_close: VALUE.1,
};

fn syntax(spec: &CallSpec) -> Result<CallSyntax, SchemaError> {
    let (rules, calls) = call_rules(spec, &TAGS, "f")?;
    Ok(CallSyntax {
        open_lark: marker(spec, OPEN),
        open_text: text_marker(spec, OPEN),
        body: format!("{calls} {NL} {}", marker(spec, CLOSE)),
        separator: Some(NL.into()),
        rules,
    })
}

/// `name<arg_key>k</arg_key><arg_value>v</arg_value>..`, a bare `name`, or a JSON call.
fn parse_call(body: &str, schemas: &ParameterSchemas) -> Option<ToolCall> {
    let body = body.trim();
    if body.starts_with('{') {
        return call_from_value(&serde_json::from_str(body).ok()?);
    }
    let (name, mut rest) = body.split_once(KEY.0).map_or((body, ""), |(name, _)| (name, &body[name.len()..]));
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let schema = schemas.get(name);
    let mut arguments = Map::new();
    while !rest.trim().is_empty() {
        let key = between(&mut rest, KEY)?;
        let value = between(&mut rest, VALUE)?;
        let key = key.trim();
        let is_string = schema.and_then(|s| s.get(key)).and_then(|s| s.get("type")) == Some(&Value::from("string"));
        arguments.insert(key.to_string(), if is_string { Value::from(value.trim()) } else { typed(value.trim()) });
    }
    Some(ToolCall { name: name.to_string(), arguments: Value::Object(arguments).to_string() })
}

/// The text between the next `open` and `close` tags of `rest` (only whitespace before them),
/// `rest` moved past them.
fn between<'a>(rest: &mut &'a str, (open, close): (&str, &str)) -> Option<&'a str> {
    let after = rest.trim_start().strip_prefix(open)?;
    let (inside, after) = after.split_once(close)?;
    *rest = after;
    Some(inside)
}

/// A value the schema does not call a string: JSON, or Python's `True`/`False`/`None`, else text.
fn typed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| match text {
        "True" => Value::Bool(true),
        "False" => Value::Bool(false),
        "None" => Value::Null,
        _ => Value::from(text),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::super::{parameter_schemas, ModelFormat};
    use super::*;
    use crate::server::chat::piece::Piece;

    #[test]
    fn calls_split_across_tokens_with_values_typed_from_the_schema() {
        let template = "{{ '<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>";
        assert_eq!(ModelFormat::of_template(template).name(), "glm", "before Hermes: the template has <tool_call> too");
        let schemas = parameter_schemas(&[serde_json::json!({"type": "function", "function": {"name": "edit",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"}}}}})]);
        let mut reader = Glm.reader(schemas);
        let pieces = [
            "I will edit it.<tool_",
            "call>edit\n<arg_key>path</arg_key>\n<arg_value>42",
            "</arg_value>\n<arg_key>line</arg_key><arg_value>7</arg_value>\n<arg_key>dry</arg_key>",
            "<arg_value>True</arg_value>\n</tool_call><tool_call>noop</tool_call>",
        ];
        let mut out: Vec<Piece> = pieces.iter().flat_map(|t| reader.push(t)).collect();
        out.extend(reader.finish());
        assert_eq!(out[0], Piece::Text("I will edit it.".into()));
        let Piece::Call(edit) = &out[1] else { panic!("{out:?}") };
        assert_eq!(edit.name, "edit");
        let arguments: Value = serde_json::from_str(&edit.arguments).unwrap();
        assert_eq!(arguments, serde_json::json!({"path": "42", "line": 7, "dry": true}), "a string stays text");
        assert_eq!(out[2], call("noop", "{}"));
        // A JSON call reads; a body that is neither stays text, markers and all.
        assert_eq!(read(&Glm, &["<tool_call>{\"name\": \"w\", \"arguments\": {}}</tool_call>"]), [call("w", "{}")]);
        let broken = "<tool_call>edit<arg_key>path</arg_key>oops</tool_call>";
        assert_eq!(read(&Glm, &[broken]), [Piece::Text(broken.into())]);
    }
}
