//! Qwen3-Coder's XML (also Qwen3.5/3.6, Qwen3-Coder-Next, and Seed-OSS inside `<seed:tool_call>`):
//! `<tool_call>\n<function=name>\n
//! <parameter=key>\nvalue\n</parameter>\n</function>\n</tool_call>`. The values are text, typed
//! from the tool's JSON Schema (a number, a boolean, JSON for objects and arrays), as Qwen's
//! own parser reads them; the newlines between tags are optional.

use serde_json::{Map, Value};

use super::hermes::{CLOSE, OPEN};
use super::lark::{lark_string, marker, text_marker, CallSyntax};
use super::paired::PairedCalls;
use super::xml_calls::{call_rules, ArgumentTags, NL};
use super::{CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};
use crate::server::chat::piece::ToolCall;

/// Seed-OSS writes the same calls inside its own markers.
const SEED_OPEN: &str = "<seed:tool_call>";
const SEED_CLOSE: &str = "</seed:tool_call>";

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    if !(template.contains("<function=") && template.contains("<parameter=")) {
        return None;
    }
    let seed = template.contains(SEED_OPEN);
    let (open, close) = if seed { (SEED_OPEN, SEED_CLOSE) } else { (OPEN, CLOSE) };
    Some(Box::new(QwenXml { open, close }))
}

/// The calls' markers: Qwen's `<tool_call>` or Seed-OSS's `<seed:tool_call>`.
pub(super) struct QwenXml {
    open: &'static str,
    close: &'static str,
}

impl ChatFormat for QwenXml {
    fn name(&self) -> &'static str {
        if self.open == SEED_OPEN {
            "seed-xml"
        } else {
            "qwen-xml"
        }
    }

    fn markers(&self) -> &'static [&'static str] {
        // Nemotron 3's tokenizer may hold Qwen's markers as special tokens (Qwen's does not).
        if self.open == SEED_OPEN {
            &[SEED_OPEN, SEED_CLOSE]
        } else {
            &[OPEN, CLOSE]
        }
    }

    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        // A call cut short (no `</function>`) is left as text, as a Hermes call cut short is.
        let parse = |body: &str, schemas: &ParameterSchemas, closed: bool| {
            (closed || body.contains("</function>")).then(|| parse_call(body, schemas)).flatten().map(|c| vec![c])
        };
        Box::new(PairedCalls::new(self.open, self.close, parse, schemas))
    }

    /// A named call's arguments are not JSON here: they are read when the call is complete.
    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        Some(self.syntax(spec).and_then(|s| s.forced(spec, None)))
    }

    fn strict_calls(&self, spec: &CallSpec) -> Option<Result<Grammar, SchemaError>> {
        Some(self.syntax(spec).and_then(|s| s.strict(spec)))
    }
}

/// `<function=name>`, `<parameter=key>` and their closing tags around each call's parts.
const TAGS: ArgumentTags = ArgumentTags {
    function: |_, name| lark_string(&format!("<function={name}>")),
    function_close: |_| lark_string("</function>"),
    parameter: |_, key| lark_string(&format!("<parameter={key}>")),
    value_close: "</parameter>",
};

impl QwenXml {
    fn syntax(&self, spec: &CallSpec) -> Result<CallSyntax, SchemaError> {
        let (rules, calls) = call_rules(spec, &TAGS, "f")?;
        Ok(CallSyntax {
            open_lark: marker(spec, self.open),
            open_text: text_marker(spec, self.open),
            body: format!("{NL} {calls} {NL} {}", marker(spec, self.close)),
            separator: Some(NL.into()),
            rules,
        })
    }
}

/// `<function=name><parameter=key>value</parameter>..</function>` (whitespace around the tags
/// as the model writes it; one newline either side of a value is the format's, not the value's).
fn parse_call(text: &str, schemas: &ParameterSchemas) -> Option<ToolCall> {
    let rest = text.trim().strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim();
    let body_end = rest.rfind("</function>").unwrap_or(rest.len());
    rest = &rest[..body_end];
    let schema = schemas.get(name);
    let mut arguments = Map::new();
    while let Some(at) = rest.find("<parameter=") {
        let after = &rest[at + "<parameter=".len()..];
        let (key, after) = after.split_once('>')?;
        // A value runs to its closing tag, or (as models sometimes write) to the next parameter.
        let end = after.find("</parameter>").or_else(|| after.find("<parameter=")).unwrap_or(after.len());
        let raw = after[..end].strip_prefix('\n').unwrap_or(&after[..end]);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let key = key.trim();
        arguments.insert(key.to_string(), typed_value(raw, schema.and_then(|s| s.get(key))));
        rest = after[end..].strip_prefix("</parameter>").unwrap_or(&after[end..]);
    }
    (!name.is_empty()).then(|| ToolCall { name: name.to_string(), arguments: Value::Object(arguments).to_string() })
}

/// A parameter's text as the JSON value its schema asks for (as Qwen's own parser does):
/// strings stay text; numbers, booleans, objects and arrays are parsed; with no schema, JSON if
/// it parses, else text.
fn typed_value(raw: &str, schema: Option<&Value>) -> Value {
    let types: Vec<&str> = match schema.and_then(|s| s.get("type")) {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let trimmed = raw.trim();
    if types.contains(&"string") || (types.is_empty() && schema.is_some_and(|s| s.get("enum").is_some())) {
        return Value::String(raw.to_string());
    }
    if trimmed == "null" && (types.is_empty() || types.contains(&"null")) {
        return Value::Null;
    }
    let parsed = serde_json::from_str::<Value>(trimmed).ok();
    let fits = |v: &Value| {
        types.is_empty()
            || types.iter().any(|t| match *t {
                "integer" => v.is_i64() || v.is_u64(),
                "number" => v.is_number(),
                "boolean" => v.is_boolean(),
                "object" => v.is_object(),
                "array" => v.is_array(),
                "null" => v.is_null(),
                _ => false,
            })
    };
    match parsed {
        Some(v) if fits(&v) => v,
        // `True`/`False` as Python writes them.
        _ if types.contains(&"boolean") && trimmed.eq_ignore_ascii_case("true") => Value::Bool(true),
        _ if types.contains(&"boolean") && trimmed.eq_ignore_ascii_case("false") => Value::Bool(false),
        _ => Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::parameter_schemas;
    use super::super::tests::{call, read};
    use super::*;
    use crate::server::chat::piece::Piece;

    const QWEN: QwenXml = QwenXml { open: OPEN, close: CLOSE };

    #[test]
    fn calls_typed_from_the_schema() {
        let schemas = parameter_schemas(&[serde_json::json!({"type": "function", "function": {"name": "edit",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"},
            "dry": {"type": "boolean"}, "opts": {"type": "object"}, "code": {"type": "string"}}}}})]);
        let mut p = QWEN.reader(schemas);
        let pieces = [
            "I will edit it.\n<tool_",
            "call>\n<function=edit>\n<parameter=path>\nsrc/main.rs\n</parameter>\n",
            "<parameter=line>\n42\n</parameter>\n<parameter=dry>\nFalse\n</parameter>\n",
            "<parameter=opts>\n{\"a\": [1]}\n</parameter>\n<parameter=code>\n  let x = 1;\n\n</parameter>\n",
            "</function>\n</tool_call>",
        ];
        let mut out: Vec<Piece> = pieces.iter().flat_map(|t| p.push(t)).collect();
        out.extend(p.finish());
        assert_eq!(out[0], Piece::Text("I will edit it.\n".into()));
        let Piece::Call(edit) = &out[1] else { panic!("{out:?}") };
        assert_eq!(edit.name, "edit");
        let args: Value = serde_json::from_str(&edit.arguments).unwrap();
        assert_eq!(
            args,
            serde_json::json!({"path": "src/main.rs", "line": 42, "dry": false, "opts": {"a": [1]}, "code": "  let x = 1;\n"})
        );
        // No schema (an unknown tool): JSON where it parses, else text; a call cut short stays text.
        let out = read(
            &QWEN,
            &["<tool_call><function=f><parameter=n>7</parameter><parameter=s>hi</parameter></function></tool_call>"],
        );
        assert_eq!(out, vec![call("f", r#"{"n":7,"s":"hi"}"#)]);
        let out = read(&QWEN, &["<tool_call>\n<function=f>\n<parameter=n>"]);
        assert_eq!(out, vec![Piece::Text("<tool_call>\n<function=f>\n<parameter=n>".into())]);
    }
}
