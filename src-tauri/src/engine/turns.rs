//! Turns on the one device between the chat engines and the encoder engines (embeddings,
//! reranking). Chat steps run as they always have, side by side; an encoder batch runs alone, in
//! the gap after the chat steps running when it asked (a waiting batch holds new steps back until
//! it has had its turn), so the two never fight over the GPU or the CPU's cores. While chat
//! decodes, an encoder batch is sized to half a decode step (`encoder_budget`): a token's latency
//! grows by at most half, whatever the embedding traffic. With no chat decoding, batches run
//! unbounded.

use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// An encoder batch may take this share of a decode step.
pub const ENCODER_SHARE: f64 = 0.5;
/// Chat counts as decoding for this long after its last decode step.
const DECODING_RECENTLY: Duration = Duration::from_millis(500);

#[derive(Default)]
struct State {
    /// Chat steps running now.
    chat_steps: usize,
    /// An encoder batch runs now.
    encoder_running: bool,
    /// Encoder batches waiting: new chat steps wait for them.
    encoders_waiting: usize,
    /// Recent decode steps' duration (exponential average), and when the last one ended.
    decode_step: Option<Duration>,
    last_decode: Option<Instant>,
}

#[derive(Default)]
pub struct DeviceTurns {
    state: Mutex<State>,
    changed: Condvar,
}

/// The process's turns: one device, whatever the engines.
pub fn device_turns() -> &'static DeviceTurns {
    static TURNS: OnceLock<DeviceTurns> = OnceLock::new();
    TURNS.get_or_init(DeviceTurns::default)
}

/// Held while a chat step or an encoder batch runs.
pub struct Turn<'a> {
    turns: &'a DeviceTurns,
    encoder: bool,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut state = self.turns.lock();
        if self.encoder {
            state.encoder_running = false;
        } else {
            state.chat_steps -= 1;
        }
        self.turns.changed.notify_all();
    }
}

impl DeviceTurns {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A chat engine's step: waits while an encoder batch runs or waits for its turn.
    pub fn chat_step(&self) -> Turn<'_> {
        let mut state = self.lock();
        while state.encoder_running || state.encoders_waiting > 0 {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.chat_steps += 1;
        Turn { turns: self, encoder: false }
    }

    /// An encoder batch: waits until the chat steps running now are done.
    pub fn encoder_batch(&self) -> Turn<'_> {
        let mut state = self.lock();
        state.encoders_waiting += 1;
        while state.encoder_running || state.chat_steps > 0 {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.encoders_waiting -= 1;
        state.encoder_running = true;
        Turn { turns: self, encoder: true }
    }

    /// A chat engine decoded a step in `took`.
    pub fn record_decode(&self, took: Duration) {
        let mut state = self.lock();
        state.decode_step = Some(match state.decode_step {
            Some(avg) => avg.mul_f64(0.8) + took.mul_f64(0.2),
            None => took,
        });
        state.last_decode = Some(Instant::now());
    }

    /// How long the next encoder batch may take: half a recent decode step while chat decodes,
    /// unbounded (`None`) otherwise.
    pub fn encoder_budget(&self) -> Option<Duration> {
        let state = self.lock();
        let decoding = state.last_decode.is_some_and(|t| t.elapsed() < DECODING_RECENTLY);
        decoding.then(|| state.decode_step.unwrap_or_default().mul_f64(ENCODER_SHARE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_waiting_encoder_batch_runs_between_chat_steps_and_alone() {
        let turns = Arc::new(DeviceTurns::default());
        let chat = turns.chat_step();
        // A second chat step runs beside the first (chat engines never wait on each other).
        let other_chat = turns.chat_step();
        drop(other_chat);
        let ran = Arc::new(AtomicBool::new(false));
        let encoder = {
            let (turns, ran) = (turns.clone(), ran.clone());
            std::thread::spawn(move || {
                let _turn = turns.encoder_batch();
                ran.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
            })
        };
        // Until the encoder's thread asks for its turn (however slow the machine).
        while turns.lock().encoders_waiting == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(!ran.load(Ordering::SeqCst), "the encoder waits for the running chat step");
        drop(chat);
        // The next chat step waits for the encoder batch that was waiting.
        let began = Instant::now();
        let _next = turns.chat_step();
        assert!(ran.load(Ordering::SeqCst), "the encoder had its turn before the next chat step");
        assert!(began.elapsed() >= Duration::from_millis(40), "and the chat step waited for it");
        encoder.join().unwrap();
    }

    #[test]
    fn the_budget_is_half_a_recent_decode_step() {
        let turns = DeviceTurns::default();
        assert_eq!(turns.encoder_budget(), None, "no chat decoding: unbounded");
        turns.record_decode(Duration::from_millis(40));
        assert_eq!(turns.encoder_budget(), Some(Duration::from_millis(20)));
    }
}
