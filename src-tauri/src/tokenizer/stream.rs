//! Streaming detokenization: turns tokens into text as soon as the text is stable.
//!
//! Decoding token by token breaks words (SentencePiece drops a leading space when a piece is
//! decoded alone) and characters (a byte-fallback or byte-level token may hold half of a UTF-8
//! sequence). So each step decodes a short window of recent tokens with some context before
//! it and emits only the new, complete part: text ending in U+FFFD (an incomplete character)
//! or in a zero-width joiner (an emoji sequence going on) waits for the next token.

use super::{Tokenizer, TokenizerError};

#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Start of the context window (tokens already emitted, decoded again for context).
    prefix_offset: usize,
    /// Tokens before this index have been emitted as text.
    read_offset: usize,
    skip_special_tokens: bool,
}

const REPLACEMENT: char = '\u{FFFD}';
const ZERO_WIDTH_JOINER: char = '\u{200D}';

impl StreamDecoder {
    pub fn new(skip_special_tokens: bool) -> StreamDecoder {
        StreamDecoder { skip_special_tokens, ..Default::default() }
    }

    /// Adds a token; returns the text that became stable, if any.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let before = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let now = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        if now.len() <= before.len() || now.ends_with(REPLACEMENT) || now.ends_with(ZERO_WIDTH_JOINER) {
            return Ok(None);
        }
        // Normally `now` extends `before`; if the context decoded differently once more tokens
        // came (rare normalisations), emit what follows their common prefix.
        let delta = now[common_prefix_len(&before, &now)..].to_string();
        self.advance();
        Ok(Some(delta))
    }

    /// The text still held back (an incomplete character at the very end), for the last
    /// token of a generation.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> Result<Option<String>, TokenizerError> {
        if self.read_offset == self.ids.len() {
            return Ok(None);
        }
        let before = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let now = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        let common = common_prefix_len(&before, &now);
        self.advance();
        let delta = now[common..].to_string();
        Ok((!delta.is_empty()).then_some(delta))
    }

    fn advance(&mut self) {
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
    }
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices().zip(b.chars()).find(|((_, x), y)| x != y).map_or_else(|| a.len().min(b.len()), |((i, _), _)| i)
}
