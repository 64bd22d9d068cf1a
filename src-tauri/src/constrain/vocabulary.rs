//! A model's vocabulary as llguidance sees it: every token's bytes in a trie, from which token
//! masks are computed, and the parser factory that compiles grammars against it. Built once per
//! tokenizer (a 150k vocabulary takes a fraction of a second) and shared by every request.

use std::sync::Arc;

use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::ParserFactory;

use super::json_layout::is_whitespace;

/// The first byte of a special token's entry in the trie: such tokens never match text, only
/// a grammar that names them (`<[id]>` in Lark). No UTF-8 text holds this byte.
pub const SPECIAL_MARKER: u8 = 0xFF;

pub struct Vocabulary {
    factory: ParserFactory,
    /// Whether a token's text holds an ASCII digit or whitespace (the JSON layout bounds look
    /// at those only).
    shapes_layout: Vec<bool>,
    /// Whether a token's text holds a `"`.
    has_quote: Vec<bool>,
    /// The tokens that are just `}` or `]`.
    closers: Vec<u32>,
    eos_ids: Vec<u32>,
}

impl Vocabulary {
    /// `words[id]`: the token's bytes; a special token's are [`SPECIAL_MARKER`] then its name;
    /// an unused id's are empty. The EOS tokens end a complete document.
    pub fn new(mut words: Vec<Vec<u8>>, eos_ids: &[u32]) -> Result<Vocabulary, String> {
        let eos_ids: Vec<u32> = eos_ids.iter().copied().filter(|&id| (id as usize) < words.len()).collect();
        let Some(&first_eos) = eos_ids.first() else {
            return Err("the tokenizer has no end-of-sequence token inside its vocabulary".into());
        };
        for &id in &eos_ids {
            // An end token the tokenizer does not mark special must still never count as text.
            let word = &mut words[id as usize];
            if word.first() != Some(&SPECIAL_MARKER) {
                word.insert(0, SPECIAL_MARKER);
            }
        }
        let shapes_layout = words
            .iter()
            .map(|w| w.first() != Some(&SPECIAL_MARKER) && w.iter().any(|&b| b.is_ascii_digit() || is_whitespace(b)))
            .collect();
        let has_quote = words.iter().map(|w| w.first() != Some(&SPECIAL_MARKER) && w.contains(&b'"')).collect();
        let closers =
            (0..words.len() as u32).filter(|&id| matches!(words[id as usize].as_slice(), b"}" | b"]")).collect();
        let info = TokRxInfo::new(words.len() as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos_ids);
        // Not canonical: the sampler picks tokens freely, so grammars never force a tokenization.
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        factory.limits_mut().verbose_errors = false;
        Ok(Vocabulary { factory, shapes_layout, has_quote, closers, eos_ids })
    }

    pub fn len(&self) -> usize {
        self.shapes_layout.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shapes_layout.is_empty()
    }

    pub fn is_eos(&self, token: u32) -> bool {
        self.eos_ids.contains(&token)
    }

    pub(super) fn factory(&self) -> &ParserFactory {
        &self.factory
    }

    /// The token's bytes (empty for special and unused tokens).
    pub(super) fn text_bytes(&self, token: u32) -> &[u8] {
        let trie = self.factory.tok_env().tok_trie();
        if (token as usize) >= self.len() || trie.is_special_token(token) {
            return &[];
        }
        trie.token(token)
    }

    pub(super) fn shapes_layout(&self, token: u32) -> bool {
        self.shapes_layout.get(token as usize).copied().unwrap_or(false)
    }

    pub(super) fn has_quote(&self, token: u32) -> bool {
        self.has_quote.get(token as usize).copied().unwrap_or(false)
    }

    pub(super) fn closers(&self) -> &[u32] {
        &self.closers
    }

    /// For tests: the 256 bytes (id = byte), then `special` tokens, then the end token.
    #[cfg(test)]
    pub fn of_bytes(special: &[&str]) -> Vocabulary {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for name in special.iter().chain(&["<|end|>"]) {
            words.push([&[SPECIAL_MARKER], name.as_bytes()].concat());
        }
        let end = words.len() as u32 - 1;
        Vocabulary::new(words, &[end]).expect("a vocabulary")
    }
}
