//! How a generation ended, told the same way by every dialect, and a whole answer assembled
//! once for all of them. The rule: a cancelled or failed generation never looks like a normal
//! finish — non-streaming it is an error response, streaming it ends with the dialect's error
//! event instead of its usual last frame.

use axum::http::StatusCode;

use super::piece::{Piece, ToolCall};
use super::structured::ToolMode;
use crate::engine::{Finish, FinishReason, Usage};
use crate::server::ApiError;

/// A generation that did not end normally, as the error every dialect reports (`None`: it
/// finished, by a stop or by its length limit).
pub fn failure(finish: &Finish) -> Option<ApiError> {
    match finish.reason {
        FinishReason::Stop | FinishReason::Length => None,
        FinishReason::Error => {
            Some(ApiError::internal(finish.error.clone().unwrap_or_else(|| "generation failed".into())))
        }
        FinishReason::Overloaded => Some(ApiError {
            code: Some("server_overloaded"),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                finish.error.clone().unwrap_or_else(|| "the server is too busy to start this request now".into()),
            )
        }),
        FinishReason::Unavailable => Some(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            finish.error.clone().unwrap_or_else(|| "a machine of the model's cluster was lost".into()),
        )),
        // The engine cancels what is still running when its model is unloaded or the server stops
        // (a client that went away reads nothing more).
        FinishReason::Cancelled => Some(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the request was cancelled: its model was unloaded or the server is shutting down",
        )),
    }
}

/// The finish of a request whose engine went away without telling how it ended.
pub fn engine_gone() -> Finish {
    Finish {
        reason: FinishReason::Error,
        stop: None,
        error: Some("the engine stopped before the request finished".into()),
        usage: Usage::default(),
        timings: Default::default(),
    }
}

/// `Server-Timing` for a finished request (milliseconds), as browsers' developer tools and
/// `curl -v` show it: queue, prefix-cache restore, prefill, first token, decode.
pub fn server_timing(finish: &Finish) -> axum::http::HeaderValue {
    let t = &finish.timings;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let value = format!(
        "queue;dur={:.1}, restore;dur={:.1}, prefill;dur={:.1};desc=\"{} chunks, {} cached\", ttft;dur={:.1}, decode;dur={:.1}",
        ms(t.queue),
        ms(t.restore),
        ms(t.prefill),
        t.prefill_chunks,
        finish.usage.cached_tokens,
        ms(t.time_to_first_token),
        ms(t.decode)
    );
    axum::http::HeaderValue::from_str(&value).expect("ASCII")
}

/// `response` with the `Server-Timing` of `finish`.
pub fn with_server_timing(mut response: axum::response::Response, finish: &Finish) -> axum::response::Response {
    response.headers_mut().insert("server-timing", server_timing(finish));
    response
}

/// A whole answer: text, reasoning and calls.
pub struct Whole {
    /// `None` when there are calls and no text beside them (OpenAI's shape).
    pub content: Option<String>,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
}

impl Whole {
    /// Folds the parser's pieces; with a named `tool_choice` the arguments make its one call.
    pub fn from_pieces(pieces: Vec<Piece>, mode: &ToolMode) -> Whole {
        let (mut text, mut reasoning, mut arguments, mut calls) =
            (String::new(), String::new(), String::new(), Vec::new());
        for piece in pieces {
            match piece {
                Piece::Text(t) => text.push_str(&t),
                Piece::Reasoning(t) => reasoning.push_str(&t),
                Piece::Arguments(t) => arguments.push_str(&t),
                Piece::Call(c) => calls.push(c),
            }
        }
        if let ToolMode::Named(name) = mode {
            calls.push(ToolCall { name: name.clone(), arguments });
        }
        let content = if calls.is_empty() { Some(text) } else { text_beside_calls(&text) };
        Whole { content, reasoning, calls }
    }
}

/// The text of an answer that also has tool calls: the whitespace around the calls is noise,
/// and nothing left means no text at all.
pub fn text_beside_calls(text: &str) -> Option<String> {
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish(reason: FinishReason) -> Finish {
        Finish { reason, stop: None, error: None, usage: Usage::default(), timings: Default::default() }
    }

    #[test]
    fn only_stop_and_length_are_normal_ends() {
        assert!(failure(&finish(FinishReason::Stop)).is_none());
        assert!(failure(&finish(FinishReason::Length)).is_none());
        assert_eq!(failure(&finish(FinishReason::Cancelled)).unwrap().status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(failure(&finish(FinishReason::Error)).unwrap().status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failure(&engine_gone()).unwrap().message, "the engine stopped before the request finished");
    }

    #[test]
    fn text_beside_calls_is_trimmed_or_dropped() {
        let call = || Piece::Call(ToolCall { name: "w".into(), arguments: "{}".into() });
        let whole = Whole::from_pieces(vec![Piece::Text(" \n".into()), call()], &ToolMode::Off);
        assert_eq!((whole.content, whole.calls.len()), (None, 1));
        let whole = Whole::from_pieces(vec![Piece::Text(" ok \n".into()), call()], &ToolMode::Off);
        assert_eq!(whole.content.as_deref(), Some("ok"));
        let whole = Whole::from_pieces(vec![Piece::Text(" free text ".into())], &ToolMode::Off);
        assert_eq!(whole.content.as_deref(), Some(" free text "));
    }
}
