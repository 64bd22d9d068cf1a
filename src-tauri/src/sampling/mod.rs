//! Choosing the next token from logits (greedy or sampled, with penalties), and finding stop
//! strings in the generated text. Pure Rust on the host: one row of logits per sequence, so every
//! sequence of a batch can have its own parameters and seed.

mod params;
mod rng;
mod sampler;
mod stop;

pub use params::{InvalidParam, SamplingParams};
pub use rng::Rng;
pub use sampler::{argmax, top_logprobs, Sampled, Sampler};
pub use stop::{StopMatch, StopMatcher};
