//! The Lark rules of calls whose arguments are tagged one by one rather than written as one JSON
//! object (Qwen's XML, MiniMax-M2's `<invoke>`, GLM's key and value tags): per function, its
//! opening text, then its parameters in the schema's order (required ones present), each a key
//! tag and a value ended by a closing tag, then its closing text. A string's value is raw text up
//! to the closing tag (within its length bounds), or one of its `enum`; other values are JSON of
//! their schema. One newline is allowed between any two tags, as the models write them.

use serde_json::Value;

use super::lark::{json_rule, lark_string, marker, regex_text};
use super::CallSpec;
use crate::constrain::SchemaError;

/// An optional newline in Lark.
pub(super) const NL: &str = r#""\n"?"#;

/// How a format tags a call's parts (the tags as text; a tag that is a special token of the
/// vocabulary is named by id where the grammar allows it).
pub(super) struct ArgumentTags {
    /// The Lark that opens the call of `name`.
    pub function: fn(&CallSpec, &str) -> String,
    /// The Lark that closes it (may be empty).
    pub function_close: fn(&CallSpec) -> String,
    /// The Lark before the value of `key`.
    pub parameter: fn(&CallSpec, &str) -> String,
    /// The tag that ends a value.
    pub value_close: &'static str,
}

/// Rules `{prefix}{i}` for each function's call, and the alternative of them all.
pub(super) fn call_rules(spec: &CallSpec, tags: &ArgumentTags, prefix: &str) -> Result<(String, String), SchemaError> {
    let close_special = (spec.special)(tags.value_close);
    let close_lark = marker(spec, tags.value_close);
    let mut rules = Vec::new();
    let mut alternatives = Vec::new();
    for (i, f) in spec.functions.iter().enumerate() {
        let required: Vec<&str> = f
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut parts = Vec::new();
        if let Some(properties) = f.parameters.get("properties").and_then(Value::as_object) {
            for (j, (key, schema)) in properties.iter().enumerate() {
                let value = match (schema.get("type").and_then(Value::as_str), schema.get("enum")) {
                    (Some("string"), Some(Value::Array(values))) => {
                        let raw: Vec<String> = values.iter().filter_map(Value::as_str).map(lark_string).collect();
                        format!("{NL} ({}) {NL} {close_lark}", raw.join(" | "))
                    }
                    (Some("string"), _) => {
                        let terminal = format!("{}{i}_P{j}", prefix.to_uppercase());
                        let bound = |key: &str| schema.get(key).and_then(Value::as_u64);
                        let (min, max) = (bound("minLength"), bound("maxLength"));
                        let length = match (min, max) {
                            (None, None) => "*".to_string(),
                            (min, max) => {
                                format!("{{{},{}}}", min.unwrap_or(0), max.map(|m| m.to_string()).unwrap_or_default())
                            }
                        };
                        match close_special {
                            // A special token cannot be inside text: the text (a terminal is never
                            // empty: an empty value is no terminal at all), then the token.
                            Some(_) => {
                                let lo = min.unwrap_or(0).max(1);
                                let hi = max.map(|m| m.to_string()).unwrap_or_default();
                                rules.push(format!(r"{terminal}: /(?s:.{{{lo},{hi}}})/"));
                                let optional = if min.unwrap_or(0) == 0 { "?" } else { "" };
                                format!("{terminal}{optional} {close_lark}")
                            }
                            // The text and its closing tag are one lexeme, which ends at the tag's
                            // first appearance (a lexeme ends only where it cannot go on).
                            None => {
                                let close = regex_text(tags.value_close);
                                rules.push(format!(
                                    r"{terminal}: /\n?(?s:.{length})\n?{close}/ & ~/(?s:.*){close}(?s:.+)/"
                                ));
                                terminal
                            }
                        }
                    }
                    _ => format!("{NL} {} {NL} {close_lark}", json_rule(schema)?),
                };
                let rule = format!("{prefix}{i}_p{j}");
                rules.push(format!("{rule}: {} {value} {NL}", (tags.parameter)(spec, key)));
                parts.push(if required.contains(&key.as_str()) { rule } else { format!("{rule}?") });
            }
        }
        rules.push(format!(
            "{prefix}{i}: {} {NL} {} {}",
            (tags.function)(spec, &f.name),
            parts.join(" "),
            (tags.function_close)(spec)
        ));
        alternatives.push(format!("{prefix}{i}"));
    }
    Ok((format!("{}\n", rules.join("\n")), format!("({})", alternatives.join(" | "))))
}
