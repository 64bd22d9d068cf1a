//! The formats whose calls of a turn sit in one section, each call a marker, the function's name
//! (in the family's spelling), a separator, its JSON arguments and an end marker: DeepSeek-V3.1's
//! and Kimi K2's (all markers special tokens of their vocabularies): the reading of a section and
//! the grammars of forced and strict calls, from the markers and how the family spells a name;
//! and the one `ChatFormat` both families are ([`SectionFormat`]).

use serde_json::Value;

use super::lark::{json_rule, marker, text_marker, CallSyntax};
use super::paired::{PairedCalls, ParseBody};
use super::{CallReader, CallSpec, ChatFormat, ForcedCalls, ParameterSchemas};
use crate::constrain::{Grammar, SchemaError};
use crate::server::chat::piece::ToolCall;

/// A family whose calls sit in sections: its name, its markers, and (DeepSeek-V3.1, whose
/// template renders none) the description of the tools its model card puts after the system
/// prompt.
#[derive(Clone, Copy)]
pub(super) struct SectionFormat {
    pub name: &'static str,
    pub sections: &'static Sections,
    /// [`markers`] of `sections`.
    pub markers: &'static [&'static str],
    /// `sections`' own [`Sections::parse`] (a function pointer, as the paired reader takes).
    pub parse: ParseBody,
    pub tool_instructions: Option<fn(&[Value]) -> String>,
}

/// The markers of `sections`, all special tokens whose text the reader must see.
pub(super) const fn markers(sections: &Sections) -> [&'static str; 5] {
    [sections.begin, sections.end, sections.call_begin, sections.arguments, sections.call_end]
}

impl ChatFormat for SectionFormat {
    fn name(&self) -> &'static str {
        self.name
    }

    fn markers(&self) -> &'static [&'static str] {
        self.markers
    }

    fn reader(&self, schemas: ParameterSchemas) -> Box<dyn CallReader> {
        Box::new(PairedCalls::new(self.sections.begin, self.sections.end, self.parse, schemas))
    }

    fn forced_calls(&self, spec: &CallSpec) -> Option<Result<ForcedCalls, SchemaError>> {
        Some(self.sections.forced(spec))
    }

    fn strict_calls(&self, spec: &CallSpec) -> Option<Result<Grammar, SchemaError>> {
        Some(self.sections.strict(spec))
    }

    fn tool_instructions(&self, tools: &[Value]) -> Option<String> {
        self.tool_instructions.map(|describe| describe(tools))
    }
}

pub(super) struct Sections {
    pub begin: &'static str,
    pub end: &'static str,
    pub call_begin: &'static str,
    /// Between the name and the arguments.
    pub arguments: &'static str,
    pub call_end: &'static str,
    /// The Lark of a call's name part for a function (`name`, or Kimi's `functions.name:0`).
    pub name_lark: fn(&str) -> String,
    /// Lark rules the name parts refer to.
    pub rules: &'static str,
    /// The function's name in a call's name part.
    pub name_of: fn(&str) -> &str,
    /// The arguments' text as JSON.
    pub arguments_of: fn(&str) -> Option<Value>,
}

impl Sections {
    pub fn forced(&self, spec: &CallSpec) -> Result<ForcedCalls, SchemaError> {
        self.syntax(spec)?.forced(spec, Some(self.arguments))
    }

    pub fn strict(&self, spec: &CallSpec) -> Result<Grammar, SchemaError> {
        self.syntax(spec)?.strict(spec)
    }

    /// One section: one call, or (parallel calls allowed) several in a row.
    fn syntax(&self, spec: &CallSpec) -> Result<CallSyntax, SchemaError> {
        let calls = spec
            .functions
            .iter()
            .map(|f| {
                Ok(format!(
                    "{} {} {} {} {}",
                    marker(spec, self.call_begin),
                    (self.name_lark)(&f.name),
                    marker(spec, self.arguments),
                    json_rule(&f.parameters)?,
                    marker(spec, self.call_end)
                ))
            })
            .collect::<Result<Vec<String>, SchemaError>>()?;
        let call = format!("({})", calls.join(" | "));
        let more = if spec.parallel { format!("{call}*") } else { String::new() };
        Ok(CallSyntax {
            open_lark: marker(spec, self.begin),
            open_text: text_marker(spec, self.begin),
            body: format!("{call} {more} {}", marker(spec, self.end)),
            separator: None,
            rules: self.rules.to_string(),
        })
    }

    /// Every complete call of a section (`None`: none, or one that does not read: it stays text).
    pub fn parse(&self, body: &str) -> Option<Vec<ToolCall>> {
        let mut calls = Vec::new();
        let mut rest = body;
        while let Some(at) = rest.find(self.call_begin) {
            let after = &rest[at + self.call_begin.len()..];
            let Some(end) = after.find(self.call_end) else { break };
            let (name, arguments) = after[..end].split_once(self.arguments)?;
            let arguments = (self.arguments_of)(arguments.trim())?;
            calls.push(ToolCall { name: (self.name_of)(name.trim()).to_string(), arguments: arguments.to_string() });
            rest = &after[end + self.call_end.len()..];
        }
        (!calls.is_empty()).then_some(calls)
    }
}
