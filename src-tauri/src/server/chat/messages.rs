//! A chat request's messages and tools as chat templates expect them, checked: anything
//! malformed is a 400 naming the message or tool.

use serde_json::{json, Value};

use super::images::{image_part, text_or_parts, ImageInput, MAX_IMAGES};
use crate::server::ApiError;

/// A request's messages as the chat template expects them, and the images they carry.
pub struct Normalized {
    pub messages: Vec<Value>,
    /// In the order they appear; each stands in its message's content as `{"type": "image"}`.
    pub images: Vec<ImageInput>,
}

/// Messages as the chat template expects them: `content` as one string (text parts joined) or,
/// in a message with images, a list of `{"type": "text", "text"}` and `{"type": "image"}` parts
/// (as the vision models' templates read them); `developer` as `system`, tool-call arguments as
/// objects (what the templates `tojson`).
pub fn normalize_messages(messages: &[Value], max: usize) -> Result<Normalized, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    if messages.len() > max {
        return Err(ApiError::invalid("messages", format!("at most {max} messages are allowed")));
    }
    let mut images = Vec::new();
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let param = format!("messages[{i}]");
            let mut m = m
                .as_object()
                .cloned()
                .ok_or_else(|| ApiError::invalid(&param, format!("{param} must be an object")))?;
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid(&param, format!("{param}.role must be a string")))?;
            let role = match role {
                "system" | "user" | "assistant" | "tool" => role.to_string(),
                "developer" => "system".to_string(),
                other => {
                    return Err(ApiError::invalid(
                        &param,
                        format!("{param}.role {other:?} is not one of system, user, assistant, tool"),
                    ))
                }
            };
            m.insert("role".into(), Value::String(role));
            let content = match m.get("content") {
                None | Some(Value::Null) => Value::Null,
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(Value::Array(parts)) => content_parts(parts, &param, &mut images)?,
                Some(_) => {
                    return Err(ApiError::invalid(
                        &param,
                        format!("{param}.content must be a string or a list of text and image parts"),
                    ))
                }
            };
            m.insert("content".into(), content);
            if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
                for call in calls.iter_mut() {
                    let args = call.pointer("/function/arguments").and_then(Value::as_str).map(str::to_string);
                    if let Some(parsed) = args.and_then(|a| serde_json::from_str::<Value>(&a).ok()) {
                        call["function"]["arguments"] = parsed;
                    }
                }
            }
            Ok(Value::Object(m))
        })
        .collect::<Result<Vec<Value>, ApiError>>()?;
    if images.len() > MAX_IMAGES {
        return Err(ApiError::invalid(
            &images[MAX_IMAGES].param,
            format!("{} images in one request: at most {MAX_IMAGES} are taken", images.len()),
        ));
    }
    Ok(Normalized { messages, images })
}

/// Takes off the final assistant message, to be continued: its text follows the generation prompt.
pub fn final_assistant_text(messages: &mut Vec<Value>) -> Result<String, ApiError> {
    let last = messages.last().filter(|m| m["role"] == "assistant" && m.get("tool_calls").is_none_or(Value::is_null));
    if last.is_none() {
        return Err(ApiError::invalid(
            "continue_final_message",
            "continue_final_message needs a final assistant message without tool calls",
        ));
    }
    let last = messages.pop().expect("checked");
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "a conversation cannot be only the assistant message to continue"));
    }
    Ok(last["content"].as_str().unwrap_or_default().to_string())
}

/// Tools as templates expect them: every function with a `description` (gpt-oss's template,
/// as published, fails on one without; clients often leave it out). Empty where missing.
pub fn with_descriptions(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .map(|tool| {
            let mut tool = tool.clone();
            if let Some(function) = tool.get_mut("function").and_then(Value::as_object_mut) {
                function.entry("description").or_insert_with(|| Value::from(""));
            }
            tool
        })
        .collect()
}

/// A message's content parts: their text joined, or with images the parts in order (images
/// read and checked into `images`).
fn content_parts(parts: &[Value], param: &str, images: &mut Vec<ImageInput>) -> Result<Value, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => out.push(json!({"type": "text", "text": t})),
            (Some("image_url"), _) => {
                images.push(image_part(part, &format!("{param}.content[{j}]"))?);
                out.push(json!({"type": "image"}));
            }
            (Some(kind), _) => {
                return Err(ApiError::invalid(
                    param,
                    format!("{param}: content parts of type {kind:?} are not supported"),
                ))
            }
            _ => return Err(ApiError::invalid(param, format!("{param}: each content part needs a type"))),
        }
    }
    Ok(text_or_parts(out))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_final_assistant_message_is_continued() {
        let mut messages =
            vec![json!({"role": "user", "content": "JSON please"}), json!({"role": "assistant", "content": "{\"a\":"})];
        assert_eq!(final_assistant_text(&mut messages).unwrap(), "{\"a\":");
        assert_eq!(messages.len(), 1);
        let mut user_last = vec![json!({"role": "user", "content": "hi"})];
        assert_eq!(final_assistant_text(&mut user_last).unwrap_err().param.as_deref(), Some("continue_final_message"));
    }
}
