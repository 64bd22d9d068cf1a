//! Prompt lookup: the tokens that followed the latest earlier occurrence of what was just
//! written, proposed as the next ones. Coding agents' answers repeat their prompts (a file given
//! back with an edit, a patch's context lines, paths named in tool arguments), and any text
//! repeats itself; it needs no second model and no memory beyond an index of the n-grams seen.

use std::collections::HashMap;

/// The longest and shortest suffix looked up: longer matches predict better, the shortest
/// still finds the repeats a bigram anchors (an identifier's next use).
const LONGEST: usize = 4;
const SHORTEST: usize = 2;

/// An n-gram of up to [`LONGEST`] tokens (unused slots zero) and its length.
type Key = (u8, [u32; LONGEST]);

fn key(tokens: &[u32]) -> Key {
    let mut k = [0; LONGEST];
    k[..tokens.len()].copy_from_slice(tokens);
    (tokens.len() as u8, k)
}

/// One sequence's n-gram index, kept up to date as its tokens grow.
#[derive(Default)]
pub struct PromptLookup {
    /// Each n-gram seen: the position right after its latest occurrence.
    latest: HashMap<Key, usize>,
    /// N-grams ending before this position are indexed.
    indexed: usize,
}

impl PromptLookup {
    /// Up to `most` tokens proposed to follow `tokens` (empty when nothing earlier matches).
    pub fn propose(&mut self, tokens: &[u32], most: usize) -> Vec<u32> {
        let len = tokens.len();
        if most == 0 || len < SHORTEST + 1 {
            return Vec::new();
        }
        // Index every n-gram that ends before the last position: the suffix itself is looked
        // up, so it must not find itself.
        for end in self.indexed.max(SHORTEST)..len {
            for n in SHORTEST..=LONGEST.min(end) {
                self.latest.insert(key(&tokens[end - n..end]), end);
            }
        }
        self.indexed = self.indexed.max(len);
        for n in (SHORTEST..=LONGEST.min(len - 1)).rev() {
            if let Some(&after) = self.latest.get(&key(&tokens[len - n..])) {
                // What followed it then; where that runs into the present (a repeating
                // pattern), it goes on with the pattern.
                return tokens[after..len.min(after + most)].to_vec();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_match_of_the_longest_suffix() {
        let mut lookup = PromptLookup::default();
        // "1 2 3 4 5 6 ... 9 2 3" : the suffix "2 3" was followed by "4 5 6".
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 2, 3];
        assert_eq!(lookup.propose(&tokens, 3), vec![4, 5, 6]);
        // A longer suffix wins over a more recent shorter one.
        let tokens = [7, 2, 3, 10, 11, 1, 2, 3, 20, 21, 9, 7, 2, 3];
        let mut lookup = PromptLookup::default();
        assert_eq!(lookup.propose(&tokens, 2), vec![10, 11]);
    }

    #[test]
    fn grows_with_the_sequence_and_never_matches_itself() {
        let mut lookup = PromptLookup::default();
        let mut tokens = vec![5, 6, 7, 8];
        assert!(lookup.propose(&tokens, 4).is_empty());
        tokens.extend([5, 6]);
        assert_eq!(lookup.propose(&tokens, 4), vec![7, 8, 5, 6]);
        tokens.extend([7]);
        assert_eq!(lookup.propose(&tokens, 2), vec![8, 5]);
        // A repeating pattern runs on to the present.
        let mut lookup = PromptLookup::default();
        assert_eq!(lookup.propose(&[1, 2, 1, 2, 1, 2], 5), vec![1, 2]);
    }
}
