//! What shape the answer must take, from `tools`, `tool_choice`, `parallel_tool_calls` and
//! `response_format`: free text (tool calls parsed from it in the model's format), JSON or
//! JSON valid against a schema, or tool calls the model is made to write (in its own format
//! where its [`super::format::ChatFormat`] has a grammar for them, else as JSON). The last two
//! are enforced by a grammar (constrained decoding).

use std::sync::Arc;

use serde_json::{json, Value};

use super::format::{CallSpec, Function, ModelFormat};
use crate::constrain::Grammar;
use crate::server::ApiError;

#[derive(Debug, Clone, PartialEq)]
pub enum ToolMode {
    /// No tools, or `tool_choice: "none"`, or a JSON `response_format`.
    Off,
    /// `tool_choice: "auto"`: calls read from the text in the model's own format.
    Auto,
    /// A function named in `tool_choice`: the whole answer is its arguments.
    Named(String),
    /// `tool_choice: "required"`: the answer is a JSON list of `{"name", "arguments"}`.
    Required,
}

pub struct AnswerShape<'a> {
    /// The tools the prompt shows the model.
    pub prompt_tools: Option<&'a [Value]>,
    pub mode: ToolMode,
    pub grammar: Option<Arc<Grammar>>,
    /// Forced calls (`Named`, `Required`) written in the model's own format rather than as
    /// JSON: the format, and for a named call the exact text around its JSON arguments.
    pub call_format: Option<CallFormat>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CallFormat {
    /// A named call's JSON arguments follow this text (a key, or Mistral's `[ARGS]`).
    pub arguments_after: Option<String>,
}

/// What the request asks of the answer's shape.
pub struct ShapeRequest<'a, 'b> {
    pub tools: Option<&'a [Value]>,
    pub tool_choice: Option<&'b Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<&'b Value>,
}

/// The model's side: its format, and a special token's id by its text (forced calls name their
/// format's markers by id); `strict_tools`: the server's `--strict-tools`.
pub struct ShapeContext<'a> {
    pub format: &'a ModelFormat,
    pub special: &'a (dyn Fn(&str) -> Option<u32> + Sync),
    pub strict_tools: bool,
}

impl<'a> AnswerShape<'a> {
    /// Whether a grammar decides the whole answer (no reasoning, no free text around it).
    pub fn grammar_decides_answer(&self) -> bool {
        self.grammar.is_some() && self.mode != ToolMode::Auto
    }
}

pub fn answer_shape<'a>(request: ShapeRequest<'a, '_>, context: &ShapeContext) -> Result<AnswerShape<'a>, ApiError> {
    let ShapeRequest { tools, tool_choice, parallel_tool_calls, response_format } = request;
    let ShapeContext { format, special, strict_tools } = *context;
    let calls = format.calls();
    let tools = tools.filter(|t| !t.is_empty());
    let functions = tools
        .map(|t| t.iter().enumerate().map(|(i, tool)| function_of(i, tool)).collect::<Result<Vec<_>, _>>())
        .transpose()?;
    let choice = parse_tool_choice(tool_choice)?;
    let format_grammar = response_format_grammar(response_format)?.map(Arc::new);
    let Some(functions) = functions else {
        return match choice {
            Choice::Required | Choice::Named(_) => Err(ApiError::invalid("tool_choice", "tool_choice requires tools")),
            Choice::Auto | Choice::None => {
                Ok(AnswerShape { prompt_tools: None, mode: ToolMode::Off, grammar: format_grammar, call_format: None })
            }
        };
    };
    let shape = |mode, grammar: Option<Grammar>| AnswerShape {
        prompt_tools: tools,
        mode,
        grammar: grammar.map(Arc::new),
        call_format: None,
    };
    let parallel = parallel_tool_calls != Some(false);
    let spec = |functions, named| CallSpec { functions, named, parallel: parallel && !named, special };
    match choice {
        Choice::None => {
            Ok(AnswerShape { prompt_tools: None, mode: ToolMode::Off, grammar: format_grammar, call_format: None })
        }
        Choice::Auto if format_grammar.is_some() => {
            Ok(AnswerShape { prompt_tools: tools, mode: ToolMode::Off, grammar: format_grammar, call_format: None })
        }
        Choice::Auto if !format.writes_calls() => Ok(shape(ToolMode::Off, None)),
        Choice::Auto => {
            let all: Vec<&Function> = functions.iter().collect();
            let strict = strict_tools.then(|| calls.strict_calls(&spec(&all, false))).flatten();
            let grammar = strict.transpose().map_err(|e| ApiError::invalid("tools", format!("tools: {e}")))?;
            Ok(shape(ToolMode::Auto, grammar))
        }
        Choice::Named(name) => {
            let function = functions.iter().find(|f| f.name == name).ok_or_else(|| {
                ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice names the function {name:?}, which is not among the tools"),
                )
            })?;
            if let Some(forced) = calls.forced_calls(&spec(&[function], true)) {
                let forced = forced.map_err(|e| schema_error(&function.name, e))?;
                let call_format = CallFormat { arguments_after: forced.arguments_after };
                return Ok(AnswerShape {
                    call_format: Some(call_format),
                    ..shape(ToolMode::Named(name), Some(forced.grammar))
                });
            }
            let grammar = Grammar::from_schema(&function.parameters).map_err(|e| schema_error(&function.name, e))?;
            Ok(shape(ToolMode::Named(name), Some(grammar)))
        }
        Choice::Required => {
            let all: Vec<&Function> = functions.iter().collect();
            if let Some(forced) = calls.forced_calls(&spec(&all, false)) {
                let forced = forced.map_err(|e| ApiError::invalid("tools", format!("tools: {e}")))?;
                let call_format = CallFormat { arguments_after: None };
                return Ok(AnswerShape {
                    call_format: Some(call_format),
                    ..shape(ToolMode::Required, Some(forced.grammar))
                });
            }
            let alternatives: Vec<Value> = functions
                .iter()
                .map(|f| json!({"type": "object", "properties": {"name": {"const": f.name}, "arguments": f.parameters}, "required": ["name", "arguments"]}))
                .collect();
            let mut calls = json!({"type": "array", "items": {"anyOf": alternatives}, "minItems": 1});
            if !parallel {
                calls["maxItems"] = json!(1);
            }
            let grammar =
                Grammar::from_schema(&calls).map_err(|e| ApiError::invalid("tools", format!("tools: {e}")))?;
            Ok(shape(ToolMode::Required, Some(grammar)))
        }
    }
}

fn function_of(index: usize, tool: &Value) -> Result<Function, ApiError> {
    let param = format!("tools[{index}]");
    let bad = |message: &str| ApiError::invalid(&param, format!("{param}: {message}"));
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad("only tools of type \"function\" are supported"));
    }
    let function = tool.get("function").filter(|f| f.is_object()).ok_or_else(|| bad("function must be an object"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("function.name must be a non-empty string"))?;
    let parameters = match function.get("parameters") {
        // No parameters: the function takes none.
        None | Some(Value::Null) => json!({"type": "object", "properties": {}, "additionalProperties": false}),
        Some(p) if p.is_object() => p.clone(),
        Some(_) => return Err(bad("function.parameters must be a JSON Schema object")),
    };
    Ok(Function { name: name.to_string(), parameters })
}

enum Choice {
    Auto,
    None,
    Required,
    Named(String),
}

fn parse_tool_choice(choice: Option<&Value>) -> Result<Choice, ApiError> {
    let bad = || {
        ApiError::invalid("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    };
    match choice {
        None | Some(Value::Null) => Ok(Choice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(Choice::Auto),
            "none" => Ok(Choice::None),
            "required" | "any" => Ok(Choice::Required),
            _ => Err(bad()),
        },
        Some(Value::Object(o)) => {
            // {"type": "function", "function": {"name": ..}}, or the flat {"type": "function", "name": ..}.
            let name = o.get("function").and_then(|f| f.get("name")).or_else(|| o.get("name")).and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => Ok(Choice::Named(name.to_string())),
                _ => Err(bad()),
            }
        }
        Some(_) => Err(bad()),
    }
}

/// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"schema": ..}}`.
fn response_format_grammar(format: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    let invalid = |message: String| ApiError::invalid("response_format", message);
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::any_object())),
        Some("json_schema") => {
            let spec = format
                .get("json_schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| invalid("response_format.json_schema must be an object".into()))?;
            match spec.get("schema") {
                None | Some(Value::Null) => Ok(Some(Grammar::any_object())),
                Some(schema) => Grammar::from_schema(schema)
                    .map(Some)
                    .map_err(|e| invalid(format!("response_format.json_schema.schema: {e}"))),
            }
        }
        Some(other) => {
            Err(invalid(format!("response_format type {other:?} is not one of text, json_object, json_schema")))
        }
        None => Err(invalid("response_format.type must be a string".into())),
    }
}

fn schema_error(function: &str, e: crate::constrain::SchemaError) -> ApiError {
    ApiError::invalid("tools", format!("the parameters of function {function:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape_of<'a>(
        tools: Option<&'a [Value]>,
        tool_choice: Option<&Value>,
        parallel_tool_calls: Option<bool>,
        response_format: Option<&Value>,
        template_source: &str,
    ) -> Result<AnswerShape<'a>, ApiError> {
        let request = ShapeRequest { tools, tool_choice, parallel_tool_calls, response_format };
        let format = ModelFormat::of_template(template_source);
        answer_shape(request, &ShapeContext { format: &format, special: &|_| None, strict_tools: false })
    }

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
        ]
    }

    #[test]
    fn modes_from_tool_choice() {
        let t = tools();
        let hermes = "<tool_call>";
        let shape = |choice: Option<Value>| shape_of(Some(&t), choice.as_ref(), None, None, hermes);
        assert_eq!(shape(None).unwrap().mode, ToolMode::Auto);
        assert!(shape(Some(json!("none"))).unwrap().prompt_tools.is_none());
        let required = shape(Some(json!("required"))).unwrap();
        assert_eq!(required.mode, ToolMode::Required);
        assert!(required.grammar.is_some());
        let named = shape(Some(json!({"type": "function", "function": {"name": "get_weather"}}))).unwrap();
        assert_eq!(named.mode, ToolMode::Named("get_weather".into()));
        assert_eq!(shape_of(Some(&t), None, None, None, "plain").unwrap().mode, ToolMode::Off);
    }

    #[test]
    fn forced_and_strict_calls_in_the_templates_format() {
        let t = tools();
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let forced = shape_of(Some(&t), Some(&named), None, None, "<tool_call>").unwrap();
        let format = forced.call_format.as_ref().expect("Hermes calls");
        assert_eq!(format.arguments_after.as_deref(), Some("\"arguments\""));
        assert!(forced.grammar_decides_answer());
        // No format the server writes: the call is plain JSON, as before.
        assert!(shape_of(Some(&t), Some(&named), None, None, "plain").unwrap().call_format.is_none());
        let request =
            ShapeRequest { tools: Some(&t), tool_choice: None, parallel_tool_calls: None, response_format: None };
        let hermes = ModelFormat::of_template("<tool_call>");
        let context = ShapeContext { format: &hermes, special: &|_| None, strict_tools: true };
        let strict = answer_shape(request, &context).unwrap();
        assert_eq!(strict.mode, ToolMode::Auto);
        assert!(strict.grammar.is_some() && !strict.grammar_decides_answer(), "free text, reasoning and calls");
    }

    #[test]
    fn bad_choices_and_formats_are_400s_naming_the_parameter() {
        let t = tools();
        let err = |r: Result<AnswerShape, ApiError>| {
            r.err().expect("an error").body()["error"]["param"].as_str().unwrap_or_default().to_string()
        };
        assert_eq!(err(shape_of(Some(&t), Some(&json!("sometimes")), None, None, "")), "tool_choice");
        assert_eq!(
            err(shape_of(Some(&t), Some(&json!({"type": "function", "function": {"name": "nope"}})), None, None, "",)),
            "tool_choice"
        );
        assert_eq!(err(shape_of(None, Some(&json!("required")), None, None, "")), "tool_choice");
        assert_eq!(err(shape_of(Some(&[json!({"type": "retrieval"})]), None, None, None, "")), "tools[0]");
        assert_eq!(err(shape_of(None, None, None, Some(&json!({"type": "xml"})), "")), "response_format");
        let pattern = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {"required": ["a"]}}}});
        assert_eq!(err(shape_of(None, None, None, Some(&pattern), "")), "response_format");
    }
}
