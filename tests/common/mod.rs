//! Helpers shared by the integration tests: the HTTP API over a tiny model (`api`), an engine on
//! a model folder (`engine`), the fake Hugging Face Hub (`fake_hub`), machines on a network of
//! their own (`lan`), and small file helpers.
#![allow(dead_code)]

pub mod api;
pub mod drafting;
pub mod engine;
pub mod fake_hub;
#[cfg(target_os = "linux")]
pub mod lan;

/// An engine with a prefix cache of 1 GiB in RAM and 1 GiB on disk in `cache`, prefilling in
/// chunks of 48 tokens (so chunks cross the 64-token blocks' edges).
pub fn disk_config(cache: &std::path::Path) -> fastmlx::engine::EngineConfig {
    fastmlx::engine::EngineConfig {
        prefill_chunk: 48,
        prefix_cache_bytes: 1 << 30,
        prefix_cache_disk: Some((cache.to_path_buf(), 1 << 30)),
        ..Default::default()
    }
}

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use fastmlx::generate::{generate, GenerateRequest, Generation};
use fastmlx::mlx::Backend;
use fastmlx::model::LoadedModel;
use fastmlx::sampling::SamplingParams;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// MLX work from several test threads at once is serialised: one engine thread owns MLX in
/// the product, and the tests keep to that.
pub fn mlx_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn backend() -> Backend {
    Backend::init()
}

/// A file the setup script provides; a clear failure (never a skip) when it is missing.
pub fn setup_file(relative: &str) -> PathBuf {
    let path = root().join(relative);
    assert!(path.exists(), "{} is missing: run scripts/setup.sh --test", path.display());
    path
}

pub fn smollm2_gguf() -> PathBuf {
    setup_file(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Changes a model folder's `config.json` in place.
pub fn edit_config(dir: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(path, config.to_string()).unwrap();
}

/// Every file under `dir`, in its subfolders too (none when it does not exist).
pub fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

pub fn read_json(relative: &str) -> serde_json::Value {
    let path = root().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn ids(value: &serde_json::Value) -> Vec<u32> {
    value.as_array().expect("a list of ids").iter().map(|v| v.as_u64().expect("an id") as u32).collect()
}

/// Greedy decoding of exactly `max_tokens` tokens (EOS does not stop it).
pub fn greedy(model: &LoadedModel, prompt_ids: Vec<u32>, max_tokens: usize) -> Generation {
    let request = GenerateRequest {
        prompt_ids,
        params: SamplingParams::greedy(),
        max_tokens,
        stop: vec![],
        ignore_eos: true,
        kv_format: fastmlx::model::KvFormat::FULL,
    };
    generate(model, &request, |_| {}).expect("generation")
}

/// How long a command a test runs may take before the test fails (instead of hanging).
pub const COMMAND_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// `Command::output`, but killed, and the test failed with the command line, past [`COMMAND_LIMIT`].
pub trait OutputWithin {
    fn output_within(&mut self) -> std::process::Output;
}

impl OutputWithin for std::process::Command {
    fn output_within(&mut self) -> std::process::Output {
        use std::io::Read;
        use std::process::Stdio;
        let what = format!("{self:?}");
        let mut child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // Read both pipes while waiting, so a chatty child never blocks on a full pipe.
        let read = |mut pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                bytes
            })
        };
        let stdout = read(Box::new(child.stdout.take().expect("piped")));
        let stderr = read(Box::new(child.stderr.take().expect("piped")));
        let deadline = std::time::Instant::now() + COMMAND_LIMIT;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what}: still running after {COMMAND_LIMIT:?}; killed");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        std::process::Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
    }
}

/// The engine's metrics once it has nothing left to do (the last finish event can arrive a moment
/// before the step that sent it publishes its metrics); fails the test past `limit`.
pub fn wait_idle_within(
    engine: &fastmlx::engine::EngineHandle,
    limit: std::time::Duration,
) -> fastmlx::engine::Metrics {
    let mut metrics = engine.metrics();
    let deadline = std::time::Instant::now() + limit;
    loop {
        let m = metrics.borrow_and_update().clone();
        if m.running == 0 && m.queued == 0 {
            return m;
        }
        assert!(std::time::Instant::now() < deadline, "the engine did not go idle: {m:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A request's streamed tokens and how it finished.
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub finish: fastmlx::engine::Finish,
}

/// Reads a request's stream to its end.
pub fn collect(mut stream: fastmlx::engine::RequestStream) -> Outcome {
    use fastmlx::engine::Event;
    let mut tokens = Vec::new();
    loop {
        match stream.blocking_recv().expect("a finish event") {
            Event::Delta { token, .. } => tokens.push(token),
            Event::Finish(finish) => return Outcome { tokens, finish },
        }
    }
}
