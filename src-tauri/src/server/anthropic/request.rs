//! Anthropic's Messages request as the server's chat request: `system` (text or blocks, and
//! system entries among the messages, as Claude Code sends), text / `tool_use` / `tool_result`
//! blocks, custom tools with `input_schema` (`defer_loading` ones too), `tool_choice`,
//! `thinking` (enabled, adaptive, disabled; `display`), `stop_sequences`,
//! `output_config.format` (structured outputs) and `effort`. `context_management` is accepted
//! and changes nothing: earlier thinking is never shown to the model again, and tool results are
//! kept (a conversation past the context is a clear 400). Anthropic's server tools are left out
//! (only Anthropic runs them). Image and document blocks get a clear 400.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::server::chat::images::text_or_parts;
use crate::server::chat::{ChatRequest, CommonParams, StopParam};
use crate::server::ApiError;

/// The chat request and its parameters; `max_tokens` is required unless `counting` (count_tokens).
pub fn to_chat(body: &Value, counting: bool) -> Result<(ChatRequest, CommonParams), ApiError> {
    let model = body.get("model").and_then(Value::as_str).filter(|m| !m.trim().is_empty());
    let model = model.ok_or_else(|| ApiError::invalid("model", "model: field required"))?;
    let max_tokens = match body.get("max_tokens") {
        None | Some(Value::Null) if counting => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => n.as_u64(),
        None | Some(Value::Null) => return Err(ApiError::invalid("max_tokens", "max_tokens: field required")),
        Some(_) => return Err(ApiError::invalid("max_tokens", "max_tokens: must be an integer of at least 1")),
    };
    let raw_messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::invalid("messages", "messages: field required (a list)"))?;
    if raw_messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages: at least one message is required"));
    }
    let mut messages = Vec::new();
    if let Some(system) = body.get("system").filter(|s| !s.is_null()) {
        let text = text_of(system, "system")?;
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    let mut tool_names: HashMap<String, String> = HashMap::new();
    for (i, message) in raw_messages.iter().enumerate() {
        let param = format!("messages[{i}]");
        // Claude Code puts a system entry among the messages: it joins the system prompt.
        if message.get("role").and_then(Value::as_str) == Some("system") {
            let text = text_of(message.get("content").unwrap_or(&Value::Null), &format!("{param}.content"))?;
            match messages.first_mut().filter(|m| m["role"] == "system") {
                Some(system) => {
                    system["content"] = json!(format!("{}\n\n{text}", system["content"].as_str().unwrap_or_default()))
                }
                None => messages.insert(0, json!({"role": "system", "content": text})),
            }
            continue;
        }
        convert_message(message, &param, &mut tool_names, &mut messages)?;
    }
    let tools = match body.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) => {
            let converted = tools.iter().enumerate().map(|(i, t)| convert_tool(t, i)).collect::<Result<Vec<_>, _>>()?;
            Some(converted.into_iter().flatten().collect::<Vec<_>>()).filter(|t| !t.is_empty())
        }
        Some(_) => return Err(ApiError::invalid("tools", "tools: must be a list")),
    };
    let (tool_choice, parallel) = tool_choice(body.get("tool_choice"))?;
    let thinking = match body.get("thinking").and_then(|t| t.get("type")).and_then(Value::as_str) {
        None => None,
        Some("enabled" | "adaptive" | "between_tools") => Some(true),
        Some("disabled") => Some(false),
        Some(other) => {
            return Err(ApiError::invalid(
                "thinking",
                format!("thinking.type {other:?} is not one of enabled, disabled"),
            ))
        }
    };
    let float = |key: &str| -> Result<Option<f32>, ApiError> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| ApiError::invalid(key, format!("{key}: must be a number"))),
        }
    };
    let stop = match body.get("stop_sequences") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(StopParam::Many(
            items
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ApiError::invalid("stop_sequences", "stop_sequences: must be a list of strings"))?,
        )),
        Some(_) => return Err(ApiError::invalid("stop_sequences", "stop_sequences: must be a list of strings")),
    };
    let top_k = match body.get("top_k") {
        None | Some(Value::Null) => None,
        Some(v) => {
            Some(v.as_u64().ok_or_else(|| ApiError::invalid("top_k", "top_k: must be a non-negative integer"))? as u32)
        }
    };
    // Structured outputs: `output_config.format` is a JSON Schema the answer must follow.
    let response_format = match body.pointer("/output_config/format") {
        None | Some(Value::Null) => None,
        Some(format) => match (format.get("type").and_then(Value::as_str), format.get("schema")) {
            (Some("json_schema"), Some(schema)) => {
                Some(json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}))
            }
            _ => {
                return Err(ApiError::invalid(
                    "output_config.format",
                    "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                ))
            }
        },
    };
    // A final assistant message is a prefill the answer continues.
    let prefill = raw_messages.last().and_then(|m| m.get("role")).and_then(Value::as_str) == Some("assistant");
    let request = ChatRequest {
        messages,
        tools,
        tool_choice,
        parallel_tool_calls: parallel,
        response_format,
        continue_final_message: prefill.then_some(true),
        chat_template_kwargs: thinking.map(|on| Map::from_iter([("enable_thinking".to_string(), Value::Bool(on))])),
        reasoning_effort: effort(body, thinking),
        ..Default::default()
    };
    let common = CommonParams {
        model: Some(model.to_string()),
        max_tokens,
        temperature: float("temperature")?,
        top_p: float("top_p")?,
        top_k,
        stop,
        stream: body.get("stream").and_then(Value::as_bool),
        // Claude Code asks for Claude's own ceiling (32000 and more).
        cap_max_tokens: true,
        ..Default::default()
    };
    Ok((request, common))
}

/// A string, or a list of text blocks (joined by blank lines), as `system` and `tool_result`
/// contents may be.
fn text_of(value: &Value, param: &str) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::new();
            for (i, block) in blocks.iter().enumerate() {
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        texts.push(block.get("text").and_then(Value::as_str).unwrap_or_default().to_string())
                    }
                    // What Claude Code's tool search returns: a deferred tool, which the model
                    // was shown from the start here (see `convert_tool`).
                    Some("tool_reference") => {
                        let name = block.get("tool_name").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::invalid(param, format!("{param}[{i}].tool_name: field required"))
                        })?;
                        texts.push(format!("Tool {name} is available."))
                    }
                    Some(kind) => return Err(unsupported_block(kind, &format!("{param}[{i}]"))),
                    None => return Err(ApiError::invalid(param, format!("{param}[{i}]: each block needs a type"))),
                }
            }
            Ok(texts.join("\n\n"))
        }
        _ => Err(ApiError::invalid(param, format!("{param}: must be a string or a list of text blocks"))),
    }
}

/// A `tool_result`'s content as the chat core takes a tool message's: its text, or with images
/// (Claude Code returns screenshots this way) text and image parts in order.
fn tool_result_content(value: &Value, param: &str, is_error: bool) -> Result<Value, ApiError> {
    let error_prefix = |text: String| if is_error { format!("Error: {text}") } else { text };
    let Value::Array(blocks) = value else { return Ok(Value::String(error_prefix(text_of(value, param)?))) };
    if !blocks.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("image")) {
        return Ok(Value::String(error_prefix(text_of(value, param)?)));
    }
    let mut parts = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let at = format!("{param}[{i}]");
        match block.get("type").and_then(Value::as_str) {
            Some("image") => parts.push(image_block(block, &at)?),
            _ => parts.push(json!({"type": "text", "text": text_of(&Value::Array(vec![block.clone()]), &at)?})),
        }
    }
    if is_error {
        parts.insert(0, json!({"type": "text", "text": "Error: "}));
    }
    Ok(Value::Array(parts))
}

/// An `image` block as the chat core's image part: `{"type": "base64", "media_type", "data"}`
/// as a data URL; a `url` source as its URL (which the core refuses to fetch, saying why).
fn image_block(block: &Value, param: &str) -> Result<Value, ApiError> {
    let source = block
        .get("source")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiError::invalid(param, format!("{param}.source: field required")))?;
    let field = |key: &str| {
        source
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(param, format!("{param}.source.{key}: field required")))
    };
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => format!("data:{};base64,{}", field("media_type")?, field("data")?),
        Some("url") => field("url")?.to_string(),
        Some(other) => {
            return Err(ApiError::invalid(param, format!("{param}.source.type: {other:?} is not one of base64, url")))
        }
        None => return Err(ApiError::invalid(param, format!("{param}.source.type: field required"))),
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn unsupported_block(kind: &str, param: &str) -> ApiError {
    match kind {
        "document" => ApiError::invalid(param, format!("{param}: document blocks are not supported")),
        _ => ApiError::invalid(param, format!("{param}: blocks of type {kind:?} are not supported here")),
    }
}

/// One Anthropic message as OpenAI messages: a user turn's `tool_result` blocks become `tool`
/// messages (in order, before its text); an assistant's `tool_use` blocks its `tool_calls`.
fn convert_message(
    message: &Value,
    param: &str,
    tool_names: &mut HashMap<String, String>,
    out: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let role = message
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(param, format!("{param}.role: field required")))?;
    if role != "user" && role != "assistant" {
        return Err(ApiError::invalid(
            param,
            format!("{param}.role: {role:?} is not one of user, assistant (the system prompt goes in `system`)"),
        ));
    }
    let blocks = match message.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => return Err(ApiError::invalid(param, format!("{param}.content: must be a string or a list of blocks"))),
    };
    let mut text = Vec::new();
    // The user's images, in order among the text (`text` keeps the text alone).
    let mut parts: Vec<Value> = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{param}.content[{j}]");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let t = block.get("text").and_then(Value::as_str).unwrap_or_default().to_string();
                parts.push(json!({"type": "text", "text": t}));
                text.push(t);
            }
            Some("image") if role == "user" => parts.push(image_block(block, &at)?),
            // Earlier thinking is not shown to the model again, as the templates do.
            Some("thinking" | "redacted_thinking") if role == "assistant" => {}
            Some("tool_use") if role == "assistant" => {
                let id = block
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(&at, format!("{at}.id: field required")))?;
                let name = block
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(&at, format!("{at}.name: field required")))?;
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_names.insert(id.to_string(), name.to_string());
                calls.push(
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}),
                );
            }
            Some("tool_result") if role == "user" => {
                let id = block
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(&at, format!("{at}.tool_use_id: field required")))?;
                let is_error = block.get("is_error").and_then(Value::as_bool) == Some(true);
                let content = match block.get("content") {
                    None | Some(Value::Null) => Value::String(if is_error { "Error: ".into() } else { String::new() }),
                    Some(c) => tool_result_content(c, &format!("{at}.content"), is_error)?,
                };
                let mut tool = json!({"role": "tool", "tool_call_id": id, "content": content});
                if let Some(name) = tool_names.get(id) {
                    tool["name"] = json!(name);
                }
                out.push(tool);
            }
            Some(kind) => return Err(unsupported_block(kind, &at)),
            None => return Err(ApiError::invalid(&at, format!("{at}.type: field required"))),
        }
    }
    let text = text.join("");
    if role == "assistant" {
        let mut m = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        out.push(m);
    } else {
        let content = text_or_parts(parts);
        let has_results = blocks.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"));
        if content.is_array() || content.as_str().is_some_and(|t| !t.is_empty()) || !has_results {
            out.push(json!({"role": "user", "content": content}));
        }
    }
    Ok(())
}

/// A custom tool as a chat tool (`defer_loading` ones too: with no tool search running here,
/// the model sees them from the start); Anthropic's server tools (web search, code execution,
/// tool search, ...) run only on Anthropic's side and are left out.
fn convert_tool(tool: &Value, i: usize) -> Result<Option<Value>, ApiError> {
    let param = format!("tools[{i}]");
    if tool.get("type").and_then(Value::as_str).is_some_and(|k| k != "custom") {
        return Ok(None);
    }
    let name = tool
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(&param, format!("{param}.name: field required")))?;
    let schema = tool
        .get("input_schema")
        .cloned()
        .ok_or_else(|| ApiError::invalid(&param, format!("{param}.input_schema: field required")))?;
    let mut function = json!({"name": name, "parameters": schema});
    if let Some(d) = tool.get("description").and_then(Value::as_str) {
        function["description"] = json!(d);
    }
    Ok(Some(json!({"type": "function", "function": function})))
}

/// `{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}`.
/// The reasoning effort for templates that take one (gpt-oss): `output_config.effort` if given,
/// else from the thinking budget (under 4k tokens low, under 16k medium, else high).
fn effort(body: &Value, thinking: Option<bool>) -> Option<String> {
    if let Some(effort) = body.pointer("/output_config/effort").and_then(Value::as_str) {
        return Some(if effort == "max" { "high" } else { effort }.to_string());
    }
    let budget = body.pointer("/thinking/budget_tokens").and_then(Value::as_u64);
    let level = match (thinking?, budget) {
        (false, _) => "low",
        (true, Some(b)) if b < 4096 => "low",
        (true, Some(b)) if b < 16_384 => "medium",
        (true, _) => "high",
    };
    Some(level.to_string())
}

fn tool_choice(choice: Option<&Value>) -> Result<(Option<Value>, Option<bool>), ApiError> {
    let Some(choice) = choice.filter(|c| !c.is_null()) else { return Ok((None, None)) };
    let parallel = choice.get("disable_parallel_tool_use").and_then(Value::as_bool).map(|d| !d);
    let openai = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid("tool_choice", "tool_choice.name: field required"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(ApiError::invalid("tool_choice", "tool_choice.type must be one of auto, any, tool, none")),
    };
    Ok((Some(openai), parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_round_trip_converts() {
        let body = json!({
            "model": "claude-sonnet-4-5", "max_tokens": 100,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "..", "signature": "x"}, {"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "Thanks"}]}
            ],
            "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"], "temperature": 0.5, "thinking": {"type": "enabled", "budget_tokens": 1024}
        });
        let (chat, common) = to_chat(&body, false).unwrap();
        let roles: Vec<&str> = chat.messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(chat.messages[2]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
        assert_eq!(
            (chat.messages[3]["tool_call_id"].as_str(), chat.messages[3]["name"].as_str()),
            (Some("toolu_1"), Some("w"))
        );
        assert_eq!(chat.tools.unwrap()[0]["function"]["parameters"]["type"], "object");
        assert_eq!((chat.tool_choice, chat.parallel_tool_calls), (Some(json!("required")), Some(false)));
        assert_eq!(chat.chat_template_kwargs.unwrap()["enable_thinking"], true);
        assert_eq!((common.max_tokens, common.temperature), (Some(100), Some(0.5)));
    }

    #[test]
    fn a_tool_search_result_names_the_tool() {
        let result = json!({"type": "tool_result", "tool_use_id": "toolu_1",
                            "content": [{"type": "tool_reference", "tool_name": "NotebookEdit"}]});
        let body = json!({"model": "m", "max_tokens": 10, "messages": [
            {"role": "user", "content": "Edit the notebook."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "notebook"}}]},
            {"role": "user", "content": [result]}
        ]});
        let (chat, _) = to_chat(&body, false).unwrap();
        assert_eq!(chat.messages[2]["content"], "Tool NotebookEdit is available.");
        let mut nameless = body.clone();
        nameless["messages"][2]["content"][0]["content"][0] = json!({"type": "tool_reference"});
        let param = to_chat(&nameless, false).unwrap_err().param.unwrap();
        assert!(param.ends_with(".content"), "{param}");
    }

    #[test]
    fn structured_output_format() {
        let body = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
            "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}}});
        let (chat, _) = to_chat(&body, false).unwrap();
        assert_eq!(chat.response_format.unwrap()["json_schema"]["schema"], json!({"type": "object"}));
        let bad = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "output_config": {"format": {"type": "xml"}}});
        assert_eq!(to_chat(&bad, false).unwrap_err().param.as_deref(), Some("output_config.format"));
    }

    #[test]
    fn images_become_the_chat_cores_image_parts_in_turns_and_tool_results() {
        let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}});
        let part = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
        let body = json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": true,
                                          "content": [{"type": "text", "text": "partial"}, image]}]}]});
        let chat = to_chat(&body, false).unwrap().0;
        assert_eq!(chat.messages[0]["content"], json!([part, {"type": "text", "text": "What is it?"}]));
        assert_eq!(
            chat.messages[2]["content"],
            json!([{"type": "text", "text": "Error: "}, {"type": "text", "text": "partial"}, part])
        );
        // Text-only turns stay strings.
        let plain = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
        assert_eq!(to_chat(&plain, false).unwrap().0.messages[0]["content"], json!("hi"));
        let url = json!({"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}});
        let chat =
            to_chat(&json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [url]}]}), false);
        assert_eq!(chat.unwrap().0.messages[0]["content"][0]["image_url"]["url"], "https://x.test/a.png");
    }

    #[test]
    fn bad_requests_name_the_field() {
        let param = |body: Value| to_chat(&body, false).unwrap_err().param;
        let ok = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        assert!(to_chat(&ok, false).is_ok());
        let with = |key: &str, v: Value| {
            let mut b = ok.clone();
            b[key] = v;
            b
        };
        assert_eq!(param(json!({"model": "m", "messages": []})).as_deref(), Some("max_tokens"));
        assert!(
            to_chat(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), true).is_ok(),
            "count_tokens needs no max_tokens"
        );
        assert_eq!(param(with("messages", json!([]))).as_deref(), Some("messages"));
        let system_inside =
            with("messages", json!([{"role": "system", "content": "Also this."}, {"role": "user", "content": "hi"}]));
        let chat = to_chat(&system_inside, false).unwrap().0;
        assert_eq!(chat.messages[0], json!({"role": "system", "content": "Also this."}));
        assert_eq!(chat.messages.len(), 2);
        assert_eq!(
            param(with("messages", json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]))).as_deref(),
            Some("messages[0].content[0]")
        );
        let server_tool = with("tools", json!([{"type": "web_search_20250305", "name": "web_search"}]));
        assert!(to_chat(&server_tool, false).unwrap().0.tools.is_none(), "server tools are left out");
        assert_eq!(param(with("tool_choice", json!({"type": "sometimes"}))).as_deref(), Some("tool_choice"));
        assert_eq!(param(with("max_tokens", json!(0))).as_deref(), Some("max_tokens"));
    }
}
