//! The reader shared by the formats that wrap each call in a pair of markers (Hermes'
//! `<tool_call>`, Qwen's XML inside it, Gemma 4's and LFM2's special tokens): text around the
//! calls passes through as it comes, a possible start of the opening marker is held back, and
//! each call is read when its closing marker arrives. What does not read as calls stays text,
//! markers and all.

use super::{partial_len, CallReader, ParameterSchemas};
use crate::server::chat::piece::{Piece, ToolCall};

/// Reads the body between the markers as calls; `closed`: the closing marker came (else the
/// generation ended inside the call, a stop token or the length limit cutting it).
pub(super) type ParseBody = fn(body: &str, schemas: &ParameterSchemas, closed: bool) -> Option<Vec<ToolCall>>;

pub(super) struct PairedCalls {
    open: &'static str,
    close: &'static str,
    parse: ParseBody,
    schemas: ParameterSchemas,
    /// Text not yet emitted: a possible start of the opening marker, or a call being read.
    pending: String,
    in_call: bool,
}

impl PairedCalls {
    pub fn new(open: &'static str, close: &'static str, parse: ParseBody, schemas: ParameterSchemas) -> PairedCalls {
        PairedCalls { open, close, parse, schemas, pending: String::new(), in_call: false }
    }
}

impl CallReader for PairedCalls {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let (open, close) = (self.open, self.close);
        let mut out = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(close) else { return out };
                let body: String = self.pending.drain(..end + close.len()).collect();
                let body = &body[..end];
                match (self.parse)(body, &self.schemas, true) {
                    Some(calls) => out.extend(calls.into_iter().map(Piece::Call)),
                    None => out.push(Piece::Text(format!("{open}{body}{close}"))),
                }
                self.in_call = false;
                continue;
            }
            if let Some(start) = self.pending.find(open) {
                let text: String = self.pending.drain(..start).collect();
                if !text.trim().is_empty() {
                    out.push(Piece::Text(text));
                }
                self.pending.drain(..open.len());
                self.in_call = true;
                continue;
            }
            let emit_to = self.pending.len() - partial_len(&self.pending, open);
            if emit_to > 0 {
                out.push(Piece::Text(self.pending.drain(..emit_to).collect()));
            }
            return out;
        }
    }

    fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        if rest.is_empty() {
            return Vec::new();
        }
        if !self.in_call {
            return vec![Piece::Text(rest)];
        }
        match (self.parse)(&rest, &self.schemas, false) {
            Some(calls) => calls.into_iter().map(Piece::Call).collect(),
            None => vec![Piece::Text(format!("{}{rest}", self.open))],
        }
    }
}
