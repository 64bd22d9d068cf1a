//! Which tokens may come next under a grammar, for one row of the batch. llguidance's matcher
//! checks one token cheaply, so the sampler first tries the token it would pick anyway and
//! asks for the whole vocabulary's mask only when that one is not allowed.

use std::sync::Arc;

use llguidance::Matcher;

use super::json_layout::JsonLayout;
use super::{Grammar, Vocabulary};

pub struct TokenConstraint {
    matcher: Matcher,
    vocab: Arc<Vocabulary>,
    /// Present for JSON grammars.
    layout: Option<JsonLayout>,
}

impl TokenConstraint {
    /// Compiles `grammar` against the vocabulary; the error says what in the grammar failed.
    pub fn new(grammar: &Grammar, vocab: Arc<Vocabulary>) -> Result<TokenConstraint, String> {
        let parser = vocab.factory().create_parser(grammar.spec()).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(error);
        }
        Ok(TokenConstraint { matcher, vocab, layout: grammar.bounds_layout().then(JsonLayout::default) })
    }

    /// Whether `token` may come next (the sampler's first choice, checked alone).
    pub fn allows(&mut self, token: u32) -> bool {
        if self.vocab.is_eos(token) {
            return self.is_complete();
        }
        if self.matcher.is_stopped()
            || token as usize >= self.vocab.len()
            || !self.matcher.validate_tokens(&[token]).is_ok_and(|n| n == 1)
        {
            return false;
        }
        let Some(layout) = self.layout else { return true };
        let (matcher, vocab) = (&mut self.matcher, &self.vocab);
        let mut closer_allowed =
            || vocab.closers().iter().any(|&c| matcher.validate_tokens(&[c]).is_ok_and(|n| n == 1));
        layout.allows(vocab.text_bytes(token), &mut closer_allowed)
    }

    /// Sets the logits of every token that may not come next to -inf; returns how many may.
    pub fn mask(&mut self, logits: &mut [f32]) -> usize {
        let Ok(mut allowed) = self.matcher.compute_mask_or_eos() else {
            logits.fill(f32::NEG_INFINITY);
            return 0;
        };
        if let Some(layout) = self.layout {
            // Only tokens with digits or whitespace can break the layout's bounds (or any token
            // where a bracket must close). Where none would be left, the grammar alone decides.
            let all = layout.must_close();
            // Inside a string only a token that closes it can reach the layout.
            let in_string = layout.in_string() && !all;
            let closer_allowed = self.vocab.closers().iter().any(|&c| allowed.is_allowed(c));
            let mut out_of_bounds = Vec::new();
            allowed.iter_set_entries(|id| {
                let id = id as u32;
                if (all || self.vocab.shapes_layout(id) && (!in_string || self.vocab.has_quote(id)))
                    && !layout.allows(self.vocab.text_bytes(id), &mut || closer_allowed)
                {
                    out_of_bounds.push(id);
                }
            });
            if out_of_bounds.len() < allowed.num_set() {
                for id in out_of_bounds {
                    allowed.disallow_token(id);
                }
            }
        }
        // A word of the bitset at a time: most are all-zero.
        let mut count = 0;
        let words = allowed.as_slice();
        for (i, chunk) in logits.chunks_mut(32).enumerate() {
            let valid = low_bits(allowed.len().saturating_sub(i * 32));
            let bits = words.get(i).copied().unwrap_or(0) & valid;
            if bits == 0 {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            count += bits.count_ones() as usize;
            for (j, logit) in chunk.iter_mut().enumerate() {
                if bits & (1 << j) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        count
    }

    /// Takes the chosen token (one [`TokenConstraint::allows`] or the mask allowed); false if
    /// the grammar does not allow it.
    pub fn advance(&mut self, token: u32) -> bool {
        if self.vocab.is_eos(token) {
            // The document stays complete: with `ignore_eos` more end tokens may follow.
            return self.is_complete();
        }
        if let Some(layout) = &mut self.layout {
            layout.advance(self.vocab.text_bytes(token));
        }
        self.matcher.consume_token(token).is_ok()
    }

    /// Whether the output so far is a whole document (an end token may come now).
    pub fn is_complete(&mut self) -> bool {
        if self.matcher.is_stopped() {
            return self.matcher.stop_reason().is_ok();
        }
        self.matcher.is_accepting().unwrap_or(false)
    }
}

/// A mask of the lowest `n` bits (all 32 for `n` of 32 or more).
fn low_bits(n: usize) -> u32 {
    if n >= 32 {
        u32::MAX
    } else {
        (1u32 << n) - 1
    }
}
