//! The RAM tier: blocks of up to `block` tokens in a tree (each block's key chains its parent's),
//! least recently used first out when over the byte budget. Generic over what a block holds, so
//! the bookkeeping is tested without a model.
//!
//! A prompt reuses every whole block it shares with a cached sequence *and*, where it diverges
//! in the middle of a block, the tokens of that block before the divergence: keys and values at
//! a position depend only on the tokens up to it, so the first `n` positions of a cached block
//! are exactly what prefilling those `n` tokens would give. That costs one comparison per
//! sibling at the divergence point (few), and it keeps the end of a finished answer (a partial
//! last block) usable by the next turn.

use std::collections::{BTreeMap, HashMap};

use super::key::{chain, BlockKey};

/// What a block holds.
pub trait Payload {
    fn bytes(&self) -> usize;
    /// Whether a longer block that starts with the same tokens makes this one redundant (its
    /// positions are all in the longer one); not when it holds what only its end has.
    fn covered_by_longer(&self) -> bool {
        true
    }
    /// Whether a lookup may stop at this block's end, and only there (a recurrent state's
    /// snapshot), for [`BlockStore::find_resumable`].
    fn resumable_at_end(&self) -> bool {
        false
    }
}

struct Entry<P> {
    parent: BlockKey,
    tokens: Vec<u32>,
    payload: P,
    /// The tick of its last use (key of `lru`).
    used: u64,
}

/// Where a prompt left the cached sequences: a cached sequence went on differently from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divergence {
    /// Tokens of the prompt that matched.
    pub position: usize,
    /// How far the cached sequence that diverged goes, at least.
    pub cached_through: usize,
    /// The cached text picks up again a few tokens later in the prompt: the same conversation
    /// with a small edit (a date, an injected reminder), not another conversation.
    pub resumes: bool,
}

/// Whether `cached` (the cached tokens after a divergence) shows up again in `prompt` (the
/// prompt's tokens after it) within a few tokens: a run of 8 cached tokens, skipped 1 to 4
/// tokens into the cached side, found among the first 24 of the prompt's.
pub(super) fn resumes(cached: &[u32], prompt: &[u32]) -> bool {
    const RUN: usize = 8;
    (1..=4).any(|skip| {
        let Some(run) = cached.get(skip..skip + RUN) else { return false };
        prompt[..prompt.len().min(24 + RUN)].windows(RUN).any(|w| w == run)
    })
}

/// The cached blocks a prompt starts with: each payload with how many of its tokens apply.
pub struct Found<'a, P> {
    pub blocks: Vec<(&'a P, usize)>,
    pub keys: Vec<BlockKey>,
    pub tokens: usize,
    pub divergence: Option<Divergence>,
}

pub struct BlockStore<P> {
    root: BlockKey,
    block: usize,
    entries: HashMap<BlockKey, Entry<P>>,
    children: HashMap<BlockKey, Vec<BlockKey>>,
    lru: BTreeMap<u64, BlockKey>,
    clock: u64,
    bytes: usize,
    pub evictions: u64,
}

impl<P: Payload> BlockStore<P> {
    pub fn new(root: BlockKey, block: usize) -> BlockStore<P> {
        assert!(block > 0);
        BlockStore {
            root,
            block,
            entries: HashMap::new(),
            children: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
            bytes: 0,
            evictions: 0,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn block_count(&self) -> usize {
        self.entries.len()
    }

    fn touch(&mut self, key: &BlockKey) {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(key) {
            self.lru.remove(&e.used);
            e.used = self.clock;
            self.lru.insert(self.clock, *key);
        }
    }

    /// The longest cached start of `tokens[..limit]`, marked used.
    pub fn find(&mut self, tokens: &[u32], limit: usize) -> Found<'_, P> {
        self.find_from(self.root, &tokens[..limit.min(tokens.len())])
    }

    /// The longest cached continuation of `tokens` after block `parent` (positions in the
    /// result count from `parent`'s end), marked used.
    pub fn find_from(&mut self, parent: BlockKey, tokens: &[u32]) -> Found<'_, P> {
        let mut path: Vec<(BlockKey, usize)> = Vec::new();
        let mut parent = parent;
        for chunk in tokens.chunks_exact(self.block) {
            let key = chain(&parent, chunk);
            if !self.entries.contains_key(&key) {
                break;
            }
            path.push((key, chunk.len()));
            parent = key;
        }
        let matched = path.len() * self.block;
        // Mid-block: the sibling sharing the most tokens with what comes next.
        let rest = &tokens[matched..];
        let mut divergence = None;
        let best = self.children.get(&parent).into_iter().flatten().filter_map(|child| {
            let entry = self.entries.get(child)?;
            let common = entry.tokens.iter().zip(rest).take_while(|(a, b)| a == b).count();
            Some((common, entry.tokens.len(), *child))
        });
        if let Some((common, len, child)) = best.max_by_key(|(common, len, _)| (*common, usize::MAX - len)) {
            if common > 0 {
                path.push((child, common));
            }
            if common < len && common < rest.len() {
                let resumes = resumes(&self.entries[&child].tokens[common..], &rest[common..]);
                divergence = Some(Divergence { position: matched + common, cached_through: matched + len, resumes });
            }
        }
        // Deepest first, so a prefix is always fresher than what extends it: eviction takes
        // the tails of conversations before the system prompt they share.
        for (key, _) in path.iter().rev() {
            self.touch(key);
        }
        let blocks = path.iter().map(|(key, n)| (&self.entries[key].payload, *n)).collect();
        let keys = path.iter().map(|(key, _)| *key).collect();
        Found { blocks, keys, tokens: path.iter().map(|(_, n)| n).sum(), divergence }
    }

    /// The longest start of `tokens[..limit]` that ends where a block [`Payload::resumable_at_end`]
    /// ends (whole blocks along the way, then that block whole), marked used.
    pub fn find_resumable(&mut self, tokens: &[u32], limit: usize) -> Found<'_, P> {
        let tokens = &tokens[..limit.min(tokens.len())];
        let (mut parent, mut at) = (self.root, 0);
        let (mut path, mut best): (Vec<BlockKey>, Vec<BlockKey>) = (Vec::new(), Vec::new());
        loop {
            let rest = &tokens[at..];
            let stops = self.children.get(&parent).into_iter().flatten().filter_map(|child| {
                let e = self.entries.get(child)?;
                (e.payload.resumable_at_end() && rest.starts_with(&e.tokens)).then_some((*child, e.tokens.len()))
            });
            if let Some((child, _)) = stops.max_by_key(|(_, len)| *len) {
                best = path.iter().copied().chain([child]).collect();
            }
            let Some(chunk) = rest.get(..self.block) else { break };
            let key = chain(&parent, chunk);
            if !self.entries.contains_key(&key) {
                break;
            }
            path.push(key);
            (parent, at) = (key, at + self.block);
        }
        for key in best.iter().rev() {
            self.touch(key);
        }
        let blocks: Vec<(&P, usize)> =
            best.iter().map(|key| (&self.entries[key].payload, self.entries[key].tokens.len())).collect();
        let tokens = blocks.iter().map(|(_, n)| n).sum();
        Found { blocks, keys: best, tokens, divergence: None }
    }

    pub fn root(&self) -> BlockKey {
        self.root
    }

    pub fn contains(&self, key: &BlockKey) -> bool {
        self.entries.contains_key(key)
    }

    /// A block's parent, tokens and payload.
    pub fn get(&self, key: &BlockKey) -> Option<(&BlockKey, &[u32], &P)> {
        self.entries.get(key).map(|e| (&e.parent, e.tokens.as_slice(), &e.payload))
    }

    /// Puts `payload` in place of block `key`'s (the same values held elsewhere).
    pub fn replace_payload(&mut self, key: &BlockKey, payload: P) {
        if let Some(entry) = self.entries.get_mut(key) {
            self.bytes = self.bytes - entry.payload.bytes() + payload.bytes();
            entry.payload = payload;
        }
    }

    /// Adds one block under `parent` (read back from the disk tier); returns its key.
    pub fn insert_block(&mut self, parent: BlockKey, tokens: Vec<u32>, payload: P) -> BlockKey {
        let key = chain(&parent, &tokens);
        if !self.entries.contains_key(&key) {
            self.bytes += payload.bytes();
            self.clock += 1;
            self.entries.insert(key, Entry { parent, tokens, payload, used: self.clock });
            self.lru.insert(self.clock, key);
            self.children.entry(parent).or_default().push(key);
        }
        self.touch(&key);
        key
    }

    /// Stores the blocks of `tokens` not cached yet; `make(start, end)` builds the payload of
    /// positions `start..end` (`None`, when they are no longer at hand, or an error stops the
    /// storing, keeping what was stored). Returns the keys of the blocks newly stored.
    pub fn insert<E>(
        &mut self,
        tokens: &[u32],
        mut make: impl FnMut(usize, usize) -> Result<Option<P>, E>,
    ) -> Result<Vec<BlockKey>, E> {
        let mut parent = self.root;
        let mut added = Vec::new();
        let mut path = Vec::new();
        for (i, chunk) in tokens.chunks(self.block).enumerate() {
            let key = chain(&parent, chunk);
            if !self.entries.contains_key(&key) {
                let start = i * self.block;
                let Some(payload) = make(start, start + chunk.len())? else { break };
                // A partial sibling this block extends is no longer needed.
                let covered: Vec<BlockKey> = self
                    .children
                    .get(&parent)
                    .into_iter()
                    .flatten()
                    .filter(|k| {
                        self.entries.get(*k).is_some_and(|e| {
                            e.tokens.len() < chunk.len()
                                && chunk.starts_with(&e.tokens)
                                && e.payload.covered_by_longer()
                        })
                    })
                    .copied()
                    .collect();
                for k in covered {
                    self.remove_tree(&k);
                }
                self.bytes += payload.bytes();
                self.clock += 1;
                self.entries.insert(key, Entry { parent, tokens: chunk.to_vec(), payload, used: self.clock });
                self.lru.insert(self.clock, key);
                self.children.entry(parent).or_default().push(key);
                added.push(key);
            }
            path.push(key);
            parent = key;
        }
        for key in path.iter().rev() {
            self.touch(key);
        }
        Ok(added)
    }

    /// Evicts least recently used blocks (with the blocks that hang from them, unreachable
    /// without them) until at most `budget` bytes are held.
    pub fn shrink_to(&mut self, budget: usize) {
        while self.bytes > budget {
            let Some((_, key)) = self.lru.first_key_value().map(|(t, k)| (*t, *k)) else { break };
            self.remove_tree(&key);
        }
    }

    pub fn clear(&mut self) {
        self.evictions += self.entries.len() as u64;
        self.entries.clear();
        self.children.clear();
        self.lru.clear();
        self.bytes = 0;
    }

    fn remove_tree(&mut self, key: &BlockKey) {
        let Some(entry) = self.entries.remove(key) else { return };
        self.lru.remove(&entry.used);
        self.bytes -= entry.payload.bytes();
        self.evictions += 1;
        if let Some(siblings) = self.children.get_mut(&entry.parent) {
            siblings.retain(|k| k != key);
            if siblings.is_empty() {
                self.children.remove(&entry.parent);
            }
        }
        for child in self.children.remove(key).unwrap_or_default() {
            self.remove_tree(&child);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake payload: the positions it covers, 10 bytes a token.
    #[derive(Debug, PartialEq)]
    struct Span(usize, usize);
    impl Payload for Span {
        fn bytes(&self) -> usize {
            (self.1 - self.0) * 10
        }
    }

    fn store() -> BlockStore<Span> {
        BlockStore::new([0; 32], 4)
    }

    /// Stores `tokens`; returns how many tokens were new.
    fn put(s: &mut BlockStore<Span>, tokens: &[u32]) -> usize {
        let added = s.insert(tokens, |a, b| Ok::<_, ()>(Some(Span(a, b)))).unwrap();
        added.iter().map(|k| s.get(k).unwrap().1.len()).sum()
    }

    fn spans(s: &mut BlockStore<Span>, tokens: &[u32]) -> (Vec<(usize, usize, usize)>, usize, Option<Divergence>) {
        let found = s.find(tokens, tokens.len());
        (found.blocks.iter().map(|(p, n)| (p.0, p.1, *n)).collect(), found.tokens, found.divergence)
    }

    #[test]
    fn whole_blocks_then_the_shared_part_of_the_next() {
        let mut s = store();
        assert_eq!(put(&mut s, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), 10);
        assert_eq!(s.block_count(), 3, "two whole blocks and a partial one");
        // The next turn: everything cached, then more.
        let (blocks, n, div) = spans(&mut s, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!((blocks, n, div), (vec![(0, 4, 4), (4, 8, 4), (8, 10, 2)], 10, None));
        // Diverging inside the second block: its first two tokens still count.
        let (blocks, n, div) = spans(&mut s, &[1, 2, 3, 4, 5, 6, 0, 0, 0]);
        assert_eq!(blocks, vec![(0, 4, 4), (4, 8, 2)]);
        assert_eq!(n, 6);
        assert_eq!(div, Some(Divergence { position: 6, cached_through: 8, resumes: false }));
        // Nothing shared.
        let (blocks, n, div) = spans(&mut s, &[9, 9, 9, 9, 9]);
        assert_eq!((blocks.len(), n), (0, 0));
        assert_eq!(div, Some(Divergence { position: 0, cached_through: 4, resumes: false }));
        // The limit holds.
        assert_eq!(s.find(&[1, 2, 3, 4, 5, 6, 7, 8], 5).tokens, 5);
    }

    #[test]
    fn storing_again_adds_nothing_and_a_longer_tail_replaces_a_shorter_one() {
        let mut s = store();
        put(&mut s, &[1, 2, 3, 4, 5]);
        assert_eq!(put(&mut s, &[1, 2, 3, 4, 5]), 0);
        assert_eq!(put(&mut s, &[1, 2, 3, 4, 5, 6, 7]), 3, "the tail [5, 6, 7] replaces [5]");
        assert_eq!((s.block_count(), s.bytes()), (2, 70));
        assert_eq!(put(&mut s, &[1, 2, 3, 4, 5, 6, 7, 8]), 4, "the whole block replaces the tail");
        assert_eq!((s.block_count(), s.bytes()), (2, 80));
    }

    #[test]
    fn least_recently_used_goes_first_with_what_hangs_from_it() {
        let mut s = store();
        put(&mut s, &[1, 1, 1, 1, 2, 2, 2, 2]);
        put(&mut s, &[3, 3, 3, 3, 4, 4, 4, 4]);
        assert_eq!(s.bytes(), 160);
        s.find(&[1, 1, 1, 1, 2, 2, 2, 2], 8);
        s.shrink_to(100);
        assert_eq!(s.find(&[3, 3, 3, 3, 4, 4, 4, 4], 8).tokens, 0, "the older conversation went");
        assert_eq!(s.find(&[1, 1, 1, 1, 2, 2, 2, 2], 8).tokens, 8);
        assert_eq!(s.bytes(), 80);
        s.shrink_to(0);
        assert!(s.block_count() == 0 && s.bytes() == 0);
        assert!(s.evictions >= 4);
    }

    #[test]
    fn an_edit_is_told_from_another_conversation() {
        let cached: Vec<u32> = (100..120).collect();
        // One token changed, the text goes on as cached.
        let mut edited = cached.clone();
        edited[0] = 7;
        assert!(resumes(&cached, &edited));
        // A longer edit (a reminder injected), then the cached text again.
        let injected: Vec<u32> = [vec![1, 2, 3, 4, 5, 6], cached[1..].to_vec()].concat();
        assert!(resumes(&cached, &injected));
        // Something else altogether.
        assert!(!resumes(&cached, &(200..230).collect::<Vec<u32>>()));
        assert!(!resumes(&cached[..5], &edited), "too little cached text to tell");
    }

    /// A fake recurrent payload: whether its block keeps a snapshot at its end.
    struct Snap(bool);
    impl Payload for Snap {
        fn bytes(&self) -> usize {
            10
        }
        fn covered_by_longer(&self) -> bool {
            !self.0
        }
        fn resumable_at_end(&self) -> bool {
            self.0
        }
    }

    #[test]
    fn a_recurrent_lookup_stops_only_at_snapshots_and_keeps_partial_ones() {
        let mut s: BlockStore<Snap> = BlockStore::new([0; 32], 4);
        let snap_at = |end: usize| move |_: usize, e: usize| Ok::<_, ()>(Some(Snap(e == end)));
        // A sequence of 6 (snapshot at its end, in a partial block), then a longer one through
        // the same tokens with a snapshot at 12 only.
        s.insert(&[1, 2, 3, 4, 5, 6], snap_at(6)).unwrap();
        s.insert(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9], snap_at(12)).unwrap();
        assert_eq!(s.block_count(), 4, "the partial block with its snapshot stays beside the whole one");
        let found = |s: &mut BlockStore<Snap>, t: &[u32], limit: usize| s.find_resumable(t, limit).tokens;
        assert_eq!(found(&mut s, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9, 0], 12), 12);
        assert_eq!(found(&mut s, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9], 11), 6, "not mid-block");
        assert_eq!(found(&mut s, &[1, 2, 3, 4, 5, 6, 0], 7), 6);
        assert_eq!(found(&mut s, &[1, 2, 3, 4, 5, 0], 6), 0, "no state before 6");
        assert_eq!(found(&mut s, &[1, 2, 3, 4, 5, 6, 7, 8, 1], 9), 6, "the whole block at 8 keeps no state");
        // Plain payloads: a longer block still replaces the partial one it covers.
        let mut plain = store();
        put(&mut plain, &[1, 2, 3, 4, 5, 6]);
        put(&mut plain, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(plain.block_count(), 2);
    }
}
