//! An engine on a model folder for the engine tests: started, run a request on, waited for.

use std::path::Path;
use std::time::Duration;

use fastmlx::engine::{EngineConfig, EngineHandle, FinishReason, Metrics, Request};
use fastmlx::model::{load_model_with, LoadOptions};

use super::{collect, wait_idle_within, Outcome};

/// An engine serving the model in `dir`, loaded as `load_model` does.
pub fn start(dir: &Path, config: EngineConfig) -> EngineHandle {
    start_with(dir, config, LoadOptions::default())
}

/// An engine serving the model in `dir`, loaded with `options` (its weights' form).
pub fn start_with(dir: &Path, config: EngineConfig, options: LoadOptions) -> EngineHandle {
    let path = dir.to_path_buf();
    EngineHandle::start(config, move || load_model_with(&path, &fastmlx::mlx::Backend::init(), &options)).unwrap()
}

/// Greedy, exactly `max_tokens` tokens (EOS does not stop it).
pub fn request(prompt: &[u32], max_tokens: usize) -> Request {
    Request { ignore_eos: true, ..Request::new(prompt.to_vec(), max_tokens) }
}

/// Runs [`request`] to its end, which must be its length limit.
pub fn run(engine: &EngineHandle, prompt: &[u32], max_tokens: usize) -> Outcome {
    let outcome = collect(engine.submit(request(prompt, max_tokens)).unwrap());
    assert_eq!(outcome.finish.reason, FinishReason::Length, "{:?}", outcome.finish);
    outcome
}

/// The metrics once the engine has nothing left to do (the last finish event can arrive a
/// moment before the step that sent it publishes its metrics); fails the test after 30 s.
pub fn wait_idle(engine: &EngineHandle) -> Metrics {
    wait_idle_within(engine, Duration::from_secs(30))
}
