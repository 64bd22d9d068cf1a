//! A chat request in the server's common form (OpenAI's chat shape: every dialect translates
//! into it), validated, rendered with the model's chat template, tokenized and submitted.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::answer::AnswerParser;
use super::params::CommonParams;
use super::reasoning::ReasoningSplitter;
use super::structured::{answer_shape, AnswerShape, ShapeContext, ShapeRequest, ToolMode};
use super::{harmony, tool_calls};
use crate::engine::{ModelInfo, RequestStream};
use crate::server::{ApiError, AppState};
use crate::store::Served;
use crate::tokenizer::chat_template::{ChatTemplate, RenderRequest};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct ChatRequest {
    /// `{"role": "system" | "developer" | "user" | "assistant" | "tool", "content": text or text parts, ...}`;
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

/// Tools as templates expect them: every function with a `description` (gpt-oss's template,
/// as published, fails on one without; clients often leave it out). Empty where missing.
fn with_descriptions(tools: &[Value]) -> Vec<Value> {
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

/// The chat template's extra variables: `chat_template_kwargs` and what `reasoning_effort` sets.
fn template_kwargs(request: &ChatRequest) -> Result<Map<String, Value>, ApiError> {
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

/// A chat generation under way, with what a dialect needs to render it.
pub struct StartedChat {
    /// The served model's id.
    pub model: String,
    pub stream: RequestStream,
    /// Splits the generated text into text, reasoning and tool calls.
    pub parser: AnswerParser,
    pub mode: ToolMode,
    pub tokenizer: Arc<Tokenizer>,
    /// `Some(top)` when per-token log-probabilities were asked for.
    pub logprobs: Option<usize>,
    pub prompt_tokens: usize,
}

/// A chat request's prompt, rendered and tokenized, with what generation needs next.
pub struct RenderedChat {
    pub served: Served,
    pub info: ModelInfo,
    pub text: String,
    pub prompt_ids: Vec<u32>,
    pub shape: AnswerShape<'static>,
    /// Where each message's text begins in `text` (characters), found in order.
    pub message_starts: Vec<usize>,
    /// For a model with recurrent layers: where the system prompt ends (tokens).
    pub snapshot_at: Option<usize>,
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

/// Validates the messages and tools, renders the chat template and tokenizes (loading the
/// model if it is not loaded).
pub async fn render(state: &AppState, request: &ChatRequest, model: Option<&str>) -> Result<RenderedChat, ApiError> {
    let served = state.models.serve(state.resolve_model(model).as_deref()).await?;
    let info = served.engine.model_info().clone();
    let messages = normalize_messages(&request.messages, state.config.max_messages)?;
    let template = info.chat_template.as_ref().ok_or_else(|| {
        ApiError::bad_request("this model has no chat template; use /v1/completions with a raw prompt")
    })?;
    let format = tool_calls::ToolFormat::of_template(template.source());
    let mut messages =
        if template.source().contains("tool_calls") { messages } else { inline_tool_calls(messages, format) };
    if template.source().contains("length != 9") {
        nine_character_call_ids(&mut messages);
    }
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
    let context =
        ShapeContext { template_source: template.source(), special: &special, strict_tools: state.config.strict_tools };
    let shape = answer_shape(shape_request, &context)?;
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
    let prompt_ids = info.tokenizer.encode(&text, false, true).map_err(|e| ApiError::internal(e.to_string()))?;
    let shape = AnswerShape { prompt_tools: None, ..shape };
    let message_starts = message_starts(&text, &messages);
    let recurrent = info.kv_footprint.state_bytes > 0;
    let snapshot_at =
        recurrent.then(|| system_prompt_end(template, &render, &text, &prompt_ids, &info.tokenizer)).flatten();
    Ok(RenderedChat { served, info, text, prompt_ids, shape, message_starts, snapshot_at })
}

/// Validates, renders the chat template, tokenizes and submits.
pub async fn start(state: &AppState, request: &ChatRequest, common: &CommonParams) -> Result<StartedChat, ApiError> {
    let RenderedChat { served, info, text, prompt_ids, shape, message_starts, snapshot_at } =
        render(state, request, common.model.as_deref()).await?;
    let template = info.chat_template.as_ref().expect("rendered with a template");
    let prompt_tokens = prompt_ids.len();
    let top = request.top_logprobs.unwrap_or(0) as usize;
    if top > 20 {
        return Err(ApiError::invalid("top_logprobs", "top_logprobs may be at most 20"));
    }
    let logprobs = request.logprobs.unwrap_or(false).then_some(top);
    let mut engine_request = common.to_request(state, &info, prompt_ids, logprobs)?;
    // Harmony (gpt-oss) marks reasoning and calls with special tokens, tools or not; a grammar
    // decides the whole answer and then no channel is written.
    let harmony = !shape.grammar_decides_answer() && harmony::is_harmony(template.source());
    let markers = match (&shape.mode, &shape.call_format) {
        _ if harmony => harmony::MARKERS.as_slice(),
        (ToolMode::Auto(format), _) => format.marker_tokens(),
        (_, Some(forced)) => forced.format.marker_tokens(),
        _ => &[],
    };
    // A grammar decides the whole answer; a think block would break it.
    let reasoning =
        if shape.grammar_decides_answer() { None } else { ReasoningSplitter::for_template(template.source(), &text) };
    let reasoning_markers = reasoning.as_ref().map(ReasoningSplitter::special_tokens).unwrap_or_default();
    engine_request.special_text_tokens =
        markers.iter().chain(reasoning_markers).filter_map(|t| info.tokenizer.token_to_id(t)).collect();
    let parser = if harmony {
        AnswerParser::harmony(&shape.mode)
    } else {
        AnswerParser::new(&shape.mode, reasoning)
            .with_call_format(shape.call_format.as_ref())
            .with_schemas(tool_calls::parameter_schemas(request.tools.as_deref().unwrap_or_default()))
    };
    engine_request.grammar = shape.grammar.clone();
    engine_request.message_starts = message_starts;
    engine_request.snapshot_at = snapshot_at;
    engine_request.turn_boundary = turn_boundary(template, &info.tokenizer, template_kwargs(request)?);
    let stream = served.engine.submit(engine_request)?;
    Ok(StartedChat {
        model: served.id,
        stream,
        parser,
        mode: shape.mode,
        tokenizer: info.tokenizer.clone(),
        logprobs,
        prompt_tokens,
    })
}

/// The tokens the chat template writes between an answer and the next user message, found by
/// rendering a short conversation (for the engine to prefill once the answer is done). Trailing
/// whitespace is left out: it may be written together with the message's first characters.
/// Empty when the template does not render such a conversation as expected.
fn turn_boundary(template: &ChatTemplate, tokenizer: &Tokenizer, extra: Map<String, Value>) -> Vec<u32> {
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

/// `call_` and 9 alphanumerics (Mistral's templates insist on 9).
pub fn call_id() -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = crate::sampling::Rng::from_entropy();
    let id: String = (0..9).map(|_| CHARS[(rng.next_u64() % CHARS.len() as u64) as usize] as char).collect();
    format!("call_{id}")
}

/// Messages as the chat template expects them: `content` as one string (text parts joined),
/// `developer` as `system`, tool-call arguments as objects (what the templates `tojson`).
/// Anything malformed is a 400 naming the message.
pub fn normalize_messages(messages: &[Value], max: usize) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    if messages.len() > max {
        return Err(ApiError::invalid("messages", format!("at most {max} messages are allowed")));
    }
    messages
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
                Some(Value::Array(parts)) => Value::String(join_text_parts(parts, &param)?),
                Some(_) => {
                    return Err(ApiError::invalid(
                        &param,
                        format!("{param}.content must be a string or a list of text parts"),
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
        .collect()
}

/// Takes off the final assistant message, to be continued: its text follows the generation prompt.
fn final_assistant_text(messages: &mut Vec<Value>) -> Result<String, ApiError> {
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

/// Mistral's templates refuse tool-call ids that are not 9 characters: each id (the calls' and the
/// tool results') maps to 9 alphanumerics derived from it, so calls and results still pair up.
fn nine_character_call_ids(messages: &mut [Value]) {
    fn nine(id: &str) -> String {
        if id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()) {
            return id.to_string();
        }
        // FNV-1a, written in base 62 (62^9 > 2^53: distinct ids stay distinct in practice).
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.bytes() {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..9)
            .map(|_| {
                let c = CHARS[(hash % 62) as usize] as char;
                hash /= 62;
                c
            })
            .collect()
    }
    for m in messages.iter_mut() {
        if let Some(Value::String(id)) = m.get("tool_call_id") {
            m["tool_call_id"] = Value::String(nine(id));
        }
        if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
            for call in calls.iter_mut() {
                if let Some(Value::String(id)) = call.get("id") {
                    call["id"] = Value::String(nine(id));
                }
            }
        }
    }
}

/// For templates that know nothing of tool calls: an assistant turn's calls become its text (in
/// the model's own format where it has one, as LFM2's; else the JSON list `tool_choice:
/// "required"` has the model write), so that the model sees what it called before the `tool`
/// turns that answer it.
fn inline_tool_calls(messages: Vec<Value>, format: Option<tool_calls::ToolFormat>) -> Vec<Value> {
    messages
        .into_iter()
        .map(|mut m| {
            let Some(Value::Array(calls)) = m.get("tool_calls").cloned() else { return m };
            let listed: Vec<Value> = calls
                .iter()
                .map(|c| json!({"name": c.pointer("/function/name").cloned().unwrap_or(Value::Null), "arguments": c.pointer("/function/arguments").cloned().unwrap_or(json!({}))}))
                .collect();
            let text = m.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
            let own_format = format == Some(tool_calls::ToolFormat::Pythonic);
            let calls_text =
                if own_format { super::pythonic_calls::write_calls(&calls) } else { Value::Array(listed).to_string() };
            let separator = if own_format { "" } else { "\n" };
            m["content"] =
                Value::String(if text.is_empty() { calls_text } else { format!("{text}{separator}{calls_text}") });
            m.as_object_mut().map(|o| o.remove("tool_calls"));
            m
        })
        .collect()
}

fn join_text_parts(parts: &[Value], param: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for part in parts {
        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => text.push_str(t),
            (Some(kind), _) => {
                return Err(ApiError::invalid(
                    param,
                    format!("{param}: content parts of type {kind:?} are not supported"),
                ))
            }
            _ => return Err(ApiError::invalid(param, format!("{param}: each content part needs a type"))),
        }
    }
    Ok(text)
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

    #[test]
    fn call_ids_fit_mistral_and_still_pair() {
        let mut messages = vec![
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_AbC123xyZ", "type": "function", "function": {"name": "w"}}, {"id": "ABCDEFGHI", "type": "function", "function": {"name": "w"}}]}),
            json!({"role": "tool", "tool_call_id": "call_AbC123xyZ", "content": "sunny"}),
            json!({"role": "tool", "tool_call_id": "ABCDEFGHI", "content": "rain"}),
        ];
        nine_character_call_ids(&mut messages);
        let first = messages[0]["tool_calls"][0]["id"].as_str().unwrap().to_string();
        assert!(first.len() == 9 && first.chars().all(|c| c.is_ascii_alphanumeric()), "{first}");
        assert_eq!(messages[1]["tool_call_id"], first.as_str(), "the result still pairs with its call");
        assert_eq!(messages[0]["tool_calls"][1]["id"], "ABCDEFGHI", "a valid id is kept");
        assert_eq!(messages[2]["tool_call_id"], "ABCDEFGHI");
    }

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
