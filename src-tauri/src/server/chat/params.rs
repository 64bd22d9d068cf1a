//! The generation parameters every dialect ends up with (OpenAI's names, the server's common
//! form), checked and turned into an engine request.

use serde::Deserialize;

use crate::engine::{ModelInfo, Request};
use crate::sampling::SamplingParams;
use crate::server::{ApiError, AppState};

/// `stop`: one string or a list.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StopParam {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with no choices and the usage.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The parameters chat and text completions share. Unknown fields are ignored (clients send
/// many: `user`, `prompt_cache_key`, `parallel_tool_calls`, ...).
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
pub struct CommonParams {
    /// A local model's id (loaded on demand if it is not loaded; names no local model has get a
    /// 404); left out, the model served now.
    pub model: Option<String>,
    /// Most tokens to generate (default: what the context window leaves).
    pub max_tokens: Option<u64>,
    /// The newer name of `max_tokens`; wins over it.
    pub max_completion_tokens: Option<u64>,
    /// 0 to 100; 0 is greedy. Default 1.
    pub temperature: Option<f32>,
    /// Nucleus sampling, in (0, 1].
    pub top_p: Option<f32>,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: Option<u32>,
    /// Drop tokens less likely than min_p times the most likely one.
    pub min_p: Option<f32>,
    /// -2 to 2.
    pub presence_penalty: Option<f32>,
    /// -2 to 2.
    pub frequency_penalty: Option<f32>,
    /// Divides the logits of recent tokens (1 = off).
    pub repetition_penalty: Option<f32>,
    /// Same seed and parameters, same output.
    pub seed: Option<i64>,
    /// Strings that end the generation (not included in the output).
    pub stop: Option<StopParam>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Only 1 is supported.
    pub n: Option<u32>,
    /// Token id (as a string) to a bias from -100 to 100 added to its logit.
    pub logit_bias: Option<std::collections::HashMap<String, f32>>,
    /// `false`: no drafted tokens for this request (speculative decoding; its output is the same
    /// either way). Default: as the server is configured.
    pub speculative: Option<bool>,
    /// Generate past the model's end-of-sequence tokens, to `max_tokens` or a stop string (vLLM's
    /// and llama.cpp's `ignore_eos`: benchmarks send it for answers of a set length).
    pub ignore_eos: Option<bool>,
    /// vLLM's request priority: lower runs sooner (default 0; `X-Priority` in every dialect).
    pub priority: Option<i64>,
    /// `X-Priority`, set by the handler.
    #[serde(skip)]
    #[schema(ignore)]
    pub header_priority: Option<i32>,
    /// A fill-in-the-middle request (autocomplete): the interactive lane unless it says otherwise.
    #[serde(skip)]
    #[schema(ignore)]
    pub fill_in_the_middle: bool,
    /// Set by dialects whose clients send a model's own output ceiling (Anthropic's `max_tokens`,
    /// Ollama's `num_predict`): it is capped to what fits instead of refused.
    #[serde(skip)]
    #[schema(ignore)]
    pub cap_max_tokens: bool,
}

impl CommonParams {
    pub fn streaming(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }

    /// The engine request for `prompt_ids`, after checking every parameter.
    pub fn to_request(
        &self,
        state: &AppState,
        info: &ModelInfo,
        prompt_ids: Vec<u32>,
        logprobs: Option<usize>,
    ) -> Result<Request, ApiError> {
        let config = &state.config;
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid("n", "only n = 1 is supported"));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopParam::One(s)) => vec![s.clone()],
            Some(StopParam::Many(v)) => v.clone(),
        };
        if stop.len() > config.max_stop_strings {
            return Err(ApiError::invalid(
                "stop",
                format!("at most {} stop strings are allowed", config.max_stop_strings),
            ));
        }
        if stop.iter().any(|s| s.chars().count() > config.max_stop_length) {
            return Err(ApiError::invalid(
                "stop",
                format!("stop strings may be at most {} characters", config.max_stop_length),
            ));
        }
        let room = info.context_length.saturating_sub(prompt_ids.len());
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(0) => return Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1")),
            Some(n) if self.cap_max_tokens => (n as usize).min(config.max_tokens_limit).min(room.max(1)),
            Some(n) if n as usize > config.max_tokens_limit => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!("max_tokens may be at most {}", config.max_tokens_limit),
                ))
            }
            Some(n) => n as usize,
            None => room.min(config.max_tokens_limit),
        };
        let mut logit_bias = Vec::new();
        for (token, bias) in self.logit_bias.iter().flatten() {
            let id = token.parse::<u32>().ok().filter(|&id| (id as usize) < info.vocab_size);
            let id = id.ok_or_else(|| {
                ApiError::invalid("logit_bias", format!("logit_bias key {token:?} is not a token id of this model"))
            })?;
            logit_bias.push((id, *bias));
        }
        let defaults = SamplingParams::default();
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self.top_k.unwrap_or(0) as usize,
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(defaults.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            seed: self.seed.map(|s| s as u64),
            logit_bias,
            ..defaults
        };
        params.validate().map_err(|e| ApiError::invalid(e.param, e.message))?;
        let priority =
            crate::server::priority::engine_priority(self.priority, self.header_priority, self.fill_in_the_middle)?;
        let mut request = Request::new(prompt_ids, max_tokens.max(1));
        request.priority = priority;
        request.params = params;
        request.stop = stop;
        request.logprobs = logprobs;
        request.speculative = self.speculative.unwrap_or(true);
        request.ignore_eos = self.ignore_eos.unwrap_or(false);
        Ok(request)
    }
}
