//! What the output must match: JSON valid against a schema, or a Lark grammar (the tool-call
//! formats). Checked when the request arrives (a bad schema is the client's error); compiled
//! against a model's vocabulary when the answer starts ([`super::TokenConstraint`]).
//!
//! Schemas get OpenAI's strict-mode reading before llguidance compiles them: an object with
//! `properties` and no `additionalProperties` takes no other keys; properties come in the
//! schema's order; `nullable: true` (OpenAPI) allows `null`; a `format` llguidance cannot
//! enforce is an annotation (as JSON Schema says) and is dropped, the others are enforced.

use llguidance::api::{GrammarInit, ParserLimits, TopLevelGrammar};
use llguidance::earley::ValidationResult;
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SchemaError(pub String);

#[derive(Debug, Clone)]
pub struct Grammar {
    spec: TopLevelGrammar,
    /// JSON is generated: bound its numbers and whitespace ([`super::json_layout`]).
    bounds_layout: bool,
}

/// Whitespace between JSON tokens: one run of at most 24 spaces and tabs with at most one line
/// break in it. Room for pretty-printing, none for a weak model's endless newlines.
const WHITESPACE: &str = r"[\x20\x09]{1,24}|[\x20\x09]{0,8}\x0D?\x0A[\x20\x09]{0,24}";

/// The `format`s llguidance turns into a regular expression.
const ENFORCED_FORMATS: &[&str] =
    &["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"];

/// RFC 3339's full-date, leap years counted (llguidance's allows February 29 of any year, which
/// validators refuse), and its time with a bounded fraction.
const DATE: &str = concat!(
    r"(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))",
    r"|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
);
const TIME: &str =
    r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";

/// `format: email` as generated: the common shape of an address (dot-separated words, a domain
/// with a top-level name), which every validator accepts (pydantic's `EmailStr` wants the
/// top-level name that RFC 5321 leaves optional), and of bounded length.
const EMAIL: &str = concat!(
    r"^[A-Za-z0-9_%+-]{1,32}(\.[A-Za-z0-9_%+-]{1,32}){0,3}",
    r"@[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?){0,3}\.[A-Za-z]{2,12}$"
);

impl Grammar {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub fn any_object() -> Grammar {
        Grammar::from_schema(&json!({"type": "object"})).expect("the schema of any object compiles")
    }

    pub fn from_schema(schema: &Value) -> Result<Grammar, SchemaError> {
        match schema {
            Value::Bool(false) => return Err(SchemaError("the schema `false` matches nothing".into())),
            Value::Bool(true) | Value::Object(_) => {}
            _ => return Err(SchemaError("a JSON Schema must be an object".into())),
        }
        Grammar::checked(TopLevelGrammar::from_json_schema(Grammar::strict_schema(schema)?), true)
    }

    /// The schema as this module reads it (see the module's doc), with the whitespace bounds;
    /// for `%json` in a Lark grammar.
    pub fn strict_schema(schema: &Value) -> Result<Value, SchemaError> {
        let mut schema = match schema {
            Value::Bool(true) => json!({}),
            other => other.clone(),
        };
        if let Some(path) = ref_loop(&schema) {
            return Err(SchemaError(format!(
                "the schema refers to itself at {path} without any value in between (a $ref loop through anyOf, oneOf or allOf)"
            )));
        }
        strict(&mut schema, true)?;
        if let Value::Object(s) = &mut schema {
            // `\u00e9` as well as `é`: models trained on ASCII-escaped JSON write both.
            let options = json!({"whitespace_pattern": WHITESPACE, "json_allow_general_unicode_escapes": true});
            s.insert("x-guidance".into(), options);
        }
        Ok(schema)
    }

    /// A Lark grammar (llguidance's dialect: `%json {…}` for a schema inside, `<[id]>` for a
    /// special token). `bounds_layout`: the JSON inside it is the point of it (its layout is bounded).
    pub fn from_lark(source: String, bounds_layout: bool) -> Result<Grammar, SchemaError> {
        Grammar::checked(TopLevelGrammar::from_lark(source), bounds_layout)
    }

    fn checked(spec: TopLevelGrammar, bounds_layout: bool) -> Result<Grammar, SchemaError> {
        match GrammarInit::Serialized(spec.clone()).validate(None, ParserLimits::default()) {
            ValidationResult::Error(e) => Err(SchemaError(e)),
            ValidationResult::Valid | ValidationResult::Warnings(_) => Ok(Grammar { spec, bounds_layout }),
        }
    }

    pub(super) fn spec(&self) -> TopLevelGrammar {
        self.spec.clone()
    }

    pub(super) fn bounds_layout(&self) -> bool {
        self.bounds_layout
    }
}

/// Rewrites a schema (and every schema inside it) to the strict reading in the module's doc.
/// `closes_objects` is false inside `allOf`, whose parts each describe only some of the keys.
fn strict(schema: &mut Value, closes_objects: bool) -> Result<(), SchemaError> {
    let Value::Object(s) = schema else { return Ok(()) };
    if s.get("nullable") == Some(&Value::Bool(true)) {
        s.remove("nullable");
        allow_null(s);
    }
    if let Some(format) = s.get("format").and_then(Value::as_str) {
        let own = match format {
            "email" => Some(EMAIL.to_string()),
            "date" => Some(format!("^{DATE}$")),
            "date-time" => Some(format!("^{DATE}[Tt]{TIME}$")),
            _ => None,
        };
        if let (Some(pattern), false) = (own, s.contains_key("pattern")) {
            s.remove("format");
            s.insert("pattern".into(), json!(pattern));
        } else if !ENFORCED_FORMATS.contains(&format) {
            s.remove("format");
        }
    }
    if s.get("uniqueItems") == Some(&Value::Bool(false))
        || s.get("maxItems").and_then(Value::as_u64).is_some_and(|max| max <= 1)
    {
        // Nothing to enforce: no two items to compare.
        s.remove("uniqueItems");
    }
    if s.get("uniqueItems") == Some(&Value::Bool(true)) {
        if let Some(arrays) = distinct_arrays(s) {
            s.remove("uniqueItems");
            s.insert("anyOf".into(), Value::Array(arrays));
        }
    }
    if let (true, Some(Value::Object(properties))) = (closes_objects, s.get("properties")) {
        if !s.contains_key("additionalProperties") {
            let required = s.get("required").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
            if let Some(missing) = required.iter().filter_map(Value::as_str).find(|k| !properties.contains_key(*k)) {
                return Err(SchemaError(format!(
                    "{missing:?} is required but not among the properties (and no others are allowed)"
                )));
            }
            s.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
    for (key, value) in s.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Value::Object(map) = value {
                    map.values_mut().try_for_each(|v| strict(v, true))?;
                }
            }
            "anyOf" | "oneOf" | "prefixItems" => {
                if let Value::Array(list) = value {
                    list.iter_mut().try_for_each(|v| strict(v, true))?;
                }
            }
            "allOf" => {
                if let Value::Array(list) = value {
                    list.iter_mut().try_for_each(|v| strict(v, false))?;
                }
            }
            "items" => match value {
                Value::Array(list) => list.iter_mut().try_for_each(|v| strict(v, true))?,
                v => strict(v, true)?,
            },
            "additionalProperties"
            | "additionalItems"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "unevaluatedProperties"
            | "unevaluatedItems" => strict(value, true)?,
            _ => {}
        }
    }
    Ok(())
}

/// A path through which the schema reaches itself again without reading a value (`$ref`s
/// looping through `anyOf`/`oneOf`/`allOf`), which no grammar can generate.
fn ref_loop(root: &Value) -> Option<String> {
    // Schemas are named by JSON pointer; 1: on the current path, 2: done.
    let mut state: std::collections::HashMap<String, u8> = std::collections::HashMap::new();
    let mut stack: Vec<(String, Vec<String>)> = vec![(String::new(), Vec::new())];
    state.insert(String::new(), 1);
    stack[0].1 = next_without_reading(root, "");
    while let Some((pointer, mut next)) = stack.pop() {
        match next.pop() {
            None => {
                state.insert(pointer, 2);
            }
            Some(target) => {
                stack.push((pointer, next));
                match state.get(&target) {
                    Some(1) => return Some(format!("#{target}")),
                    Some(_) => {}
                    None => {
                        state.insert(target.clone(), 1);
                        let onward =
                            root.pointer(&target).map(|s| next_without_reading(s, &target)).unwrap_or_default();
                        stack.push((target, onward));
                    }
                }
            }
        }
    }
    None
}

/// The schemas `schema` (at `pointer`) stands for before any value is read.
fn next_without_reading(schema: &Value, pointer: &str) -> Vec<String> {
    let mut next = Vec::new();
    if let Some(target) = schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')) {
        next.push(target.to_string());
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = schema.get(key).and_then(Value::as_array) {
            next.extend((0..list.len()).map(|i| format!("{pointer}/{key}/{i}")));
        }
    }
    next
}

/// `uniqueItems` over items of a few values (`enum`, `const`, `boolean`; pydantic's
/// `set[Literal[...]]`): every array of distinct values as one alternative, when there are at
/// most [`MAX_DISTINCT_ARRAYS`] of them. `None` where that cannot be done.
fn distinct_arrays(s: &Map<String, Value>) -> Option<Vec<Value>> {
    const MAX_DISTINCT_ARRAYS: usize = 400;
    if s.contains_key("prefixItems") || s.contains_key("anyOf") {
        return None;
    }
    let items = s.get("items")?;
    let values: Vec<Value> = match (items.get("enum"), items.get("const"), items.get("type").and_then(Value::as_str)) {
        (Some(Value::Array(values)), _, _) => values.clone(),
        (None, Some(value), _) => vec![value.clone()],
        (None, None, Some("boolean")) => vec![json!(true), json!(false)],
        _ => return None,
    };
    if values.iter().any(|v| v.is_object() || v.is_array()) {
        return None;
    }
    let mut values = values;
    values.dedup();
    let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
    let max = s.get("maxItems").and_then(Value::as_u64).map_or(values.len(), |m| (m as usize).min(values.len()));
    // Ordered selections of k of n values, k from min to max.
    let mut arrays = Vec::new();
    let mut stack: Vec<Vec<usize>> = vec![Vec::new()];
    while let Some(chosen) = stack.pop() {
        if chosen.len() >= min {
            let prefix: Vec<Value> = chosen.iter().map(|&i| json!({"const": values[i]})).collect();
            arrays.push(json!({"prefixItems": prefix, "items": false, "minItems": chosen.len()}));
            if arrays.len() > MAX_DISTINCT_ARRAYS {
                return None;
            }
        }
        if chosen.len() < max {
            for i in (0..values.len()).filter(|i| !chosen.contains(i)) {
                stack.push([chosen.as_slice(), &[i]].concat());
            }
        }
    }
    Some(arrays)
}

/// `nullable: true`: `null` joins the types (or the values of an `enum`).
fn allow_null(s: &mut Map<String, Value>) {
    if let Some(Value::Array(values)) = s.get_mut("enum") {
        if !values.contains(&Value::Null) {
            values.push(Value::Null);
        }
        return;
    }
    match s.get_mut("type") {
        Some(Value::String(t)) => {
            let t = std::mem::take(t);
            s.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(types)) => {
            if !types.contains(&json!("null")) {
                types.push(json!("null"));
            }
        }
        _ => {
            let rest = std::mem::take(s);
            s.insert("anyOf".into(), json!([Value::Object(rest), {"type": "null"}]));
        }
    }
}
