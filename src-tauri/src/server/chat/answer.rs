//! The answer as it streams, split into what the dialects report apart: reasoning, text, and
//! tool calls (read in the model's format, or the forced ones of [`ToolMode::Named`] and
//! [`ToolMode::Required`]).

use super::format::reasoning::{Part, ReasoningSplitter};
use super::format::{parse_call_list, CallReader, ModelFormat, ParameterSchemas};
use super::named_arguments::NamedArguments;
use super::piece::{Piece, ToolCall};
use super::structured::{AnswerShape, ToolMode};

enum Tools {
    Off,
    Parse(Box<dyn CallReader>),
    Named,
    /// A named call in the model's format: its JSON arguments, read out of the call's text.
    NamedArguments(NamedArguments),
    /// A named call in a format whose arguments are not JSON (Qwen's XML): read when complete.
    NamedParsed(Box<dyn CallReader>, Vec<ToolCall>),
    /// The JSON list of calls, read to the end.
    Required(String),
}

pub struct AnswerParser {
    reasoning: Option<ReasoningSplitter>,
    tools: Tools,
    /// A format whose reader reads the whole answer (Harmony's channels: reasoning, text and
    /// calls; `tools` is then `Off`), and whether tools were offered (else a call is shown as
    /// text).
    whole: Option<(Box<dyn CallReader>, bool)>,
}

impl AnswerParser {
    /// The parser of an answer of `shape` from a model of `format` to `prompt`, and the special
    /// tokens whose text it must see (the engine keeps their text for it).
    pub fn for_answer(
        format: &ModelFormat,
        shape: &AnswerShape,
        schemas: ParameterSchemas,
        prompt: &str,
    ) -> (AnswerParser, Vec<&'static str>) {
        let calls = format.calls();
        // A grammar that decides the whole answer leaves no room for reasoning or channels.
        if shape.grammar_decides_answer() {
            let markers = if shape.call_format.is_some() { calls.markers().to_vec() } else { Vec::new() };
            return (AnswerParser::new(&shape.mode, None).with_call_format(shape, format, schemas), markers);
        }
        if calls.reads_whole_answer() {
            let offered = matches!(shape.mode, ToolMode::Auto);
            let parser =
                AnswerParser { reasoning: None, tools: Tools::Off, whole: Some((calls.reader(schemas), offered)) };
            return (parser, calls.markers().to_vec());
        }
        let reasoning = format.reasoning(prompt);
        let mut markers = match shape.mode {
            ToolMode::Auto => calls.markers().to_vec(),
            _ => Vec::new(),
        };
        markers.extend(reasoning.as_ref().map(ReasoningSplitter::special_tokens).unwrap_or_default());
        let parser = match shape.mode {
            ToolMode::Auto => AnswerParser { reasoning, tools: Tools::Parse(calls.reader(schemas)), whole: None },
            _ => AnswerParser::new(&shape.mode, reasoning),
        };
        (parser, markers)
    }

    fn new(mode: &ToolMode, reasoning: Option<ReasoningSplitter>) -> AnswerParser {
        let tools = match mode {
            // Where tools are read out of a free answer, `for_answer` gives the format's reader.
            ToolMode::Off | ToolMode::Auto => Tools::Off,
            ToolMode::Named(_) => Tools::Named,
            ToolMode::Required => Tools::Required(String::new()),
        };
        AnswerParser { reasoning, tools, whole: None }
    }

    /// Forced calls written in the model's own format (not as JSON).
    fn with_call_format(
        mut self,
        shape: &AnswerShape,
        format: &ModelFormat,
        schemas: ParameterSchemas,
    ) -> AnswerParser {
        let Some(call_format) = &shape.call_format else { return self };
        self.tools = match (&self.tools, &call_format.arguments_after) {
            (Tools::Named, Some(key)) => Tools::NamedArguments(NamedArguments::new(key)),
            (Tools::Named, None) => Tools::NamedParsed(format.calls().reader(schemas), Vec::new()),
            (Tools::Required(_), _) => Tools::Parse(format.calls().reader(schemas)),
            _ => return self,
        };
        self
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        if let Some((reader, offered)) = self.whole.as_mut() {
            return calls_shown_as_text(reader.push(text), *offered);
        }
        let parts = match self.reasoning.as_mut() {
            Some(r) => r.push(text),
            None => vec![Part::Answer(text.to_string())],
        };
        self.route(parts)
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        if let Some((reader, offered)) = self.whole.as_mut() {
            return calls_shown_as_text(reader.finish(), *offered);
        }
        let parts = self.reasoning.as_mut().map(ReasoningSplitter::finish).unwrap_or_default();
        let mut out = self.route(parts);
        match &mut self.tools {
            Tools::Off | Tools::Named | Tools::NamedArguments(_) => {}
            Tools::Parse(reader) => out.extend(reader.finish()),
            Tools::NamedParsed(reader, calls) => {
                calls.extend(reader.finish().into_iter().filter_map(only_calls));
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
        out.retain(|p| !p.is_empty());
        out
    }

    fn route(&mut self, parts: Vec<Part>) -> Vec<Piece> {
        let mut out = Vec::new();
        for part in parts {
            match part {
                Part::Reasoning(t) => out.push(Piece::Reasoning(t)),
                Part::Answer(t) => match &mut self.tools {
                    Tools::Off => out.push(Piece::Text(t)),
                    Tools::Parse(reader) => out.extend(reader.push(&t)),
                    Tools::Named => out.push(Piece::Arguments(t)),
                    Tools::NamedArguments(arguments) => out.push(Piece::Arguments(arguments.push(&t))),
                    // Held to the end: its arguments come out once the call is complete.
                    Tools::NamedParsed(reader, calls) => {
                        calls.extend(reader.push(&t).into_iter().filter_map(only_calls))
                    }
                    Tools::Required(buffer) => buffer.push_str(&t),
                },
            }
        }
        out.retain(|p| !p.is_empty());
        out
    }
}

/// A call where no tools were offered is shown as text (its arguments).
fn calls_shown_as_text(pieces: Vec<Piece>, offered: bool) -> Vec<Piece> {
    pieces
        .into_iter()
        .map(|p| match p {
            Piece::Call(call) if !offered => Piece::Text(call.arguments),
            other => other,
        })
        .filter(|p| !p.is_empty())
        .collect()
}

fn only_calls(piece: Piece) -> Option<ToolCall> {
    match piece {
        Piece::Call(call) => Some(call),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::chat::structured::CallFormat;

    fn shape(mode: ToolMode, call_format: Option<CallFormat>, grammar: bool) -> AnswerShape<'static> {
        let grammar = grammar.then(|| std::sync::Arc::new(crate::constrain::Grammar::any_object()));
        AnswerShape { prompt_tools: None, mode, grammar, call_format }
    }

    fn run(template: &str, shape: &AnswerShape, prompt: &str, pieces: &[&str]) -> Vec<Piece> {
        let format = ModelFormat::of_template(template);
        let (mut p, _) = AnswerParser::for_answer(&format, shape, Default::default(), prompt);
        let mut out: Vec<Piece> = pieces.iter().flat_map(|t| p.push(t)).collect();
        out.extend(p.finish());
        out
    }

    #[test]
    fn reasoning_then_a_hermes_call() {
        let out = run(
            "<tool_call></think>",
            &shape(ToolMode::Auto, None, false),
            "<|im_start|>assistant\n",
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
        let harmony = "<|channel|><|message|>";
        let text = "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>commentary to=functions.w <|constrain|>json<|message|>{\"city\": \"Oslo\"}";
        let out = run(harmony, &shape(ToolMode::Auto, None, false), "", &[text]);
        assert_eq!(
            out,
            vec![
                Piece::Reasoning("Weather needed.".into()),
                Piece::Call(ToolCall { name: "w".into(), arguments: "{\"city\":\"Oslo\"}".into() })
            ]
        );
        let out = run(harmony, &shape(ToolMode::Off, None, false), "", &["<|channel|>final<|message|>Hi."]);
        assert_eq!(out, vec![Piece::Text("Hi.".into())]);
        let out = run(harmony, &shape(ToolMode::Off, None, false), "", &[text]);
        assert_eq!(out[1], Piece::Text("{\"city\":\"Oslo\"}".into()), "no tools offered: the call is text");
    }

    #[test]
    fn forced_calls() {
        let plain = "{{ messages }}";
        let named = shape(ToolMode::Named("w".into()), None, true);
        let out = run(plain, &named, "", &["{\"city\":", " \"Oslo\"}"]);
        assert_eq!(out, vec![Piece::Arguments("{\"city\":".into()), Piece::Arguments(" \"Oslo\"}".into())]);
        let required = shape(ToolMode::Required, None, true);
        let out = run(plain, &required, "", &["[{\"name\": \"w\", ", "\"arguments\": {\"city\": \"Oslo\"}}]"]);
        assert_eq!(out, vec![Piece::Call(ToolCall { name: "w".into(), arguments: "{\"city\":\"Oslo\"}".into() })]);
        let out = run(plain, &required, "", &["[{\"name\": \"w\""]);
        assert_eq!(out, vec![Piece::Text("[{\"name\": \"w\"".into())], "cut short: the text as it is");
        // In the model's own format, its arguments streamed from after the key.
        let hermes = shape(
            ToolMode::Named("w".into()),
            Some(CallFormat { arguments_after: Some("\"arguments\"".into()) }),
            true,
        );
        let out = run(
            "<tool_call>",
            &hermes,
            "",
            &["<tool_call>\n{\"name\": \"w\", \"arguments\": ", "{\"a\": 1}}\n</tool_call>"],
        );
        let arguments: String = out.iter().map(|p| if let Piece::Arguments(a) = p { a.as_str() } else { "" }).collect();
        assert_eq!(arguments, "{\"a\": 1}");
    }
}
