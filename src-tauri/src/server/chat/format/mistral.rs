//! Mistral: the special token `[TOOL_CALLS]`, then a JSON list of calls (v3 tokenizers:
//! `[TOOL_CALLS] [{"name": .., "arguments": {..}}]`) or `name[ARGS]{..}` per call (v11 and
//! later: Mistral Small 3.2, Devstral, Magistral; `[CALL_ID]id` before `[ARGS]` in some). Its
//! templates refuse call ids that are not nine characters.

use serde_json::{json, Value};

use super::lark::{call_objects, json_rule, lark_string, marker, text_marker, CallSyntax};
use super::{parse_call_list, partial_len, CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};
use crate::server::chat::piece::{Piece, ToolCall};

const CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    template.contains(CALLS).then(|| {
        Box::new(Mistral { name_args: template.contains(ARGS), nine_character_ids: template.contains("length != 9") })
            as Box<dyn ChatFormat>
    })
}

pub(super) struct Mistral {
    /// `name[ARGS]{..}` per call (v11+), else the JSON list (v3).
    name_args: bool,
    /// The template refuses call ids that are not nine characters.
    nine_character_ids: bool,
}

impl ChatFormat for Mistral {
    fn name(&self) -> &'static str {
        if self.name_args {
            "mistral-v11"
        } else {
            "mistral-v3"
        }
    }

    fn markers(&self) -> &'static [&'static str] {
        &[CALLS, ARGS, CALL_ID]
    }

    fn reader(&self, _schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(Reader { pending: String::new(), in_calls: false })
    }

    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        let arguments_after = if self.name_args { ARGS } else { "\"arguments\"" };
        Some(self.syntax(spec).and_then(|s| s.forced(spec, Some(arguments_after))))
    }

    fn strict_calls(&self, spec: &CallSpec) -> Option<Result<Grammar, SchemaError>> {
        Some(self.syntax(spec).and_then(|s| s.strict(spec)))
    }

    fn rewrite_history(&self, messages: &mut [Value]) {
        if self.nine_character_ids {
            nine_character_call_ids(messages);
        }
    }
}

impl Mistral {
    fn syntax(&self, spec: &CallSpec) -> Result<CallSyntax, SchemaError> {
        if self.name_args {
            // `[TOOL_CALLS]name[ARGS]{...}` per call.
            let alternatives = spec
                .functions
                .iter()
                .map(|f| Ok(format!("{} {} {}", lark_string(&f.name), marker(spec, ARGS), json_rule(&f.parameters)?)))
                .collect::<Result<Vec<String>, SchemaError>>()?;
            return Ok(CallSyntax {
                open_lark: marker(spec, CALLS),
                open_text: text_marker(spec, CALLS),
                body: format!("({})", alternatives.join(" | ")),
                separator: Some(String::new()),
                rules: String::new(),
            });
        }
        // `[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`, an `"id"` after the arguments as
        // the template writes calls in the history.
        let mut items = call_objects(spec.functions, "arguments");
        let alternatives = match items.get_mut("anyOf") {
            Some(Value::Array(list)) => list.iter_mut().collect::<Vec<_>>(),
            _ => vec![&mut items],
        };
        for call in alternatives {
            call["properties"]["id"] = json!({"type": "string", "pattern": "^[A-Za-z0-9]{9}$"});
        }
        let mut list = json!({"type": "array", "items": items, "minItems": 1});
        if !spec.parallel {
            list["maxItems"] = json!(1);
        }
        Ok(CallSyntax {
            open_lark: marker(spec, CALLS),
            open_text: text_marker(spec, CALLS),
            body: format!("{}? {}", lark_string(" "), json_rule(&list)?),
            separator: None,
            rules: String::new(),
        })
    }
}

/// Text up to `[TOOL_CALLS]`; after it, everything is read to the end.
struct Reader {
    pending: String,
    in_calls: bool,
}

impl CallReader for Reader {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        if self.in_calls {
            return Vec::new();
        }
        if let Some(start) = self.pending.find(CALLS) {
            let text: String = self.pending.drain(..start + CALLS.len()).collect();
            self.in_calls = true;
            let text = &text[..start];
            return if text.trim().is_empty() { Vec::new() } else { vec![Piece::Text(text.to_string())] };
        }
        let emit_to = self.pending.len() - partial_len(&self.pending, CALLS);
        if emit_to == 0 {
            return Vec::new();
        }
        vec![Piece::Text(self.pending.drain(..emit_to).collect())]
    }

    fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        if rest.is_empty() {
            return Vec::new();
        }
        if !self.in_calls {
            return vec![Piece::Text(rest)];
        }
        match parse_calls(&rest) {
            Some(calls) => calls.into_iter().map(Piece::Call).collect(),
            None => vec![Piece::Text(format!("{CALLS}{rest}"))],
        }
    }
}

/// What follows `[TOOL_CALLS]`: `[{call}, ..]`, or `name[ARGS]{..}` (with `[CALL_ID]id` before
/// `[ARGS]` in some versions), repeated after further `[TOOL_CALLS]` markers.
fn parse_calls(text: &str) -> Option<Vec<ToolCall>> {
    let text = text.trim();
    if text.starts_with('[') {
        return parse_call_list(text);
    }
    text.split(CALLS)
        .filter(|part| !part.trim().is_empty())
        .map(|part| {
            let (name, arguments) = part.split_once(ARGS)?;
            let name = name.split(CALL_ID).next()?.trim();
            let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
            (!name.is_empty() && arguments.is_object())
                .then(|| ToolCall { name: name.to_string(), arguments: arguments.to_string() })
        })
        .collect::<Option<Vec<_>>>()
        .filter(|c| !c.is_empty())
}

/// Each id (the calls' and the tool results') maps to nine alphanumerics derived from it, so
/// calls and results still pair up.
fn nine_character_call_ids(messages: &mut [Value]) {
    fn nine(id: &str) -> String {
        if id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()) {
            return id.to_string();
        }
        // FNV-1a, written in base 62 (62^9 > 2^53: distinct ids stay distinct in practice).
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.bytes() {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..9)
            .map(|_| {
                let c = CHARS[(hash % 62) as usize] as char;
                hash /= 62;
                c
            })
            .collect()
    }
    for m in messages.iter_mut() {
        if let Some(Value::String(id)) = m.get("tool_call_id") {
            m["tool_call_id"] = Value::String(nine(id));
        }
        if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
            for call in calls.iter_mut() {
                if let Some(Value::String(id)) = call.get("id") {
                    call["id"] = Value::String(nine(id));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;

    const V3: Mistral = Mistral { name_args: false, nine_character_ids: true };

    #[test]
    fn calls_after_the_marker_token() {
        let out = read(
            &V3,
            &[
                "[TOOL",
                "_CALLS]",
                "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, ",
                "{\"name\": \"b\", \"arguments\": {}}]",
            ],
        );
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Rome"}"#), call("b", "{}")]);
        let out = read(
            &V3,
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
        assert_eq!(read(&V3, &["[TOOL_CALLS]", "oops"]), vec![Piece::Text("[TOOL_CALLS]oops".into())]);
        assert_eq!(read(&V3, &["[not a call]"]), vec![Piece::Text("[not a call]".into())]);
    }

    #[test]
    fn call_ids_fit_the_template_and_still_pair() {
        let mut messages = vec![
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_AbC123xyZ", "type": "function", "function": {"name": "w"}}, {"id": "ABCDEFGHI", "type": "function", "function": {"name": "w"}}]}),
            json!({"role": "tool", "tool_call_id": "call_AbC123xyZ", "content": "sunny"}),
            json!({"role": "tool", "tool_call_id": "ABCDEFGHI", "content": "rain"}),
        ];
        V3.rewrite_history(&mut messages);
        let first = messages[0]["tool_calls"][0]["id"].as_str().unwrap().to_string();
        assert!(first.len() == 9 && first.chars().all(|c| c.is_ascii_alphanumeric()), "{first}");
        assert_eq!(messages[1]["tool_call_id"], first.as_str(), "the result still pairs with its call");
        assert_eq!(messages[0]["tool_calls"][1]["id"], "ABCDEFGHI", "a valid id is kept");
        assert_eq!(messages[2]["tool_call_id"], "ABCDEFGHI");
    }
}
