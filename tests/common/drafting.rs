//! What the speculative-decoding tests share: prompts that repeat themselves, a request's
//! answer, and a session of requests (alone, batched, sampled, a next turn, a stop string) whose
//! answers must not change with drafting on.

use fastmlx::engine::{EngineHandle, Event, FinishReason, Metrics, Request};

pub const GENERATE: usize = 40;

/// Prompts that repeat themselves, as edits of code do: lookups find proposals at once.
pub const PROMPTS: [&str; 4] = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a",
    "the cat sat on the mat. the cat sat on the",
    "ababababababababab",
    "fn main() { println!(\"hi\"); }\nfn main() { println!(",
];

pub fn bytes(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

#[derive(Debug, PartialEq)]
pub struct Answer {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reason: FinishReason,
}

pub fn answer(engine: &EngineHandle, request: Request) -> Answer {
    let mut stream = engine.submit(request).unwrap();
    let (mut tokens, mut text) = (Vec::new(), String::new());
    loop {
        match stream.blocking_recv().expect("a finish event") {
            Event::Delta { token, text: piece, .. } => {
                tokens.push(token);
                text.push_str(&piece);
            }
            Event::Finish(f) => return Answer { tokens, text, reason: f.reason },
        }
    }
}

pub fn greedy(prompt: &[u32]) -> Request {
    Request { ignore_eos: true, ..Request::new(prompt.to_vec(), GENERATE) }
}

pub fn sampled(prompt: &[u32], seed: u64) -> Request {
    let mut r = greedy(prompt);
    r.params.temperature = 0.9;
    r.params.top_p = 0.95;
    r.params.seed = Some(seed);
    r
}

/// Everything the test asks of one engine, in order: each prompt alone, greedy; the prompts
/// together (a batch); seeded sampling, together; a next turn after the first answer; and the
/// first prompt with a stop string (when one is given).
pub fn session(engine: &EngineHandle, stop: Option<&str>) -> (Vec<Answer>, Metrics) {
    let mut out = Vec::new();
    for p in PROMPTS {
        out.push(answer(engine, greedy(&bytes(p))));
    }
    let together = |make: &dyn Fn(usize, &[u32]) -> Request| -> Vec<Answer> {
        let streams: Vec<Request> = PROMPTS.iter().enumerate().map(|(i, p)| make(i, &bytes(p))).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = streams.into_iter().map(|r| s.spawn(move || answer(engine, r))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    out.extend(together(&|_, p| greedy(p)));
    out.extend(together(&|i, p| sampled(p, 11 + i as u64)));
    // The first answer given back and the prompt again: lookups propose the answer once more
    // (whatever the model writes, so every architecture drafts here).
    let mut next_turn = bytes(PROMPTS[0]);
    next_turn.extend(&out[0].tokens);
    next_turn.extend(bytes(PROMPTS[0]));
    out.push(answer(engine, greedy(&next_turn)));
    if let Some(stop) = stop {
        let mut r = greedy(&bytes(PROMPTS[0]));
        r.stop = vec![stop.to_string()];
        out.push(answer(engine, r));
    }
    (out, super::engine::wait_idle(engine))
}

/// A stop string from the middle of a first answer, where drafts run (none when it is short).
pub fn stop_inside(first: &Answer) -> Option<String> {
    let chars: Vec<char> = first.text.chars().collect();
    (chars.len() >= 16).then(|| chars[10..13].iter().collect())
}

/// Runs [`session`] on `engine` (then shut down) and requires its answers to be `want`;
/// returns its metrics.
pub fn same_answers(engine: EngineHandle, stop: Option<&str>, want: &[Answer], what: &str) -> Metrics {
    let (got, metrics) = session(&engine, stop);
    drop(engine);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{what}: answer {i} differs");
    }
    metrics
}
