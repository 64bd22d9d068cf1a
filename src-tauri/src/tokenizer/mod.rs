//! Text <-> token ids (`tokenizers`), chat templates (minijinja), and streaming decoding.

pub mod chat_template;
mod from_gguf;
mod pyjson;
mod pyrepr;
mod stream;
mod token_bytes;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::constrain::{Vocabulary, SPECIAL_MARKER};

pub use chat_template::{ChatTemplate, TemplateError};
pub use from_gguf::{tokenizer_from_gguf_metadata, GgufTokenizerMetadata};
pub use stream::StreamDecoder;

/// `json.dumps(value)` with Python's default separators (`", "`, `": "`), non-ASCII kept: how
/// model cards write JSON into the prompts their models were trained on.
pub fn python_json(value: &serde_json::Value) -> String {
    pyjson::dumps(&minijinja::Value::from_serialize(value), &pyjson::PyJsonOptions::new(None))
        .unwrap_or_else(|_| value.to_string())
}

#[derive(Debug, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(pub String);

impl From<tokenizers::Error> for TokenizerError {
    fn from(e: tokenizers::Error) -> Self {
        TokenizerError(e.to_string())
    }
}

/// A model's tokenizer with the special tokens generation needs.
pub struct Tokenizer {
    /// Special tokens in the text are encoded as special tokens.
    inner: tokenizers::Tokenizer,
    /// The same vocabulary, but special-token text is encoded literally (user text in chats).
    literal: tokenizers::Tokenizer,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Every id that ends generation (the tokenizer's EOS plus `generation_config.json`'s).
    pub eos_ids: Vec<u32>,
    /// Prepend BOS to raw prompts (tokenizers' post-processor does it for `tokenizer.json`
    /// models; GGUF says so in `tokenizer.ggml.add_bos_token`).
    add_bos_id: Option<u32>,
    /// Built on first use (constrained decoding).
    constraint_vocabulary: OnceLock<Result<Arc<Vocabulary>, String>>,
    /// Every token's own bytes, built on first use (log-probabilities' `bytes`).
    raw_bytes: OnceLock<Vec<Vec<u8>>>,
}

impl Tokenizer {
    pub fn new(
        inner: tokenizers::Tokenizer,
        bos_token: Option<String>,
        eos_token: Option<String>,
        extra_eos_ids: &[u32],
        add_bos_id: Option<u32>,
    ) -> Tokenizer {
        let mut literal = inner.clone();
        literal.set_encode_special_tokens(true);
        let mut eos_ids: Vec<u32> = eos_token.as_deref().and_then(|t| inner.token_to_id(t)).into_iter().collect();
        for id in extra_eos_ids {
            if !eos_ids.contains(id) {
                eos_ids.push(*id);
            }
        }
        Tokenizer {
            inner,
            literal,
            bos_token,
            eos_token,
            eos_ids,
            add_bos_id,
            constraint_vocabulary: OnceLock::new(),
            raw_bytes: OnceLock::new(),
        }
    }

    pub fn from_file(path: &Path) -> Result<tokenizers::Tokenizer, TokenizerError> {
        tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError(format!("{}: {e}", path.display())))
    }

    /// Encodes `text`. With `add_special_tokens` the tokenizer's BOS (if it uses one) is
    /// prepended; with `parse_special` the text of special tokens (`<|im_start|>`, FIM markers)
    /// becomes those tokens, otherwise it is encoded as plain text.
    pub fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let tokenizer = if parse_special { &self.inner } else { &self.literal };
        let mut ids = tokenizer.encode_fast(text, add_special_tokens)?.get_ids().to_vec();
        if let (true, Some(bos)) = (add_special_tokens, self.add_bos_id) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        Ok(self.inner.decode(ids, skip_special_tokens)?)
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    /// The id of a token given by its text (`[TOOL_CALLS]`), if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The text of token `id` as the vocabulary spells it, if it has that id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Tokens in the vocabulary, the added (special) ones included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Whether `id` is a special (control) token, never shown as text.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.get_added_tokens_decoder().get(&id).is_some_and(|t| t.special)
    }

    /// The vocabulary as constrained decoding sees it (every token's bytes), built once.
    pub fn constraint_vocabulary(&self) -> Result<Arc<Vocabulary>, String> {
        self.constraint_vocabulary
            .get_or_init(|| Vocabulary::new(self.token_byte_table(SPECIAL_MARKER), &self.eos_ids).map(Arc::new))
            .clone()
    }

    /// The bytes token `id` stands for (a byte-level token may hold half a UTF-8 character,
    /// which decoding it alone turns into U+FFFD); a special token's are its text.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        // A marker no text token starts with is dropped from the special ones.
        const MARKER: u8 = 0xFF;
        let table = self.raw_bytes.get_or_init(|| self.token_byte_table(MARKER));
        match table.get(id as usize) {
            Some(bytes) if self.is_special(id) => bytes.get(1..).unwrap_or_default().to_vec(),
            Some(bytes) => bytes.clone(),
            None => Vec::new(),
        }
    }

    /// Every token's bytes by id; a special token's are `marker` then its text.
    pub fn token_byte_table(&self, marker: u8) -> Vec<Vec<u8>> {
        token_bytes::token_bytes(&self.inner, marker)
    }
}
