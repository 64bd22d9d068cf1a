//! A model family's output format, one file each: which special tokens mark its tool calls, how
//! its calls are read out of the answer while it streams, the grammar of the calls it is made to
//! write (a forced `tool_choice`, `--strict-tools`), how earlier calls are written back into a
//! conversation whose template renders none, and which tags its reasoning sits in.
//!
//! The format is chosen once per loaded model from its chat template ([`ModelFormat::of_template`],
//! kept by [`FormatCache`] while the model is loaded), never sniffed again per request. Adding a
//! family's format is one file implementing [`ChatFormat`] (with its `detect` and its tests) and
//! its name in the list below.

mod lark;
mod paired;
mod plain;
pub mod reasoning;
mod sections;
#[cfg(test)]
mod tests;
mod xml_calls;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use serde_json::{json, Map, Value};

use super::piece::{Piece, ToolCall};
use crate::constrain::{Grammar, SchemaError};
use crate::tokenizer::ChatTemplate;
use reasoning::{ReasoningSplitter, ReasoningTags};

/// The formats, each a module with a `detect`: tried in this order on a model's chat template,
/// the first that recognises it wins (Harmony's, Gemma 4's, MiniMax's, DeepSeek's, Kimi's and Nemotron's markers are their own; GLM's and
/// Qwen's XML templates also hold Hermes' `<tool_call>`, so they come first; Llama's test is the
/// loosest, so it comes last). A template none of them recognises gets [`plain::Plain`]: no
/// tool calls are read.
macro_rules! formats {
    ($($format:ident),* $(,)?) => {
        $(mod $format;)*
        const DETECT: &[Detect] = &[$($format::detect),*];
    };
}
formats![harmony, gemma4, pythonic, minimax, deepseek, kimi, glm, qwen_xml, nemotron, hermes, mistral, llama_json];

/// A format's test of a chat template: the format, when the template writes it.
type Detect = fn(&str) -> Option<Box<dyn ChatFormat>>;

/// One family's output format.
pub trait ChatFormat: Send + Sync {
    /// A short name, for logs and tests.
    fn name(&self) -> &'static str;

    /// Special tokens of the format whose text its reader must see (the engine drops the text of
    /// special tokens otherwise).
    fn markers(&self) -> &'static [&'static str];

    /// Whether the model writes tool calls at all (else tools are shown to it, but nothing it
    /// writes is read as a call).
    fn writes_calls(&self) -> bool {
        true
    }

    /// A reader of the calls in a free answer (`tool_choice: "auto"`) as it streams.
    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader>;

    /// Whether the format's reader reads the whole answer, reasoning included, tools or not
    /// (Harmony's channels); a reasoning splitter then never runs before it.
    fn reads_whole_answer(&self) -> bool {
        false
    }

    /// The grammar of forced calls (`tool_choice` required or named) as the model writes them;
    /// `None` where the format has none here (the calls are then plain JSON).
    fn forced_calls(&self, _spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        None
    }

    /// With `tool_choice: "auto"` and `--strict-tools`: free text, but a call the model opens
    /// must complete as a call of an offered function. `None` where the format has none.
    fn strict_calls(&self, _spec: &CallSpec) -> Option<Result<Grammar, SchemaError>> {
        None
    }

    /// An earlier assistant turn's calls (`{"function": {"name", "arguments"}}`, arguments an
    /// object) as text after its `content`, for a template that renders no `tool_calls`: by
    /// default the JSON list `tool_choice: "required"` has the model write, on a line of its own.
    fn calls_as_text(&self, content: &str, calls: &[Value]) -> String {
        let listed: Vec<Value> = calls
            .iter()
            .map(|c| json!({"name": c.pointer("/function/name").cloned().unwrap_or(Value::Null), "arguments": c.pointer("/function/arguments").cloned().unwrap_or(json!({}))}))
            .collect();
        let listed = Value::Array(listed).to_string();
        if content.is_empty() {
            listed
        } else {
            format!("{content}\n{listed}")
        }
    }

    /// What the template insists on in earlier turns, fixed before rendering (Mistral's
    /// nine-character call ids).
    fn rewrite_history(&self, _messages: &mut [Value]) {}

    /// For a template that renders no tool list: the description of `tools` the family's model
    /// card puts after the system prompt (`None`: the format has none).
    fn tool_instructions(&self, _tools: &[Value]) -> Option<String> {
        None
    }

    /// The tags this format's models reason in, given their template (default: the tags the
    /// template closes, `<think>` or Gemma 4's thought channel).
    fn reasoning_tags(&self, template: &str) -> Option<ReasoningTags> {
        reasoning::tags_of(template)
    }
}

/// Reads calls out of the answer's text as it streams.
pub trait CallReader: Send {
    /// Feeds newly generated text; returns what can be emitted now (text, calls; Harmony's
    /// reader also reasoning).
    fn push(&mut self, text: &str) -> Vec<Piece>;
    /// Generation ended: whatever is held back, as calls if it reads as calls, else as text.
    fn finish(&mut self) -> Vec<Piece>;
}

/// Each function's parameter schemas (`properties`), by function name: what types the values of
/// the formats that write them as text (Qwen's XML).
pub type ParameterSchemas = HashMap<String, Map<String, Value>>;

/// A function the model may be made to call.
pub struct Function {
    pub name: String,
    pub parameters: Value,
}

/// What a forced or strict call grammar is built for.
pub struct CallSpec<'a> {
    pub functions: &'a [&'a Function],
    /// One named function (`tool_choice` naming it): its arguments are streamed.
    pub named: bool,
    /// More than one call allowed.
    pub parallel: bool,
    /// A special token's id by its text: the grammar names a marker by id where it is a special
    /// token of the vocabulary, else writes it as text.
    pub special: &'a (dyn Fn(&str) -> Option<u32> + Sync),
}

/// The grammar of the forced calls, and for one named function the text its JSON arguments
/// follow (a key, or Mistral's `[ARGS]`), to stream them as they come; `None` when the format's
/// arguments are not JSON (Qwen's XML: they are read when the call is complete).
pub struct ForcedCalls {
    pub grammar: Grammar,
    pub arguments_after: Option<String>,
}

/// A model's format, resolved once from its chat template.
pub struct ModelFormat {
    calls: Box<dyn ChatFormat>,
    reasoning: Option<ReasoningTags>,
    /// Whether the template renders an assistant turn's `tool_calls` itself...
    renders_tool_calls: bool,
    /// ...and the request's `tools`.
    renders_tools: bool,
}

impl ModelFormat {
    pub fn of_template(source: &str) -> ModelFormat {
        let calls = DETECT.iter().find_map(|detect| detect(source)).unwrap_or_else(|| Box::new(plain::Plain));
        let reasoning = if calls.reads_whole_answer() { None } else { calls.reasoning_tags(source) };
        ModelFormat {
            reasoning,
            renders_tool_calls: source.contains("tool_calls"),
            renders_tools: source.contains("tools"),
            calls,
        }
    }

    /// For prompts no template made (raw completions): no calls, no reasoning.
    pub fn plain() -> ModelFormat {
        ModelFormat { calls: Box::new(plain::Plain), reasoning: None, renders_tool_calls: false, renders_tools: false }
    }

    /// The tool-call format (`plain` when the model writes none).
    pub fn calls(&self) -> &dyn ChatFormat {
        self.calls.as_ref()
    }

    pub fn name(&self) -> &'static str {
        self.calls.name()
    }

    /// Whether calls are read out of this model's answers.
    pub fn writes_calls(&self) -> bool {
        self.calls.writes_calls()
    }

    /// The messages as the template gets them: earlier calls written into their turn's text
    /// where the template renders none, and what the format insists on.
    pub fn history(&self, mut messages: Vec<Value>) -> Vec<Value> {
        if !self.renders_tool_calls {
            for m in &mut messages {
                let Some(Value::Array(calls)) = m.get("tool_calls").cloned() else { continue };
                let content = m.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
                m["content"] = Value::String(self.calls.calls_as_text(&content, &calls));
                m.as_object_mut().map(|o| o.remove("tool_calls"));
            }
        }
        self.calls.rewrite_history(&mut messages);
        messages
    }

    /// The messages with the family's description of `tools` after the system prompt, where the
    /// template renders no tool list itself (DeepSeek-V3.1's model card asks so).
    pub fn with_tool_instructions(&self, mut messages: Vec<Value>, tools: Option<&[Value]>) -> Vec<Value> {
        let Some(text) = tools.filter(|_| !self.renders_tools).and_then(|t| self.calls.tool_instructions(t)) else {
            return messages;
        };
        match messages.first_mut().filter(|m| m.get("role").and_then(Value::as_str) == Some("system")) {
            Some(system) => {
                let content = system.get("content").and_then(Value::as_str).unwrap_or_default();
                system["content"] = Value::String(format!("{content}\n\n{text}"));
            }
            None => messages.insert(0, json!({"role": "system", "content": format!("\n\n{text}")})),
        }
        messages
    }

    /// The reasoning splitter for an answer to `prompt` (it knows whether the prompt already
    /// opened a thought), where the model reasons in tags.
    pub fn reasoning(&self, prompt: &str) -> Option<ReasoningSplitter> {
        self.reasoning.map(|tags| ReasoningSplitter::after_prompt(tags, prompt))
    }
}

/// The format of each loaded model, resolved on its first chat request and kept while its
/// template (held by the loaded model) lives.
#[derive(Default)]
pub struct FormatCache {
    resolved: Mutex<Vec<(Weak<ChatTemplate>, Arc<ModelFormat>)>>,
}

impl FormatCache {
    pub fn of(&self, template: &Arc<ChatTemplate>) -> Arc<ModelFormat> {
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        // Models unloaded since: their entries go.
        resolved.retain(|(t, _)| t.strong_count() > 0);
        if let Some((_, format)) = resolved.iter().find(|(t, _)| std::ptr::eq(t.as_ptr(), Arc::as_ptr(template))) {
            return format.clone();
        }
        let format = Arc::new(ModelFormat::of_template(template.source()));
        tracing::debug!("chat format: {}, reasoning {:?}", format.name(), format.reasoning.map(|t| t.name()));
        resolved.push((Arc::downgrade(template), format.clone()));
        format
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

/// `{"name": .., "arguments" | "parameters": {..} | "<json text>"}` as a call.
pub fn call_from_value(value: &Value) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// `[{"name": .., "arguments": {..}}, ..]`: the calls of a JSON list (what `tool_choice:
/// "required"` has a model without a call grammar write, and Mistral v3's list).
pub fn parse_call_list(text: &str) -> Option<Vec<ToolCall>> {
    let calls: Vec<Value> = serde_json::from_str(text.trim()).ok()?;
    calls.iter().map(call_from_value).collect::<Option<Vec<_>>>().filter(|c| !c.is_empty())
}

/// The length of the longest suffix of `text` that begins `marker` (held back while streaming).
fn partial_len(text: &str, marker: &str) -> usize {
    // Whole characters only: DeepSeek's markers hold multi-byte ones.
    (1..marker.len()).rev().filter(|&n| marker.is_char_boundary(n)).find(|&n| text.ends_with(&marker[..n])).unwrap_or(0)
}
