//! What a web page in the user's browser can and cannot make the local server do (the Origin
//! guard and CORS, agreeing), and model names over HTTP that never reach the file system.

#![allow(clippy::await_holding_lock)]

mod common;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use common::api::*;
use fastmlx::engine::EngineConfig;
use fastmlx::fixtures::synthetic;
use fastmlx::model::Arch;
use fastmlx::server::ServerConfig;
use serde_json::{json, Value};

/// A request as a page's `fetch` sends it: an `Origin`, and a "simple" content type, so no
/// preflight would stop it.
fn from_page(method: Method, uri: &str, origin: Option<&str>, body: &str) -> Request<Body> {
    let mut r = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::CONTENT_TYPE, "text/plain;charset=UTF-8");
    if let Some(origin) = origin {
        r = r.header(header::ORIGIN, origin);
    }
    r.body(Body::from(body.to_string())).unwrap()
}

/// Every state-changing route of every dialect and of the admin API.
fn state_changing(id: &str) -> Vec<(Method, String, String)> {
    let chat = json!({"model": id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    vec![
        (Method::POST, "/admin/settings".into(), json!({"keep_alive_secs": 1}).to_string()),
        (Method::POST, "/admin/unload".into(), json!({"model": id}).to_string()),
        (Method::POST, "/admin/cluster/take-back".into(), String::new()),
        (Method::POST, "/admin/load".into(), json!({"model": id}).to_string()),
        (Method::POST, "/admin/pull".into(), json!({"repo": "someone/some-model"}).to_string()),
        (Method::POST, "/admin/pull/cancel".into(), json!({"repo": "someone/some-model"}).to_string()),
        (Method::DELETE, format!("/admin/models/{id}?force=true"), String::new()),
        (Method::POST, "/v1/chat/completions".into(), chat.clone()),
        (Method::POST, "/v1/completions".into(), json!({"model": id, "prompt": "hi", "max_tokens": 2}).to_string()),
        (
            Method::POST,
            "/v1/messages".into(),
            json!({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string(),
        ),
        (Method::POST, "/v1/responses".into(), json!({"input": "hi", "max_output_tokens": 2}).to_string()),
        (
            Method::POST,
            "/api/chat".into(),
            json!({"model": id, "messages": [{"role": "user", "content": "hi"}], "stream": false}).to_string(),
        ),
        (Method::POST, "/api/generate".into(), json!({"model": id, "prompt": "hi", "stream": false}).to_string()),
        (Method::POST, "/api/pull".into(), json!({"model": "hf.co/someone/some-model", "stream": false}).to_string()),
        (Method::DELETE, "/api/delete".into(), json!({"model": id}).to_string()),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_pages_are_refused_with_nothing_changed() {
    let _mlx = common::mlx_lock();
    let config_dir = tempfile::tempdir().unwrap();
    let settings = config_dir.path().join("config.toml");
    std::fs::write(&settings, "port = 9000\n").unwrap();
    let h =
        harness(EngineConfig::default(), ServerConfig { settings_file: Some(settings.clone()), ..Default::default() })
            .await;
    for origin in ["https://evil.example", "null", "http://localhost.evil.example", "file://"] {
        for (method, uri, body) in state_changing(&h.id) {
            let (status, answer) = send(&h, from_page(method.clone(), &uri, Some(origin), &body)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{origin} {method} {uri}: {answer}");
            let answer: Value = serde_json::from_str(&answer).unwrap();
            // In the dialect's own envelope.
            if uri.starts_with("/api/") {
                assert!(answer["error"].as_str().unwrap().contains("not allowed"), "{uri}: {answer}");
            } else if uri.starts_with("/v1/messages") {
                assert_eq!(
                    (answer["type"].as_str(), answer["error"]["type"].as_str()),
                    (Some("error"), Some("permission_error")),
                    "{answer}"
                );
            } else {
                assert_eq!(answer["error"]["type"], "permission_error", "{uri}: {answer}");
            }
        }
    }
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), "port = 9000\n", "settings file untouched");
    assert_eq!(h.state.models.loaded().len(), 1, "the model is still loaded");
    assert!(h.state.pulls.list().is_empty(), "no pull started");
    let (_, s) = send_json(&h, get("/admin/settings")).await;
    assert!(s["keep_alive_secs"].is_null(), "settings unchanged: {s}");
    // Reads are refused too (a page must not even list the models or read the metrics).
    for uri in ["/v1/models", "/admin/status", "/metrics", "/api/tags"] {
        let (status, _) = send(&h, from_page(Method::GET, uri, Some("https://evil.example"), "")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{uri}");
    }
    // An <img> pointed at the API sends no Origin, but the browser marks it cross-site.
    let img = Request::get("/admin/search?q=x")
        .header(header::HOST, "127.0.0.1:8080")
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "no-cors");
    assert_eq!(send(&h, img.body(Body::empty()).unwrap()).await.0, StatusCode::FORBIDDEN);
    // A link to the UI from another site is a navigation, and opens the UI.
    let link = Request::get("/ui/")
        .header(header::HOST, "127.0.0.1:8080")
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate");
    assert_ne!(send(&h, link.body(Body::empty()).unwrap()).await.0, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread")]
async fn own_local_app_and_editor_origins_and_plain_clients_are_served() {
    let _mlx = common::mlx_lock();
    let h = harness(
        EngineConfig::default(),
        ServerConfig { allowed_origins: vec!["https://app.example".into()], ..Default::default() },
    )
    .await;
    let chat = json!({"model": h.id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    for origin in [
        Some("http://127.0.0.1:8080"),
        Some("http://localhost:5173"),
        Some("http://[::1]:3000"),
        Some("tauri://localhost"),
        Some("http://tauri.localhost"),
        Some("vscode-webview://1a2b3c"),
        Some("vscode-file://vscode-app"),
        Some("https://app.example"),
        None,
    ] {
        let (status, body) = send(&h, from_page(Method::POST, "/v1/chat/completions", origin, &chat)).await;
        assert_eq!(status, StatusCode::OK, "{origin:?}: {body}");
    }
    // A body with no Content-Type at all (curl -d with the header dropped) is served too.
    let bare = Request::post("/api/generate")
        .header(header::HOST, "localhost:11434")
        .body(Body::from(
            json!({"model": h.id, "prompt": "hi", "stream": false, "options": {"num_predict": 2}}).to_string(),
        ))
        .unwrap();
    let (status, body) = send(&h, bare).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // `*` trusts every page, explicitly.
    let open =
        harness(EngineConfig::default(), ServerConfig { allowed_origins: vec!["*".into()], ..Default::default() })
            .await;
    let (status, _) = send(&open, from_page(Method::GET, "/v1/models", Some("https://anything.example"), "")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn preflights_agree_with_the_guard() {
    let _mlx = common::mlx_lock();
    let h = harness(
        EngineConfig::default(),
        ServerConfig { allowed_origins: vec!["https://app.example".into()], ..Default::default() },
    )
    .await;
    let preflight = |origin: &str| {
        Request::builder()
            .method(Method::OPTIONS)
            .uri("/v1/chat/completions")
            .header(header::HOST, "127.0.0.1:8080")
            .header(header::ORIGIN, origin)
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
            .header(header::ACCESS_CONTROL_REQUEST_HEADERS, "content-type,authorization")
            .body(Body::empty())
            .unwrap()
    };
    for origin in ["http://localhost:5173", "https://app.example", "tauri://localhost", "http://127.0.0.1:8080"] {
        let response =
            tower::ServiceExt::oneshot(fastmlx::server::app(h.state.clone()), preflight(origin)).await.unwrap();
        assert!(response.status().is_success(), "{origin}: {}", response.status());
        assert_eq!(response.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], origin);
    }
    for origin in ["https://evil.example", "null"] {
        let response =
            tower::ServiceExt::oneshot(fastmlx::server::app(h.state.clone()), preflight(origin)).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{origin}");
        assert!(response.headers().get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none(), "{origin}");
    }
}

/// A path as a model name is never opened: an existing file and a missing one get the same
/// answer, so the API is no file-existence oracle.
#[tokio::test(flavor = "multi_thread")]
async fn paths_are_not_model_names() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let outside = tempfile::tempdir().unwrap();
    let real_model = outside.path().join("elsewhere");
    synthetic::write_tiny_model(&real_model, Arch::Llama, 2, None).unwrap();
    let existing =
        [real_model.to_string_lossy().into_owned(), "/etc/passwd".into(), "/".into(), "../../etc/passwd".into()];
    let missing = [
        outside.path().join("nope").to_string_lossy().into_owned(),
        "/etc/no-such-file".into(),
        "/nope/".into(),
        "../../etc/nope".into(),
    ];
    let answers = |name: String| {
        let requests = vec![
            post("/admin/load", json!({"model": name}).to_string()),
            post(
                "/v1/chat/completions",
                json!({"model": name, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            ),
            post("/v1/completions", json!({"model": name, "prompt": "hi"}).to_string()),
            post("/api/show", json!({"model": name}).to_string()),
            post("/api/generate", json!({"model": name, "prompt": "hi", "stream": false}).to_string()),
        ];
        (name, requests)
    };
    for (a, b) in existing.into_iter().zip(missing) {
        let (name_a, requests_a) = answers(a);
        let (name_b, requests_b) = answers(b);
        for (ra, rb) in requests_a.into_iter().zip(requests_b) {
            let uri = ra.uri().to_string();
            let (status_a, body_a) = send(&h, ra).await;
            let (status_b, body_b) = send(&h, rb).await;
            assert_eq!(status_a, StatusCode::NOT_FOUND, "{uri} {name_a}: {body_a}");
            assert_eq!(status_b, StatusCode::NOT_FOUND, "{uri} {name_b}: {body_b}");
            let same = body_a.replace(&name_a, "NAME") == body_b.replace(&name_b, "NAME");
            assert!(same, "{uri}: the answers tell the files apart:\n{body_a}\n{body_b}");
        }
    }
    assert_eq!(h.state.models.loaded().len(), 1, "nothing else was loaded");
}

/// A model given at start by a path outside the models folders stays known by its name after
/// an unload (the UI's Unload button does not strand it).
#[tokio::test(flavor = "multi_thread")]
async fn a_model_given_by_path_reloads_by_name() {
    let _mlx = common::mlx_lock();
    let h = default_harness().await;
    let outside = tempfile::tempdir().unwrap();
    let path = outside.path().join("my-model");
    synthetic::write_tiny_model(&path, Arch::Llama, 2, None).unwrap();
    let served = h.state.models.load_given(&path.to_string_lossy()).await.unwrap();
    assert_eq!(served.id, "my-model");
    let (status, body) = send_json(&h, post("/admin/unload", json!({"model": "my-model"}).to_string())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, list) = send_json(&h, get("/admin/models")).await;
    assert!(
        list.as_array().unwrap().iter().any(|m| m["id"] == "my-model" && m["loaded"] == false),
        "still listed: {list}"
    );
    let (status, body) = send_json(&h, post("/v1/chat/completions", chat(json!({"model": "my-model"})))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["model"], "my-model");
}
