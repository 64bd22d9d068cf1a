//! Streaming answers from an engine stream: each engine event becomes zero or more frames.
//! OpenAI's and Anthropic's server-sent events and Ollama's NDJSON are renderings of the same
//! frame stream. Dropping the response (client gone) drops the engine stream, which cancels the
//! request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};

use crate::engine::{Event, RequestStream};

/// `first` at once, then `map` of each engine event, then `last` once the request has finished
/// (an engine that went away without a finish is mapped as a failed finish, so every dialect
/// ends such a stream with its error, never as a normal finish).
pub fn frames<T: Send + 'static>(
    engine_stream: RequestStream,
    first: Vec<T>,
    mut map: impl FnMut(Event) -> Vec<T> + Send + 'static,
    last: Vec<T>,
) -> impl Stream<Item = T> + Send {
    struct State<T, F> {
        stream: RequestStream,
        pending: VecDeque<T>,
        last: Option<Vec<T>>,
        map: F,
    }
    let state = State { stream: engine_stream, pending: first.into(), last: Some(last), map: move |e| map(e) };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(frame) = s.pending.pop_front() {
                return Some((frame, s));
            }
            let last = s.last.take()?;
            match s.stream.recv().await {
                Some(event) => {
                    let is_finish = matches!(event, Event::Finish(_));
                    s.pending.extend((s.map)(event));
                    if is_finish {
                        s.pending.extend(last);
                    } else {
                        s.last = Some(last);
                    }
                }
                // The engine went away without a finish: the dialect tells it as a failure.
                None => {
                    s.pending.extend((s.map)(Event::Finish(super::chat::outcome::engine_gone())));
                    s.pending.extend(last);
                }
            }
        }
    })
}

/// OpenAI's SSE: `data: {json}` per payload, `data: [DONE]` at the end.
pub fn stream_events(
    engine_stream: RequestStream,
    first: Vec<serde_json::Value>,
    map: impl FnMut(Event) -> Vec<serde_json::Value> + Send + 'static,
) -> Response {
    let data = |v: serde_json::Value| SseEvent::default().data(v.to_string());
    let first = first.into_iter().map(data).collect();
    let mut map = map;
    let events = frames(
        engine_stream,
        first,
        move |e| map(e).into_iter().map(data).collect(),
        vec![SseEvent::default().data("[DONE]")],
    );
    with_keepalive(events.map(Ok))
}

/// Named events (`event: name` + `data: {json}`), as Anthropic's and the Responses API send.
pub fn named_events(
    engine_stream: RequestStream,
    first: Vec<(&'static str, serde_json::Value)>,
    map: impl FnMut(Event) -> Vec<(&'static str, serde_json::Value)> + Send + 'static,
) -> Response {
    let named = |(name, v): (&'static str, serde_json::Value)| SseEvent::default().event(name).data(v.to_string());
    let first = first.into_iter().map(named).collect();
    let mut map = map;
    let events = frames(engine_stream, first, move |e| map(e).into_iter().map(named).collect(), Vec::new());
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
