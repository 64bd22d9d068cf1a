//! LFM2's tool-call syntax: a Python list of calls with keyword arguments between the special
//! tokens `<|tool_call_start|>` and `<|tool_call_end|>`:
//! `[get_weather(location="Paris, France", days=3), search(query='rust', tags=["a", "b"])]`.
//! Values are Python literals (strings in either quote, numbers, `True`/`False`/`None`, lists,
//! tuples, dicts); JSON's `true`/`false`/`null` are read too, as mlx-lm's parser does, because
//! chat templates render nested containers as JSON.

use serde_json::{Map, Number, Value};

use super::paired::PairedCalls;
use super::{CallReader, ChatFormat, ParameterSchemas};
use crate::server::chat::piece::ToolCall;

const OPEN: &str = "<|tool_call_start|>";
const CLOSE: &str = "<|tool_call_end|>";

/// The special tokens whose text the reader must see.
const MARKERS: [&str; 2] = [OPEN, CLOSE];

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    (template.contains("<|tool_list_start|>") || template.contains(OPEN))
        .then(|| Box::new(Pythonic) as Box<dyn ChatFormat>)
}

pub(super) struct Pythonic;

impl ChatFormat for Pythonic {
    fn name(&self) -> &'static str {
        "pythonic"
    }

    fn markers(&self) -> &'static [&'static str] {
        &MARKERS
    }

    /// Cut short (no end marker: it is LFM2's stop token), a complete list still reads as the
    /// calls it holds.
    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(PairedCalls::new(OPEN, CLOSE, |body, _, _| parse_calls(body), schemas))
    }

    /// LFM2's template renders an assistant turn's content only: its earlier calls go back in
    /// as it writes them, markers included.
    fn calls_as_text(&self, content: &str, calls: &[Value]) -> String {
        format!("{content}{}", write_calls(calls))
    }
}

/// Values nest at most this deep: a model's runaway output must not overflow the stack.
const MAX_DEPTH: usize = 128;

/// What is between the markers: the calls, or `None` if it does not read as a list of calls.
fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut reader = Reader { rest: body.trim(), depth: 0 };
    // A lone call without its list brackets, as small models sometimes write, reads too.
    let bracketed = reader.eat("[");
    let mut calls = Vec::new();
    loop {
        if bracketed && reader.eat("]") {
            break;
        }
        calls.push(reader.call()?);
        if reader.eat(",") {
            continue;
        }
        if bracketed && !reader.eat("]") {
            return None;
        }
        break;
    }
    (!calls.is_empty() && reader.rest.trim().is_empty()).then_some(calls)
}

/// Calls (`{"function": {"name", "arguments"}}`, arguments an object) as LFM2 writes them,
/// markers included.
fn write_calls(calls: &[Value]) -> String {
    let listed: Vec<String> = calls
        .iter()
        .map(|call| {
            let name = call.pointer("/function/name").and_then(Value::as_str).unwrap_or_default();
            let arguments = match call.pointer("/function/arguments") {
                Some(Value::Object(args)) => {
                    args.iter().map(|(k, v)| format!("{k}={}", python_literal(v))).collect::<Vec<_>>().join(", ")
                }
                _ => String::new(),
            };
            format!("{name}({arguments})")
        })
        .collect();
    format!("{OPEN}[{}]{CLOSE}", listed.join(", "))
}

/// A JSON value as a Python literal (strings in JSON's escaping, which Python reads alike).
fn python_literal(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => Value::String(s.clone()).to_string(),
        Value::Array(items) => format!("[{}]", items.iter().map(python_literal).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

struct Reader<'a> {
    rest: &'a str,
    depth: usize,
}

impl Reader<'_> {
    /// Skips whitespace, then `token` if it is next.
    fn eat(&mut self, token: &str) -> bool {
        self.rest = self.rest.trim_start();
        match self.rest.strip_prefix(token) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    /// An identifier (letters, digits, `_`; not starting with a digit).
    fn name(&mut self) -> Option<&str> {
        self.rest = self.rest.trim_start();
        let end = self.rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(self.rest.len());
        let (name, rest) = self.rest.split_at(end);
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        self.rest = rest;
        Some(name)
    }

    /// `name(key=value, ...)`, the name dotted or not; positional arguments are not calls a
    /// tool can take.
    fn call(&mut self) -> Option<ToolCall> {
        let mut name = self.name()?.to_string();
        while self.rest.starts_with('.') {
            self.rest = &self.rest[1..];
            name = format!("{name}.{}", self.name()?);
        }
        if !self.eat("(") {
            return None;
        }
        let mut arguments = Map::new();
        while !self.eat(")") {
            let key = self.name()?.to_string();
            if !self.eat("=") {
                return None;
            }
            let value = self.value()?;
            arguments.insert(key, value);
            if !self.eat(",") && !self.rest.trim_start().starts_with(')') {
                return None;
            }
        }
        Some(ToolCall { name, arguments: Value::Object(arguments).to_string() })
    }

    fn value(&mut self) -> Option<Value> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        let value = self.value_inner();
        self.depth -= 1;
        value
    }

    fn value_inner(&mut self) -> Option<Value> {
        self.rest = self.rest.trim_start();
        let first = self.rest.chars().next()?;
        match first {
            '"' | '\'' => self.string().map(Value::String),
            '[' => self.sequence('[', ']'),
            '(' => self.sequence('(', ')'),
            '{' => self.dict(),
            _ if first == '-' || first == '+' || first.is_ascii_digit() || first == '.' => self.number(),
            _ => match self.name()? {
                "True" | "true" => Some(Value::Bool(true)),
                "False" | "false" => Some(Value::Bool(false)),
                "None" | "null" => Some(Value::Null),
                _ => None,
            },
        }
    }

    /// Items up to `close`, a trailing comma allowed, as a JSON array.
    fn sequence(&mut self, open: char, close: char) -> Option<Value> {
        self.rest = self.rest.strip_prefix(open)?;
        let close = close.to_string();
        let mut items = Vec::new();
        while !self.eat(&close) {
            items.push(self.value()?);
            if !self.eat(",") && !self.rest.trim_start().starts_with(close.as_str()) {
                return None;
            }
        }
        Some(Value::Array(items))
    }

    /// `{key: value, ...}`; keys are strings (numbers and booleans as their text, as JSON
    /// needs string keys).
    fn dict(&mut self) -> Option<Value> {
        self.rest = self.rest.strip_prefix('{')?;
        let mut map = Map::new();
        while !self.eat("}") {
            let key = match self.value()? {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return None,
            };
            if !self.eat(":") {
                return None;
            }
            map.insert(key, self.value()?);
            if !self.eat(",") && !self.rest.trim_start().starts_with('}') {
                return None;
            }
        }
        Some(Value::Object(map))
    }

    /// A Python string literal in single or double quotes (not triple-quoted), its escapes
    /// read as Python reads them (`\x41`, `\u00e9`, `\U0001F600`, octal `\101`, `\a\b\f\v`;
    /// a surrogate pair makes one character, a lone surrogate U+FFFD); adjacent literals
    /// concatenate, as in Python.
    fn string(&mut self) -> Option<String> {
        let mut out = String::new();
        loop {
            self.rest = self.rest.trim_start();
            let quote = self.rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
            let mut chars = self.rest[1..].char_indices().peekable();
            // A high surrogate waiting for its low half.
            let mut high: Option<u32> = None;
            let end = loop {
                let (i, c) = chars.next()?;
                let code = match c {
                    '\\' => {
                        let (_, escaped) = chars.next()?;
                        let mut hex = |n: usize| -> Option<u32> {
                            let digits: String = (0..n).map(|_| chars.next().map(|(_, c)| c)).collect::<Option<_>>()?;
                            u32::from_str_radix(&digits, 16).ok()
                        };
                        match escaped {
                            'n' => Some(0x0A),
                            't' => Some(0x09),
                            'r' => Some(0x0D),
                            'a' => Some(0x07),
                            'b' => Some(0x08),
                            'f' => Some(0x0C),
                            'v' => Some(0x0B),
                            'x' => Some(hex(2)?),
                            'u' => Some(hex(4)?),
                            'U' => Some(hex(8)?),
                            '0'..='7' => {
                                let mut value = escaped.to_digit(8)?;
                                for _ in 0..2 {
                                    match chars.peek().and_then(|(_, c)| c.to_digit(8)) {
                                        Some(d) => {
                                            value = value * 8 + d;
                                            chars.next();
                                        }
                                        None => break,
                                    }
                                }
                                Some(value)
                            }
                            '\n' => None,
                            '\\' | '\'' | '"' => Some(escaped as u32),
                            // Python keeps the backslash of an unknown escape.
                            other => {
                                out.push('\\');
                                Some(other as u32)
                            }
                        }
                    }
                    c if c == quote => break i,
                    c => Some(c as u32),
                };
                let Some(code) = code else { continue };
                match (high.take(), code) {
                    (Some(h), 0xDC00..=0xDFFF) => {
                        out.push(char::from_u32(0x10000 + ((h - 0xD800) << 10) + (code - 0xDC00))?);
                        continue;
                    }
                    (Some(_), _) => out.push(char::REPLACEMENT_CHARACTER),
                    (None, _) => {}
                }
                match code {
                    0xD800..=0xDBFF => high = Some(code),
                    _ => out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER)),
                }
            };
            if high.is_some() {
                out.push(char::REPLACEMENT_CHARACTER);
            }
            self.rest = &self.rest[1 + end + 1..];
            if !self.rest.trim_start().starts_with(['"', '\'']) {
                return Some(out);
            }
        }
    }

    /// An int or a float (`_` separators allowed, as in Python).
    fn number(&mut self) -> Option<Value> {
        let end = self
            .rest
            .char_indices()
            .find(|&(i, c)| {
                let sign_ok = i == 0 || matches!(self.rest[..i].chars().last(), Some('e' | 'E'));
                !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '_') || (matches!(c, '-' | '+') && sign_ok))
            })
            .map_or(self.rest.len(), |(i, _)| i);
        let text: String = self.rest[..end].chars().filter(|c| *c != '_').collect();
        let text = text.strip_prefix('+').unwrap_or(&text);
        self.rest = &self.rest[end..];
        if let Ok(int) = text.parse::<i64>() {
            return Some(Value::Number(int.into()));
        }
        let float: f64 = text.parse().ok()?;
        Number::from_f64(float).map(Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;
    use crate::server::chat::piece::Piece;

    #[test]
    fn calls_split_across_tokens() {
        let pieces =
            ["Checking.", "<|tool_call_start|>", "[get_weather(location=\"Par", "is\", days=2)]", "<|tool_call_end|>"];
        assert_eq!(
            read(&Pythonic, &pieces),
            [Piece::Text("Checking.".into()), call("get_weather", r#"{"location":"Paris","days":2}"#)]
        );
        // Generation stopped at the end marker (a stop token): the list still reads.
        assert_eq!(read(&Pythonic, &["<|tool_call_start|>[f(a=1)]"]), [call("f", r#"{"a":1}"#)]);
        // Not calls: the text, markers and all.
        assert_eq!(
            read(&Pythonic, &["<|tool_call_start|>[f(a=]<|tool_call_end|>"]),
            [Piece::Text("<|tool_call_start|>[f(a=]<|tool_call_end|>".into())]
        );
    }

    fn args(call: &ToolCall) -> Value {
        serde_json::from_str(&call.arguments).unwrap()
    }

    #[test]
    fn reads_calls_with_python_values() {
        let calls = parse_calls(
            r#"[get_weather(location="Paris, France", days=3, metric=True, ratio=-2.5e1, extra=None,
                tags=['a', "b"], where={"lat": 59.9, 'name': 'Oslo'}, pair=(1, 2),), noop()]"#,
        )
        .unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            args(&calls[0]),
            serde_json::json!({"location": "Paris, France", "days": 3, "metric": true, "ratio": -25.0,
                "extra": null, "tags": ["a", "b"], "where": {"lat": 59.9, "name": "Oslo"}, "pair": [1, 2]})
        );
        assert_eq!((calls[1].name.as_str(), args(&calls[1])), ("noop", serde_json::json!({})));
    }

    #[test]
    fn reads_escapes_json_literals_dotted_names_and_a_lone_call() {
        let calls = parse_calls(r#"[tools.search(q='it\'s "x"\n', ok=true, n=null, u="\u00e9")]"#).unwrap();
        assert_eq!(calls[0].name, "tools.search");
        assert_eq!(args(&calls[0]), serde_json::json!({"q": "it's \"x\"\n", "ok": true, "n": null, "u": "é"}));
        // Python's other escapes: hex, long unicode, octal, control letters, surrogates.
        let calls = parse_calls(r#"[f(a="\x41\101\7\U0001F600\a\v", b="\ud83d\ude00", c="\ud83d!", d="\q")]"#).unwrap();
        assert_eq!(
            args(&calls[0]),
            serde_json::json!({"a": "AA\u{7}😀\u{7}\u{b}", "b": "😀", "c": "\u{fffd}!", "d": "\\q"})
        );
        let lone = parse_calls(r#" f(a=1) "#).unwrap();
        assert_eq!((lone[0].name.as_str(), args(&lone[0])), ("f", serde_json::json!({"a": 1})));
    }

    #[test]
    fn written_calls_read_back() {
        let calls = [
            serde_json::json!({"function": {"name": "get_weather", "arguments": {"location": "Paris \"17e\"\n", "days": 3,
                "ok": false, "none": null, "tags": ["a"], "where": {"lat": 59.9}}}}),
            serde_json::json!({"function": {"name": "noop", "arguments": {}}}),
        ];
        let text = write_calls(&calls);
        assert_eq!(
            text,
            r#"<|tool_call_start|>[get_weather(location="Paris \"17e\"\n", days=3, ok=False, none=None, tags=["a"], where={"lat": 59.9}), noop()]<|tool_call_end|>"#
        );
        let body = text.strip_prefix(OPEN).and_then(|t| t.strip_suffix(CLOSE)).unwrap();
        let read = parse_calls(body).unwrap();
        assert_eq!(args(&read[0]), calls[0]["function"]["arguments"]);
        assert_eq!((read[1].name.as_str(), args(&read[1])), ("noop", serde_json::json!({})));
    }

    #[test]
    fn refuses_what_is_not_a_list_of_calls() {
        for bad in [
            "",
            "[]",
            "[f(1)]",
            "[f(a=1]",
            "[f(a=1)] trailing",
            "[f(a=unknown)]",
            "[f(a='open)]",
            "[1abc(a=1)]",
            "plain text",
            "[f(a=1) g(b=2)]",
        ] {
            assert_eq!(parse_calls(bad), None, "{bad:?}");
        }
        let deep = format!("[f(a={}{})]", "[".repeat(1000), "]".repeat(1000));
        assert_eq!(parse_calls(&deep), None, "nesting is bounded");
    }
}
