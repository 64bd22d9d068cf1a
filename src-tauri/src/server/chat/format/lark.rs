//! The Lark grammars of calls in a model's own format, built from what a format says of its
//! syntax ([`CallSyntax`]): forced calls (`tool_choice` required or named: the answer is held to
//! the calls exactly as the model's template trains it to write them, so the tokens it is made to
//! write are the ones it would pick, and the format's own reader reads them) and strict ones
//! (`--strict-tools`: free text until the model opens a call, then a valid call).

use serde_json::{json, Value};

use super::{CallSpec, ForcedCalls, Function};
use crate::constrain::{Grammar, SchemaError};

/// A format's calls in Lark: the marker that opens one, what follows it, what may separate two.
pub(super) struct CallSyntax {
    pub open_lark: String,
    /// The opening marker when it is text (not a special token of the vocabulary).
    pub open_text: Option<String>,
    pub body: String,
    /// A Lark expression (`None`: a second call cannot follow).
    pub separator: Option<String>,
    /// Rules the body refers to.
    pub rules: String,
}

impl CallSyntax {
    /// What may follow the first call.
    fn more(&self, parallel: bool) -> String {
        match (&self.separator, parallel) {
            (Some(separator), true) => format!("({separator} call)*"),
            _ => String::new(),
        }
    }

    fn call_rule(&self) -> String {
        format!("call: {} {}\n{}", self.open_lark, self.body, self.rules)
    }

    /// The grammar of forced calls in this syntax (a named call's arguments follow
    /// `arguments_after`).
    pub fn forced(&self, spec: &CallSpec, arguments_after: Option<&str>) -> Result<ForcedCalls, SchemaError> {
        let lark = format!("start: call {}\n{}", self.more(spec.parallel), self.call_rule());
        let arguments_after = arguments_after.filter(|_| spec.named).map(str::to_string);
        Ok(ForcedCalls { grammar: Grammar::from_lark(lark, true)?, arguments_after })
    }

    /// Free text, then calls in this syntax once the model opens one.
    pub fn strict(&self, spec: &CallSpec) -> Result<Grammar, SchemaError> {
        let more = self.more(spec.parallel);
        let calls = self.call_rule();
        let lark = match &self.open_text {
            // A text marker: the free text is one lexeme up to its first appearance, or all of
            // the answer (a lexeme ends only where it cannot go on, so the marker is inside it).
            Some(open) => {
                let open = regex_text(open);
                format!(
                    "start: FREE | OPENED {} {more}\n{calls}\nFREE: /(?s:.*)/ & ~/(?s:.*){open}(?s:.*)/\nOPENED: /(?s:.*){open}/ & ~/(?s:.*){open}(?s:.+)/\n",
                    self.body
                )
            }
            // A special token: text cannot hold it.
            None => format!("start: FREE? | FREE? call {more}\n{calls}\nFREE: /(?s:.+)/\n"),
        };
        Grammar::from_lark(lark, false)
    }
}

/// A format's marker in Lark: by id when it is a special token of the vocabulary, else as text.
pub(super) fn marker(spec: &CallSpec, text: &str) -> String {
    (spec.special)(text).map_or_else(|| lark_string(text), |id| format!("<[{id}]>"))
}

/// The marker as text when it is not a special token of the vocabulary.
pub(super) fn text_marker(spec: &CallSpec, text: &str) -> Option<String> {
    (spec.special)(text).is_none().then(|| text.to_string())
}

/// Text matched literally in a Lark regular expression.
pub(super) fn regex_text(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c.to_string() } else { format!("\\x{:02x}", c as u32) })
        .collect()
}

/// `{"name": <const>, "<arguments key>": <parameters>}` for each function, as one schema.
pub(super) fn call_objects(functions: &[&Function], arguments_key: &str) -> Value {
    let alternatives: Vec<Value> = functions
        .iter()
        .map(|f| {
            json!({"type": "object", "properties": {"name": {"const": f.name}, arguments_key: f.parameters},
                   "required": ["name", arguments_key], "additionalProperties": false})
        })
        .collect();
    match <[Value; 1]>::try_from(alternatives) {
        Ok([one]) => one,
        Err(many) => json!({"anyOf": many}),
    }
}

/// A schema inside a Lark grammar, read as [`Grammar::from_schema`] reads it.
pub(super) fn json_rule(schema: &Value) -> Result<String, SchemaError> {
    Ok(format!("%json {}", Grammar::strict_schema(schema)?))
}

/// A Lark string literal (Lark takes JSON's string syntax).
pub(super) fn lark_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}
