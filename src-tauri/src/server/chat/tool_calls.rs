//! Tool calls in what the model writes, as the model families write them, turned into OpenAI
//! `tool_calls` while the text streams (the stream is never held back as a whole because
//! `tools` were sent: Open WebUI always sends them).
//!
//! - Hermes style (Qwen 2.5/3 and most tool-tuned models): `<tool_call>{"name": .., "arguments": {..}}</tool_call>`,
//!   possibly several, possibly after some text.
//! - Mistral: the special token `[TOOL_CALLS]`, then a JSON list of calls (v3 tokenizers) or
//!   `name[ARGS]{..}` per call (v11+, `[CALL_ID]id` in between in some).
//! - Llama 3.x JSON tool calling: the whole answer is `{"name": .., "parameters": {..}}`, maybe
//!   after the special token `<|python_tag|>`, several calls separated by `;`.
//! - Qwen3-Coder (and Qwen3.5/3.6, Qwen3-Coder-Next) XML: `<tool_call>\n<function=name>\n
//!   <parameter=key>\nvalue\n</parameter>\n</function>\n</tool_call>`; the values are text,
//!   typed from the tool's JSON Schema (a number, a boolean, JSON for objects and arrays).
//! - Gemma 4: `<|tool_call>call:name{key:value,..}<tool_call|>` (special tokens; see
//!   [`super::gemma4_calls`]).
//!
//! The markers that are special tokens only reach this parser if the request asks the engine to
//! keep their text ([`ToolFormat::marker_tokens`]).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::{gemma4_calls, pythonic_calls};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Mistral,
    LlamaJson,
    QwenXml,
    /// gpt-oss: calls are messages to `functions.*` (read by `harmony::HarmonyParser`, which
    /// also splits the reasoning; this parser passes such text through).
    Harmony,
    Gemma4,
    /// LFM2: a Python list of calls between `<|tool_call_start|>` and `<|tool_call_end|>`.
    Pythonic,
}

/// Each function's parameter schemas (`properties`), by function name: what typed XML values.
pub type ParameterSchemas = HashMap<String, Map<String, Value>>;

impl ToolFormat {
    /// The format a chat template trains its model on, if it supports tools at all.
    pub fn of_template(source: &str) -> Option<ToolFormat> {
        if super::harmony::is_harmony(source) {
            Some(ToolFormat::Harmony)
        } else if source.contains(gemma4_calls::OPEN) && source.contains(gemma4_calls::CLOSE) {
            Some(ToolFormat::Gemma4)
        } else if source.contains("<|tool_list_start|>") || source.contains(pythonic_calls::OPEN) {
            Some(ToolFormat::Pythonic)
        } else if source.contains("<function=") && source.contains("<parameter=") {
            Some(ToolFormat::QwenXml)
        } else if source.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if source.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if source.contains("<|python_tag|>") || source.contains("\"parameters\"") || source.contains("ipython") {
            Some(ToolFormat::LlamaJson)
        } else {
            None
        }
    }

    /// Special tokens of this format whose text the parser must see.
    pub fn marker_tokens(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes | ToolFormat::QwenXml => &[],
            ToolFormat::Mistral => &[MISTRAL_CALLS, "[ARGS]", "[CALL_ID]"],
            ToolFormat::LlamaJson => &[PYTHON_TAG],
            ToolFormat::Harmony => &super::harmony::MARKERS,
            ToolFormat::Gemma4 => &gemma4_calls::MARKERS,
            ToolFormat::Pythonic => &pythonic_calls::MARKERS,
        }
    }

    /// The markers around one call, for the formats that wrap each call in a pair.
    fn call_delimiters(self) -> (&'static str, &'static str) {
        match self {
            ToolFormat::Gemma4 => (gemma4_calls::OPEN, gemma4_calls::CLOSE),
            ToolFormat::Pythonic => (pythonic_calls::OPEN, pythonic_calls::CLOSE),
            _ => (OPEN, CLOSE),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI sends them as a string).
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Call(ToolCall),
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

pub struct ToolCallParser {
    format: ToolFormat,
    /// For the XML format's values.
    schemas: ParameterSchemas,
    /// Text not yet emitted: a possible start of `<tool_call>`, or a call being read.
    pending: String,
    in_call: bool,
    /// Llama JSON: whether the answer so far is all whitespace (a call may still start).
    at_start: bool,
}

impl ToolCallParser {
    pub fn new(format: ToolFormat) -> ToolCallParser {
        ToolCallParser { format, schemas: HashMap::new(), pending: String::new(), in_call: false, at_start: true }
    }

    /// The tools' parameter schemas, which type the XML format's values.
    pub fn with_schemas(mut self, schemas: ParameterSchemas) -> ToolCallParser {
        self.schemas = schemas;
        self
    }

    /// Feeds newly generated text; returns what can be emitted now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        match self.format {
            ToolFormat::Hermes | ToolFormat::QwenXml | ToolFormat::Gemma4 | ToolFormat::Pythonic => self.push_hermes(),
            ToolFormat::Mistral => self.push_mistral(),
            ToolFormat::LlamaJson => self.push_llama(),
            ToolFormat::Harmony => vec![Piece::Text(std::mem::take(&mut self.pending))],
        }
    }

    /// Generation ended: whatever is left, as calls if it parses, else as text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        if rest.is_empty() {
            return Vec::new();
        }
        let calls = match self.format {
            ToolFormat::Hermes if self.in_call => parse_call(&rest).map(|c| vec![c]),
            // Cut short (no `</function>`): left as text, as a Hermes call cut short is.
            ToolFormat::QwenXml if self.in_call && rest.contains("</function>") => {
                parse_xml_call(&rest, &self.schemas).map(|c| vec![c])
            }
            ToolFormat::Gemma4 if self.in_call => gemma4_calls::parse_calls(&rest),
            // Cut short (no end marker), a complete list still reads as the calls it holds.
            ToolFormat::Pythonic if self.in_call => pythonic_calls::parse_calls(&rest),
            ToolFormat::Mistral if self.in_call => parse_mistral(&rest),
            ToolFormat::LlamaJson if self.in_call => parse_llama(rest.trim_start().trim_start_matches(PYTHON_TAG)),
            _ => None,
        };
        match calls {
            Some(calls) => calls.into_iter().map(Piece::Call).collect(),
            None if self.in_call
                && matches!(
                    self.format,
                    ToolFormat::Hermes | ToolFormat::QwenXml | ToolFormat::Gemma4 | ToolFormat::Pythonic
                ) =>
            {
                vec![Piece::Text(format!("{}{rest}", self.format.call_delimiters().0))]
            }
            None if self.in_call && self.format == ToolFormat::Mistral => {
                vec![Piece::Text(format!("{MISTRAL_CALLS}{rest}"))]
            }
            None if self.format == ToolFormat::LlamaJson => {
                vec![Piece::Text(rest.trim_start().trim_start_matches(PYTHON_TAG).to_string())]
            }
            None => vec![Piece::Text(rest)],
        }
    }

    /// Calls each wrapped in a pair of markers, text around them.
    fn push_hermes(&mut self) -> Vec<Piece> {
        let (open, close) = self.format.call_delimiters();
        let mut out = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(close) else { return out };
                let body: String = self.pending.drain(..end + close.len()).collect();
                let body = &body[..end];
                let calls = match self.format {
                    ToolFormat::QwenXml => parse_xml_call(body, &self.schemas).map(|c| vec![c]),
                    ToolFormat::Gemma4 => gemma4_calls::parse_calls(body),
                    ToolFormat::Pythonic => pythonic_calls::parse_calls(body),
                    _ => parse_call(body).map(|c| vec![c]),
                };
                match calls {
                    Some(calls) => out.extend(calls.into_iter().map(Piece::Call)),
                    None => out.push(Piece::Text(format!("{open}{body}{close}"))),
                }
                self.in_call = false;
                continue;
            }
            if let Some(start) = self.pending.find(open) {
                let text: String = self.pending.drain(..start).collect();
                if !text.trim().is_empty() {
                    out.push(Piece::Text(text));
                }
                self.pending.drain(..open.len());
                self.in_call = true;
                continue;
            }
            // Hold back a suffix that may be the start of the opening marker.
            let keep = (1..open.len()).rev().find(|&n| self.pending.ends_with(&open[..n])).unwrap_or(0);
            let emit_to = self.pending.len() - keep;
            if emit_to > 0 {
                out.push(Piece::Text(self.pending.drain(..emit_to).collect()));
            }
            return out;
        }
    }

    /// Text up to `[TOOL_CALLS]`; after it, everything is read to the end.
    fn push_mistral(&mut self) -> Vec<Piece> {
        if self.in_call {
            return Vec::new();
        }
        if let Some(start) = self.pending.find(MISTRAL_CALLS) {
            let text: String = self.pending.drain(..start + MISTRAL_CALLS.len()).collect();
            self.in_call = true;
            let text = &text[..start];
            return if text.trim().is_empty() { Vec::new() } else { vec![Piece::Text(text.to_string())] };
        }
        let keep = (1..MISTRAL_CALLS.len()).rev().find(|&n| self.pending.ends_with(&MISTRAL_CALLS[..n])).unwrap_or(0);
        let emit_to = self.pending.len() - keep;
        if emit_to == 0 {
            return Vec::new();
        }
        vec![Piece::Text(self.pending.drain(..emit_to).collect())]
    }

    fn push_llama(&mut self) -> Vec<Piece> {
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
}

/// `{"name": .., "arguments" | "parameters": {..} | "<json text>"}`.
fn parse_call(text: &str) -> Option<ToolCall> {
    call_from_value(&serde_json::from_str(text.trim()).ok()?)
}

/// `<function=name><parameter=key>value</parameter>..</function>` (whitespace around the tags
/// as the model writes it; one newline either side of a value is the format's, not the value's).
fn parse_xml_call(text: &str, schemas: &ParameterSchemas) -> Option<ToolCall> {
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

/// An XML parameter's text as the JSON value its schema asks for (as Qwen's own parser does):
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

/// The parameter schemas of OpenAI-shaped tools (`{"type": "function", "function": {..}}`).
pub fn parameter_schemas(tools: &[Value]) -> ParameterSchemas {
    tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name")?.as_str()?.to_string();
            let properties =
                f.pointer("/parameters/properties").and_then(Value::as_object).cloned().unwrap_or_default();
            Some((name, properties))
        })
        .collect()
}

/// What follows `[TOOL_CALLS]`: `[{call}, ..]`, or `name[ARGS]{..}` (with `[CALL_ID]id` before
/// `[ARGS]` in some versions), repeated after further `[TOOL_CALLS]` markers.
fn parse_mistral(text: &str) -> Option<Vec<ToolCall>> {
    let text = text.trim();
    if text.starts_with('[') {
        let calls: Vec<Value> = serde_json::from_str(text).ok()?;
        return calls.iter().map(call_from_value).collect::<Option<Vec<_>>>().filter(|c| !c.is_empty());
    }
    text.split(MISTRAL_CALLS)
        .filter(|part| !part.trim().is_empty())
        .map(|part| {
            let (name, arguments) = part.split_once("[ARGS]")?;
            let name = name.split("[CALL_ID]").next()?.trim();
            let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
            (!name.is_empty() && arguments.is_object())
                .then(|| ToolCall { name: name.to_string(), arguments: arguments.to_string() })
        })
        .collect::<Option<Vec<_>>>()
        .filter(|c| !c.is_empty())
}

/// One or more JSON calls separated by `;`.
fn parse_llama(text: &str) -> Option<Vec<ToolCall>> {
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

pub(crate) fn call_from_value(value: &Value) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(format: ToolFormat, pieces: &[&str]) -> Vec<Piece> {
        let mut p = ToolCallParser::new(format);
        let mut out: Vec<Piece> = pieces.iter().flat_map(|t| p.push(t)).collect();
        out.extend(p.finish());
        // Merge adjacent text for easy comparison.
        let mut merged: Vec<Piece> = Vec::new();
        for piece in out {
            match (merged.last_mut(), piece) {
                (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
                (_, piece) => merged.push(piece),
            }
        }
        merged
    }

    fn call(name: &str, args: &str) -> Piece {
        Piece::Call(ToolCall { name: name.into(), arguments: args.into() })
    }

    #[test]
    fn hermes_calls_split_across_tokens() {
        let out = run(
            ToolFormat::Hermes,
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
    fn hermes_several_calls_and_plain_text() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>";
        assert_eq!(run(ToolFormat::Hermes, &[text]), vec![call("a", "{}"), call("b", r#"{"x": 1}"#)]);
        assert_eq!(run(ToolFormat::Hermes, &["a < b ", "and <tool"]), vec![Piece::Text("a < b and <tool".into())]);
    }

    #[test]
    fn hermes_broken_call_stays_text() {
        let out = run(ToolFormat::Hermes, &["<tool_call>{not json</tool_call>"]);
        assert_eq!(out, vec![Piece::Text("<tool_call>{not json</tool_call>".into())]);
        let out = run(ToolFormat::Hermes, &["<tool_call>{\"name\": \"a\""]);
        assert_eq!(out, vec![Piece::Text("<tool_call>{\"name\": \"a\"".into())]);
    }

    #[test]
    fn llama_json_call_or_text() {
        let out =
            run(ToolFormat::LlamaJson, &[" {\"name\": \"get_weather\", ", "\"parameters\": {\"city\": \"Oslo\"}}"]);
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Oslo"}"#)]);
        assert_eq!(run(ToolFormat::LlamaJson, &["Hello", " there"]), vec![Piece::Text("Hello there".into())]);
        assert_eq!(run(ToolFormat::LlamaJson, &["{curly} words"]), vec![Piece::Text("{curly} words".into())]);
    }

    #[test]
    fn mistral_calls_after_the_marker_token() {
        let out = run(
            ToolFormat::Mistral,
            &[
                "[TOOL",
                "_CALLS]",
                "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, ",
                "{\"name\": \"b\", \"arguments\": {}}]",
            ],
        );
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Rome"}"#), call("b", "{}")]);
        let out = run(
            ToolFormat::Mistral,
            &[
                "Sure. ",
                "[TOOL_CALLS]",
                "get_weather",
                "[ARGS]",
                "{\"city\": \"Rome\"}",
                "[TOOL_CALLS]",
                "b[CALL_ID]a1b2c3d4e[ARGS]{}",
            ],
        );
        assert_eq!(out, vec![Piece::Text("Sure. ".into()), call("get_weather", r#"{"city":"Rome"}"#), call("b", "{}")]);
        assert_eq!(run(ToolFormat::Mistral, &["[TOOL_CALLS]", "oops"]), vec![Piece::Text("[TOOL_CALLS]oops".into())]);
        assert_eq!(run(ToolFormat::Mistral, &["[not a call]"]), vec![Piece::Text("[not a call]".into())]);
    }

    #[test]
    fn llama_python_tag_and_several_calls() {
        let out = run(
            ToolFormat::LlamaJson,
            &[
                "<|python",
                "_tag|>",
                "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
            ],
        );
        assert_eq!(out, vec![call("a", r#"{"x":1}"#), call("b", "{}")]);
        let out = run(ToolFormat::LlamaJson, &["<|python_tag|>", "brave_search.call(query=\"x\")"]);
        assert_eq!(out, vec![Piece::Text("brave_search.call(query=\"x\")".into())]);
    }

    #[test]
    fn qwen_xml_calls_typed_from_the_schema() {
        let schemas = parameter_schemas(&[serde_json::json!({"type": "function", "function": {"name": "edit",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"},
            "dry": {"type": "boolean"}, "opts": {"type": "object"}, "code": {"type": "string"}}}}})]);
        let mut p = ToolCallParser::new(ToolFormat::QwenXml).with_schemas(schemas);
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
        let out = run(
            ToolFormat::QwenXml,
            &["<tool_call><function=f><parameter=n>7</parameter><parameter=s>hi</parameter></function></tool_call>"],
        );
        assert_eq!(out, vec![call("f", r#"{"n":7,"s":"hi"}"#)]);
        let out = run(ToolFormat::QwenXml, &["<tool_call>\n<function=f>\n<parameter=n>"]);
        assert_eq!(out, vec![Piece::Text("<tool_call>\n<function=f>\n<parameter=n>".into())]);
    }

    #[test]
    fn formats_from_templates() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates");
        let of = |f: &str| ToolFormat::of_template(&std::fs::read_to_string(dir.join(f)).unwrap());
        assert_eq!(of("qwen2.5.jinja"), Some(ToolFormat::Hermes));
        assert_eq!(of("qwen3.jinja"), Some(ToolFormat::Hermes));
        assert_eq!(of("llama3.1.jinja"), Some(ToolFormat::LlamaJson));
        assert_eq!(of("mistral-v0.3.jinja"), Some(ToolFormat::Mistral));
        assert_eq!(of("smollm2.jinja"), None);
        assert_eq!(of("gemma4.jinja"), Some(ToolFormat::Gemma4));
        assert_eq!(of("lfm2.jinja"), Some(ToolFormat::Pythonic));
        for qwen3_5 in ["qwen3.5.jinja", "qwen3.6.jinja", "qwen3-coder.jinja"] {
            assert_eq!(of(qwen3_5), Some(ToolFormat::QwenXml), "{qwen3_5}");
        }
        for next in ["qwen3-next-instruct.jinja", "qwen3-next-thinking.jinja"] {
            assert_eq!(of(next), Some(ToolFormat::Hermes), "{next}");
        }
    }

    #[test]
    fn pythonic_calls_split_across_tokens() {
        let pieces =
            ["Checking.", "<|tool_call_start|>", "[get_weather(location=\"Par", "is\", days=2)]", "<|tool_call_end|>"];
        assert_eq!(
            run(ToolFormat::Pythonic, &pieces),
            [Piece::Text("Checking.".into()), call("get_weather", r#"{"location":"Paris","days":2}"#)]
        );
        // Generation stopped at the end marker (a stop token): the list still reads.
        assert_eq!(run(ToolFormat::Pythonic, &["<|tool_call_start|>[f(a=1)]"]), [call("f", r#"{"a":1}"#)]);
        // Not calls: the text, markers and all.
        assert_eq!(
            run(ToolFormat::Pythonic, &["<|tool_call_start|>[f(a=]<|tool_call_end|>"]),
            [Piece::Text("<|tool_call_start|>[f(a=]<|tool_call_end|>".into())]
        );
    }

    #[test]
    fn gemma4_calls_split_across_tokens() {
        let q = "<|\"|>";
        let pieces = [
            "Let me check.",
            "<|tool_",
            "call>call:get_weather{location:",
            q,
            "Paris, France",
            q,
            "}<tool_call|><|tool_call>call:noop{}<tool_",
            "call|>",
        ];
        assert_eq!(
            run(ToolFormat::Gemma4, &pieces),
            [
                Piece::Text("Let me check.".into()),
                call("get_weather", r#"{"location":"Paris, France"}"#),
                call("noop", "{}")
            ]
        );
        // Cut short: text, markers and all.
        assert_eq!(
            run(ToolFormat::Gemma4, &["<|tool_call>call:f{a:1"]),
            [Piece::Text("<|tool_call>call:f{a:1".into())]
        );
    }
}
