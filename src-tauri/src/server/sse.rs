//! Streaming answers: each of the answer's events becomes zero or more frames. OpenAI's and
//! Anthropic's server-sent events and Ollama's NDJSON are renderings of the same frame stream.
//! Dropping the response (client gone) drops the engine stream, which cancels the request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};

use super::chat::stream::{AnswerEvent, AnswerStream};

/// `first` at once, then `map` of each of the answer's events (its end included: a normal one,
/// or the failure every dialect tells as its error), then `last` once it has ended.
pub fn frames<T: Send + 'static>(
    answer: AnswerStream,
    first: Vec<T>,
    mut map: impl FnMut(AnswerEvent) -> Vec<T> + Send + 'static,
    last: Vec<T>,
) -> impl Stream<Item = T> + Send {
    struct State<T, F> {
        answer: AnswerStream,
        pending: VecDeque<T>,
        last: Option<Vec<T>>,
        map: F,
    }
    let state = State { answer, pending: first.into(), last: Some(last), map: move |e| map(e) };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(frame) = s.pending.pop_front() {
                return Some((frame, s));
            }
            match s.answer.next().await {
                Some(event) => s.pending.extend((s.map)(event)),
                None => s.pending.extend(s.last.take()?),
            }
        }
    })
}

/// OpenAI's SSE: `data: {json}` per payload, `data: [DONE]` at the end.
pub fn stream_events(
    answer: AnswerStream,
    first: Vec<serde_json::Value>,
    map: impl FnMut(AnswerEvent) -> Vec<serde_json::Value> + Send + 'static,
) -> Response {
    let data = |v: serde_json::Value| SseEvent::default().data(v.to_string());
    let first = first.into_iter().map(data).collect();
    let mut map = map;
    let events = frames(
        answer,
        first,
        move |e| map(e).into_iter().map(data).collect(),
        vec![SseEvent::default().data("[DONE]")],
    );
    with_keepalive(events.map(Ok))
}

/// Named events (`event: name` + `data: {json}`), as Anthropic's and the Responses API send.
pub fn named_events(
    answer: AnswerStream,
    first: Vec<(&'static str, serde_json::Value)>,
    map: impl FnMut(AnswerEvent) -> Vec<(&'static str, serde_json::Value)> + Send + 'static,
) -> Response {
    let named = |(name, v): (&'static str, serde_json::Value)| SseEvent::default().event(name).data(v.to_string());
    let first = first.into_iter().map(named).collect();
    let mut map = map;
    let events = frames(answer, first, move |e| map(e).into_iter().map(named).collect(), Vec::new());
    with_keepalive(events.map(Ok))
}

/// `: keepalive` comments through long prefills (never `: ping`, which Continue reads as the
/// end of the stream).
fn with_keepalive<S: Stream<Item = Result<SseEvent, Infallible>> + Send + 'static>(events: S) -> Response {
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)).text("keepalive")).into_response()
}

/// One JSON object per line (Ollama's streaming format).
pub fn ndjson(lines: impl Stream<Item = serde_json::Value> + Send + 'static) -> Response {
    let body = Body::from_stream(lines.map(|v| {
        let mut line = v.to_string();
        line.push('\n');
        Ok::<_, Infallible>(Bytes::from(line))
    }));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}
