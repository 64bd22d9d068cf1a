//! The answer as it streams, split into what OpenAI's chat API reports separately: reasoning,
//! text, and tool calls (parsed in the template's format, or the forced ones of
//! [`ToolMode::Named`]/[`ToolMode::Required`]).

use serde_json::Value;

use super::harmony::HarmonyParser;
use super::named_arguments::NamedArguments;
use super::reasoning::{Part, ReasoningSplitter};
use super::structured::{CallFormat, ToolMode};
use super::tool_calls::{self, call_from_value, ParameterSchemas, ToolCall, ToolCallParser};

#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Reasoning(String),
    /// A complete tool call.
    Call(ToolCall),
    /// More of the arguments of the one call a named `tool_choice` forces.
    Arguments(String),
}

enum Tools {
    Off,
    Parse(ToolCallParser),
    Named,
    /// A named call in the model's format: its JSON arguments, read out of the call's text.
    NamedArguments(NamedArguments),
    /// A named call in a format whose arguments are not JSON (Qwen's XML): read when complete.
    NamedParsed(ToolCallParser, Vec<ToolCall>),
    /// The JSON list of calls, read to the end.
    Required(String),
}

pub struct AnswerParser {
    reasoning: Option<ReasoningSplitter>,
    tools: Tools,
    /// gpt-oss: one parser for reasoning, answer and calls (`tools` is then `Off`), and whether
    /// tools were offered (else a call is shown as text).
    harmony: Option<(HarmonyParser, bool)>,
}

impl AnswerParser {
    pub fn new(mode: &ToolMode, reasoning: Option<ReasoningSplitter>) -> AnswerParser {
        let tools = match mode {
            ToolMode::Off => Tools::Off,
            ToolMode::Auto(format) => Tools::Parse(ToolCallParser::new(*format)),
            ToolMode::Named(_) => Tools::Named,
            ToolMode::Required => Tools::Required(String::new()),
        };
        AnswerParser { reasoning, tools, harmony: None }
    }

    /// Forced calls written in the model's own format (not as JSON).
    pub fn with_call_format(mut self, call_format: Option<&CallFormat>) -> AnswerParser {
        let Some(CallFormat { format, arguments_after }) = call_format else { return self };
        self.tools = match (&self.tools, arguments_after) {
            (Tools::Named, Some(key)) => Tools::NamedArguments(NamedArguments::new(key)),
            (Tools::Named, None) => Tools::NamedParsed(ToolCallParser::new(*format), Vec::new()),
            (Tools::Required(_), _) => Tools::Parse(ToolCallParser::new(*format)),
            _ => return self,
        };
        self
    }

    /// For a Harmony model (gpt-oss) answering freely: channels split reasoning from the
    /// answer, and calls come back as calls when `mode` offers tools.
    pub fn harmony(mode: &ToolMode) -> AnswerParser {
        let calls = matches!(mode, ToolMode::Auto(_));
        AnswerParser { reasoning: None, tools: Tools::Off, harmony: Some((HarmonyParser::new(), calls)) }
    }
    /// The tools' parameter schemas, for formats that write values as text (Qwen's XML).
    pub fn with_schemas(mut self, schemas: ParameterSchemas) -> AnswerParser {
        self.tools = match self.tools {
            Tools::Parse(parser) => Tools::Parse(parser.with_schemas(schemas)),
            Tools::NamedParsed(parser, calls) => Tools::NamedParsed(parser.with_schemas(schemas), calls),
            other => other,
        };
        self
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        if let Some((harmony, calls)) = self.harmony.as_mut() {
            return harmony_pieces(harmony.push(text), *calls);
        }
        let parts = match self.reasoning.as_mut() {
            Some(r) => r.push(text),
            None => vec![Part::Answer(text.to_string())],
        };
        self.route(parts)
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        if let Some((harmony, calls)) = self.harmony.as_mut() {
            return harmony_pieces(harmony.finish(), *calls);
        }
        let parts = self.reasoning.as_mut().map(ReasoningSplitter::finish).unwrap_or_default();
        let mut out = self.route(parts);
        match &mut self.tools {
            Tools::Off | Tools::Named => {}
            Tools::Parse(parser) => out.extend(parser.finish().into_iter().map(from_tool_piece)),
            Tools::NamedArguments(_) => {}
            Tools::NamedParsed(parser, calls) => {
                calls.extend(parser.finish().into_iter().filter_map(tool_call));
                out.extend(calls.drain(..).next().map(|c| Piece::Arguments(c.arguments)));
            }
            Tools::Required(buffer) => {
                let text = std::mem::take(buffer);
                match parse_call_list(&text) {
                    Some(calls) => out.extend(calls.into_iter().map(Piece::Call)),
                    None if text.is_empty() => {}
                    None => out.push(Piece::Text(text)),
                }
            }
        }
        out
    }

    fn route(&mut self, parts: Vec<Part>) -> Vec<Piece> {
        let mut out = Vec::new();
        for part in parts {
            match part {
                Part::Reasoning(t) => out.push(Piece::Reasoning(t)),
                Part::Answer(t) => match &mut self.tools {
                    Tools::Off => out.push(Piece::Text(t)),
                    Tools::Parse(parser) => out.extend(parser.push(&t).into_iter().map(from_tool_piece)),
                    Tools::Named => out.push(Piece::Arguments(t)),
                    Tools::NamedArguments(arguments) => out.push(Piece::Arguments(arguments.push(&t))),
                    // Held to the end: its arguments come out once the call is complete.
                    Tools::NamedParsed(parser, calls) => {
                        calls.extend(parser.push(&t).into_iter().filter_map(tool_call))
                    }
                    Tools::Required(buffer) => buffer.push_str(&t),
                },
            }
        }
        out.retain(|p| !matches!(p, Piece::Text(t) | Piece::Reasoning(t) | Piece::Arguments(t) if t.is_empty()));
        out
    }
}

/// A Harmony call where no tools were offered is shown as text (its arguments).
fn harmony_pieces(pieces: Vec<Piece>, calls: bool) -> Vec<Piece> {
    pieces
        .into_iter()
        .map(|p| match p {
            Piece::Call(call) if !calls => Piece::Text(call.arguments),
            other => other,
        })
        .filter(|p| !matches!(p, Piece::Text(t) | Piece::Reasoning(t) if t.is_empty()))
        .collect()
}

fn tool_call(piece: tool_calls::Piece) -> Option<ToolCall> {
    match piece {
        tool_calls::Piece::Call(call) => Some(call),
        tool_calls::Piece::Text(_) => None,
    }
}

fn from_tool_piece(piece: tool_calls::Piece) -> Piece {
    match piece {
        tool_calls::Piece::Text(t) => Piece::Text(t),
        tool_calls::Piece::Call(c) => Piece::Call(c),
    }
}

/// `[{"name": .., "arguments": {..}}, ..]`, as the grammar of `tool_choice: "required"` makes it.
fn parse_call_list(text: &str) -> Option<Vec<ToolCall>> {
    let calls: Vec<Value> = serde_json::from_str(text).ok()?;
    calls.iter().map(call_from_value).collect::<Option<Vec<_>>>().filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::chat::tool_calls::ToolFormat;

    fn run(mode: ToolMode, thinking: Option<bool>, pieces: &[&str]) -> Vec<Piece> {
        let mut p = AnswerParser::new(&mode, thinking.map(ReasoningSplitter::new));
        let mut out: Vec<Piece> = pieces.iter().flat_map(|t| p.push(t)).collect();
        out.extend(p.finish());
        out
    }

    #[test]
    fn reasoning_then_a_hermes_call() {
        let out = run(
            ToolMode::Auto(ToolFormat::Hermes),
            Some(false),
            &["<think>need weather</think>\n\n", "<tool_call>{\"name\": \"w\", \"arguments\": {}}</tool_call>"],
        );
        assert_eq!(
            out,
            vec![
                Piece::Reasoning("need weather".into()),
                Piece::Call(ToolCall { name: "w".into(), arguments: "{}".into() })
            ]
        );
    }

    #[test]
    fn harmony_reasoning_answer_and_calls() {
        let text = "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>commentary to=functions.w <|constrain|>json<|message|>{\"city\": \"Oslo\"}";
        let mut p = AnswerParser::harmony(&ToolMode::Auto(ToolFormat::Harmony));
        let mut out = p.push(text);
        out.extend(p.finish());
        assert_eq!(
            out,
            vec![
                Piece::Reasoning("Weather needed.".into()),
                Piece::Call(ToolCall { name: "w".into(), arguments: "{\"city\":\"Oslo\"}".into() })
            ]
        );
        let mut p = AnswerParser::harmony(&ToolMode::Off);
        let mut out = p.push("<|channel|>final<|message|>Hi.");
        out.extend(p.finish());
        assert_eq!(out, vec![Piece::Text("Hi.".into())]);
    }

    #[test]
    fn forced_calls() {
        let out = run(ToolMode::Named("w".into()), None, &["{\"city\":", " \"Oslo\"}"]);
        assert_eq!(out, vec![Piece::Arguments("{\"city\":".into()), Piece::Arguments(" \"Oslo\"}".into())]);
        let out = run(ToolMode::Required, None, &["[{\"name\": \"w\", ", "\"arguments\": {\"city\": \"Oslo\"}}]"]);
        assert_eq!(out, vec![Piece::Call(ToolCall { name: "w".into(), arguments: "{\"city\":\"Oslo\"}".into() })]);
        let out = run(ToolMode::Required, None, &["[{\"name\": \"w\""]);
        assert_eq!(out, vec![Piece::Text("[{\"name\": \"w\"".into())], "cut short: the text as it is");
    }
}
