//! Several models resident at once: loading on demand, unloading (MLX memory back where it
//! was), least-recently-used eviction within the memory budget, busy models never evicted,
//! refusal when a model cannot fit, and the idle time-out.

// Each test holds the MLX lock for its whole body, awaits included.
#![allow(clippy::await_holding_lock)]

mod common;

use std::path::Path;
use std::time::Duration;

use fastmlx::engine::{EngineConfig, Request};
use fastmlx::fixtures::synthetic;
use fastmlx::model::Arch;
use fastmlx::store::{Catalog, Residency, ResidencyConfig, ResidencyError, StorePaths};

const MB: u64 = 1 << 20;

fn models(dir: &Path) -> std::path::PathBuf {
    let models = dir.join("models");
    for (name, arch) in [("tiny-llama", Arch::Llama), ("tiny-qwen2", Arch::Qwen2), ("tiny-qwen3", Arch::Qwen3)] {
        synthetic::write_tiny_model(&models.join(name), arch, 1, None).unwrap();
    }
    models
}

/// Each tiny model takes its weights (tiny) plus a 256 MB KV budget: `budget_mb` decides how
/// many fit.
fn residency(models: &Path, budget_mb: u64, keep_alive: Option<Duration>) -> Residency {
    let config = ResidencyConfig {
        engine: EngineConfig { kv_budget_bytes: Some(256 << 20), ..Default::default() },
        memory_budget: budget_mb * MB,
        keep_alive,
        ..Default::default()
    };
    Residency::new(Catalog::new(StorePaths::only(models)), config)
}

fn loaded_ids(r: &Residency) -> Vec<String> {
    r.loaded().into_iter().map(|m| m.id).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn load_on_demand_and_unload_frees_mlx_memory() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let r = residency(&models(dir.path()), 4096, None);
    let before = fastmlx::mlx::memory_stats().active;
    let served = r.serve(Some("tiny-llama")).await.unwrap();
    assert_eq!(served.id, "tiny-llama");
    let weights = served.engine.model_info().weights_bytes;
    let loaded = fastmlx::mlx::memory_stats().active;
    assert!(loaded >= before + weights, "active {before} -> {loaded}, weights {weights}");
    // A request without a model goes to the most recently used one.
    assert_eq!(r.serve(None).await.unwrap().id, "tiny-llama");
    drop(served);
    r.unload("tiny-llama").await.unwrap();
    let after = fastmlx::mlx::memory_stats().active;
    assert!(after <= before, "MLX active memory back: {before} -> {loaded} -> {after}");
    assert!(loaded_ids(&r).is_empty());
    assert!(matches!(r.unload("tiny-llama").await, Err(ResidencyError::NotLoaded(_))));
    assert!(matches!(r.serve(None).await, Err(ResidencyError::NoModel)));
    assert!(matches!(r.serve(Some("no-such-model")).await, Err(ResidencyError::Catalog(_))));
}

#[tokio::test(flavor = "multi_thread")]
async fn least_recently_used_idle_model_is_evicted() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    // Room for two models' KV budgets, not three.
    let r = residency(&models(dir.path()), 600, None);
    r.serve(Some("tiny-llama")).await.unwrap();
    r.serve(Some("tiny-qwen2")).await.unwrap();
    r.serve(Some("tiny-llama")).await.unwrap(); // llama is now the most recent
    r.serve(Some("tiny-qwen3")).await.unwrap();
    assert_eq!(loaded_ids(&r), vec!["tiny-qwen3", "tiny-llama"], "qwen2, least recently used, made room");
    r.unload_all().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn busy_models_stay_and_a_model_that_cannot_fit_is_refused() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let r = residency(&models(dir.path()), 400, None);
    let llama = r.serve(Some("tiny-llama")).await.unwrap();
    let mut request = Request::new(vec![1, 2, 3], 100_000);
    request.ignore_eos = true;
    let stream = llama.engine.submit(request).unwrap();
    while llama.engine.snapshot().running == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let err = r.serve(Some("tiny-qwen2")).await.err().expect("no room while llama is busy");
    assert!(matches!(err, ResidencyError::NoRoom { .. }), "{err}");
    assert!(err.to_string().contains("tiny-llama"), "the message says who holds the memory: {err}");
    drop(stream);
    while llama.engine.snapshot().running > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    r.serve(Some("tiny-qwen2")).await.unwrap();
    assert_eq!(loaded_ids(&r), vec!["tiny-qwen2"]);
    let tiny = residency(&models(dir.path()), 100, None);
    let err = tiny.serve(Some("tiny-llama")).await.err().expect("100 MB cannot hold a 256 MB KV floor");
    assert!(matches!(err, ResidencyError::NoRoom { .. }) && loaded_ids(&tiny).is_empty(), "{err}");
    r.unload_all().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_models_unload_after_their_keep_alive() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let r = residency(&models(dir.path()), 4096, Some(Duration::from_millis(300)));
    r.serve(Some("tiny-llama")).await.unwrap();
    r.load("tiny-qwen2", Some(Duration::from_secs(3600))).await.unwrap();
    assert!(r.unload_idle().await.is_empty(), "not idle long enough yet");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(r.unload_idle().await, vec!["tiny-llama".to_string()]);
    assert_eq!(loaded_ids(&r), vec!["tiny-qwen2"], "its own keep_alive keeps qwen2");
    r.unload_all().await;
}

/// A draft model paired with a model (`--draft-model`) loads with it, counts in its footprint,
/// and goes with it; other models load without one.
#[tokio::test(flavor = "multi_thread")]
async fn a_draft_model_loads_and_unloads_with_its_model() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let config = ResidencyConfig {
        engine: EngineConfig { kv_budget_bytes: Some(256 << 20), ..Default::default() },
        memory_budget: 4096 * MB,
        drafts: vec![("tiny-qwen2".into(), "tiny-qwen3".into())],
        ..Default::default()
    };
    let r = Residency::new(Catalog::new(StorePaths::only(&models(dir.path()))), config);
    let before = fastmlx::mlx::memory_stats().active;
    let served = r.serve(Some("tiny-qwen2")).await.unwrap();
    let info = served.engine.model_info().clone();
    assert_eq!(info.draft_model.as_deref(), Some("tiny-qwen3"));
    let draft = r.serve(Some("tiny-qwen3")).await.unwrap();
    assert_eq!(draft.engine.model_info().draft_model, None, "a model loaded alone drafts with nothing");
    let draft_weights = draft.engine.model_info().weights_bytes;
    drop((served, draft));
    r.unload_all().await;
    let after = fastmlx::mlx::memory_stats().active;
    assert!(after <= before, "MLX active memory back with the draft unloaded: {before} -> {after}");
    let alone = residency(&dir.path().join("models"), 4096, None);
    let own = alone.serve(Some("tiny-qwen2")).await.unwrap().engine.model_info().weights_bytes;
    assert_eq!(info.weights_bytes, own + draft_weights, "the draft's weights count in the model's");
    alone.unload_all().await;
}

/// A model with a KV format of its own (`--model-kv`) is served with it; the others with the
/// server's.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_of_its_own_kv_format_is_served_with_it() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let server = fastmlx::model::KvFormat::from_settings(8, 32, 0).unwrap();
    let config = ResidencyConfig {
        engine: EngineConfig { kv_budget_bytes: Some(256 << 20), kv_format: server, ..Default::default() },
        memory_budget: 4096 * MB,
        model_kv: vec!["tiny-qwen2=4/32/100".parse().unwrap(), "tiny-llama=off".parse().unwrap()],
        ..Default::default()
    };
    let r = Residency::new(Catalog::new(StorePaths::only(&models(dir.path()))), config);
    let format = |id: &'static str| {
        let r = &r;
        async move { r.serve(Some(id)).await.unwrap().engine.config().kv_format }
    };
    assert_eq!(format("tiny-qwen2").await, fastmlx::model::KvFormat::from_settings(4, 32, 100).unwrap());
    assert_eq!(format("tiny-llama").await, fastmlx::model::KvFormat::FULL);
    r.unload_all().await;
    // The tiny Qwen3's heads are 48 wide: the server's group of 32 cannot split them, and the
    // load says so.
    let error = r.serve(Some("tiny-qwen3")).await.err().expect("refused");
    assert!(error.to_string().contains("does not divide the model's head size 48"), "{error}");
}
