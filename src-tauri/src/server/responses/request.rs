//! A Responses API request as the server's chat request: `input` as text or items (messages,
//! `function_call`, `function_call_output`; `reasoning` items, with or without
//! `encrypted_content`, are dropped as the stateless design drops earlier reasoning),
//! `instructions`, function tools (flat, or grouped in a `namespace`: offered to the model as
//! `namespace.name`, reported back as Codex expects, `namespace` and bare `name`; also when an
//! `additional_tools` input item brings them), custom
//! (freeform) tools (offered as a function of one string, `input`: a Lark grammar in its
//! description, a regex as its pattern; called back as `custom_tool_call`), `tool_choice`, `text.format`,
//! `max_output_tokens`. OpenAI's hosted tools (web search, file search, code
//! interpreter, ...) cannot run here: they are left out of the prompt, and a `tool_choice` that
//! forces one is a 400. `include`, `reasoning.summary`, `prompt_cache_key`, `client_metadata`
//! are accepted and change nothing. Nothing is stored: `store: true` and `previous_response_id`
//! get a clear 400.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::server::chat::images::text_or_parts;
use crate::server::chat::{ChatRequest, CommonParams};
use crate::server::ApiError;

/// A tool the model sees under another name or shape than the client's: a function of a
/// namespace (seen as `namespace.name`), or a custom tool (seen as a function of `input`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    pub namespace: Option<String>,
    /// The tool's own name.
    pub name: String,
    pub custom: bool,
}

/// Those tools, by the name the model sees.
pub type OfferedTools = HashMap<String, Offered>;

/// The name the model sees a tool by: `namespace.name` for a tool of a namespace.
fn seen_name(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}.{name}"),
        None => name.to_string(),
    }
}

/// The one parameter a custom tool is offered with.
pub const CUSTOM_INPUT: &str = "input";

pub fn to_chat(body: &Value) -> Result<(ChatRequest, CommonParams, OfferedTools), ApiError> {
    if body.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            "previous_response_id",
            "previous_response_id is not supported: this server stores no responses; send the whole conversation in `input` (with store: false)",
        ));
    }
    if body.get("store").and_then(Value::as_bool) == Some(true) {
        return Err(ApiError::invalid("store", "store: true is not supported: this server stores no responses; send store: false and the whole conversation in `input`"));
    }
    if body.get("conversation").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            "conversation",
            "conversations are not supported: this server stores nothing; send the whole conversation in `input`",
        ));
    }
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(ApiError::invalid("instructions", "instructions must be a string")),
    }
    let mut offered = OfferedTools::new();
    // Tools an `additional_tools` input item brings (Codex's "Responses Lite" sends them there).
    let mut additional = Vec::new();
    match body.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let param = format!("input[{i}]");
                if item.get("type").and_then(Value::as_str) == Some("additional_tools") {
                    let Some(Value::Array(tools)) = item.get("tools") else {
                        return Err(ApiError::invalid(&param, format!("{param}.tools must be a list of tools")));
                    };
                    for (j, tool) in tools.iter().enumerate() {
                        additional.extend(convert_tool(tool, &format!("{param}.tools[{j}]"), None, &mut offered)?);
                    }
                    continue;
                }
                convert_item(item, &param, &mut messages)?;
            }
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("input", "input is required (text or a list of items)"))
        }
        Some(_) => return Err(ApiError::invalid("input", "input must be text or a list of items")),
    }
    let mut tools = Vec::new();
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, tool) in list.iter().enumerate() {
                tools.extend(convert_tool(tool, &format!("tools[{i}]"), None, &mut offered)?);
            }
        }
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list")),
    }
    tools.extend(additional);
    // Two tools the model would see under one name: a call could not say which.
    let mut seen = std::collections::HashSet::new();
    if let Some(name) = tools.iter().filter_map(|t| t["function"]["name"].as_str()).find(|n| !seen.insert(*n)) {
        return Err(ApiError::invalid(
            "tools",
            format!(
                "two tools are offered as {name:?} (namespaced tools are named `namespace.name`): names must be unique"
            ),
        ));
    }
    // None, or only hosted tools: the model is offered none.
    let tools = (!tools.is_empty()).then_some(tools);
    let tool_choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(json!(s)),
        Some(Value::Object(o)) if matches!(o.get("type").and_then(Value::as_str), Some("function" | "custom")) => {
            let name = o
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid("tool_choice", "tool_choice.name is required"))?;
            let name = seen_name(o.get("namespace").and_then(Value::as_str), name);
            Some(json!({"type": "function", "function": {"name": name}}))
        }
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str).is_some_and(is_hosted) => {
            let kind = o.get("type").and_then(Value::as_str).unwrap_or_default();
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice forces the hosted tool {kind:?}, which this server cannot run (it runs no tools; only function and custom tools can be called)"),
            ));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice must be \"auto\", \"none\", \"required\", or {\"type\": \"function\" or \"custom\", \"name\": ...}",
            ))
        }
    };
    let response_format = match body.pointer("/text/format") {
        None | Some(Value::Null) => None,
        Some(format) => match format.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(json!({"type": "json_object"})),
            Some("json_schema") => {
                let schema = format
                    .get("schema")
                    .cloned()
                    .ok_or_else(|| ApiError::invalid("text.format.schema", "text.format.schema is required"))?;
                let name = format.get("name").cloned().unwrap_or_else(|| json!("format"));
                Some(json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema}}))
            }
            _ => {
                return Err(ApiError::invalid(
                    "text.format",
                    "text.format.type must be text, json_object or json_schema",
                ))
            }
        },
    };
    let request = ChatRequest {
        messages,
        tools,
        tool_choice,
        parallel_tool_calls: body.get("parallel_tool_calls").and_then(Value::as_bool),
        response_format,
        reasoning_effort: body.pointer("/reasoning/effort").and_then(Value::as_str).map(str::to_string),
        ..Default::default()
    };
    let number = |key: &str| -> Result<Option<f64>, ApiError> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::invalid(key, format!("{key} must be a number"))),
        }
    };
    let max_tokens = match number("max_output_tokens")? {
        None => None,
        Some(n) if n >= 1.0 && n.fract() == 0.0 => Some(n as u64),
        Some(_) => {
            return Err(ApiError::invalid("max_output_tokens", "max_output_tokens must be an integer of at least 1"))
        }
    };
    let common = CommonParams {
        model: body.get("model").and_then(Value::as_str).map(str::to_string),
        max_tokens,
        temperature: number("temperature")?.map(|t| t as f32),
        top_p: number("top_p")?.map(|t| t as f32),
        stream: body.get("stream").and_then(Value::as_bool),
        priority: body.get("priority").and_then(Value::as_i64),
        ..Default::default()
    };
    Ok((request, common, offered))
}

/// One input item: a message (`type` "message" or just a `role`), a `function_call` (joined to
/// the assistant turn before it), a `function_call_output`; earlier `reasoning` is dropped.
fn convert_item(item: &Value, param: &str, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
    match kind {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(param, format!("{param}.role is required")))?;
            let role = match role {
                "user" | "assistant" | "system" => role,
                "developer" => "system",
                other => return Err(ApiError::invalid(param, format!("{param}.role {other:?} is not one of user, assistant, system, developer"))),
            };
            let content = match item.get("content") {
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(Value::Array(parts)) => {
                    // Text joined; with images, the chat core's text and image parts in order.
                    let mut chat_parts = Vec::new();
                    for (j, part) in parts.iter().enumerate() {
                        let piece = match part.get("type").and_then(Value::as_str) {
                            Some("input_text" | "output_text" | "text") => part.get("text").and_then(Value::as_str).unwrap_or_default(),
                            Some("refusal") => part.get("refusal").and_then(Value::as_str).unwrap_or_default(),
                            Some("input_image") => {
                                let at = format!("{param}.content[{j}]");
                                let url = match (part.get("image_url").and_then(Value::as_str), part.get("file_id")) {
                                    (Some(url), _) => url,
                                    (None, Some(_)) => return Err(ApiError::invalid(&at, format!("{at}: file_id images are not supported (there is no Files API here); send image_url as a data URL"))),
                                    (None, None) => return Err(ApiError::invalid(&at, format!("{at}.image_url: field required"))),
                                };
                                chat_parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
                                continue;
                            }
                            Some(other @ ("input_file" | "input_audio")) => {
                                return Err(ApiError::invalid(param, format!("{param}.content[{j}]: {other} is not supported")))
                            }
                            other => return Err(ApiError::invalid(param, format!("{param}.content[{j}]: content of type {other:?} is not supported"))),
                        };
                        chat_parts.push(json!({"type": "text", "text": piece}));
                    }
                    text_or_parts(chat_parts)
                }
                _ => return Err(ApiError::invalid(param, format!("{param}.content must be text or a list of content parts"))),
            };
            out.push(json!({"role": role, "content": content}));
        }
        "function_call" | "custom_tool_call" => {
            let field = |key: &str| item.get(key).and_then(Value::as_str).ok_or_else(|| ApiError::invalid(param, format!("{param}.{key} is required")));
            let name = seen_name(item.get("namespace").and_then(Value::as_str), field("name")?);
            // A custom tool's input as the model saw its call: the function's one argument.
            let arguments = match kind {
                "custom_tool_call" => json!({CUSTOM_INPUT: field("input")?}).to_string(),
                _ => field("arguments")?.to_string(),
            };
            let call = json!({"id": field("call_id")?, "type": "function", "function": {"name": name, "arguments": arguments}});
            // Calls after an assistant message (or after other calls) belong to that turn.
            match out.last_mut().filter(|m| m["role"] == "assistant") {
                Some(last) => match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    Some(calls) => calls.push(call),
                    None => last["tool_calls"] = json!([call]),
                },
                None => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
            }
        }
        "function_call_output" | "custom_tool_call_output" => {
            let call_id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(param, format!("{param}.call_id is required")))?;
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(""),
                _ => return Err(ApiError::invalid(param, format!("{param}.output must be text"))),
            };
            out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
        }
        "reasoning" => {}
        other => return Err(ApiError::invalid(param, format!("{param}: items of type {other:?} are not supported (messages, function and custom tool calls and their outputs are)"))),
    }
    Ok(())
}

/// Tool types OpenAI runs on its side (and whatever new type this server does not know): none
/// can run here.
fn is_hosted(kind: &str) -> bool {
    !matches!(kind, "function" | "custom" | "namespace")
}

/// `{"type": "function", "name", "description", "parameters", "strict"}` as a chat tool; a
/// `namespace` as its functions, named `namespace.name`; a custom tool as a function of one
/// string; a hosted tool as nothing.
fn convert_tool(
    tool: &Value,
    param: &str,
    namespace: Option<(&str, &str)>,
    offered: &mut OfferedTools,
) -> Result<Vec<Value>, ApiError> {
    let kind = tool
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(param, format!("{param}.type is required")))?;
    let name = || {
        tool.get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::invalid(param, format!("{param}.name is required")))
    };
    match (kind, namespace) {
        ("namespace", None) => {
            let group = name()?;
            let about = tool.get("description").and_then(Value::as_str).unwrap_or_default();
            let Some(Value::Array(children)) = tool.get("tools") else {
                return Err(ApiError::invalid(param, format!("{param}.tools must be a list of function tools")));
            };
            let mut out = Vec::new();
            for (j, child) in children.iter().enumerate() {
                out.extend(convert_tool(child, &format!("{param}.tools[{j}]"), Some((group, about)), offered)?);
            }
            Ok(out)
        }
        ("namespace", Some(_)) => Err(ApiError::invalid(param, format!("{param}: namespaces do not nest"))),
        ("function" | "custom", _) => {
            let own = name()?;
            let custom = kind == "custom";
            let (name, description) = match namespace {
                Some((group, about)) => {
                    let description = tool.get("description").and_then(Value::as_str).unwrap_or_default();
                    (seen_name(Some(group), own), Some(format!("{about} {description}").trim().to_string()))
                }
                None => (own.to_string(), tool.get("description").and_then(Value::as_str).map(str::to_string)),
            };
            if namespace.is_some() || custom {
                let namespace = namespace.map(|(group, _)| group.to_string());
                offered.insert(name.clone(), Offered { namespace, name: own.to_string(), custom });
            }
            let parameters = if custom {
                custom_parameters(tool, param)?
            } else {
                tool.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}))
            };
            let mut function = json!({"name": name, "parameters": parameters});
            if let Some(d) = description.filter(|d| !d.is_empty()) {
                function["description"] = json!(d);
            }
            Ok(vec![json!({"type": "function", "function": function})])
        }
        // Hosted tools: left out of the prompt.
        _ => Ok(Vec::new()),
    }
}

/// A custom tool's input as a function's one string parameter. Its `format` says what the text
/// must be: a regular expression becomes the string's `pattern` (held whenever a grammar
/// constrains the call, as when `tool_choice` forces it); a Lark grammar is shown to the model
/// in the description (a JSON string whose text follows a grammar is beyond JSON Schema).
fn custom_parameters(tool: &Value, param: &str) -> Result<Value, ApiError> {
    let mut input = json!({"type": "string"});
    match tool.get("format") {
        None | Some(Value::Null) => input["description"] = json!("The tool's input, as free text."),
        Some(format) => match format.get("type").and_then(Value::as_str) {
            Some("text") => input["description"] = json!("The tool's input, as free text."),
            Some("grammar") => {
                let definition = format.get("definition").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid(param, format!("{param}.format.definition is required (the grammar's text)"))
                })?;
                match format.get("syntax").and_then(Value::as_str) {
                    Some("lark") => {
                        input["description"] = json!(format!(
                            "The tool's input: raw text (not JSON) that this Lark grammar accepts:\n{definition}"
                        ))
                    }
                    Some("regex") => {
                        input["description"] = json!("The tool's input: text that the pattern accepts.");
                        // Anchored: the whole input must match, as the API means it.
                        input["pattern"] = json!(format!("^(?:{definition})$"));
                    }
                    other => {
                        return Err(ApiError::invalid(
                            param,
                            format!("{param}.format.syntax {other:?} is not one of lark, regex"),
                        ))
                    }
                }
            }
            other => {
                return Err(ApiError::invalid(
                    param,
                    format!("{param}.format.type {other:?} is not one of text, grammar"),
                ))
            }
        },
    }
    Ok(json!({"type": "object", "properties": {CUSTOM_INPUT: input}, "required": [CUSTOM_INPUT]}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_convert() {
        let body = json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 50, "store": false,
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "call_1", "name": "w", "arguments": "{\"city\":\"Oslo\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
            ],
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "function", "name": "w"}
        });
        let (chat, common, _) = to_chat(&body).unwrap();
        let roles: Vec<&str> = chat.messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(chat.messages[2]["tool_calls"][0]["id"], "call_1");
        assert_eq!(chat.tool_choice.unwrap()["function"]["name"], "w");
        assert_eq!(common.max_tokens, Some(50));
    }

    #[test]
    fn custom_tools_are_functions_of_their_input() {
        let grammar = "start: \"*** Begin Patch\" LF body \"*** End Patch\"";
        let body = json!({
            "input": [
                {"role": "user", "content": "Patch it."},
                {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"},
                {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done"}
            ],
            "tools": [
                {"type": "custom", "name": "apply_patch", "description": "Edit files.",
                 "format": {"type": "grammar", "syntax": "lark", "definition": grammar}},
                {"type": "custom", "name": "note"},
                {"type": "namespace", "name": "ids", "tools": [
                    {"type": "custom", "name": "code", "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]{3}"}}]}
            ],
            "tool_choice": {"type": "custom", "name": "apply_patch"}
        });
        let (chat, _, offered) = to_chat(&body).unwrap();
        let tools = chat.tools.unwrap();
        let input = |k: usize| tools[k]["function"]["parameters"]["properties"][CUSTOM_INPUT].clone();
        assert!(input(0)["description"].as_str().unwrap().ends_with(grammar), "{}", tools[0]);
        assert_eq!(tools[0]["function"]["description"], "Edit files.");
        assert_eq!(tools[0]["function"]["parameters"]["required"], json!([CUSTOM_INPUT]));
        assert_eq!((input(1)["type"].as_str(), input(1).get("pattern")), (Some("string"), None));
        assert_eq!(input(2)["pattern"], "^(?:[A-Z]{3})$");
        assert_eq!(tools[2]["function"]["name"], "ids.code");
        let custom = |namespace: Option<&str>, name: &str| Offered {
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
            custom: true,
        };
        assert_eq!(offered["apply_patch"], custom(None, "apply_patch"));
        assert_eq!(offered["ids.code"], custom(Some("ids"), "code"));
        let call = &chat.messages[1]["tool_calls"][0]["function"];
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments, json!({CUSTOM_INPUT: "*** Begin Patch\n*** End Patch"}));
        assert_eq!(
            (chat.messages[2]["role"].as_str(), chat.messages[2]["content"].as_str()),
            (Some("tool"), Some("Done"))
        );
        assert_eq!(chat.tool_choice.unwrap()["function"]["name"], "apply_patch");

        let bad_format = json!({"input": "hi", "tools": [{"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "ebnf", "definition": "a"}}]});
        assert_eq!(to_chat(&bad_format).unwrap_err().param.as_deref(), Some("tools[0]"));
        let no_definition = json!({"input": "hi", "tools": [{"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "lark"}}]});
        assert_eq!(to_chat(&no_definition).unwrap_err().param.as_deref(), Some("tools[0]"));
    }

    #[test]
    fn additional_tools_items_add_tools() {
        let run =
            json!({"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}});
        let body = json!({"input": [
            {"type": "additional_tools", "role": "developer", "tools": [{"type": "namespace", "name": "functions", "tools": [run]}]},
            {"role": "user", "content": "List the files."}
        ]});
        let (chat, _, offered) = to_chat(&body).unwrap();
        assert_eq!(chat.messages.len(), 1);
        assert_eq!(chat.tools.unwrap()[0]["function"]["name"], "functions.exec_command");
        assert_eq!(
            (offered["functions.exec_command"].namespace.as_deref(), offered["functions.exec_command"].custom),
            (Some("functions"), false)
        );
        let bad = json!({"input": [{"type": "additional_tools", "role": "developer", "tools": "x"}]});
        assert_eq!(to_chat(&bad).unwrap_err().param.as_deref(), Some("input[0]"));
        // The same tool in `tools` and in the item: two tools under one name.
        let twice =
            json!({"input": [{"type": "additional_tools", "role": "developer", "tools": [run]}], "tools": [run]});
        assert_eq!(to_chat(&twice).unwrap_err().param.as_deref(), Some("tools"));
        let clash = json!({"input": "hi", "tools": [{"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "b.c"}]},
                                                    {"type": "namespace", "name": "a.b", "tools": [{"type": "function", "name": "c"}]}]});
        assert_eq!(to_chat(&clash).unwrap_err().param.as_deref(), Some("tools"));
    }

    #[test]
    fn stored_state_is_refused() {
        let param = |body: Value| to_chat(&body).unwrap_err().param;
        assert_eq!(
            param(json!({"input": "hi", "previous_response_id": "resp_1"})).as_deref(),
            Some("previous_response_id")
        );
        assert_eq!(param(json!({"input": "hi", "store": true})).as_deref(), Some("store"));
        assert_eq!(param(json!({"input": "hi", "tools": [{"name": "w"}]})).as_deref(), Some("tools[0]"));
        let forced = json!({"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}});
        assert_eq!(param(forced).as_deref(), Some("tool_choice"));
        assert_eq!(param(json!({})).as_deref(), Some("input"));
        assert!(to_chat(&json!({"input": "hi"})).is_ok());
    }
}
