//! Texts to an encoder's tokens as sentence-transformers makes them: the model's special tokens
//! around the text (and between a query and a document for rerankers), cut at the model's
//! `max_seq_length` when asked to, never padded (the batch pads). The `truncation` and `padding`
//! a `tokenizer.json` may carry are ignored: all-MiniLM-L6-v2's says 128, its model takes 256.

use std::path::Path;

use tokenizers::{EncodeInput, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::model::error::{ModelError, Result};

/// One text's tokens, ready for the encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedText {
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
    /// Tokens of an instruction before the text (the pooling may leave them out).
    pub prompt_len: usize,
}

impl EncodedText {
    /// Token ids given by the caller, used as they are.
    pub fn from_ids(ids: Vec<u32>) -> EncodedText {
        let type_ids = vec![0; ids.len()];
        EncodedText { ids, type_ids, prompt_len: 0 }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// A text longer than the model takes, where the caller asked not to cut it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("an input is longer than the {max} tokens this model takes")]
pub struct TooLong {
    pub max: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error(transparent)]
    TooLong(#[from] TooLong),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

pub struct EncoderTokenizer {
    /// Cuts at `max_tokens` (longest first for pairs; for a judge's prompt, at what its prefix
    /// and suffix leave); the cut-off part is in `overflowing`.
    cutting: tokenizers::Tokenizer,
    pub max_tokens: usize,
    lowercase: bool,
    pairs: PairFormat,
}

/// How a reranker's query and document become one input.
enum PairFormat {
    /// The tokenizer's own pair encoding (a cross-encoder's `[CLS] q [SEP] d [SEP]`).
    Native,
    /// A decoder judge's prompt (Qwen3-Reranker's): fixed tokens before and after the
    /// instruction, query and document, the middle cut when too long.
    Judge { prefix: Vec<u32>, suffix: Vec<u32>, instruction: String },
}

/// Qwen3-Reranker's prompt, as its model card scores with it.
pub const JUDGE_PREFIX: &str = "<|im_start|>system\nJudge whether the Document meets the requirements based on \
    the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n\
    <|im_start|>user\n";
pub const JUDGE_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
pub const JUDGE_INSTRUCTION: &str = "Given a web search query, retrieve relevant passages that answer the query";

impl EncoderTokenizer {
    pub fn load(path: &Path, max_tokens: usize, lowercase: bool) -> Result<EncoderTokenizer> {
        let bad = |message: String| ModelError::Tokenizer { path: path.to_path_buf(), message };
        let mut cutting = tokenizers::Tokenizer::from_file(path).map_err(|e| bad(e.to_string()))?;
        cutting.with_padding(None);
        cutting
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| bad(e.to_string()))?;
        Ok(EncoderTokenizer { cutting, max_tokens, lowercase, pairs: PairFormat::Native })
    }

    /// A decoder judge's tokenizer: pairs in Qwen3-Reranker's prompt, at most `max_tokens`.
    pub fn load_judge(path: &Path, max_tokens: usize) -> Result<EncoderTokenizer> {
        let bad = |message: String| ModelError::Tokenizer { path: path.to_path_buf(), message };
        let plain = tokenizers::Tokenizer::from_file(path).map_err(|e| bad(e.to_string()))?;
        let ids = |text: &str| -> Result<Vec<u32>> {
            Ok(plain.encode(text, false).map_err(|e| bad(e.to_string()))?.get_ids().to_vec())
        };
        let (prefix, suffix) = (ids(JUDGE_PREFIX)?, ids(JUDGE_SUFFIX)?);
        let fixed = prefix.len() + suffix.len();
        if max_tokens <= fixed {
            return Err(bad(format!("{max_tokens} tokens leave no room for a query and a document")));
        }
        let mut tokenizer = EncoderTokenizer::load(path, max_tokens - fixed, false)?;
        tokenizer.max_tokens = max_tokens;
        tokenizer.pairs = PairFormat::Judge { prefix, suffix, instruction: JUDGE_INSTRUCTION.into() };
        Ok(tokenizer)
    }

    /// The id of `token` as the vocabulary has it (a judge's "yes" and "no").
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.cutting.token_to_id(token)
    }

    /// `prompt` (an instruction such as `"query: "`) then `text`; longer than the model takes:
    /// cut when `truncate`, else [`TooLong`].
    pub fn encode(&self, prompt: &str, text: &str, truncate: bool) -> Result<EncodedText, EncodeError> {
        let full = self.case(&format!("{prompt}{text}"));
        let encoding = self.run(EncodeInput::Single(full.into()))?;
        let prompt_len = if prompt.is_empty() { 0 } else { self.prompt_tokens(prompt)? };
        self.finish(encoding, truncate, prompt_len)
    }

    /// A reranker's input: the query and a document as a pair.
    pub fn encode_pair(&self, query: &str, document: &str, truncate: bool) -> Result<EncodedText, EncodeError> {
        match &self.pairs {
            PairFormat::Native => {
                let input = EncodeInput::Dual(self.case(query).into(), self.case(document).into());
                let encoding = self.run(input)?;
                self.finish(encoding, truncate, 0)
            }
            PairFormat::Judge { prefix, suffix, instruction } => {
                let middle = format!("<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}");
                let inner = self.finish(self.run(EncodeInput::Single(middle.into()))?, truncate, 0)?;
                let ids: Vec<u32> = prefix.iter().chain(&inner.ids).chain(suffix).copied().collect();
                Ok(EncodedText::from_ids(ids))
            }
        }
    }

    /// Token ids given by the caller: checked against the model's limit, cut when `truncate`.
    pub fn check_ids(&self, mut ids: Vec<u32>, truncate: bool) -> Result<EncodedText, TooLong> {
        if ids.len() > self.max_tokens {
            if !truncate {
                return Err(TooLong { max: self.max_tokens });
            }
            ids.truncate(self.max_tokens);
        }
        Ok(EncodedText::from_ids(ids))
    }

    fn case(&self, text: &str) -> String {
        if self.lowercase {
            text.to_lowercase()
        } else {
            text.to_string()
        }
    }

    fn run(&self, input: EncodeInput) -> Result<tokenizers::Encoding, EncodeError> {
        self.cutting.encode(input, true).map_err(|e| EncodeError::Tokenizer(e.to_string()))
    }

    fn finish(
        &self,
        encoding: tokenizers::Encoding,
        truncate: bool,
        prompt_len: usize,
    ) -> Result<EncodedText, EncodeError> {
        if !encoding.get_overflowing().is_empty() && !truncate {
            return Err(TooLong { max: self.max_tokens }.into());
        }
        Ok(EncodedText { ids: encoding.get_ids().to_vec(), type_ids: encoding.get_type_ids().to_vec(), prompt_len })
    }

    /// The instruction's own tokens as sentence-transformers counts them: its encoding less a
    /// closing special token.
    fn prompt_tokens(&self, prompt: &str) -> Result<usize, EncodeError> {
        let encoding = self.run(EncodeInput::Single(self.case(prompt).into()))?;
        let n = encoding.get_ids().len();
        let closes_special = encoding.get_special_tokens_mask().last() == Some(&1);
        Ok(if closes_special { n - 1 } else { n })
    }
}
