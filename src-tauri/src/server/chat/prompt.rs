//! A chat request in the server's common form (OpenAI's chat shape: every dialect translates
//! into it), validated, rendered with the model's chat template and tokenized.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::images::ImageInput;
use super::messages::{final_assistant_text, normalize_messages, with_descriptions, Normalized};
use super::model::ChatModel;
use super::structured::{answer_shape, AnswerShape, ShapeContext, ShapeRequest};
use crate::model::vision::{decode, DecodedImage, PromptImages};
use crate::server::{ApiError, ServerConfig};
use crate::tokenizer::chat_template::{ChatTemplate, RenderRequest};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Default, Clone, Deserialize, utoipa::ToSchema)]
pub struct ChatRequest {
    /// `{"role": "system" | "developer" | "user" | "assistant" | "tool", "content": text, or text and `image_url` parts (data URLs), ...}`;
    /// assistant turns may carry `tool_calls`, tool turns a `tool_call_id`.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    /// `[{"type": "function", "function": {"name", "description", "parameters": JSON Schema}}]`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `"auto"` (default), `"none"`, `"required"`, or `{"type": "function", "function": {"name": ...}}`;
    /// the last two are enforced by constrained decoding.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// `false`: at most one call with `tool_choice: "required"`.
    pub parallel_tool_calls: Option<bool>,
    /// `{"type": "text" | "json_object"}` or `{"type": "json_schema", "json_schema": {"name", "schema"}}`;
    /// JSON answers are enforced by constrained decoding.
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
    /// Report each token's log-probability.
    pub logprobs: Option<bool>,
    /// With `logprobs`: this many alternatives per token (at most 20).
    pub top_logprobs: Option<u32>,
    /// Extra chat-template variables (vLLM's name), e.g. `{"enable_thinking": false}` for Qwen 3.
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// The last message is an assistant turn to continue (vLLM's name; Anthropic's prefill):
    /// the answer carries on from its text instead of starting a new turn.
    pub continue_final_message: Option<bool>,
    /// `"none"`, `"minimal"`, `"low"`, `"medium"` or `"high"`: gpt-oss's template states it to the
    /// model (none and minimal as low, its least); templates with a thinking switch (Qwen 3) turn
    /// thinking off for none and minimal. `chat_template_kwargs` overrides both.
    pub reasoning_effort: Option<String>,
}

/// The chat template's extra variables: `chat_template_kwargs` and what `reasoning_effort` sets.
pub(super) fn template_kwargs(request: &ChatRequest) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = request.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(effort) = request.reasoning_effort.as_deref() {
        let level = match effort {
            "none" | "minimal" | "low" => "low",
            "medium" | "high" => effort,
            other => {
                return Err(ApiError::invalid(
                    "reasoning_effort",
                    format!("reasoning_effort {other:?} is not one of none, minimal, low, medium, high"),
                ))
            }
        };
        kwargs.entry("reasoning_effort").or_insert_with(|| Value::from(level));
        kwargs.entry("enable_thinking").or_insert_with(|| Value::Bool(!matches!(effort, "none" | "minimal")));
    }
    Ok(kwargs)
}

/// A chat request's prompt, rendered and tokenized, with what generation needs next.
pub struct RenderedChat {
    pub text: String,
    pub prompt_ids: Vec<u32>,
    pub shape: AnswerShape<'static>,
    /// Where each message's text begins in `text` (characters), found in order.
    pub message_starts: Vec<usize>,
    /// For a model with recurrent layers: where the system prompt ends (tokens).
    pub snapshot_at: Option<usize>,
    /// The prompt's images, their tokens in `prompt_ids` (a model that sees).
    pub images: Option<Arc<PromptImages>>,
}

/// The character offset in `text` where each message's content is found, in order (a message
/// whose content is not found, e.g. an empty one, takes the previous one's offset).
fn message_starts(text: &str, messages: &[Value]) -> Vec<usize> {
    let mut from = 0;
    messages
        .iter()
        .map(|m| {
            let content = m.get("content").and_then(Value::as_str).unwrap_or_default();
            if let Some(at) = (!content.is_empty()).then(|| text[from..].find(content)).flatten() {
                from += at;
            }
            text[..from].chars().count()
        })
        .collect()
}

/// Where the system part of the prompt ends in its tokens (the first other message's content
/// starts there), when the tokens split there: a model with recurrent layers keeps its state at
/// that point, so that another conversation with the same system prompt (an agent's instructions
/// and tools) resumes from it instead of from the last multiple of `SNAPSHOT_TOKENS`. Found by
/// rendering `render` once more with that content replaced by a marker: whatever the template
/// writes after the system messages (a tool list, the next role's header) comes before it.
fn system_prompt_end(
    template: &ChatTemplate,
    render: &RenderRequest,
    text: &str,
    prompt_ids: &[u32],
    tokenizer: &Tokenizer,
) -> Option<usize> {
    const MARKER: &str = "\u{E000}\u{E001}";
    let first_other = render.messages.iter().position(|m| m["role"] != "system").filter(|&i| i > 0)?;
    let mut marked = render.messages.to_vec();
    marked[first_other]["content"] = Value::String(MARKER.into());
    let probe = template.render(&RenderRequest { messages: &marked, extra: render.extra.clone(), ..*render }).ok()?;
    let at = probe.find(MARKER)?;
    // The same text up to there: nothing before it depends on that message's content.
    if text.get(..at)? != &probe[..at] {
        return None;
    }
    let ids = tokenizer.encode(&text[..at], false, true).ok()?;
    (!ids.is_empty() && ids.len() + 1 < prompt_ids.len() && prompt_ids.starts_with(&ids)).then_some(ids.len())
}

/// Validates the messages and tools, renders `model`'s chat template and tokenizes.
pub fn render(model: &ChatModel, request: &ChatRequest, config: &ServerConfig) -> Result<RenderedChat, ApiError> {
    let info = &model.info;
    let Normalized { messages, images } = normalize_messages(&request.messages, config.max_messages)?;
    // Checked before the template runs, so that a text-only model refuses images whatever else.
    let decoded = read_images(info, &images)?;
    let template = info.chat_template.as_ref().ok_or_else(|| {
        ApiError::bad_request("this model has no chat template; use /v1/completions with a raw prompt")
    })?;
    let mut messages = model.format.history(messages);
    let prefill = match request.continue_final_message {
        Some(true) => Some(final_assistant_text(&mut messages)?),
        _ => None,
    };
    let tools = request.tools.as_deref().map(with_descriptions);
    let shape_request = ShapeRequest {
        tools: tools.as_deref(),
        tool_choice: request.tool_choice.as_ref(),
        parallel_tool_calls: request.parallel_tool_calls,
        response_format: request.response_format.as_ref(),
    };
    let special = |text: &str| info.tokenizer.token_to_id(text).filter(|&id| info.tokenizer.is_special(id));
    let context = ShapeContext { format: &model.format, special: &special, strict_tools: config.strict_tools };
    let shape = answer_shape(shape_request, &context)?;
    let messages = model.format.with_tool_instructions(messages, shape.prompt_tools);
    let render = RenderRequest {
        messages: &messages,
        tools: shape.prompt_tools,
        add_generation_prompt: true,
        extra: template_kwargs(request)?,
    };
    let mut text = template.render(&render).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    if let Some(prefill) = prefill {
        text.push_str(&prefill);
    }
    // Gemma 3 expands its image placeholders in the text, before tokenizing, as its reference.
    if let Some(expanded) = info.vision.as_ref().filter(|_| !decoded.is_empty()).and_then(|p| p.expand_text(&text)) {
        text = expanded;
    }
    let prompt_ids = info.tokenizer.encode(&text, false, true).map_err(|e| ApiError::internal(e.to_string()))?;
    let (prompt_ids, images) = match (&info.vision, decoded.is_empty()) {
        (Some(processor), false) => {
            let (ids, prepared) =
                processor.prepare(&prompt_ids, &decoded).map_err(|e| ApiError::invalid("messages", e))?;
            (ids, Some(Arc::new(prepared)))
        }
        _ => (prompt_ids, None),
    };
    let shape = AnswerShape { prompt_tools: None, ..shape };
    let message_starts = message_starts(&text, &messages);
    let recurrent = info.kv_footprint.state_bytes > 0;
    let snapshot_at =
        recurrent.then(|| system_prompt_end(template, &render, &text, &prompt_ids, &info.tokenizer)).flatten();
    Ok(RenderedChat { text, prompt_ids, shape, message_starts, snapshot_at, images })
}

/// The request's images decoded, for a model that sees them: refused whole for a text-only model
/// (answering about an image it never saw would mislead), and, before any pixel is decoded, when
/// their tokens alone would not fit the context window (which bounds the memory their pixels
/// take).
fn read_images(info: &crate::engine::ModelInfo, images: &[ImageInput]) -> Result<Vec<DecodedImage>, ApiError> {
    let Some(first) = images.first() else { return Ok(Vec::new()) };
    let Some(processor) = &info.vision else {
        return Err(ApiError::invalid(
            &first.param,
            format!(
                "{}: the model {} reads text only in FastMLX; send the request without images",
                first.param, info.name
            ),
        ));
    };
    let mut tokens = 0;
    for image in images {
        let (h, w) = (image.header.height as usize, image.header.width as usize);
        tokens += processor.image_tokens(h, w).map_err(|e| ApiError::invalid(&image.param, e))?;
    }
    if tokens >= info.context_length {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "the {} images alone take {tokens} tokens; the context window is {}",
                images.len(),
                info.context_length
            ),
        ));
    }
    images
        .iter()
        .map(|image| {
            decode(&image.bytes, Some(image.header.media_type))
                .map_err(|e| ApiError::invalid(&image.param, format!("{}: {e}", image.param)))
        })
        .collect()
}

/// The tokens the chat template writes between an answer and the next user message, found by
/// rendering a short conversation (for the engine to prefill once the answer is done). Trailing
/// whitespace is left out: it may be written together with the message's first characters.
/// Empty when the template does not render such a conversation as expected.
pub(super) fn turn_boundary(template: &ChatTemplate, tokenizer: &Tokenizer, extra: Map<String, Value>) -> Vec<u32> {
    const ANSWER: &str = "Answer A.";
    const NEXT: &str = "Message B.";
    let messages = [
        json!({"role": "user", "content": "Message A."}),
        json!({"role": "assistant", "content": ANSWER}),
        json!({"role": "user", "content": NEXT}),
    ];
    let render = RenderRequest { messages: &messages, tools: None, add_generation_prompt: false, extra };
    let Ok(text) = template.render(&render) else { return Vec::new() };
    let Some(start) = text.find(ANSWER).map(|at| at + ANSWER.len()) else { return Vec::new() };
    let Some(end) = text[start..].find(NEXT).map(|at| start + at) else { return Vec::new() };
    let mut ids = tokenizer.encode(&text[start..end], false, true).unwrap_or_default();
    while ids.last().is_some_and(|&id| tokenizer.decode(&[id], false).is_ok_and(|t| t.trim().is_empty())) {
        ids.pop();
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_prompt_ends_where_the_first_other_message_starts() {
        let inner: tokenizers::Tokenizer =
            crate::fixtures::synthetic::tokenizer_json().to_string().parse().expect("the tiny tokenizer");
        let tokenizer = Tokenizer::new(inner, None, Some("<|im_end|>".into()), &[], None);
        // A template that writes a tool line after the system messages, which the user's text
        // ("weather") also appears in.
        let template = ChatTemplate::new(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
             {% if m.role == 'system' and (loop.last or messages[loop.index].role != 'system') %}Tools: get the weather\n{% endif %}\
             {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            None,
            None,
        )
        .unwrap();
        let messages = [
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "system", "content": "Tools: none."}),
            json!({"role": "user", "content": "weather"}),
            json!({"role": "assistant", "content": "Ok."}),
        ];
        let render = |messages| RenderRequest { messages, add_generation_prompt: true, ..Default::default() };
        let text = template.render(&render(&messages)).unwrap();
        let ids = tokenizer.encode(&text, false, true).unwrap();
        let end = system_prompt_end(&template, &render(&messages), &text, &ids, &tokenizer).expect("a boundary");
        let head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>system\nTools: none.<|im_end|>\n\
                    Tools: get the weather\n<|im_start|>user\n";
        assert!(text.starts_with(head), "{text}");
        assert_eq!(end, tokenizer.encode(head, false, true).unwrap().len());
        // No system message, or nothing after it: no boundary.
        assert_eq!(system_prompt_end(&template, &render(&messages[2..]), &text, &ids, &tokenizer), None);
        assert_eq!(system_prompt_end(&template, &render(&messages[..2]), &text, &ids, &tokenizer), None);
        // Tokens that do not split there (a different prompt): none either.
        assert_eq!(system_prompt_end(&template, &render(&messages), &text, &ids[1..], &tokenizer), None);
    }
}
