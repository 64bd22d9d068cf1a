//! A `tokenizers` tokenizer rebuilt from GGUF metadata (`tokenizer.ggml.*`): the byte-level BPE
//! vocabulary and merges, control tokens as special tokens, and the pre-tokenizer named by
//! `tokenizer.ggml.pre` (the same splitting rules the model's original `tokenizer.json` had).

use serde_json::{json, Map, Value};

use super::TokenizerError;

/// The `tokenizer.ggml.*` metadata of a GGUF file.
#[derive(Debug, Clone, Default)]
pub struct GgufTokenizerMetadata {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: which pre-tokenizer regex the model uses.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    /// llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Vec<i32>,
}

const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

// The splitting regexes of the model families' original tokenizer.json files.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

pub fn tokenizer_from_gguf_metadata(meta: &GgufTokenizerMetadata) -> Result<tokenizers::Tokenizer, TokenizerError> {
    if meta.model != "gpt2" {
        return Err(TokenizerError(format!(
            "tokenizer.ggml.model {:?} is not supported (byte-level BPE \"gpt2\" is); load the model's Hugging Face folder instead",
            meta.model
        )));
    }
    if meta.tokens.is_empty() {
        return Err(TokenizerError("tokenizer.ggml.tokens is empty".into()));
    }
    let vocab: Map<String, Value> = meta.tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let added_tokens: Vec<Value> = meta
        .token_types
        .iter()
        .enumerate()
        .filter(|(_, t)| matches!(**t, CONTROL | USER_DEFINED))
        .filter_map(|(i, t)| {
            meta.tokens.get(i).map(|content| {
                json!({"id": i, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                       "normalized": false, "special": *t == CONTROL})
            })
        })
        .collect();
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    let pre_tokenizer = match meta.pre.as_deref() {
        Some("smollm") => {
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]})
        }
        Some("llama-bpe" | "llama3" | "smaug-bpe" | "dbrx") => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
        }
        Some("qwen2" | "deepseek-r1-qwen") => {
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]})
        }
        Some("gpt2" | "gpt-2" | "default") | None => byte_level(true),
        Some(other) => {
            tracing::warn!("GGUF pre-tokenizer {other:?} is not known; using GPT-2's byte-level splitting");
            byte_level(true)
        }
    };
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": meta.merges},
    });
    tokenizer
        .to_string()
        .parse::<tokenizers::Tokenizer>()
        .map_err(|e| TokenizerError(format!("building the GGUF tokenizer: {e}")))
}
