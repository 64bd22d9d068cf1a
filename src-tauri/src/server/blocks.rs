//! An answer as a sequence of content blocks: thinking, text, tool calls, each opened, filled
//! and closed in order. Anthropic's content blocks and the Responses API's output items are
//! both renderings of these events; the non-streaming answers fold them into a list.

use super::chat::outcome::text_beside_calls;
use super::chat::structured::ToolMode;
use super::chat::{call_id, Piece};

#[derive(Debug, Clone, PartialEq)]
pub enum BlockKind {
    Thinking,
    Text,
    ToolCall { id: String, name: String },
}

impl BlockKind {
    pub fn content(&self) -> Content {
        match self {
            BlockKind::Thinking => Content::Thinking,
            BlockKind::Text => Content::Text,
            BlockKind::ToolCall { .. } => Content::Arguments,
        }
    }
}

/// What a delta adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    Thinking,
    Text,
    /// A fragment of a call's JSON arguments.
    Arguments,
}

#[derive(Debug, Clone, PartialEq)]
pub enum BlockEvent {
    Start { index: usize, kind: BlockKind },
    Delta { index: usize, content: Content, text: String },
    Stop { index: usize },
}

/// Turns the answer parser's pieces into block events.
pub struct Blocks {
    open: Option<(usize, BlockKind)>,
    next: usize,
}

impl Blocks {
    /// With a named `tool_choice`, the answer is one call whose block opens at once.
    pub fn start(mode: &ToolMode) -> (Blocks, Vec<BlockEvent>) {
        let mut blocks = Blocks { open: None, next: 0 };
        let mut events = Vec::new();
        if let ToolMode::Named(name) = mode {
            blocks.open_block(BlockKind::ToolCall { id: call_id(), name: name.clone() }, &mut events);
        }
        (blocks, events)
    }

    pub fn push(&mut self, pieces: Vec<Piece>) -> Vec<BlockEvent> {
        let mut events = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Text(text) => self.append(BlockKind::Text, text, &mut events),
                Piece::Reasoning(text) => self.append(BlockKind::Thinking, text, &mut events),
                Piece::Arguments(text) => {
                    if let Some((index, BlockKind::ToolCall { .. })) = &self.open {
                        events.push(BlockEvent::Delta { index: *index, content: Content::Arguments, text });
                    }
                }
                Piece::Call(call) => {
                    let index = self.open_block(BlockKind::ToolCall { id: call_id(), name: call.name }, &mut events);
                    events.push(BlockEvent::Delta { index, content: Content::Arguments, text: call.arguments });
                    self.close(&mut events);
                }
            }
        }
        events
    }

    /// The events of a whole answer (non-streaming): `first` from [`Blocks::start`], then the
    /// answer's pieces, the block still open closed.
    pub fn whole(mut self, first: Vec<BlockEvent>, pieces: Vec<Piece>) -> Vec<BlockEvent> {
        let mut events = first;
        events.extend(self.push(pieces));
        events.extend(self.finish());
        events
    }

    /// Closes the block still open.
    pub fn finish(&mut self) -> Vec<BlockEvent> {
        let mut events = Vec::new();
        self.close(&mut events);
        events
    }

    fn append(&mut self, kind: BlockKind, text: String, events: &mut Vec<BlockEvent>) {
        let content = kind.content();
        let index = match &self.open {
            Some((index, open)) if *open == kind => *index,
            _ => self.open_block(kind, events),
        };
        events.push(BlockEvent::Delta { index, content, text });
    }

    fn open_block(&mut self, kind: BlockKind, events: &mut Vec<BlockEvent>) -> usize {
        self.close(events);
        let index = self.next;
        self.next += 1;
        events.push(BlockEvent::Start { index, kind: kind.clone() });
        self.open = Some((index, kind));
        index
    }

    fn close(&mut self, events: &mut Vec<BlockEvent>) {
        if let Some((index, _)) = self.open.take() {
            events.push(BlockEvent::Stop { index });
        }
    }
}

/// A whole block, for non-streaming answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub kind: BlockKind,
    /// Text, thinking, or a call's JSON arguments.
    pub text: String,
}

/// The blocks a sequence of events builds.
pub fn fold(events: impl IntoIterator<Item = BlockEvent>) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::new();
    for event in events {
        match event {
            BlockEvent::Start { kind, .. } => blocks.push(Block { kind, text: String::new() }),
            BlockEvent::Delta { index, text, .. } => {
                if let Some(block) = blocks.get_mut(index) {
                    block.text.push_str(&text);
                }
            }
            BlockEvent::Stop { .. } => {}
        }
    }
    // Whitespace between a text and a call is noise; a text block left empty is dropped.
    let has_calls = blocks.iter().any(|b| matches!(b.kind, BlockKind::ToolCall { .. }));
    if has_calls {
        for block in blocks.iter_mut().filter(|b| b.kind == BlockKind::Text) {
            block.text = text_beside_calls(&block.text).unwrap_or_default();
        }
        blocks.retain(|b| b.kind != BlockKind::Text || !b.text.is_empty());
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::chat::ToolCall;

    #[test]
    fn text_thinking_and_calls_become_ordered_blocks() {
        let (mut blocks, first) = Blocks::start(&ToolMode::Off);
        assert!(first.is_empty());
        let mut events =
            blocks.push(vec![Piece::Reasoning("hm".into()), Piece::Reasoning("m".into()), Piece::Text("Hi".into())]);
        events.extend(blocks.push(vec![
            Piece::Text(" there\n".into()),
            Piece::Call(ToolCall { name: "w".into(), arguments: "{}".into() }),
        ]));
        events.extend(blocks.finish());
        let starts: Vec<usize> = events
            .iter()
            .filter_map(|e| if let BlockEvent::Start { index, .. } = e { Some(*index) } else { None })
            .collect();
        let stops: Vec<usize> = events
            .iter()
            .filter_map(|e| if let BlockEvent::Stop { index } = e { Some(*index) } else { None })
            .collect();
        assert_eq!((starts, stops), (vec![0, 1, 2], vec![0, 1, 2]));
        let folded = fold(events);
        assert_eq!(folded[0], Block { kind: BlockKind::Thinking, text: "hmm".into() });
        assert_eq!(folded[1], Block { kind: BlockKind::Text, text: "Hi there".into() });
        assert!(matches!(&folded[2].kind, BlockKind::ToolCall { name, id } if name == "w" && id.starts_with("call_")));
    }

    #[test]
    fn a_named_call_opens_first_and_takes_the_arguments() {
        let (mut blocks, mut events) = Blocks::start(&ToolMode::Named("w".into()));
        events.extend(blocks.push(vec![Piece::Arguments("{\"a\":".into()), Piece::Arguments("1}".into())]));
        events.extend(blocks.finish());
        let folded = fold(events);
        assert_eq!(folded.len(), 1);
        assert_eq!(folded[0].text, "{\"a\":1}");
    }
}
