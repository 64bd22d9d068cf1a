//! Gemma 4's tool-call syntax: `call:name{key:value,..}` between the special tokens
//! `<|tool_call>` and `<tool_call|>`. Values are JSON-like, but keys are bare words and strings
//! sit between `<|"|>` tokens (so a string may hold any character, quotes and braces included):
//! `{location:<|"|>Paris, France<|"|>,days:3,tags:[<|"|>a<|"|>],where:{lat:59.9}}`. Forced
//! calls have no grammar here: they are plain JSON. (Gemma 4 thinks in its own channel,
//! `<|channel>thought\n..<channel|>`: see `reasoning`.)

use serde_json::{Map, Number, Value};

use super::paired::PairedCalls;
use super::{CallReader, ChatFormat, ParameterSchemas};
use crate::server::chat::piece::ToolCall;

const OPEN: &str = "<|tool_call>";
const CLOSE: &str = "<tool_call|>";
/// The string delimiter token.
const QUOTE: &str = "<|\"|>";

/// The special tokens whose text the reader must see.
const MARKERS: [&str; 3] = [OPEN, CLOSE, QUOTE];

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    (template.contains(OPEN) && template.contains(CLOSE)).then(|| Box::new(Gemma4) as Box<dyn ChatFormat>)
}

pub(super) struct Gemma4;

impl ChatFormat for Gemma4 {
    fn name(&self) -> &'static str {
        "gemma4"
    }

    fn markers(&self) -> &'static [&'static str] {
        &MARKERS
    }

    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(PairedCalls::new(OPEN, CLOSE, |body, _, _| parse_calls(body), schemas))
    }
}

/// What is between the markers: one call, or (as models sometimes write) several in a row;
/// `None` if it does not read as calls.
fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut reader = Reader { rest: body, depth: 0 };
    let mut calls = Vec::new();
    while reader.eat("call:") {
        let brace = reader.rest.find('{')?;
        let name = reader.rest[..brace].trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return None;
        }
        let name = name.to_string();
        reader.rest = &reader.rest[brace..];
        let arguments = reader.value()?;
        if !arguments.is_object() {
            return None;
        }
        calls.push(ToolCall { name, arguments: arguments.to_string() });
    }
    (!calls.is_empty() && reader.rest.trim().is_empty()).then_some(calls)
}

/// Values nest at most this deep (as serde_json's limit for the JSON formats): a model's
/// output must not exhaust the stack.
const MAX_DEPTH: usize = 128;

struct Reader<'a> {
    rest: &'a str,
    depth: usize,
}

impl Reader<'_> {
    fn skip_space(&mut self) {
        self.rest = self.rest.trim_start();
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        match self.rest.strip_prefix(token) {
            Some(after) => {
                self.rest = after;
                true
            }
            None => false,
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.depth += 1;
        let value = if self.depth > MAX_DEPTH { None } else { self.value_within() };
        self.depth -= 1;
        value
    }

    fn value_within(&mut self) -> Option<Value> {
        self.skip_space();
        if self.eat(QUOTE) {
            let end = self.rest.find(QUOTE)?;
            let text = self.rest[..end].to_string();
            self.rest = &self.rest[end + QUOTE.len()..];
            return Some(Value::String(text));
        }
        if self.eat("{") {
            let mut object = Map::new();
            if self.eat("}") {
                return Some(Value::Object(object));
            }
            loop {
                let key = self.key()?;
                if !self.eat(":") {
                    return None;
                }
                object.insert(key, self.value()?);
                if self.eat("}") {
                    return Some(Value::Object(object));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat("[") {
            let mut items = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            loop {
                items.push(self.value()?);
                if self.eat("]") {
                    return Some(Value::Array(items));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        // A bare word: a number, true/false/null, or (leniently) text.
        let end = self.rest.find([',', '}', ']']).unwrap_or(self.rest.len());
        let word = self.rest[..end].trim();
        self.rest = &self.rest[end..];
        if word.is_empty() {
            return None;
        }
        Some(match word {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" | "None" => Value::Null,
            _ => number(word).unwrap_or_else(|| Value::String(word.to_string())),
        })
    }

    /// A bare key, or one between `<|"|>` tokens.
    fn key(&mut self) -> Option<String> {
        if self.eat(QUOTE) {
            let end = self.rest.find(QUOTE)?;
            let key = self.rest[..end].to_string();
            self.rest = &self.rest[end + QUOTE.len()..];
            return Some(key);
        }
        let end = self.rest.find(':')?;
        let key = self.rest[..end].trim();
        self.rest = &self.rest[end..];
        (!key.is_empty()).then(|| key.to_string())
    }
}

fn number(word: &str) -> Option<Value> {
    if let Ok(n) = word.parse::<i64>() {
        return Some(Value::Number(n.into()));
    }
    word.parse::<f64>().ok().and_then(Number::from_f64).map(Value::Number)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;
    use crate::server::chat::piece::Piece;
    use serde_json::json;

    #[test]
    fn calls_split_across_tokens() {
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
            read(&Gemma4, &pieces),
            [
                Piece::Text("Let me check.".into()),
                call("get_weather", r#"{"location":"Paris, France"}"#),
                call("noop", "{}")
            ]
        );
        // Cut short: text, markers and all.
        assert_eq!(read(&Gemma4, &["<|tool_call>call:f{a:1"]), [Piece::Text("<|tool_call>call:f{a:1".into())]);
    }

    fn parse_call(body: &str) -> Option<ToolCall> {
        parse_calls(body).filter(|c| c.len() == 1).map(|mut c| c.remove(0))
    }

    fn args(body: &str) -> Value {
        serde_json::from_str(&parse_call(body).unwrap().arguments).unwrap()
    }

    #[test]
    fn calls_as_the_template_writes_them() {
        let call = parse_call("call:get_weather{location:<|\"|>Paris, France<|\"|>,unit:<|\"|>celsius<|\"|>}").unwrap();
        assert_eq!(call.name, "get_weather");
        assert_eq!(
            args("call:get_weather{location:<|\"|>Paris, France<|\"|>,unit:<|\"|>celsius<|\"|>}"),
            json!({"location": "Paris, France", "unit": "celsius"})
        );
        assert_eq!(
            args("call:f{days:3,metric:true,ratio:2.5,tags:[<|\"|>a<|\"|>,<|\"|>b<|\"|>],where:{lat:59.9,name:<|\"|>Oslo<|\"|>},none:null}"),
            json!({"days": 3, "metric": true, "ratio": 2.5, "tags": ["a", "b"], "where": {"lat": 59.9, "name": "Oslo"}, "none": null})
        );
        // Strings keep what JSON would have to escape.
        assert_eq!(
            args("call:edit{text:<|\"|>a \"quoted\" {brace}, [x]\n<|\"|>}"),
            json!({"text": "a \"quoted\" {brace}, [x]\n"})
        );
        assert_eq!(args("call:noop{}"), json!({}));
        assert_eq!(args(" call:f{ <|\"|>odd key<|\"|> : 1 } "), json!({"odd key": 1}));
    }

    #[test]
    fn several_calls_in_one_block() {
        let calls = parse_calls("call:a{x:1}call:b{}").unwrap();
        assert_eq!(calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let deep = format!("call:f{{a:{}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(parse_calls(&deep), None);
        let fine = format!("call:f{{a:{}1{}}}", "[".repeat(100), "]".repeat(100));
        assert!(parse_calls(&fine).is_some());
    }

    #[test]
    fn what_is_not_a_call() {
        for body in
            ["get_weather{}", "call:{a:1}", "call:f{a:<|\"|>open}", "call:f{a:1", "call:f{a:1}} trailing", "call:f[1]"]
        {
            assert_eq!(parse_call(body), None, "{body}");
        }
    }
}
