//! A model pulled from a (fake) Hub through the admin API, end to end: progress streamed as
//! server-sent events, a cut connection resumed, the model invisible until every file is
//! verified, then listed as FastMLX's own, loaded by a chat request that names it, and deleted
//! without `force`. Also: a failing pull, and a cancelled one resumed by pulling again.

// Each test holds the MLX lock for its whole body, awaits included.
#![allow(clippy::await_holding_lock)]

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::fake_hub::{FakeHub, FakeRepo};
use fastmlx::fixtures::synthetic;
use fastmlx::model::Arch;
use fastmlx::server::{app, AppState, ServerConfig};
use fastmlx::store::hub::HubClient;
use fastmlx::store::{Catalog, Residency, ResidencyConfig, StorePaths};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const REPO: &str = "test-org/tiny-llama";
const WEIGHTS: &str = "model.safetensors";

/// A real (tiny, random) model as a Hub repo: every file `write_tiny_model` writes.
fn tiny_repo() -> FakeRepo {
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), Arch::Llama, 3, None).unwrap();
    let files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    assert!(files.iter().any(|(n, _)| n == WEIGHTS), "the tiny model has {WEIGHTS}");
    let mut with_extras: Vec<(&str, Vec<u8>)> = files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    with_extras.push(("README.md", b"# tiny\n".to_vec()));
    FakeRepo::new(REPO, with_extras)
}

fn request(method: &str, uri: &str, body: Value) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/json")
        .body(if body.is_null() { Body::empty() } else { Body::from(body.to_string()) })
        .unwrap()
}

async fn send(state: &AppState, req: Request<Body>) -> (StatusCode, String) {
    let response = app(state.clone()).oneshot(req).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn events(sse: &str) -> Vec<Value> {
    sse.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect()
}

fn state(models_dir: &std::path::Path, hub: &FakeHub) -> AppState {
    let residency = Residency::new(Catalog::new(StorePaths::only(models_dir)), ResidencyConfig::default());
    AppState::with_hub(residency, ServerConfig::default(), HubClient::new(&hub.url, None))
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_resume_list_load_chat_delete() {
    let _mlx = common::mlx_lock();
    let hub = FakeHub::start(vec![tiny_repo()]).await;
    let size = hub.repo(REPO).file(WEIGHTS).len() as u64;
    // The weights' first response is cut a third of the way in: the pull resumes it.
    hub.knobs().cuts.insert(WEIGHTS.into(), [size / 3].into());
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), &hub);

    let (status, sse) = send(&s, request("POST", "/admin/pull", json!({"repo": REPO}))).await;
    assert_eq!(status, StatusCode::OK, "{sse}");
    let events = events(&sse);
    let last = events.last().unwrap();
    assert_eq!(last["state"], "done", "{sse}");
    assert_eq!(last["id"], REPO);
    assert_eq!(last["progress"]["done"], last["progress"]["total"]);
    assert!(
        hub.bytes_served(WEIGHTS) < size + size / 2,
        "resumed, not refetched: {} of {size}",
        hub.bytes_served(WEIGHTS)
    );
    let ranged = hub.file_requests(WEIGHTS).iter().filter(|r| r.range.is_some()).count();
    assert!(ranged >= 1, "the second request asked for the rest with Range");
    assert!(!dir.path().join(REPO).join("README.md").exists(), "only the files a model needs");
    assert!(!dir.path().join(".downloads/test-org--tiny-llama").exists(), "staging cleaned up");

    let (_, list) = send(&s, request("GET", "/admin/models", Value::Null)).await;
    let list: Value = serde_json::from_str(&list).unwrap();
    let entry = list.as_array().unwrap().iter().find(|m| m["id"] == REPO).expect("listed");
    assert_eq!(
        (entry["owned"].as_bool(), entry["loaded"].as_bool(), entry["architecture"].as_str()),
        (Some(true), Some(false), Some("llama"))
    );
    assert!(entry["unloadable_reason"].is_null(), "{entry}");

    let chat = json!({"model": REPO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let (status, body) = send(&s, request("POST", "/v1/chat/completions", chat)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = send(&s, request("DELETE", &format!("/admin/models/{REPO}"), Value::Null)).await;
    assert_eq!(status, StatusCode::OK, "FastMLX's own download needs no force: {body}");
    assert!(!dir.path().join(REPO).exists());
    assert!(s.models.loaded().is_empty(), "unloaded before deleting");
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_and_cancelled_pulls() {
    let _mlx = common::mlx_lock();
    let hub = FakeHub::start(vec![tiny_repo()]).await;
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), &hub);
    let (status, sse) = send(&s, request("POST", "/admin/pull", json!({"repo": "test-org/missing"}))).await;
    assert_eq!(status, StatusCode::OK);
    let last = events(&sse).pop().unwrap();
    assert_eq!(last["state"], "failed", "{sse}");
    assert!(last["message"].as_str().unwrap().contains("test-org/missing"), "{last}");

    // Slow enough to cancel midway.
    hub.knobs().chunk_delay = Some(Duration::from_millis(30));
    let watch = s.pulls.start(fastmlx::store::PullRequest { repo: REPO.into(), revision: "main".into(), gguf: None });
    while watch.progress.borrow().file != WEIGHTS || watch.progress.borrow().file_done == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = send(&s, request("POST", "/admin/pull/cancel", json!({"repo": REPO}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(watch.clone().finished().await, fastmlx::store::PullState::Cancelled);
    assert!(s.models.catalog().find(REPO).is_err(), "never visible half-downloaded");
    let (status, _) = send(&s, request("POST", "/admin/pull/cancel", json!({"repo": REPO}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing left to cancel");

    hub.knobs().chunk_delay = None;
    hub.reset_stats();
    let (_, sse) = send(&s, request("POST", "/admin/pull", json!({"repo": REPO}))).await;
    assert_eq!(events(&sse).pop().unwrap()["state"], "done", "{sse}");
    let size = hub.repo(REPO).file(WEIGHTS).len() as u64;
    assert!(
        hub.bytes_served(WEIGHTS) < size,
        "the second pull resumed the part: {} of {size}",
        hub.bytes_served(WEIGHTS)
    );
    assert!(s.models.catalog().find(REPO).is_ok());
}

/// Search results read each repo's `config.json` from the Hub: the model type, what the model
/// would serve on this machine (the planner's context and badge, as for a model on disk), or why
/// FastMLX cannot load it; GGUF repos (whose shape is in the weights) keep the size estimate.
/// A second search reads no config again.
#[tokio::test(flavor = "multi_thread")]
async fn search_results_say_what_a_repo_would_serve_here() {
    let unsupported = {
        let config = json!({"model_type": "whisper", "d_model": 384}).to_string().into_bytes();
        FakeRepo::new("test-org/tiny-whisper", vec![("config.json", config), (WEIGHTS, vec![0; 4096])])
    };
    let mut gguf = FakeRepo::new("test-org/tiny-gguf", vec![("model-Q4_K_M.gguf", vec![0; 4096])]);
    gguf.library = Some("gguf".into());
    let hub = FakeHub::start(vec![tiny_repo(), unsupported, gguf]).await;
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), &hub);

    let (status, body) = send(&s, request("GET", "/admin/search?q=test-org&all=true", Value::Null)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let hits: Vec<Value> = serde_json::from_str(&body).unwrap();
    let hit = |id: &str| hits.iter().find(|h| h["id"] == id).unwrap_or_else(|| panic!("{id} in {body}")).clone();

    let tiny = hit(REPO);
    assert_eq!(tiny["model_type"], "llama");
    assert!(tiny["unsupported"].is_null(), "{tiny}");
    let plan = &tiny["plan"];
    assert_eq!(plan["rows"], 4, "{tiny}");
    assert!(plan["context_tokens"].as_u64().unwrap() > 0, "{tiny}");
    assert_eq!(tiny["fit"], plan["fit"], "the badge is the planner's");

    let whisper = hit("test-org/tiny-whisper");
    assert_eq!(whisper["model_type"], "whisper");
    assert_eq!(whisper["unsupported"], "FastMLX does not load the model type \"whisper\"");
    assert!(whisper["plan"].is_null());
    assert!(whisper["fit"].is_string(), "the size estimate stays: {whisper}");

    let gguf = hit("test-org/tiny-gguf");
    assert!(gguf["model_type"].is_null() && gguf["plan"].is_null(), "{gguf}");

    let configs = |hub: &FakeHub| hub.requests().iter().filter(|r| r.path.ends_with("/config.json")).count();
    assert_eq!(configs(&hub), 2, "one read per repo with safetensors, none for GGUF");
    let (status, _) = send(&s, request("GET", "/admin/search?q=test-org&all=true", Value::Null)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(configs(&hub), 2, "kept from the first search");
}

/// Discover's opening list needs no network: each recommended quantization with what it would
/// take and serve here, those on disk marked; and whether the Hub answers is asked apart.
#[tokio::test(flavor = "multi_thread")]
async fn recommendations_say_what_fits_here_and_what_is_on_disk() {
    let hub = FakeHub::start(vec![tiny_repo()]).await;
    let dir = tempfile::tempdir().unwrap();
    let on_disk = "mlx-community/Llama-3.2-3B-Instruct-4bit";
    synthetic::write_tiny_model(&dir.path().join(on_disk), Arch::Llama, 3, None).unwrap();
    let s = state(dir.path(), &hub);

    let (status, body) = send(&s, request("GET", "/admin/recommended", Value::Null)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["ceiling_bytes"], s.models.memory_budget());
    let uses = list["uses"].as_array().unwrap();
    let ids: Vec<&str> = uses.iter().filter_map(|u| u["id"].as_str()).collect();
    assert_eq!(ids, ["coding", "chat", "reasoning", "small", "embeddings"]);
    let models: Vec<&Value> = uses.iter().flat_map(|u| u["models"].as_array().unwrap()).collect();
    for model in &models {
        let choice = model["choice"].as_u64().unwrap() as usize;
        let offered = &model["quantizations"][choice];
        assert_eq!(model["fit"], offered["fit"], "{model}");
        assert!(offered["memory_needed_bytes"].as_u64().unwrap() > offered["weights_bytes"].as_u64().unwrap());
        let chat = model["kind"] == "chat";
        assert_eq!(offered["plan"].is_object(), chat, "a context plan for chat models only: {model}");
        let on_disk_here = offered["repo"] == on_disk;
        assert_eq!(offered["downloaded"], on_disk_here, "{offered}");
    }
    assert!(models.iter().any(|m| m["quantizations"][0]["downloaded"] == true), "the local one is marked");

    // A model's page, on disk and on the Hub: card, config summary, files, what it takes here.
    let (status, body) = send(&s, request("GET", &format!("/admin/model-info?id={on_disk}"), Value::Null)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let info: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((info["source"].as_str(), info["config"]["model_type"].as_str()), (Some("disk"), Some("llama")));
    assert!(info["files"].as_array().unwrap().iter().any(|f| f["name"] == "config.json"), "{info}");
    assert!(info["plan"]["context_tokens"].as_u64().unwrap() > 0 && info["kv_per_1k_tokens"]["kv8"].is_u64(), "{info}");
    let (status, body) = send(&s, request("GET", &format!("/admin/model-info?repo={REPO}"), Value::Null)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let info: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((info["source"].as_str(), info["readme"].as_str()), (Some("hub"), Some("# tiny\n")));
    assert_eq!(info["config"]["layers"], 2, "{info}");
    assert!(info["plan"].is_object() && info["files"].as_array().unwrap().len() >= 4, "{info}");
    for (uri, want) in [
        ("/admin/model-info?id=no-such-model", StatusCode::NOT_FOUND),
        ("/admin/model-info", StatusCode::BAD_REQUEST),
        ("/admin/model-info?repo=..%2Fetc", StatusCode::BAD_REQUEST),
        ("/admin/model-info?repo=test-org%2Fmissing", StatusCode::NOT_FOUND),
    ] {
        let (status, body) = send(&s, request("GET", uri, Value::Null)).await;
        assert_eq!(status, want, "{uri}: {body}");
    }

    let (status, body) = send(&s, request("GET", "/admin/hub", Value::Null)).await;
    assert_eq!(status, StatusCode::OK);
    let reach: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((reach["reachable"].as_bool(), reach["error"].is_null()), (Some(true), true), "{reach}");
    // Nothing listening: unreachable, with the cause.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let residency = Residency::new(Catalog::new(StorePaths::only(dir.path())), ResidencyConfig::default());
    let offline = AppState::with_hub(
        residency,
        ServerConfig::default(),
        HubClient::new(&format!("http://127.0.0.1:{port}"), None),
    );
    let (_, body) = send(&offline, request("GET", "/admin/hub", Value::Null)).await;
    let reach: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reach["reachable"], false, "{reach}");
    assert!(reach["error"].as_str().is_some_and(|e| !e.is_empty()), "{reach}");
}
