//! gpt-oss's Harmony format: the answer is a series of messages, each a header then a body,
//!
//! `<|channel|>analysis<|message|>..thinking..<|end|><|start|>assistant<|channel|>final<|message|>..answer..<|return|>`
//!
//! and a tool call is a message on the `commentary` channel addressed to the function:
//! `<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>`
//! (the recipient may also come before the channel: `assistant to=functions.x<|channel|>..`).
//! `analysis` becomes reasoning, `final` (and `commentary` addressed to no one: a preamble the
//! user sees) the answer, calls to `functions.*` tool calls. Bodies stream as they come; a
//! marker cut across tokens is held back until it is whole. The markers are special tokens: the
//! engine keeps their text for this reader ([`MARKERS`]). The reader splits the reasoning itself,
//! so no reasoning splitter runs before it; where no tools were offered, a call is shown as text.
//! Forced calls have no grammar here: they are plain JSON (and then no channel is written).

use super::reasoning::ReasoningTags;
use super::{partial_len, CallReader, ChatFormat, ParameterSchemas};
use crate::server::chat::piece::{Piece, ToolCall};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";
const CONSTRAIN: &str = "<|constrain|>";

/// The special tokens whose text the reader must see.
const MARKERS: [&str; 7] = [START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN];

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    (template.contains(CHANNEL) && template.contains(MESSAGE)).then(|| Box::new(Harmony) as Box<dyn ChatFormat>)
}

pub(super) struct Harmony;

impl ChatFormat for Harmony {
    fn name(&self) -> &'static str {
        "harmony"
    }

    fn markers(&self) -> &'static [&'static str] {
        &MARKERS
    }

    fn reader(&self, _schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(HarmonyParser::new())
    }

    fn reads_whole_answer(&self) -> bool {
        true
    }

    fn reasoning_tags(&self, _template: &str) -> Option<ReasoningTags> {
        None
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Body {
    Reasoning,
    Answer,
    /// A call to this function; its arguments are read to the end of the message.
    Call(String),
}

struct HarmonyParser {
    /// Reading a header (up to `<|message|>`), or a body of this kind.
    body: Option<Body>,
    pending: String,
}

impl HarmonyParser {
    /// Generation starts right after the prompt's `<|start|>assistant`: in a header.
    fn new() -> HarmonyParser {
        HarmonyParser { body: None, pending: String::new() }
    }
}

impl CallReader for HarmonyParser {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.body.clone() {
                None => {
                    let Some(at) = self.pending.find(MESSAGE) else { return out };
                    let header: String = self.pending.drain(..at + MESSAGE.len()).collect();
                    self.body = Some(body_of(&header[..at]));
                }
                Some(kind) => {
                    let ends = [END, CALL, RETURN, START];
                    let end = ends.iter().filter_map(|m| self.pending.find(m).map(|at| (at, *m))).min();
                    if let Some((at, marker)) = end {
                        let body: String = self.pending.drain(..at).collect();
                        // `<|start|>` opens the next header itself; the others are consumed.
                        if marker != START {
                            self.pending.drain(..marker.len());
                        }
                        emit(&mut out, &kind, body, true);
                        self.body = None;
                        continue;
                    }
                    if matches!(kind, Body::Call(_)) {
                        return out;
                    }
                    let keep = ends.iter().map(|m| partial_len(&self.pending, m)).max().unwrap_or(0);
                    let body: String = self.pending.drain(..self.pending.len() - keep).collect();
                    emit(&mut out, &kind, body, false);
                    return out;
                }
            }
        }
    }

    /// The end of the generation (the stop token `<|return|>` or `<|call|>` is not in the text).
    fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match self.body.take() {
            Some(kind) => emit(&mut out, &kind, rest, true),
            // A header never finished: show it rather than lose it.
            None if !rest.trim().is_empty() => out.push(Piece::Text(rest)),
            None => {}
        }
        out
    }
}

/// What a header (`assistant to=functions.x<|channel|>commentary <|constrain|>json`, or a part
/// of it) makes of the body that follows.
fn body_of(header: &str) -> Body {
    let channel = header
        .split_once(CHANNEL)
        .map(|(_, rest)| rest.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or_default())
        .unwrap_or_default();
    let recipient = header
        .split_whitespace()
        .find_map(|word| word.strip_prefix("to="))
        .map(|r| r.split(CHANNEL).next().unwrap_or(r).split(CONSTRAIN).next().unwrap_or(r).to_string());
    match (channel, recipient) {
        (_, Some(recipient)) => Body::Call(recipient.strip_prefix("functions.").unwrap_or(&recipient).to_string()),
        ("analysis", None) => Body::Reasoning,
        _ => Body::Answer,
    }
}

fn emit(out: &mut Vec<Piece>, kind: &Body, body: String, whole: bool) {
    match kind {
        Body::Reasoning if !body.is_empty() => out.push(Piece::Reasoning(body)),
        Body::Answer if !body.is_empty() => out.push(Piece::Text(body)),
        Body::Call(name) if whole => {
            let arguments = body.trim();
            let arguments = match serde_json::from_str::<serde_json::Value>(arguments) {
                Ok(v) => v.to_string(),
                // Not JSON (a cut-off call): passed on as written, as OpenAI's API would.
                Err(_) => arguments.to_string(),
            };
            out.push(Piece::Call(ToolCall { name: name.clone(), arguments }));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pieces: &[&str]) -> Vec<Piece> {
        let mut p = HarmonyParser::new();
        let mut out: Vec<Piece> = pieces.iter().flat_map(|t| p.push(t)).collect();
        out.extend(p.finish());
        let mut merged: Vec<Piece> = Vec::new();
        for piece in out {
            match (merged.last_mut(), piece) {
                (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
                (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
                (_, piece) => merged.push(piece),
            }
        }
        merged
    }

    fn call(name: &str, arguments: &str) -> Piece {
        Piece::Call(ToolCall { name: name.into(), arguments: arguments.into() })
    }

    #[test]
    fn analysis_then_final_split_across_tokens() {
        let out = run(&[
            "<|channel|>",
            "analysis",
            "<|message|>",
            "User wants",
            " a greeting.",
            "<|end|>",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "final",
            "<|message|>",
            "Hello",
            "!",
        ]);
        assert_eq!(out, vec![Piece::Reasoning("User wants a greeting.".into()), Piece::Text("Hello!".into())]);
        // Markers cut inside (as text pieces would be without special tokens).
        let out = run(&[
            "<|chan",
            "nel|>analysis<|mes",
            "sage|>Hm.<|e",
            "nd|><|start|>assistant<|channel|>final<|message|>Hi<|ret",
            "urn|>",
        ]);
        assert_eq!(out, vec![Piece::Reasoning("Hm.".into()), Piece::Text("Hi".into())]);
    }

    #[test]
    fn tool_calls_in_both_header_orders() {
        let out = run(&[
            "<|channel|>analysis<|message|>Need weather.<|end|>",
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
            "{\"city\":",
            " \"Paris\"}",
        ]);
        assert_eq!(out, vec![Piece::Reasoning("Need weather.".into()), call("get_weather", r#"{"city":"Paris"}"#)]);
        let out = run(&[" to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>"]);
        assert_eq!(out, vec![call("lookup", "{}")]);
        // Two calls, the first ended by <|call|> in the text.
        let out = run(&[
            "<|channel|>commentary to=functions.a<|message|>{\"x\":1}<|call|>",
            "<|start|>assistant<|channel|>commentary to=functions.b<|message|>{}",
        ]);
        assert_eq!(out, vec![call("a", r#"{"x":1}"#), call("b", "{}")]);
    }

    #[test]
    fn preambles_and_unfinished_output() {
        let out = run(&[
            "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
        ]);
        assert_eq!(out, vec![Piece::Text("Let me look.Done.".into())]);
        assert_eq!(run(&["<|channel|>analysis<|message|>cut sh"]), vec![Piece::Reasoning("cut sh".into())]);
        assert_eq!(run(&["<|channel|>fin"]), vec![Piece::Text("<|channel|>fin".into())]);
        assert!(detect("{{ '<|channel|>analysis<|message|>' }}").is_some());
        assert!(detect("{{ '<|im_start|>' }}").is_none());
    }
}
