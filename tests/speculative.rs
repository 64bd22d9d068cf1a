//! Speculative decoding (prompt lookup, drafts verified in the batch): for every architecture's
//! tiny model, greedy and seeded sampled output are the same with drafting on (forced, so every
//! step that has a proposal drafts) and off, for one request and for rows of a batch that
//! accept different numbers of drafted tokens (realigned each step); a stop string inside an
//! accepted run ends it where plain decoding does; a next turn restored from blocks stored while
//! drafting continues as without. Models with recurrent layers do not draft (their state cannot
//! take back tokens), and their output is unchanged too.

mod common;

use fastmlx::engine::speculative::{Mode, SpeculativeConfig};
use fastmlx::engine::{EngineConfig, EngineHandle, Event, FinishReason, Metrics, Request};
use fastmlx::fixtures::synthetic;

const GENERATE: usize = 40;

/// Prompts that repeat themselves, as edits of code do: lookups find proposals at once.
const PROMPTS: [&str; 4] = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a",
    "the cat sat on the mat. the cat sat on the",
    "ababababababababab",
    "fn main() { println!(\"hi\"); }\nfn main() { println!(",
];

fn bytes(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

#[derive(Debug, PartialEq)]
struct Answer {
    tokens: Vec<u32>,
    text: String,
    reason: FinishReason,
}

fn answer(engine: &EngineHandle, request: Request) -> Answer {
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

fn greedy(prompt: &[u32]) -> Request {
    Request { ignore_eos: true, ..Request::new(prompt.to_vec(), GENERATE) }
}

fn sampled(prompt: &[u32], seed: u64) -> Request {
    let mut r = greedy(prompt);
    r.params.temperature = 0.9;
    r.params.top_p = 0.95;
    r.params.seed = Some(seed);
    r
}

/// Everything the test asks of one engine, in order: each prompt alone, greedy; the prompts
/// together (a batch); seeded sampling, together; a next turn after the first answer; and the
/// first prompt with a stop string (when one is given).
fn session(engine: &EngineHandle, stop: Option<&str>) -> (Vec<Answer>, Metrics) {
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
    let mut next_turn = bytes(PROMPTS[0]);
    next_turn.extend(&out[0].tokens);
    next_turn.extend(bytes("\n# and again\n"));
    out.push(answer(engine, greedy(&next_turn)));
    if let Some(stop) = stop {
        let mut r = greedy(&bytes(PROMPTS[0]));
        r.stop = vec![stop.to_string()];
        out.push(answer(engine, r));
    }
    (out, common::engine::wait_idle(engine))
}

fn engine(dir: &std::path::Path, mode: Mode) -> EngineHandle {
    let speculative = SpeculativeConfig { mode, draft_tokens: 6 };
    common::engine::start(dir, EngineConfig { speculative, ..Default::default() })
}

#[test]
fn drafting_changes_no_output_on_any_architecture() {
    let _mlx = common::mlx_lock();
    let (mut drafted, mut accepted, mut stops) = (0, 0, 0);
    for (arch, options) in synthetic::engine_variants() {
        let dir = tempfile::tempdir().unwrap();
        synthetic::write_tiny_model_with(dir.path(), arch, 7, &options).unwrap();
        let name = format!("{}{}", arch.model_type(), if options.moe { " (moe)" } else { "" });

        let plain = engine(dir.path(), Mode::Off);
        let (first, _) = session(&plain, None);
        // A stop string from the middle of the first answer, where drafts run.
        let chars: Vec<char> = first[0].text.chars().collect();
        let stop: Option<String> = (chars.len() >= 16).then(|| chars[10..13].iter().collect());
        let (want, off) = session(&plain, stop.as_deref());
        drop(plain);
        assert_eq!(off.draft_tokens_total, 0, "{name}: drafted with speculative decoding off");

        let drafting = engine(dir.path(), Mode::Ngram);
        let (got, on) = session(&drafting, stop.as_deref());
        drop(drafting);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: answer {i} differs with drafting on");
        }
        println!(
            "{name:<20} drafted {:>4}, accepted {:>4}, verify steps {:>3}",
            on.draft_tokens_total, on.draft_accepted_total, on.verify_steps_total
        );
        if arch.is_hybrid() {
            assert_eq!(on.draft_tokens_total, 0, "{name}: a recurrent model drafted");
            continue;
        }
        assert!(on.draft_tokens_total > 0, "{name}: nothing was drafted");
        drafted += on.draft_tokens_total;
        accepted += on.draft_accepted_total;
        if let (Some(stop), Some(last)) = (&stop, got.last()) {
            assert_eq!(last.reason, FinishReason::Stop, "{name}: the stop string {stop:?} did not end it");
            stops += 1;
        }
    }
    println!("all: drafted {drafted}, accepted {accepted}; stop strings checked on {stops} models");
    // Accepted runs happened (else the realignment of rows keeping several columns is untested).
    assert!(accepted > 50, "only {accepted} drafted tokens were accepted");
    assert!(stops > 3, "the stop-string case ran on {stops} models only");
}
