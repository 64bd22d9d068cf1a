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
//!
//! The markers that are special tokens only reach this parser if the request asks the engine to
//! keep their text ([`ToolFormat::marker_tokens`]).

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Mistral,
    LlamaJson,
}

impl ToolFormat {
    /// The format a chat template trains its model on, if it supports tools at all.
    pub fn of_template(source: &str) -> Option<ToolFormat> {
        if source.contains("<tool_call>") {
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
            ToolFormat::Hermes => &[],
            ToolFormat::Mistral => &[MISTRAL_CALLS, "[ARGS]", "[CALL_ID]"],
            ToolFormat::LlamaJson => &[PYTHON_TAG],
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
    /// Text not yet emitted: a possible start of `<tool_call>`, or a call being read.
    pending: String,
    in_call: bool,
    /// Llama JSON: whether the answer so far is all whitespace (a call may still start).
    at_start: bool,
}

impl ToolCallParser {
    pub fn new(format: ToolFormat) -> ToolCallParser {
        ToolCallParser { format, pending: String::new(), in_call: false, at_start: true }
    }

    /// Feeds newly generated text; returns what can be emitted now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        match self.format {
            ToolFormat::Hermes => self.push_hermes(),
            ToolFormat::Mistral => self.push_mistral(),
            ToolFormat::LlamaJson => self.push_llama(),
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
            ToolFormat::Mistral if self.in_call => parse_mistral(&rest),
            ToolFormat::LlamaJson if self.in_call => parse_llama(rest.trim_start().trim_start_matches(PYTHON_TAG)),
            _ => None,
        };
        match calls {
            Some(calls) => calls.into_iter().map(Piece::Call).collect(),
            None if self.in_call && self.format == ToolFormat::Hermes => vec![Piece::Text(format!("{OPEN}{rest}"))],
            None if self.in_call && self.format == ToolFormat::Mistral => {
                vec![Piece::Text(format!("{MISTRAL_CALLS}{rest}"))]
            }
            None if self.format == ToolFormat::LlamaJson => {
                vec![Piece::Text(rest.trim_start().trim_start_matches(PYTHON_TAG).to_string())]
            }
            None => vec![Piece::Text(rest)],
        }
    }

    fn push_hermes(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(CLOSE) else { return out };
                let body: String = self.pending.drain(..end + CLOSE.len()).collect();
                let body = &body[..end];
                out.push(match parse_call(body) {
                    Some(call) => Piece::Call(call),
                    None => Piece::Text(format!("{OPEN}{body}{CLOSE}")),
                });
                self.in_call = false;
                continue;
            }
            if let Some(start) = self.pending.find(OPEN) {
                let text: String = self.pending.drain(..start).collect();
                if !text.trim().is_empty() {
                    out.push(Piece::Text(text));
                }
                self.pending.drain(..OPEN.len());
                self.in_call = true;
                continue;
            }
            // Hold back a suffix that may be the start of "<tool_call>".
            let keep = (1..OPEN.len()).rev().find(|&n| self.pending.ends_with(&OPEN[..n])).unwrap_or(0);
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
    fn formats_from_templates() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates");
        let of = |f: &str| ToolFormat::of_template(&std::fs::read_to_string(dir.join(f)).unwrap());
        assert_eq!(of("qwen2.5.jinja"), Some(ToolFormat::Hermes));
        assert_eq!(of("qwen3.jinja"), Some(ToolFormat::Hermes));
        assert_eq!(of("llama3.1.jinja"), Some(ToolFormat::LlamaJson));
        assert_eq!(of("mistral-v0.3.jinja"), Some(ToolFormat::Mistral));
        assert_eq!(of("smollm2.jinja"), None);
    }
}
