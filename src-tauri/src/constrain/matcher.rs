//! A byte-at-a-time matcher for a [`Grammar`]: a set of parse stacks (a union or a choice of
//! object keys forks one stack per alternative; stacks that cannot take a byte die), so it
//! knows after every byte whether the text so far can still become a valid document, and
//! whether it is one now.

use std::sync::Arc;

use super::grammar::{Grammar, Node, NodeId, NumberRule, ANY_STRING};

/// Whitespace allowed in a row between tokens: one line break and an indent, enough for
/// pretty-printed JSON, not for a model stuck emitting blank lines.
const MAX_WHITESPACE_RUN: u8 = 24;
const LINE_BREAK: u8 = 0x80;
/// After the document: a newline or two, then only the end.
const MAX_TRAILING_WHITESPACE: u8 = 2;
/// Deeper nesting than this is refused (free-form values could otherwise nest without end).
const MAX_DEPTH: usize = 64;
/// Digits of a float's exponent (so that every number fits an f64: parsers refuse 1e999).
const MAX_EXPONENT_DIGITS: u8 = 2;
/// Digits of a number's integer or fraction part (what an f64 or i64 holds; a model repeating
/// a digit must stop somewhere).
const MAX_DIGITS: u8 = 16;
/// Forks kept at most (alternatives sharing long prefixes are rare; this bounds the worst case).
const MAX_STACKS: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Escape {
    None,
    Backslash,
    /// Hex digits of a `\u` escape still to come.
    Unicode(u8),
    /// Continuation bytes of a UTF-8 character still to come.
    Utf8(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl Num {
    fn is_complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ObjectState {
    /// After `{`.
    Open,
    AfterKey,
    AfterColon,
    AfterValue,
    /// After `,`: a key must follow.
    AfterComma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ArrayState {
    Open,
    AfterItem,
    AfterComma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Frame {
    /// A value of this node, not started.
    Value(NodeId),
    Literal {
        node: NodeId,
        pos: u32,
    },
    /// The key of property `prop` of object `node` (its opening quote already read).
    Key {
        node: NodeId,
        prop: u32,
        pos: u32,
    },
    String {
        node: NodeId,
        chars: u32,
        escape: Escape,
    },
    /// `magnitude`: an integer's value so far (for bounds); `digits`: digits in the current
    /// part (integer, fraction or exponent).
    Number {
        node: NodeId,
        state: Num,
        negative: bool,
        magnitude: u64,
        digits: u8,
    },
    /// `next`: the first property that may still come (properties are generated in order);
    /// with free-form keys, unused.
    Object {
        node: NodeId,
        state: ObjectState,
        next: u32,
    },
    Array {
        node: NodeId,
        state: ArrayState,
        count: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Stack {
    frames: Vec<Frame>,
    whitespace: u8,
}

#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<Grammar>,
    stacks: Vec<Stack>,
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Matcher {
    pub fn new(grammar: Arc<Grammar>) -> Matcher {
        let root = grammar.root();
        Matcher { grammar, stacks: vec![Stack { frames: vec![Frame::Value(root)], whitespace: 0 }] }
    }

    /// Takes `bytes` if the text stays a possible prefix of a valid document; otherwise
    /// returns false and stays as it was.
    pub fn advance(&mut self, bytes: &[u8]) -> bool {
        match self.after(bytes) {
            Some(stacks) => {
                self.stacks = stacks;
                true
            }
            None => false,
        }
    }

    /// Whether `bytes` could come next (without taking them).
    pub fn accepts(&self, bytes: &[u8]) -> bool {
        self.after(bytes).is_some()
    }

    /// Whether the text so far is a complete document.
    pub fn is_complete(&self) -> bool {
        self.stacks.iter().any(|s| match s.frames.as_slice() {
            [] => true,
            [Frame::Number { node, state, negative, magnitude, .. }] => {
                state.is_complete() && self.number_rule(*node).is_some_and(|r| in_bounds(&r, *negative, *magnitude))
            }
            _ => false,
        })
    }

    /// Whether the document is complete and nothing but whitespace may follow.
    pub fn is_finished(&self) -> bool {
        self.stacks.iter().all(|s| s.frames.is_empty())
    }

    fn after(&self, bytes: &[u8]) -> Option<Vec<Stack>> {
        let mut current = self.stacks.clone();
        for &byte in bytes {
            let mut next = Vec::with_capacity(current.len());
            for stack in current {
                self.feed(stack, byte, &mut next);
            }
            if next.is_empty() {
                return None;
            }
            if next.len() > 1 {
                dedup(&mut next);
            }
            current = next;
        }
        Some(current)
    }

    fn number_rule(&self, node: NodeId) -> Option<NumberRule> {
        match self.grammar.node(node) {
            Node::Number(rule) => Some(*rule),
            _ => None,
        }
    }

    /// Every stack `stack` becomes after `byte`, pushed onto `out`.
    fn feed(&self, mut stack: Stack, byte: u8, out: &mut Vec<Stack>) {
        if out.len() >= MAX_STACKS {
            return;
        }
        let Some(&top) = stack.frames.last() else {
            if is_whitespace(byte) && stack.whitespace < MAX_TRAILING_WHITESPACE {
                stack.whitespace += 1;
                out.push(stack);
            }
            return;
        };
        let between_tokens = matches!(top, Frame::Value(_) | Frame::Object { .. } | Frame::Array { .. });
        if between_tokens && is_whitespace(byte) {
            self.feed_whitespace(stack, top, byte, out);
            return;
        }
        let after_whitespace = stack.whitespace & !LINE_BREAK > 0;
        if between_tokens {
            stack.whitespace = 0;
        }
        match top {
            Frame::Value(_) => self.feed_value(stack, byte, out),
            Frame::Literal { .. } => self.feed_literal(stack, byte, out),
            Frame::Key { .. } => self.feed_key(stack, byte, out),
            Frame::String { .. } => self.feed_string(stack, byte, out),
            Frame::Number { .. } => self.feed_number(stack, byte, out),
            Frame::Object { .. } => self.feed_object(stack, after_whitespace, byte, out),
            Frame::Array { .. } => self.feed_array(stack, after_whitespace, byte, out),
        }
    }

    /// Whitespace between tokens: only where pretty-printed JSON has it, in bounded runs.
    fn feed_whitespace(&self, mut stack: Stack, top: Frame, byte: u8, out: &mut Vec<Stack>) {
        // Pretty JSON has no space between a key and its colon, nor before a comma; so
        // after a value, whitespace is only allowed where the closing bracket may follow.
        let allowed = match top {
            Frame::Object { state: ObjectState::AfterKey, .. } => false,
            Frame::Object { node, state: ObjectState::AfterValue, next } => match self.grammar.node(node) {
                Node::Object(rule) => !rule.properties[next as usize..].iter().any(|p| p.required),
                _ => false,
            },
            Frame::Array { node, state: ArrayState::AfterItem, count } => match self.grammar.node(node) {
                Node::Array(rule) => count >= rule.min,
                _ => false,
            },
            _ => true,
        };
        if !allowed {
            return;
        }
        // `whitespace` counts the run's bytes; LINE_BREAK marks that it had its "\n".
        let (count, broke) = (stack.whitespace & !LINE_BREAK, stack.whitespace & LINE_BREAK != 0);
        let ok = count < MAX_WHITESPACE_RUN
            && match byte {
                b'\n' => !broke,
                b'\r' => !broke,
                _ => true,
            };
        if ok {
            stack.whitespace = (count + 1) | if byte == b'\n' { LINE_BREAK } else { stack.whitespace & LINE_BREAK };
            out.push(stack);
        }
    }

    /// A value not started: its first byte picks the kind (each alternative of a union forks).
    fn feed_value(&self, mut stack: Stack, byte: u8, out: &mut Vec<Stack>) {
        let Some(&Frame::Value(node)) = stack.frames.last() else { unreachable!("called for its frame kind") };
        let g = &*self.grammar;
        match g.node(node) {
            Node::Union(alternatives) => {
                for &alternative in alternatives {
                    let mut fork = stack.clone();
                    *fork.frames.last_mut().expect("non-empty") = Frame::Value(alternative);
                    self.feed(fork, byte, out);
                }
            }
            Node::Ref(_) => unreachable!("node() follows references"),
            Node::Literal(bytes) => {
                if bytes.first() == Some(&byte) {
                    replace_top(&mut stack, Frame::Literal { node, pos: 1 });
                    if bytes.len() == 1 {
                        stack.frames.pop();
                    }
                    out.push(stack);
                }
            }
            Node::String { .. } => {
                if byte == b'"' {
                    replace_top(&mut stack, Frame::String { node, chars: 0, escape: Escape::None });
                    out.push(stack);
                }
            }
            Node::Number(rule) => {
                let state = match byte {
                    b'-' if rule.min.is_none_or(|m| m < 0) => Num::Minus,
                    b'0' => Num::Zero,
                    b'1'..=b'9' => Num::Int,
                    _ => return,
                };
                let negative = byte == b'-';
                let magnitude = if negative { 0 } else { u64::from(byte - b'0') };
                if !negative && !feasible(rule, false, magnitude, state == Num::Int) {
                    return;
                }
                replace_top(
                    &mut stack,
                    Frame::Number { node, state, negative, magnitude, digits: u8::from(!negative) },
                );
                out.push(stack);
            }
            Node::Object(_) => {
                if byte == b'{' && stack.frames.len() < MAX_DEPTH {
                    replace_top(&mut stack, Frame::Object { node, state: ObjectState::Open, next: 0 });
                    out.push(stack);
                }
            }
            Node::Array(_) => {
                if byte == b'[' && stack.frames.len() < MAX_DEPTH {
                    replace_top(&mut stack, Frame::Array { node, state: ArrayState::Open, count: 0 });
                    out.push(stack);
                }
            }
        }
    }

    /// Inside a literal (`true`, an enum value, ...): the next byte must be the literal's.
    fn feed_literal(&self, mut stack: Stack, byte: u8, out: &mut Vec<Stack>) {
        let Some(&Frame::Literal { node, pos }) = stack.frames.last() else {
            unreachable!("called for its frame kind")
        };
        let g = &*self.grammar;
        let Node::Literal(bytes) = g.node(node) else { unreachable!("literal frames point at literals") };
        if bytes.get(pos as usize) == Some(&byte) {
            if pos as usize + 1 == bytes.len() {
                stack.frames.pop();
            } else {
                replace_top(&mut stack, Frame::Literal { node, pos: pos + 1 });
            }
            out.push(stack);
        }
    }

    /// Inside a known property's key.
    fn feed_key(&self, mut stack: Stack, byte: u8, out: &mut Vec<Stack>) {
        let Some(&Frame::Key { node, prop, pos }) = stack.frames.last() else {
            unreachable!("called for its frame kind")
        };
        let g = &*self.grammar;
        let Node::Object(rule) = g.node(node) else { unreachable!("key frames point at objects") };
        let key = &rule.properties[prop as usize].key;
        if key.get(pos as usize) == Some(&byte) {
            if pos as usize + 1 == key.len() {
                stack.frames.pop();
            } else {
                replace_top(&mut stack, Frame::Key { node, prop, pos: pos + 1 });
            }
            out.push(stack);
        }
    }

    /// Inside a string: escapes, UTF-8 continuation bytes and the length bounds.
    fn feed_string(&self, mut stack: Stack, byte: u8, out: &mut Vec<Stack>) {
        let Some(&Frame::String { node, chars, escape }) = stack.frames.last() else {
            unreachable!("called for its frame kind")
        };
        let g = &*self.grammar;
        let Node::String { min_len, max_len } = *g.node(node) else { unreachable!("string frames point at strings") };
        let starts_char = |chars: u32| max_len.is_none_or(|max| chars < max);
        let next = match (escape, byte) {
            (Escape::None, b'"') => {
                if chars < min_len {
                    return;
                }
                stack.frames.pop();
                out.push(stack);
                return;
            }
            (Escape::None, b'\\') if starts_char(chars) => {
                Frame::String { node, chars: chars + 1, escape: Escape::Backslash }
            }
            (Escape::None, 0x00..=0x1f | 0x80..=0xc1 | 0xf5..=0xff) => return,
            (Escape::None, 0x20..=0x7f) if starts_char(chars) => Frame::String { node, chars: chars + 1, escape },
            // The lead byte of a multi-byte character: the character counts once.
            (Escape::None, 0xc2..=0xf4) if starts_char(chars) => {
                let more = if byte >= 0xf0 {
                    3
                } else if byte >= 0xe0 {
                    2
                } else {
                    1
                };
                Frame::String { node, chars: chars + 1, escape: Escape::Utf8(more) }
            }
            (Escape::None, _) => return,
            (Escape::Utf8(left), 0x80..=0xbf) => {
                let escape = if left == 1 { Escape::None } else { Escape::Utf8(left - 1) };
                Frame::String { node, chars, escape }
            }
            (Escape::Backslash, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                Frame::String { node, chars, escape: Escape::None }
            }
            (Escape::Backslash, b'u') => Frame::String { node, chars, escape: Escape::Unicode(4) },
            (Escape::Unicode(left), b) if b.is_ascii_hexdigit() => {
                let escape = if left == 1 { Escape::None } else { Escape::Unicode(left - 1) };
                Frame::String { node, chars, escape }
            }
            _ => return,
        };
        replace_top(&mut stack, next);
        out.push(stack);
    }

    /// Inside a number: the JSON number grammar, digit limits and integer bounds.
    fn feed_number(&self, mut stack: Stack, byte: u8, out: &mut Vec<Stack>) {
        let Some(&Frame::Number { node, state, negative, magnitude, digits }) = stack.frames.last() else {
            unreachable!("called for its frame kind")
        };
        let rule = self.number_rule(node).expect("number frames point at numbers");
        let next = match (state, byte) {
            (Num::Minus, b'0') => Some(Num::Zero),
            (Num::Minus, b'1'..=b'9') | (Num::Int, b'0'..=b'9') => Some(Num::Int),
            (Num::Zero | Num::Int, b'.') if !rule.integer => Some(Num::Dot),
            (Num::Dot | Num::Frac, b'0'..=b'9') => Some(Num::Frac),
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') if !rule.integer => Some(Num::Exp),
            (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
            (Num::Exp | Num::ExpSign | Num::ExpDigits, b'0'..=b'9') => Some(Num::ExpDigits),
            _ => None,
        };
        match next {
            Some(next) => {
                // Digits of the part this byte is in: the same part goes on counting.
                let digits = match (byte.is_ascii_digit(), next == state || (state == Num::Minus)) {
                    (false, _) => 0,
                    (true, true) => digits + 1,
                    (true, false) => 1,
                };
                let limit = if next == Num::ExpDigits { MAX_EXPONENT_DIGITS } else { MAX_DIGITS };
                if digits > limit {
                    return;
                }
                let mut magnitude = magnitude;
                if rule.integer && byte.is_ascii_digit() {
                    magnitude = magnitude.saturating_mul(10).saturating_add(u64::from(byte - b'0'));
                    if !feasible(&rule, negative, magnitude, next == Num::Int) {
                        return;
                    }
                }
                replace_top(&mut stack, Frame::Number { node, state: next, negative, magnitude, digits });
                out.push(stack);
            }
            // The number ends here; the byte belongs to what encloses it.
            None if state.is_complete() && in_bounds(&rule, negative, magnitude) => {
                stack.frames.pop();
                self.feed(stack, byte, out);
            }
            None => {}
        }
    }

    /// Between the tokens of an object: keys in schema order, required ones not skipped.
    fn feed_object(&self, mut stack: Stack, after_whitespace: bool, byte: u8, out: &mut Vec<Stack>) {
        let Some(&Frame::Object { node, state, next }) = stack.frames.last() else {
            unreachable!("called for its frame kind")
        };
        let g = &*self.grammar;
        let Node::Object(rule) = g.node(node) else { unreachable!("object frames point at objects") };
        let free_form = rule.properties.is_empty();
        let required_left = rule.properties[next as usize..].iter().any(|p| p.required);
        let set = |stack: &mut Stack, state, next| replace_top(stack, Frame::Object { node, state, next });
        match (state, byte) {
            (ObjectState::Open | ObjectState::AfterValue, b'}') if !required_left => {
                stack.frames.pop();
                out.push(stack);
            }
            (ObjectState::Open | ObjectState::AfterComma, b'"') if free_form && rule.additional.is_some() => {
                set(&mut stack, ObjectState::AfterKey, next);
                stack.frames.push(Frame::String { node: ANY_STRING, chars: 0, escape: Escape::None });
                out.push(stack);
            }
            (ObjectState::Open | ObjectState::AfterComma, b'"') if free_form => {}
            (ObjectState::Open | ObjectState::AfterComma, b'"') => {
                // Any property from `next` up to and including the first required one.
                for (i, property) in rule.properties.iter().enumerate().skip(next as usize) {
                    let mut fork = stack.clone();
                    set(&mut fork, ObjectState::AfterKey, i as u32 + 1);
                    fork.frames.push(Frame::Key { node, prop: i as u32, pos: 1 });
                    out.push(fork);
                    if property.required {
                        break;
                    }
                }
            }
            (ObjectState::AfterKey, b':') => {
                set(&mut stack, ObjectState::AfterColon, next);
                out.push(stack);
            }
            (ObjectState::AfterColon, _) => {
                let value = if free_form {
                    rule.additional.expect("a key was read")
                } else {
                    rule.properties[next as usize - 1].value
                };
                set(&mut stack, ObjectState::AfterValue, next);
                stack.frames.push(Frame::Value(value));
                self.feed(stack, byte, out);
            }
            (ObjectState::AfterValue, b',')
                if !after_whitespace && (free_form || (next as usize) < rule.properties.len()) =>
            {
                set(&mut stack, ObjectState::AfterComma, next);
                out.push(stack);
            }
            _ => {}
        }
    }

    /// Between the tokens of an array: item count bounds.
    fn feed_array(&self, mut stack: Stack, after_whitespace: bool, byte: u8, out: &mut Vec<Stack>) {
        let Some(&Frame::Array { node, state, count }) = stack.frames.last() else {
            unreachable!("called for its frame kind")
        };
        let g = &*self.grammar;
        let Node::Array(rule) = g.node(node) else { unreachable!("array frames point at arrays") };
        let set = |stack: &mut Stack, state, count| replace_top(stack, Frame::Array { node, state, count });
        match (state, byte) {
            (ArrayState::Open | ArrayState::AfterItem, b']') if count >= rule.min => {
                stack.frames.pop();
                out.push(stack);
            }
            (ArrayState::AfterItem, b',')
                if !after_whitespace
                    && rule.max.is_none_or(|max| count < max)
                    && rule.item(count as usize).is_some() =>
            {
                set(&mut stack, ArrayState::AfterComma, count);
                out.push(stack);
            }
            (ArrayState::Open | ArrayState::AfterComma, _) if byte != b']' => {
                let Some(item) = rule.item(count as usize) else { return };
                if rule.max.is_some_and(|max| count >= max) {
                    return;
                }
                set(&mut stack, ArrayState::AfterItem, count + 1);
                stack.frames.push(Frame::Value(item));
                self.feed(stack, byte, out);
            }
            _ => {}
        }
    }
}

fn replace_top(stack: &mut Stack, frame: Frame) {
    *stack.frames.last_mut().expect("non-empty stack") = frame;
}

fn dedup(stacks: &mut Vec<Stack>) {
    let mut seen = std::collections::HashSet::with_capacity(stacks.len());
    stacks.retain(|s| seen.insert(s.clone()));
}

/// Whether an integer whose digits so far make `magnitude` can still end within the rule's
/// bounds (`more_digits`: whether digits may still follow, i.e. it is not a lone `0`).
fn feasible(rule: &NumberRule, negative: bool, magnitude: u64, more_digits: bool) -> bool {
    if rule.min.is_none() && rule.max.is_none() {
        return true;
    }
    let (lo, hi) = (rule.min.map_or(i128::MIN, i128::from), rule.max.map_or(i128::MAX, i128::from));
    let sign: i128 = if negative { -1 } else { 1 };
    let mut base = i128::from(magnitude);
    let mut span: i128 = 0; // the k more digits add 0 ..= span
    for _ in 0..=19 {
        let (a, b) = (sign * base, sign * (base + span));
        let (low, high) = if a <= b { (a, b) } else { (b, a) };
        if low <= hi && high >= lo {
            return true;
        }
        if !more_digits || magnitude == 0 || base > i128::from(i64::MAX) {
            return false;
        }
        base *= 10;
        span = span * 10 + 9;
    }
    false
}

fn in_bounds(rule: &NumberRule, negative: bool, magnitude: u64) -> bool {
    if !rule.integer {
        return true;
    }
    let value = if negative { -i128::from(magnitude) } else { i128::from(magnitude) };
    rule.min.is_none_or(|m| value >= i128::from(m)) && rule.max.is_none_or(|m| value <= i128::from(m))
}
