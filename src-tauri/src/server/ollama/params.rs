//! Ollama's request fields in the server's terms: `options` as sampling parameters, `keep_alive`
//! as the model's idle time-out, names with tags as local model ids, times as Ollama writes them.

use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::Value;

use crate::server::chat::{CommonParams, StopParam};
use crate::server::{ApiError, AppState};

/// `options`: the model parameters Ollama clients send. Others are accepted and ignored, as
/// Ollama does with options a runner does not use: `num_ctx` among them, since a model's context
/// window is set when it loads (its own, or `--ctx`), not per request.
#[derive(Debug, Default, Deserialize)]
pub struct Options {
    /// Most tokens to generate; -1 (or -2) for as many as the context allows.
    pub num_predict: Option<i64>,
    pub stop: Option<Vec<String>>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
}

impl Options {
    pub fn to_common(&self, model: &str, stream: bool) -> Result<CommonParams, ApiError> {
        let max_tokens = match self.num_predict {
            None => None,
            Some(n) if n < 0 => None,
            Some(0) => {
                return Err(ApiError::invalid(
                    "options.num_predict",
                    "num_predict must be positive, or -1 for no limit",
                ))
            }
            Some(n) => Some(n as u64),
        };
        let top_k = match self.top_k {
            Some(k) if k < 0 => return Err(ApiError::invalid("options.top_k", "top_k must not be negative")),
            k => k.map(|k| k as u32),
        };
        Ok(CommonParams {
            model: Some(model.to_string()),
            max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k,
            min_p: self.min_p,
            seed: self.seed,
            stop: self.stop.clone().filter(|s| !s.is_empty()).map(StopParam::Many),
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            stream: Some(stream),
            // Clients often send the context size as num_predict.
            cap_max_tokens: true,
            ..Default::default()
        })
    }
}

/// `options` read from the body: a wrong type names the option.
pub fn options(body: &Value) -> Result<Options, ApiError> {
    match body.get("options") {
        None | Some(Value::Null) => Ok(Options::default()),
        Some(v @ Value::Object(_)) => serde_path_to_error::deserialize(v).map_err(|e| {
            let path = format!("options.{}", e.path());
            ApiError::invalid(&path, format!("{path}: {}", e.into_inner()))
        }),
        Some(_) => Err(ApiError::invalid("options", "options must be an object")),
    }
}

/// `keep_alive`: `None` keeps the server's setting, `Some(None)` keeps the model loaded for
/// good (a negative value), `Some(Some(d))` unloads it after `d` idle (0: once this request ends).
pub fn keep_alive(body: &Value) -> Result<Option<Option<Duration>>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "keep_alive",
            "keep_alive must be seconds or a duration such as \"5m\", \"1h30m\", \"0\" or \"-1\"",
        )
    };
    match body.get("keep_alive") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => seconds(n.as_f64().ok_or_else(bad)?).map(Some).ok_or_else(bad),
        Some(Value::String(s)) => parse_duration(s).map(Some).ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// Beyond this a time-out means "for good" (and stays within what dates can show).
const FOREVER_SECS: f64 = 100.0 * 365.0 * 86_400.0;

/// Seconds as a time-out: negative or past a century is forever (`None`); NaN is invalid.
fn seconds(secs: f64) -> Option<Option<Duration>> {
    if secs.is_nan() {
        return None;
    }
    if !(0.0..=FOREVER_SECS).contains(&secs) {
        return Some(None);
    }
    Duration::try_from_secs_f64(secs).ok().map(Some)
}

/// A Go duration (`"5m"`, `"1h30m"`, `"300ms"`) or bare seconds; negative means forever.
fn parse_duration(text: &str) -> Option<Option<Duration>> {
    let text = text.trim();
    if let Some(rest) = text.strip_prefix('-') {
        return parse_duration(rest).map(|_| None);
    }
    // Bare seconds, digits only (`f64::from_str` would also take "inf" and "NaN").
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return seconds(text.parse::<f64>().ok()?);
    }
    let mut total = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).filter(|&i| i > 0)?;
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    seconds(total)
}

/// Which model a request may fall back to when its name resolves to none in particular (an
/// alias with an empty target, such as the default `claude-*`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Chat, generate, show: the model served now.
    Served,
    /// Pull and delete act on a named model only.
    None,
}

/// The model a name asks for, required: aliases applied, `:latest` dropped, and Ollama's Hub
/// names (`hf.co/owner/name:Q4_K_M`) matched to what a pull of them stored. Returns the name as
/// asked and the local id.
pub fn model_name(state: &AppState, body: &Value, fallback: Fallback) -> Result<(String, String), ApiError> {
    let name =
        body.get("model").or_else(|| body.get("name")).and_then(Value::as_str).map(str::trim).unwrap_or_default();
    if name.is_empty() {
        return Err(ApiError::invalid("model", "model is required"));
    }
    if let Some(id) = pulled_model(state, name) {
        return Ok((name.to_string(), id));
    }
    match state.resolve_model(Some(name)) {
        Some(id) => Ok((name.to_string(), id)),
        None if fallback == Fallback::Served => {
            // The chat model served now (an embedding model loaded later serves no chat).
            let loaded = state.models.loaded();
            let current = loaded.iter().find(|m| m.kind == crate::model::ModelKind::Chat).or(loaded.first());
            let current = current.map(|m| m.id.clone());
            current.map(|id| (name.to_string(), id)).ok_or_else(|| not_found(name))
        }
        None => Err(not_found(name)),
    }
}

/// The local model an Ollama Hub name was pulled as: the repo's folder (MLX), or a GGUF file of
/// the repo whose name has the tag's quantization.
fn pulled_model(state: &AppState, name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if !(lower.starts_with("hf.co/") || lower.starts_with("huggingface.co/")) {
        return None;
    }
    let (repo, tag) = hub_repo(name)?;
    let tag = tag.map(|t| t.to_ascii_lowercase());
    let prefix = format!("{repo}/");
    state.models.local_models().into_iter().map(|m| m.id).find(|id| {
        id == &repo
            || (id.starts_with(&prefix) && tag.as_ref().is_none_or(|t| id.to_ascii_lowercase().contains(t.as_str())))
    })
}

/// Ollama's message for a model it does not have.
pub fn not_found(name: &str) -> ApiError {
    let name = crate::server::error::shown(name);
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found_error",
        format!("model {name} not found, try pulling it first"),
    )
}

/// Ollama's timestamps: RFC 3339 with nanoseconds.
pub fn timestamp(time: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

pub fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// `owner/name[:tag]` after an optional `hf.co/` or `huggingface.co/`; the tag (not `latest`)
/// selects a GGUF quantization.
pub fn hub_repo(name: &str) -> Option<(String, Option<String>)> {
    let name = name.strip_prefix("https://").unwrap_or(name);
    let name = name.strip_prefix("hf.co/").or_else(|| name.strip_prefix("huggingface.co/")).unwrap_or(name);
    let (repo, tag) = match name.rsplit_once(':') {
        Some((repo, tag)) => (repo, Some(tag).filter(|t| !t.is_empty() && *t != "latest")),
        None => (name, None),
    };
    let parts: Vec<&str> = repo.split('/').collect();
    let valid = parts.len() == 2
        && parts.iter().all(|p| !p.is_empty() && *p != "." && *p != ".." && !p.contains(char::is_whitespace));
    valid.then(|| (repo.to_string(), tag.map(str::to_string)))
}

/// Applies a request's `keep_alive` to the model that served it.
pub fn apply_keep_alive(state: &AppState, id: &str, keep: Option<Option<Duration>>) {
    if let Some(keep) = keep {
        state.models.set_keep_alive(id, keep);
    }
}

/// A model the catalog does not have gets Ollama's own 404 message.
pub fn named(error: ApiError, name: &str, id: &str) -> ApiError {
    if error.code == Some("model_not_found") && error.message.contains(id) {
        not_found(name)
    } else {
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names() {
        assert_eq!(
            hub_repo("mlx-community/Qwen2.5-0.5B-Instruct-4bit"),
            Some(("mlx-community/Qwen2.5-0.5B-Instruct-4bit".into(), None))
        );
        assert_eq!(
            hub_repo("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"),
            Some(("bartowski/Llama-3.2-1B-Instruct-GGUF".into(), Some("Q4_K_M".into())))
        );
        assert_eq!(hub_repo("huggingface.co/a/b:latest"), Some(("a/b".into(), None)));
        assert_eq!(hub_repo("llama3.2"), None);
        assert_eq!(hub_repo("llama3.2:3b"), None);
        assert_eq!(hub_repo("a/../b"), None);
    }
    use serde_json::json;

    #[test]
    fn keep_alive_forms() {
        let ka = |v: Value| keep_alive(&json!({ "keep_alive": v }));
        assert_eq!(ka(json!("5m")).unwrap(), Some(Some(Duration::from_secs(300))));
        assert_eq!(ka(json!("1h30m")).unwrap(), Some(Some(Duration::from_secs(5400))));
        assert_eq!(ka(json!("10m0s")).unwrap(), Some(Some(Duration::from_secs(600))));
        assert_eq!(ka(json!("300ms")).unwrap(), Some(Some(Duration::from_millis(300))));
        assert_eq!(ka(json!(0)).unwrap(), Some(Some(Duration::ZERO)));
        assert_eq!(ka(json!("0")).unwrap(), Some(Some(Duration::ZERO)));
        assert_eq!(ka(json!(-1)).unwrap(), Some(None));
        assert_eq!(ka(json!("-1m")).unwrap(), Some(None));
        assert_eq!(keep_alive(&json!({})).unwrap(), None);
        // Past a century is forever; nothing panics on huge or odd values.
        assert_eq!(ka(json!(1e20)).unwrap(), Some(None));
        assert_eq!(ka(json!("99999999999999999h")).unwrap(), Some(None));
        for bad in [json!("soon"), json!("5x"), json!(true), json!("m"), json!("inf"), json!("NaN"), json!("1e400")] {
            assert_eq!(ka(bad).unwrap_err().param.as_deref(), Some("keep_alive"));
        }
    }

    #[test]
    fn options_map_to_sampling() {
        let o = options(&json!({"options": {"num_predict": 12, "stop": ["\n"], "temperature": 0, "top_k": 5, "num_ctx": 4096, "mirostat": 0}})).unwrap();
        let c = o.to_common("m", false).unwrap();
        assert_eq!((c.max_tokens, c.temperature, c.top_k), (Some(12), Some(0.0), Some(5)));
        assert!(matches!(c.stop, Some(StopParam::Many(ref s)) if s == &["\n".to_string()]));
        assert_eq!(
            options(&json!({"options": {"num_predict": -1}})).unwrap().to_common("m", true).unwrap().max_tokens,
            None
        );
        assert_eq!(
            options(&json!({"options": {"temperature": "hot"}})).unwrap_err().param.as_deref(),
            Some("options.temperature")
        );
        assert_eq!(options(&json!({"options": 3})).unwrap_err().param.as_deref(), Some("options"));
    }
}
