//! Fill-in-the-middle prompts from a prefix and a suffix, in the model's own markers (Qwen
//! coder's `<|fim_prefix|>`, StarCoder's and SmolLM's `<fim_prefix>`, Code Llama's `<PRE>`, DeepSeek Coder's `<｜fim▁begin｜>`), as
//! Ollama's `suffix` and OpenAI's legacy `suffix` ask for. Prefix-suffix-middle order.

use crate::tokenizer::Tokenizer;

const MARKERS: &[[&str; 3]] = &[
    ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
    ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
    // DeepSeek Coder's bars are full-width (U+FF5C).
    ["<\u{ff5c}fim▁begin\u{ff5c}>", "<\u{ff5c}fim▁hole\u{ff5c}>", "<\u{ff5c}fim▁end\u{ff5c}>"],
    ["▁<PRE>", "▁<SUF>", "▁<MID>"],
    ["<PRE>", "<SUF>", "<MID>"],
];

/// The model's FIM markers, if its vocabulary has a full set.
pub fn markers(tokenizer: &Tokenizer) -> Option<[&'static str; 3]> {
    MARKERS.iter().find(|set| set.iter().all(|m| tokenizer.token_to_id(m).is_some())).copied()
}

/// The prompt text for generating what goes between `prefix` and `suffix`.
pub fn prompt(tokenizer: &Tokenizer, prefix: &str, suffix: &str) -> Option<String> {
    let [pre, suf, mid] = markers(tokenizer)?;
    Some(format!("{pre}{prefix}{suf}{suffix}{mid}"))
}
