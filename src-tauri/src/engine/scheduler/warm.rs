//! A finished chat answer's turn boundary, prefilled while the engine is idle. An agent's next
//! request resends the conversation: the prompt, the answer, the chat template's end of turn
//! and start of the next message (ChatML: `<|im_end|>`, `\n`, `<|im_start|>`, `user`), then
//! what is new. The answer's last token and that boundary are known when the answer ends, so
//! the engine computes them once it has been idle for a moment (`WARM_AFTER`), on top of the
//! answer's kept buffers: the next turn finds them in the prefix cache and prefills only its
//! new text. A few tokens cost most of a forward (the weights are read whatever the count), so
//! this pays when the client takes a moment to answer (a person, a tool that runs), and is
//! skipped when it sends the next turn at once.

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::Scheduler;
use std::sync::Arc;

use crate::engine::request::{with_image_keys, Event, FinishReason, Request};
use crate::engine::sequence::Sequence;
use crate::model::vision::PromptImages;

/// The most tokens such a prefill may compute: the boundary and little else (a long one would
/// be a prefill nobody asked for, holding up whoever comes next).
const MOST_TOKENS: usize = 64;

/// The last finished chat answer's next turn, to prefill once the engine is idle.
#[derive(Default)]
pub(super) struct NextTurn {
    /// What that turn starts with, and the conversation's images (their tokens are in it).
    tokens: Option<(Vec<u32>, Option<Arc<PromptImages>>)>,
    /// The event stream of its prefill, held so that it never reads as abandoned.
    events: Option<UnboundedReceiver<Event>>,
}

impl NextTurn {
    /// Whether a turn boundary waits to be prefilled.
    pub fn is_pending(&self) -> bool {
        self.tokens.is_some()
    }

    /// A sequence left the batch: if it was a chat answer that ended normally, its next turn is
    /// the one to prefill.
    pub fn answer_ended(&mut self, seq: &Sequence) {
        if let Some(tokens) = next_turn_start(seq) {
            self.tokens = Some((tokens, seq.request.images.clone()));
        }
    }
}

/// What the next turn of `seq`'s conversation starts with: its sequence, then the template's
/// turn boundary. An answer that stopped drops its stop token: the template writes the end of
/// the turn itself (the boundary starts with it).
fn next_turn_start(seq: &Sequence) -> Option<Vec<u32>> {
    let boundary = &seq.request.turn_boundary;
    if boundary.is_empty() {
        return None;
    }
    let mut tokens = seq.tokens().to_vec();
    match seq.finished? {
        FinishReason::Stop => {
            tokens.pop();
        }
        FinishReason::Length => {}
        FinishReason::Cancelled | FinishReason::Error | FinishReason::Overloaded | FinishReason::Unavailable => {
            return None
        }
    }
    tokens.extend_from_slice(boundary);
    Some(tokens)
}

impl Scheduler {
    /// Starts the prefill of the last finished answer's turn boundary when the kept buffers
    /// hold all but a few of its tokens; true when it started.
    pub(super) fn start_next_turn(&mut self) -> bool {
        let Some((tokens, images)) = self.warm.tokens.take() else { return false };
        let Some(cached) = self.kv.hot_shares(&with_image_keys(&tokens, images.as_deref())) else { return false };
        if cached + MOST_TOKENS < tokens.len() || cached == tokens.len() || tokens.len() >= self.info.context_length {
            return false;
        }
        let (events, receiver) = unbounded_channel();
        // One token is sampled at the end of a prefill; it is not used.
        let mut request = Request::new(tokens, 1);
        request.images = images;
        let mut seq = Sequence::new(0, request, events, &self.info, 1);
        seq.warm = true;
        self.warm.events = Some(receiver);
        let admitted = self.admit(seq);
        self.add_to_group(vec![admitted]);
        !self.group.is_empty()
    }
}
