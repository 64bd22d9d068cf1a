//! Hugging Face chat templates rendered with minijinja, in an environment that behaves like
//! the one `transformers` renders them in (trim/lstrip blocks, loop controls, Python string
//! methods, `tojson` as `json.dumps`, `raise_exception`, `strftime_now`).

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value as Json};

use super::pyjson::{self, PyJsonOptions};

#[derive(Debug, Clone, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(pub String);

impl From<Error> for TemplateError {
    fn from(e: Error) -> Self {
        // raise_exception's message is the useful part; keep minijinja's detail otherwise.
        match e.kind() {
            ErrorKind::InvalidOperation => TemplateError(e.detail().unwrap_or("invalid operation").to_string()),
            _ => TemplateError(format!("{e:#}")),
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

/// What a template is rendered with.
#[derive(Debug, Default, Clone)]
pub struct RenderRequest<'a> {
    pub messages: &'a [Json],
    pub tools: Option<&'a [Json]>,
    pub add_generation_prompt: bool,
    /// Further variables some templates read (`enable_thinking`, `date_string`, ...).
    pub extra: Map<String, Json>,
}

const TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_filter("string", |value: Value| super::pyrepr::string(&value));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_test("iterable", is_iterable);
        env.add_template_owned(TEMPLATE_NAME, without_generation_tags(source))?;
        Ok(ChatTemplate { env, source: source.to_string(), bos_token, eos_token })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(&self, request: &RenderRequest) -> Result<String, TemplateError> {
        // As transformers: special tokens that are set, then the caller's extras, then the
        // messages with their null-valued keys dropped, `tools` and `documents` always present.
        let mut context = Map::new();
        for (key, token) in [("bos_token", &self.bos_token), ("eos_token", &self.eos_token)] {
            if let Some(token) = token {
                context.insert(key.into(), Json::String(token.clone()));
            }
        }
        context.extend(request.extra.clone());
        let messages = request.messages.iter().map(drop_null_keys).collect();
        context.insert("messages".into(), Json::Array(messages));
        context.insert("tools".into(), request.tools.map_or(Json::Null, |t| Json::Array(t.to_vec())));
        context.entry("documents").or_insert(Json::Null);
        context.insert("add_generation_prompt".into(), Json::Bool(request.add_generation_prompt));
        let template = self.env.get_template(TEMPLATE_NAME)?;
        Ok(template.render(Value::from_serialize(&context))?)
    }
}

/// transformers' `{% generation %}` / `{% endgeneration %}` (it marks the assistant's tokens for
/// training masks and renders its body as it is; SmolLM3's template has it) as the `if` block
/// minijinja knows, whitespace control kept.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else { break };
        let inner = &tag[2..end];
        let (left, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, right) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        let statement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match statement {
            Some(statement) => out.push_str(&format!("{{%{left} {statement} {right}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn drop_null_keys(message: &Json) -> Json {
    match message {
        Json::Object(map) => {
            Json::Object(map.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        other => other.clone(),
    }
}

fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => Some(v.as_str().unwrap_or_default().to_string()),
        },
    };
    let mut options = PyJsonOptions::new(indent);
    if let Some(separators) = kwargs.get::<Option<Value>>("separators")? {
        let parts: Vec<Value> = separators.try_iter()?.collect();
        if let [item, key] = parts.as_slice() {
            options.item_separator = item.as_str().unwrap_or(",").to_string();
            options.key_separator = key.as_str().unwrap_or(":").to_string();
        }
    }
    options.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let _ = kwargs.get::<Option<bool>>("ensure_ascii")?;
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(pyjson::dumps(&value, &options)?))
}

/// Python's `is iterable`: sequences, mappings and strings; not `none` (which minijinja's own
/// test accepts, so Qwen3-Coder's `tools is iterable and tools | length > 0` fails on no tools).
fn is_iterable(value: Value) -> bool {
    use minijinja::value::ValueKind;
    matches!(value.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::String | ValueKind::Iterable)
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> Result<Value, Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format))
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, format!("bad strftime format {format:?}")))?;
    Ok(Value::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_blocks_render_their_body() {
        let source = "{%- for m in messages -%}{% generation %}[{{ m.content }}]{%- endgeneration %}\n{% endfor %}";
        assert!(without_generation_tags(source).contains("{%- endif %}"));
        let template = ChatTemplate::new(source, None, None).unwrap();
        let messages = [serde_json::json!({"role": "assistant", "content": "hi"})];
        let text = template.render(&RenderRequest { messages: &messages, ..Default::default() }).unwrap();
        assert_eq!(text, "[hi]", "trim_blocks eats the newline after the block tag");
        assert_eq!(without_generation_tags("{{ '{%' }} {% if x %}"), "{{ '{%' }} {% if x %}");
    }
}
