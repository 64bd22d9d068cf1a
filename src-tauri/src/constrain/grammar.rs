//! JSON Schema compiled into a small grammar of nodes that the byte matcher walks.
//!
//! Supported: `type` (one or a list, `nullable`), `properties`/`required` (generated in the
//! schema's order, optional ones may be left out, no others), free-form objects with
//! `additionalProperties`, `items`/`prefixItems`/`minItems`/`maxItems`, `enum`, `const`,
//! `anyOf`/`oneOf`, one-element `allOf`, local `$ref`s (recursive ones too), string
//! `minLength`/`maxLength`, integer bounds. Keywords that restrict values in ways the matcher
//! cannot enforce (`pattern`, `multipleOf`, bounds on non-integer numbers, ...) are refused,
//! because the output must validate against the schema. Annotations (`title`, `description`,
//! `default`, `format`, `examples`) are ignored.

use std::collections::HashMap;

use serde_json::{Map, Value};

pub type NodeId = usize;

#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// One of these (a union; `enum` is a union of literals).
    Union(Vec<NodeId>),
    /// Exactly these bytes (`const`, `true`, `false`, `null`).
    Literal(Vec<u8>),
    /// A string with a length (in characters) between these.
    String {
        min_len: u32,
        max_len: Option<u32>,
    },
    Number(NumberRule),
    Object(ObjectRule),
    Array(ArrayRule),
    /// A `$ref`, resolved once the target is compiled (refs may be recursive).
    Ref(NodeId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumberRule {
    pub integer: bool,
    /// Inclusive bounds (integers only).
    pub min: Option<i64>,
    pub max: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Property {
    /// The key as JSON text, quotes included.
    pub key: Vec<u8>,
    pub value: NodeId,
    pub required: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ObjectRule {
    /// Generated in this order; only these keys when non-empty.
    pub properties: Vec<Property>,
    /// With no `properties`: any keys, each value of this node (`None`: only `{}`).
    pub additional: Option<NodeId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ArrayRule {
    /// Items at these positions first (`prefixItems`).
    pub prefix: Vec<NodeId>,
    /// Items after the prefix (`None`: no more).
    pub items: Option<NodeId>,
    pub min: u32,
    pub max: Option<u32>,
}

impl ArrayRule {
    pub fn item(&self, index: usize) -> Option<NodeId> {
        self.prefix.get(index).copied().or(self.items)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SchemaError(pub String);

/// A compiled grammar: every node, and the one the whole output must match.
#[derive(Debug, Clone, PartialEq)]
pub struct Grammar {
    nodes: Vec<Node>,
    root: NodeId,
}

/// Nodes every grammar has, at these ids.
pub(crate) const ANY: NodeId = 0;
const ANY_OBJECT: NodeId = 1;
const ANY_ARRAY: NodeId = 2;
pub(crate) const ANY_STRING: NodeId = 3;
const ANY_NUMBER: NodeId = 4;
const TRUE: NodeId = 5;
const FALSE: NodeId = 6;
const NULL: NodeId = 7;
const BOOLEAN: NodeId = 8;

const MAX_NODES: usize = 20_000;
const MAX_NESTING: usize = 64;

/// Keywords that restrict values in ways the matcher does not enforce.
const UNSUPPORTED: &[&str] = &[
    "pattern",
    "patternProperties",
    "multipleOf",
    "minProperties",
    "maxProperties",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "propertyNames",
    "contains",
    "unevaluatedProperties",
    "unevaluatedItems",
];

impl Grammar {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub fn any_object() -> Grammar {
        Grammar { nodes: builtin_nodes(), root: ANY_OBJECT }
    }

    pub fn from_schema(schema: &Value) -> Result<Grammar, SchemaError> {
        let mut compiler = Compiler { root_schema: schema, nodes: builtin_nodes(), refs: HashMap::new() };
        let root = compiler.compile(schema, 0)?;
        let grammar = Grammar { nodes: compiler.nodes, root };
        grammar.check_no_empty_loops()?;
        Ok(grammar)
    }

    /// Refuses a schema that can refer back to itself without reading a byte (`$ref`s looping
    /// through `anyOf`/`oneOf`/`allOf`): the matcher would follow such a loop forever.
    fn check_no_empty_loops(&self) -> Result<(), SchemaError> {
        // 0: not seen, 1: on the current path, 2: done.
        let mut state = vec![0u8; self.nodes.len()];
        for start in 0..self.nodes.len() {
            if state[start] != 0 {
                continue;
            }
            let mut stack: Vec<(NodeId, usize)> = vec![(start, 0)];
            state[start] = 1;
            while let Some((id, next)) = stack.pop() {
                let targets: &[NodeId] = match &self.nodes[id] {
                    Node::Union(alternatives) => alternatives,
                    Node::Ref(target) => std::slice::from_ref(target),
                    _ => &[],
                };
                match targets.get(next) {
                    Some(&target) => {
                        stack.push((id, next + 1));
                        match state[target] {
                            1 => return Err(SchemaError("the schema refers to itself without any value in between (a $ref loop through anyOf, oneOf or allOf)".into())),
                            0 => {
                                state[target] = 1;
                                stack.push((target, 0));
                            }
                            _ => {}
                        }
                    }
                    None => state[id] = 2,
                }
            }
        }
        Ok(())
    }

    pub fn root(&self) -> NodeId {
        self.root
    }

    /// The node at `id`, with references followed.
    pub fn node(&self, mut id: NodeId) -> &Node {
        loop {
            match &self.nodes[id] {
                Node::Ref(target) => id = *target,
                node => return node,
            }
        }
    }
}

fn builtin_nodes() -> Vec<Node> {
    let mut nodes = vec![Node::Union(vec![ANY_OBJECT, ANY_ARRAY, ANY_STRING, ANY_NUMBER, TRUE, FALSE, NULL])];
    nodes.push(Node::Object(ObjectRule { properties: Vec::new(), additional: Some(ANY) }));
    nodes.push(Node::Array(ArrayRule { prefix: Vec::new(), items: Some(ANY), min: 0, max: None }));
    nodes.push(Node::String { min_len: 0, max_len: None });
    nodes.push(Node::Number(NumberRule { integer: false, min: None, max: None }));
    nodes.push(Node::Literal(b"true".to_vec()));
    nodes.push(Node::Literal(b"false".to_vec()));
    nodes.push(Node::Literal(b"null".to_vec()));
    nodes.push(Node::Union(vec![TRUE, FALSE]));
    nodes
}

struct Compiler<'a> {
    root_schema: &'a Value,
    nodes: Vec<Node>,
    refs: HashMap<String, NodeId>,
}

impl Compiler<'_> {
    fn add(&mut self, node: Node) -> Result<NodeId, SchemaError> {
        if self.nodes.len() >= MAX_NODES {
            return Err(SchemaError("the schema is too large".into()));
        }
        self.nodes.push(node);
        Ok(self.nodes.len() - 1)
    }

    fn compile(&mut self, schema: &Value, depth: usize) -> Result<NodeId, SchemaError> {
        if depth > MAX_NESTING {
            return Err(SchemaError(format!("the schema nests deeper than {MAX_NESTING} levels")));
        }
        let map = match schema {
            Value::Bool(true) => return Ok(ANY),
            Value::Bool(false) => return Err(SchemaError("the schema `false` matches nothing".into())),
            Value::Object(map) => map,
            _ => return Err(SchemaError("a schema must be an object or a boolean".into())),
        };
        if let Some(keyword) = UNSUPPORTED.iter().find(|k| map.contains_key(**k)) {
            return Err(SchemaError(format!("the JSON Schema keyword {keyword:?} is not supported")));
        }
        if let Some(reference) = map.get("$ref") {
            let reference = reference.as_str().ok_or_else(|| SchemaError("$ref must be a string".into()))?;
            return self.reference(reference, depth);
        }
        if let Some(value) = map.get("const") {
            return self.add(Node::Literal(literal(value)));
        }
        if let Some(values) = map.get("enum") {
            let values = values
                .as_array()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| SchemaError("enum must be a non-empty array".into()))?;
            let alternatives = values.iter().map(|v| self.add(Node::Literal(literal(v)))).collect::<Result<_, _>>()?;
            return self.add(Node::Union(alternatives));
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(options) = map.get(keyword) {
                let options = options
                    .as_array()
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| SchemaError(format!("{keyword} must be a non-empty array")))?;
                let alternatives = options.iter().map(|s| self.compile(s, depth + 1)).collect::<Result<_, _>>()?;
                return self.add(Node::Union(alternatives));
            }
        }
        if let Some(all) = map.get("allOf") {
            return match all.as_array().map(Vec::as_slice) {
                Some([one]) => self.compile(one, depth + 1),
                _ => Err(SchemaError("allOf is supported with one schema only".into())),
            };
        }
        let types: Vec<&str> = match map.get("type") {
            None => vec![implied_type(map)],
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|t| t.as_str().ok_or_else(|| SchemaError("type must be a string or a list of strings".into())))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(SchemaError("type must be a string or a non-empty list of strings".into())),
        };
        let mut alternatives = types.into_iter().map(|t| self.typed(t, map, depth)).collect::<Result<Vec<_>, _>>()?;
        if map.get("nullable") == Some(&Value::Bool(true)) {
            alternatives.push(NULL);
        }
        match alternatives.as_slice() {
            [one] => Ok(*one),
            _ => self.add(Node::Union(alternatives)),
        }
    }

    fn typed(&mut self, kind: &str, map: &Map<String, Value>, depth: usize) -> Result<NodeId, SchemaError> {
        match kind {
            "any" => Ok(ANY),
            "null" => Ok(NULL),
            "boolean" => Ok(BOOLEAN),
            "string" => {
                let min_len = count(map, "minLength")?.unwrap_or(0);
                let max_len = count(map, "maxLength")?;
                if max_len.is_some_and(|max| max < min_len) {
                    return Err(SchemaError("maxLength is smaller than minLength".into()));
                }
                if min_len == 0 && max_len.is_none() {
                    return Ok(ANY_STRING);
                }
                self.add(Node::String { min_len, max_len })
            }
            "integer" => {
                let rule = integer_bounds(map)?;
                self.add(Node::Number(rule))
            }
            "number" => {
                if let Some(k) = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]
                    .iter()
                    .find(|k| map.contains_key(**k))
                {
                    return Err(SchemaError(format!("{k} is supported on integers only")));
                }
                Ok(ANY_NUMBER)
            }
            "object" => self.object(map, depth),
            "array" => self.array(map, depth),
            other => Err(SchemaError(format!("unknown type {other:?}"))),
        }
    }

    fn object(&mut self, map: &Map<String, Value>, depth: usize) -> Result<NodeId, SchemaError> {
        let required: Vec<&str> = match map.get("required") {
            None => Vec::new(),
            Some(Value::Array(names)) => names
                .iter()
                .map(|n| n.as_str().ok_or_else(|| SchemaError("required must be a list of strings".into())))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(SchemaError("required must be a list of strings".into())),
        };
        let properties = match map.get("properties") {
            None => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => return Err(SchemaError("properties must be an object".into())),
        };
        if let Some(missing) = required.iter().find(|r| !properties.contains_key(**r)) {
            return Err(SchemaError(format!("required property {missing:?} is not described in properties")));
        }
        let mut rule = ObjectRule { properties: Vec::new(), additional: None };
        for (name, schema) in &properties {
            let value = self.compile(schema, depth + 1)?;
            let key = serde_json::to_vec(name).expect("a string serializes");
            rule.properties.push(Property { key, value, required: required.contains(&name.as_str()) });
        }
        if rule.properties.is_empty() {
            rule.additional = match map.get("additionalProperties") {
                None | Some(Value::Bool(true)) => Some(ANY),
                Some(Value::Bool(false)) => None,
                Some(schema) => Some(self.compile(schema, depth + 1)?),
            };
        }
        self.add(Node::Object(rule))
    }

    fn array(&mut self, map: &Map<String, Value>, depth: usize) -> Result<NodeId, SchemaError> {
        let mut rule = ArrayRule {
            prefix: Vec::new(),
            items: Some(ANY),
            min: count(map, "minItems")?.unwrap_or(0),
            max: count(map, "maxItems")?,
        };
        if map.get("uniqueItems") == Some(&Value::Bool(true)) {
            return Err(SchemaError("uniqueItems is not supported".into()));
        }
        if let Some(Value::Array(prefix)) = map.get("prefixItems") {
            rule.prefix = prefix.iter().map(|s| self.compile(s, depth + 1)).collect::<Result<_, _>>()?;
        }
        match map.get("items") {
            None => {}
            Some(Value::Bool(false)) => rule.items = None,
            // Draft 4-7 tuples.
            Some(Value::Array(tuple)) => {
                rule.prefix = tuple.iter().map(|s| self.compile(s, depth + 1)).collect::<Result<_, _>>()?;
                rule.items = match map.get("additionalItems") {
                    Some(Value::Bool(false)) => None,
                    None | Some(Value::Bool(true)) => Some(ANY),
                    Some(schema) => Some(self.compile(schema, depth + 1)?),
                };
            }
            Some(schema) => rule.items = Some(self.compile(schema, depth + 1)?),
        }
        if rule.max.is_some_and(|max| max < rule.min) {
            return Err(SchemaError("maxItems is smaller than minItems".into()));
        }
        if rule.items.is_none() && (rule.prefix.len() as u32) < rule.min {
            return Err(SchemaError("minItems asks for more items than the schema allows".into()));
        }
        self.add(Node::Array(rule))
    }

    /// `#`, `#/$defs/name`, `#/definitions/name` or any local JSON pointer.
    fn reference(&mut self, reference: &str, depth: usize) -> Result<NodeId, SchemaError> {
        if let Some(&id) = self.refs.get(reference) {
            return Ok(id);
        }
        let pointer = reference
            .strip_prefix('#')
            .ok_or_else(|| SchemaError(format!("only local $refs (\"#/...\") are supported, not {reference:?}")))?;
        let target = self
            .root_schema
            .pointer(pointer)
            .ok_or_else(|| SchemaError(format!("$ref {reference:?} points nowhere")))?;
        // Reserve the id first so that a recursive reference finds it.
        let id = self.add(Node::Ref(ANY))?;
        self.refs.insert(reference.to_string(), id);
        let compiled = self.compile(target, depth + 1)?;
        if compiled == id {
            return Err(SchemaError(format!("$ref {reference:?} refers only to itself")));
        }
        self.nodes[id] = Node::Ref(compiled);
        Ok(id)
    }
}

/// The type a schema without `type` describes.
fn implied_type(map: &Map<String, Value>) -> &'static str {
    if map.contains_key("properties") || map.contains_key("additionalProperties") || map.contains_key("required") {
        "object"
    } else if map.contains_key("items") || map.contains_key("prefixItems") {
        "array"
    } else {
        "any"
    }
}

/// A value as the exact JSON text the output must contain.
fn literal(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("JSON values serialize")
}

fn count(map: &Map<String, Value>, key: &str) -> Result<Option<u32>, SchemaError> {
    match map.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n.min(u64::from(u32::MAX)) as u32))
            .ok_or_else(|| SchemaError(format!("{key} must be a non-negative integer"))),
    }
}

fn integer_bounds(map: &Map<String, Value>) -> Result<NumberRule, SchemaError> {
    let number = |key: &str| -> Result<Option<f64>, SchemaError> {
        match map.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| SchemaError(format!("{key} must be a number"))),
        }
    };
    let clamp = |x: f64| x.clamp(i64::MIN as f64, i64::MAX as f64) as i64;
    let mut min = number("minimum")?.map(|x| clamp(x.ceil()));
    let mut max = number("maximum")?.map(|x| clamp(x.floor()));
    // Draft 6+: exclusive bounds are numbers (draft 4's booleans are refused as wrong types).
    if let Some(x) = number("exclusiveMinimum")? {
        let bound = clamp(x.floor()) + 1;
        min = Some(min.map_or(bound, |m| m.max(bound)));
    }
    if let Some(x) = number("exclusiveMaximum")? {
        let bound = clamp(x.ceil()) - 1;
        max = Some(max.map_or(bound, |m| m.min(bound)));
    }
    if let (Some(lo), Some(hi)) = (min, max) {
        if lo > hi {
            return Err(SchemaError("no integer lies between minimum and maximum".into()));
        }
    }
    Ok(NumberRule { integer: true, min, max })
}
