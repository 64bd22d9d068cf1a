//! A started generation's answer as every dialect renders it: the engine's deltas read into
//! pieces (text, reasoning, calls, arguments) with each token's log-probability, then how it
//! ended, with the rule of `outcome` applied once for all of them: a normal end brings the
//! parser's last pieces; a cancelled or failed generation (or an engine gone without a finish)
//! ends with the error alone. Dialects only render these events.

use super::answer::AnswerParser;
use super::outcome::{engine_gone, failure};
use super::piece::Piece;
use crate::engine::{Event, Finish, RequestId, RequestStream, TokenLogprob};
use crate::server::ApiError;

pub enum AnswerEvent {
    /// What a generated token added (often nothing yet: a tag still incomplete), with its
    /// log-probability when asked for.
    Pieces { pieces: Vec<Piece>, logprob: Option<TokenLogprob> },
    /// The generation ended normally (a stop or its length limit); `rest`: what the parser
    /// held back until then.
    Done { rest: Vec<Piece>, finish: Finish },
    /// It did not: the error each dialect reports in its own way.
    Failed(ApiError),
}

/// The answer of one request as it streams.
pub struct AnswerStream {
    stream: RequestStream,
    /// `None` for raw completions: the text is the answer.
    parser: Option<AnswerParser>,
    ended: bool,
}

/// A whole answer, for non-streaming responses.
pub struct WholeAnswer {
    pub pieces: Vec<Piece>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Finish,
}

/// Waits until the engine starts the request, so that one refused after waiting in the queue
/// (or cancelled first) is answered with its error status, `Retry-After` included, before a
/// streaming response has sent its headers.
pub async fn started(mut stream: RequestStream) -> Result<RequestStream, ApiError> {
    match stream.started().await {
        Err(finish) => match failure(&finish) {
            Some(error) => Err(error),
            None => Ok(stream),
        },
        Ok(()) => Ok(stream),
    }
}

impl AnswerStream {
    pub fn new(stream: RequestStream, parser: Option<AnswerParser>) -> AnswerStream {
        AnswerStream { stream, parser, ended: false }
    }

    /// The engine's id of the request (dialects derive their response ids from it).
    pub fn id(&self) -> RequestId {
        self.stream.id
    }

    /// The next event; `None` once the end was told.
    pub async fn next(&mut self) -> Option<AnswerEvent> {
        if self.ended {
            return None;
        }
        Some(match self.stream.recv().await {
            Some(Event::Delta { text, logprob, .. }) => AnswerEvent::Pieces { pieces: self.push(text), logprob },
            Some(Event::Finish(finish)) => self.end(finish),
            // The engine went away without a finish: told as a failure.
            None => self.end(engine_gone()),
        })
    }

    /// Reads the answer to its end: all its pieces, or the error of a generation that did not
    /// end normally. The text is read in one piece at the end (what the parser makes of it does
    /// not depend on how it is cut).
    pub async fn collect(mut self) -> Result<WholeAnswer, ApiError> {
        let mut text = String::new();
        let mut logprobs = Vec::new();
        let finish = loop {
            match self.stream.recv().await {
                Some(Event::Delta { text: t, logprob, .. }) => {
                    text.push_str(&t);
                    logprobs.extend(logprob);
                }
                Some(Event::Finish(finish)) => break finish,
                None => break engine_gone(),
            }
        };
        if let Some(error) = failure(&finish) {
            return Err(error);
        }
        let mut pieces = self.push(text);
        pieces.extend(self.parser.as_mut().map(AnswerParser::finish).unwrap_or_default());
        Ok(WholeAnswer { pieces, logprobs, finish })
    }

    fn push(&mut self, text: String) -> Vec<Piece> {
        match &mut self.parser {
            Some(parser) => parser.push(&text),
            None if text.is_empty() => Vec::new(),
            None => vec![Piece::Text(text)],
        }
    }

    fn end(&mut self, finish: Finish) -> AnswerEvent {
        self.ended = true;
        if let Some(error) = failure(&finish) {
            return AnswerEvent::Failed(error);
        }
        let rest = self.parser.as_mut().map(AnswerParser::finish).unwrap_or_default();
        AnswerEvent::Done { rest, finish }
    }
}

impl WholeAnswer {
    /// The answer's text (raw completions: all of it).
    pub fn text(&self) -> String {
        self.pieces.iter().filter_map(|p| if let Piece::Text(t) = p { Some(t.as_str()) } else { None }).collect()
    }
}
