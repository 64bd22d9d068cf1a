//! MiniMax-M2: the calls of one turn in one `<minimax:tool_call>` block, each an `<invoke>` with
//! its parameters tagged one by one:
//! `<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n
//! </invoke>\n</minimax:tool_call>`. Values are typed from the tool's JSON Schema as mlx-lm's
//! `minimax_m2` parser types them (integer, number, boolean, JSON objects and arrays, else the
//! text; `null` is null; a parameter the schema does not name stays text). The model thinks in
//! `<think>` first (its template opens the thought).

use serde_json::{Map, Value};

use super::lark::{lark_string, marker, text_marker, CallSyntax};
use super::paired::PairedCalls;
use super::xml_calls::{call_rules, ArgumentTags, NL};
use super::{CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};
use crate::server::chat::piece::ToolCall;

const OPEN: &str = "<minimax:tool_call>";
const CLOSE: &str = "</minimax:tool_call>";

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    template.contains(OPEN).then(|| Box::new(MiniMax) as Box<dyn ChatFormat>)
}

pub(super) struct MiniMax;

impl ChatFormat for MiniMax {
    fn name(&self) -> &'static str {
        "minimax"
    }

    fn markers(&self) -> &'static [&'static str] {
        &[OPEN, CLOSE]
    }

    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        // A block cut short keeps the invocations it completed; none: it stays text.
        Box::new(PairedCalls::new(OPEN, CLOSE, |body, schemas, _| parse_block(body, schemas), schemas))
    }

    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.forced(spec, None)))
    }

    fn strict_calls(&self, spec: &CallSpec) -> Option<Result<Grammar, SchemaError>> {
        Some(syntax(spec).and_then(|s| s.strict(spec)))
    }
}

const TAGS: ArgumentTags = ArgumentTags {
    function: |_, name| lark_string(&format!("<invoke name=\"{name}\">")),
    function_close: |_| lark_string("</invoke>"),
    parameter: |_, key| lark_string(&format!("<parameter name=\"{key}\">")),
    value_close: "</parameter>",
};

/// One block: its invocations one after another (several only when parallel calls are allowed).
fn syntax(spec: &CallSpec) -> Result<CallSyntax, SchemaError> {
    let (rules, invoke) = call_rules(spec, &TAGS, "f")?;
    let more = if spec.parallel { format!("({NL} {invoke})*") } else { String::new() };
    Ok(CallSyntax {
        open_lark: marker(spec, OPEN),
        open_text: text_marker(spec, OPEN),
        body: format!("{NL} {invoke} {more} {NL} {}", marker(spec, CLOSE)),
        separator: None,
        rules,
    })
}

/// Every complete `<invoke name=..>..</invoke>` of a block.
fn parse_block(body: &str, schemas: &ParameterSchemas) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find("<invoke name=") {
        let after = &rest[at + "<invoke name=".len()..];
        let Some(end) = after.find("</invoke>") else { break };
        calls.extend(parse_invoke(&after[..end], schemas));
        rest = &after[end + "</invoke>".len()..];
    }
    (!calls.is_empty()).then_some(calls)
}

/// `"name">` then `<parameter name="key">value</parameter>`s.
fn parse_invoke(text: &str, schemas: &ParameterSchemas) -> Option<ToolCall> {
    let (name, mut rest) = text.split_once('>')?;
    let name = unquote(name);
    if name.is_empty() {
        return None;
    }
    let schema = schemas.get(name);
    let mut arguments = Map::new();
    while let Some(at) = rest.find("<parameter name=") {
        let after = &rest[at + "<parameter name=".len()..];
        let (key, after) = after.split_once('>')?;
        let end = after.find("</parameter>").unwrap_or(after.len());
        let raw = after[..end].trim();
        let key = unquote(key);
        arguments.insert(key.to_string(), typed(raw, schema.and_then(|s| s.get(key))));
        rest = after.get(end + "</parameter>".len()..).unwrap_or("");
    }
    Some(ToolCall { name: name.to_string(), arguments: Value::Object(arguments).to_string() })
}

/// A tag's attribute value without its quotes.
fn unquote(text: &str) -> &str {
    let text = text.trim();
    ['"', '\''].iter().find_map(|q| text.strip_prefix(*q).and_then(|t| t.strip_suffix(*q))).unwrap_or(text)
}

/// The types a parameter's schema allows (`type`, a list of them, `enum` values, `anyOf` /
/// `oneOf` / `allOf`), text when it names none.
fn types_of(schema: Option<&Value>) -> Vec<String> {
    let mut out = Vec::new();
    let Some(schema) = schema.and_then(Value::as_object) else { return vec!["string".into()] };
    match schema.get("type") {
        Some(Value::String(t)) => out.push(t.clone()),
        Some(Value::Array(list)) => out.extend(list.iter().filter_map(Value::as_str).map(str::to_string)),
        _ => {}
    }
    for value in schema.get("enum").and_then(Value::as_array).into_iter().flatten() {
        out.push(
            match value {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_f64() => "number",
                Value::Number(_) => "integer",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            }
            .into(),
        );
    }
    for choice in ["anyOf", "oneOf", "allOf"] {
        for option in schema.get(choice).and_then(Value::as_array).into_iter().flatten() {
            out.extend(types_of(Some(option)));
        }
    }
    if out.is_empty() {
        out.push("string".into());
    }
    out
}

/// A value's text as its schema's types read it, in mlx-lm's order of preference.
fn typed(raw: &str, schema: Option<&Value>) -> Value {
    if raw.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let types = types_of(schema);
    let has = |t: &str| types.iter().any(|x| x.eq_ignore_ascii_case(t));
    if has("null") && ["none", "nil"].contains(&raw.to_ascii_lowercase().as_str()) {
        return Value::Null;
    }
    for t in ["integer", "number", "boolean", "object", "string"] {
        match t {
            "integer" if has("integer") || has("int") => {
                if let Ok(n) = raw.parse::<i64>() {
                    return Value::from(n);
                }
            }
            "number" if has("number") || has("float") => {
                if let Ok(x) = raw.parse::<f64>() {
                    // A whole number reads as an integer, as the reference's `int(val)` check.
                    return if x.fract() == 0.0 && x.abs() < 9.0e15 { Value::from(x as i64) } else { Value::from(x) };
                }
            }
            "boolean" if has("boolean") || has("bool") => match raw.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => return Value::Bool(true),
                "false" | "0" | "no" | "off" => return Value::Bool(false),
                _ => {}
            },
            "object" if has("object") || has("array") => {
                if let Ok(v) = serde_json::from_str::<Value>(raw) {
                    return v;
                }
            }
            "string" if has("string") || has("str") || has("text") => return Value::from(raw),
            _ => {}
        }
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::from(raw))
}

#[cfg(test)]
mod tests {
    use super::super::parameter_schemas;
    use super::super::tests::{call, read};
    use super::*;

    #[test]
    fn a_block_of_invocations_reads_as_calls_typed_from_the_schema() {
        let schemas = parameter_schemas(&[serde_json::json!({"type": "function", "function": {"name": "edit",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"},
            "dry": {"type": "boolean"}, "opts": {"type": "object"}, "ratio": {"type": ["number", "null"]}}}}})]);
        let mut reader = MiniMax.reader(schemas);
        let pieces = [
            "I will edit it.\n<minimax:tool_",
            "call>\n<invoke name=\"edit\">\n<parameter name=\"path\">src/main.rs</parameter>\n",
            "<parameter name=\"line\">42</parameter>\n<parameter name=\"dry\">False</parameter>\n",
            "<parameter name=\"opts\">{\"a\": [1]}</parameter>\n<parameter name=\"ratio\">2.0</parameter>\n</invoke>\n",
            "<invoke name=\"edit\">\n<parameter name=\"path\">007</parameter>\n<parameter name=\"x\">12</parameter>\n</invoke>\n",
            "</minimax:tool_call>",
        ];
        let mut out: Vec<_> = pieces.iter().flat_map(|t| reader.push(t)).collect();
        out.extend(reader.finish());
        assert_eq!(out[0], crate::server::chat::piece::Piece::Text("I will edit it.\n".into()));
        let args = |i: usize| match &out[i] {
            crate::server::chat::piece::Piece::Call(c) => serde_json::from_str::<Value>(&c.arguments).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(args(1), serde_json::json!({"path": "src/main.rs", "line": 42, "dry": false, "opts": {"a": [1]}, "ratio": 2}));
        // A string stays text ("007"); a parameter the schema does not name stays text too.
        assert_eq!(args(2), serde_json::json!({"path": "007", "x": "12"}));
        // A block cut short keeps the invocations it completed; with none it stays text.
        let cut = "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"n\">7</parameter>\n</invoke>\n<invoke name=\"g\">";
        assert_eq!(read(&MiniMax, &[cut]), vec![call("f", r#"{"n":"7"}"#)]);
        let none = "<minimax:tool_call>\n<invoke name=\"f\">";
        assert_eq!(read(&MiniMax, &[none]), vec![crate::server::chat::piece::Piece::Text(none.into())]);
    }
}
