//! Which tokens may come next under a grammar. Checking one token is cheap (its bytes through a
//! copy of the matcher), so the sampler first tries the token it would pick anyway and masks the
//! whole vocabulary only when that one is not allowed.

use std::sync::Arc;

use super::{Grammar, Matcher};
use crate::tokenizer::TokenBytes;

pub struct TokenConstraint {
    matcher: Matcher,
    vocab: Arc<TokenBytes>,
    /// Allowed (only) once the document is complete.
    eos_ids: Vec<u32>,
}

impl TokenConstraint {
    pub fn new(grammar: Arc<Grammar>, vocab: Arc<TokenBytes>, eos_ids: Vec<u32>) -> TokenConstraint {
        TokenConstraint { matcher: Matcher::new(grammar), vocab, eos_ids }
    }

    pub fn allows(&self, token: u32) -> bool {
        if self.eos_ids.contains(&token) {
            return self.matcher.is_complete();
        }
        match self.vocab.get(token) {
            Some(bytes) if !bytes.is_empty() => !self.matcher.is_finished() && self.matcher.accepts(bytes),
            _ => false,
        }
    }

    /// Sets the logits of every token that may not come next to -inf; returns how many may.
    pub fn mask(&self, logits: &mut [f32]) -> usize {
        // Most tokens fail on their first byte: check each first byte once.
        let mut first_byte_ok = [false; 256];
        if !self.matcher.is_finished() {
            for (b, ok) in first_byte_ok.iter_mut().enumerate() {
                *ok = self.matcher.accepts(&[b as u8]);
            }
        }
        let mut allowed = 0;
        for (id, logit) in logits.iter_mut().enumerate() {
            let id = id as u32;
            let ok = if self.eos_ids.contains(&id) {
                self.matcher.is_complete()
            } else {
                match self.vocab.get(id) {
                    Some(bytes) if !bytes.is_empty() && first_byte_ok[bytes[0] as usize] => {
                        bytes.len() == 1 || self.matcher.accepts(bytes)
                    }
                    _ => false,
                }
            };
            if ok {
                allowed += 1;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        allowed
    }

    /// Takes the chosen token; false if the grammar does not allow it.
    pub fn advance(&mut self, token: u32) -> bool {
        if self.eos_ids.contains(&token) {
            return self.matcher.is_complete();
        }
        match self.vocab.get(token) {
            Some(bytes) if !bytes.is_empty() => self.matcher.advance(bytes),
            _ => false,
        }
    }

    pub fn is_complete(&self) -> bool {
        self.matcher.is_complete()
    }
}
