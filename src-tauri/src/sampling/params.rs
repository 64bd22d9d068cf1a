//! Sampling parameters of one request, with validation.

/// How to pick tokens. The defaults are greedy decoding with no penalties.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 picks the most likely token (greedy); higher flattens the distribution.
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability adds up to this (1 = all).
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of recently seen tokens (1 = off).
    pub repetition_penalty: f32,
    /// How many recent tokens (prompt and output) the repetition penalty looks at.
    pub repetition_context: usize,
    /// Subtracted once from the logit of every token already generated (OpenAI semantics).
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token already generated.
    pub frequency_penalty: f32,
    /// Same seed, same parameters, same prompt: same output.
    pub seed: Option<u64>,
    /// Added to these tokens' logits (OpenAI's `logit_bias`; -100 bans a token).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_context: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Checks ranges; the error names the parameter at fault.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        let bad = |param: &'static str, message: &str| Err(InvalidParam { param, message: message.to_string() });
        for (name, v) in [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repetition_penalty", self.repetition_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !v.is_finite() {
                return bad(name, &format!("{name} must be a finite number"));
            }
        }
        if !(0.0..=100.0).contains(&self.temperature) {
            return bad("temperature", "temperature must be between 0 and 100");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "min_p must be between 0 and 1");
        }
        if self.repetition_penalty <= 0.0 {
            return bad("repetition_penalty", "repetition_penalty must be greater than 0");
        }
        if self.logit_bias.iter().any(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return bad("logit_bias", "logit_bias values must be between -100 and 100");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad("presence_penalty", "presence_penalty must be between -2 and 2");
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("frequency_penalty", "frequency_penalty must be between -2 and 2");
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// A sampling parameter out of range: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidParam {
    pub param: &'static str,
    pub message: String,
}
