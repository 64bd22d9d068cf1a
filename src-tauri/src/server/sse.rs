//! Server-sent events from an engine stream: each engine event becomes zero or more `data:`
//! lines, comments keep the connection alive through long prefills, `data: [DONE]` ends it.
//! Dropping the response (client gone) drops the engine stream, which cancels the request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;

use crate::engine::{Event, RequestStream};

/// `first` is sent at once; `map` turns each engine event into JSON payloads.
pub fn stream_events(
    engine_stream: RequestStream,
    first: Vec<serde_json::Value>,
    mut map: impl FnMut(Event) -> Vec<serde_json::Value> + Send + 'static,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    struct State<F> {
        stream: RequestStream,
        pending: VecDeque<SseEvent>,
        finished: bool,
        map: F,
    }
    let pending = first.into_iter().map(|v| SseEvent::default().data(v.to_string())).collect();
    let state = State { stream: engine_stream, pending, finished: false, map: move |e| map(e) };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.pending.pop_front() {
                return Some((Ok(event), s));
            }
            if s.finished {
                return None;
            }
            match s.stream.recv().await {
                Some(event) => {
                    let is_finish = matches!(event, Event::Finish(_));
                    s.pending.extend((s.map)(event).into_iter().map(|v| SseEvent::default().data(v.to_string())));
                    if is_finish {
                        s.pending.push_back(SseEvent::default().data("[DONE]"));
                        s.finished = true;
                    }
                }
                None => {
                    // The engine went away without a finish event (it shut down).
                    s.pending.push_back(SseEvent::default().data("[DONE]"));
                    s.finished = true;
                }
            }
        }
    });
    // `: keepalive` comments (never `: ping`, which Continue reads as the end of the stream).
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)).text("keepalive"))
}
