//! A fake Hugging Face Hub on 127.0.0.1 for the download tests: the model API (with `blobs=true`),
//! model search and file downloads in the real Hub's shapes (Range → 206 + Content-Range, 416,
//! ETag, Content-Length, `X-Error-Code`), LFS files redirected to a "CDN" on another host name,
//! and knobs, changeable while it runs, to make it fail the ways the real one can.

// Handlers answer errors as ready HTTP responses (axum's way); their size does not matter here.
#![allow(clippy::result_large_err)]
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

const CHUNK: usize = 64 << 10;

pub struct FakeRepo {
    pub id: String,
    pub sha: String,
    pub files: BTreeMap<String, Bytes>,
    pub gated: bool,
    pub downloads: u64,
    pub likes: u64,
    pub tags: Vec<String>,
    pub library: Option<String>,
}

impl FakeRepo {
    pub fn new(id: &str, files: Vec<(&str, Vec<u8>)>) -> FakeRepo {
        FakeRepo {
            id: id.to_string(),
            sha: sha256_hex(id.as_bytes())[..40].to_string(),
            files: files.into_iter().map(|(name, bytes)| (name.to_string(), Bytes::from(bytes))).collect(),
            gated: false,
            downloads: 0,
            likes: 0,
            tags: vec![],
            library: None,
        }
    }

    pub fn file(&self, name: &str) -> &[u8] {
        self.files.get(name).unwrap_or_else(|| panic!("{} has no {name}", self.id))
    }
}

/// As on the Hub, weights are LFS files: listed with a sha256, served from the CDN.
pub fn is_lfs(name: &str) -> bool {
    name.ends_with(".safetensors") || name.ends_with(".gguf") || name.ends_with(".bin")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corruption {
    Once,
    Always,
}

#[derive(Default)]
pub struct Knobs {
    /// The one valid token: requests without it get 401.
    pub require_token: Option<String>,
    /// Tokens that accepted the license of gated repos: other tokens get 403 on their files, no
    /// token 401.
    pub gated_access: Vec<String>,
    /// Per file: the bytes each next response sends before the connection is cut, one per response.
    pub cuts: HashMap<String, VecDeque<u64>>,
    /// Per file, once `cuts` is used up: cut every response after that many bytes.
    pub cut_always: HashMap<String, u64>,
    /// Per file: one byte flipped in the next response, or in all of them.
    pub corrupt: HashMap<String, Corruption>,
    /// Answer 200 with the whole file to Range requests.
    pub ignore_range: bool,
    /// A pause before each 64 KiB chunk: slow enough to cancel midway.
    pub chunk_delay: Option<Duration>,
}

#[derive(Clone, Debug)]
pub struct Logged {
    pub path: String,
    pub query: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
    pub status: u16,
}

#[derive(Default)]
struct Stats {
    requests: Vec<Logged>,
    bytes_served: HashMap<String, u64>,
}

struct Shared {
    repos: Vec<FakeRepo>,
    knobs: Mutex<Knobs>,
    stats: Mutex<Stats>,
    cdn_url: String,
}

pub struct FakeHub {
    /// The API and `resolve` URLs, on 127.0.0.1.
    pub url: String,
    /// Where LFS files are redirected: the same server under the name `localhost`, another
    /// host for the client (so it must not send the token there).
    pub cdn_url: String,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeHub {
    pub async fn start(repos: Vec<FakeRepo>) -> FakeHub {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let cdn_url = format!("http://localhost:{port}");
        let shared =
            Arc::new(Shared { repos, knobs: Mutex::default(), stats: Mutex::default(), cdn_url: cdn_url.clone() });
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("the fake hub serves");
        });
        FakeHub { url: format!("http://127.0.0.1:{port}"), cdn_url, shared, server }
    }

    pub fn repo(&self, id: &str) -> &FakeRepo {
        self.shared.repos.iter().find(|r| r.id == id).unwrap_or_else(|| panic!("no repo {id}"))
    }

    pub fn knobs(&self) -> MutexGuard<'_, Knobs> {
        self.shared.knobs.lock().unwrap()
    }

    pub fn requests(&self) -> Vec<Logged> {
        self.shared.stats.lock().unwrap().requests.clone()
    }

    /// Requests for one file (`resolve` and CDN both), in order.
    pub fn file_requests(&self, file: &str) -> Vec<Logged> {
        let resolve = format!("/{file}");
        self.requests()
            .into_iter()
            .filter(|r| (r.path.contains("/resolve/") || r.path.starts_with("/cdn/")) && r.path.ends_with(&resolve))
            .collect()
    }

    /// Body bytes sent for one file, cut responses included.
    pub fn bytes_served(&self, file: &str) -> u64 {
        self.shared.stats.lock().unwrap().bytes_served.get(file).copied().unwrap_or(0)
    }

    pub fn total_bytes_served(&self) -> u64 {
        self.shared.stats.lock().unwrap().bytes_served.values().sum()
    }

    pub fn reset_stats(&self) {
        *self.shared.stats.lock().unwrap() = Stats::default();
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn handle(State(hub): State<Arc<Shared>>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or("").to_string();
    let headers = request.headers().clone();
    let response = route(&hub, &path, &query, &headers);
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    hub.stats.lock().unwrap().requests.push(Logged {
        path,
        query,
        range: text(header::RANGE),
        authorization: text(header::AUTHORIZATION),
        status: response.status().as_u16(),
    });
    response
}

fn route(hub: &Arc<Shared>, path: &str, query: &str, headers: &HeaderMap) -> Response {
    let parts: Vec<String> = path.trim_start_matches('/').split('/').map(percent_decode).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    match parts.as_slice() {
        ["api", "models"] => search(hub, query),
        ["api", "models", org, name, "revision", revision] => {
            model_info(hub, &format!("{org}/{name}"), revision, query, headers)
        }
        ["cdn", org, name, file @ ..] => match find_repo(hub, &format!("{org}/{name}")) {
            Ok(repo) => serve_file(hub, repo, &file.join("/"), headers),
            Err(refusal) => refusal,
        },
        [org, name, "resolve", revision, file @ ..] if !file.is_empty() => {
            resolve(hub, &format!("{org}/{name}"), revision, &file.join("/"), headers)
        }
        _ => error(StatusCode::NOT_FOUND, None, "no such route"),
    }
}

fn find_repo<'a>(hub: &'a Shared, id: &str) -> Result<&'a FakeRepo, Response> {
    hub.repos
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(|| error(StatusCode::NOT_FOUND, Some("RepoNotFound"), "Repository not found"))
}

/// The Hub's checks, in its order: a valid token where one is required, then the gate (files only).
fn check_access(hub: &Shared, repo: &FakeRepo, headers: &HeaderMap, files: bool) -> Result<(), Response> {
    let knobs = hub.knobs.lock().unwrap();
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    if let Some(valid) = &knobs.require_token {
        match &token {
            None => return Err(error(StatusCode::UNAUTHORIZED, Some("RepoNotFound"), "Repository not found")),
            Some(t) if t != valid => {
                return Err(error(StatusCode::UNAUTHORIZED, None, "Invalid credentials in Authorization header"))
            }
            _ => {}
        }
    }
    if files && repo.gated {
        match &token {
            None => {
                return Err(error(
                    StatusCode::UNAUTHORIZED,
                    Some("GatedRepo"),
                    "Access to this model is restricted: you must be authenticated",
                ))
            }
            Some(t) if !knobs.gated_access.contains(t) => {
                return Err(error(
                    StatusCode::FORBIDDEN,
                    Some("GatedRepo"),
                    "Access to this model is restricted: accept the conditions",
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

fn known_revision(repo: &FakeRepo, revision: &str) -> Result<(), Response> {
    if revision == "main" || revision == repo.sha {
        Ok(())
    } else {
        Err(error(StatusCode::NOT_FOUND, Some("RevisionNotFound"), "Invalid rev id"))
    }
}

fn model_info(hub: &Shared, id: &str, revision: &str, query: &str, headers: &HeaderMap) -> Response {
    let checked = find_repo(hub, id)
        .and_then(|repo| check_access(hub, repo, headers, false).map(|()| repo))
        .and_then(|repo| known_revision(repo, revision).map(|()| repo));
    let repo = match checked {
        Ok(repo) => repo,
        Err(refusal) => return refusal,
    };
    // As on the Hub, sizes and LFS hashes only with `blobs=true`.
    let blobs = query_pairs(query).iter().any(|(k, v)| k == "blobs" && v == "true");
    let siblings: Vec<Value> = repo
        .files
        .iter()
        .map(|(name, bytes)| {
            let mut sibling = json!({"rfilename": name});
            if blobs {
                sibling["blobId"] = json!(&sha256_hex(bytes)[..40]);
                sibling["size"] = json!(bytes.len());
                if is_lfs(name) {
                    sibling["lfs"] = json!({"sha256": sha256_hex(bytes), "size": bytes.len(), "pointerSize": 134});
                }
            }
            sibling
        })
        .collect();
    let mut model = model_json(repo);
    model.insert("siblings".into(), json!(siblings));
    axum::Json(Value::Object(model)).into_response()
}

fn model_json(repo: &FakeRepo) -> Map<String, Value> {
    let safetensor_bytes: usize =
        repo.files.iter().filter(|(n, _)| n.ends_with(".safetensors")).map(|(_, b)| b.len()).sum();
    let mut model = json!({
        "_id": &repo.sha[..24],
        "id": repo.id,
        "modelId": repo.id,
        "author": repo.id.split('/').next(),
        "sha": repo.sha,
        "lastModified": "2025-01-15T10:30:00.000Z",
        "private": false,
        "disabled": false,
        "gated": if repo.gated { json!("manual") } else { json!(false) },
        "downloads": repo.downloads,
        "likes": repo.likes,
        "tags": repo.tags,
        "library_name": repo.library,
        "createdAt": "2024-06-01T00:00:00.000Z",
    });
    if safetensor_bytes > 0 {
        // Pretend BF16: 2 bytes per element.
        model["safetensors"] = json!({"parameters": {"BF16": safetensor_bytes / 2}, "total": safetensor_bytes / 2});
    }
    // Names only, as in a listing (the revision endpoint adds sizes with `blobs=true`).
    model["siblings"] = repo.files.keys().map(|name| json!({"rfilename": name})).collect();
    if repo.files.keys().any(|n| n.ends_with(".gguf")) {
        model["gguf"] = json!({"total": 135_000_000, "architecture": "llama", "context_length": 8192});
    }
    match model {
        Value::Object(map) => map,
        _ => unreachable!(),
    }
}

/// `search` (substring of the id), `filter` (a tag), `sort=downloads`, `limit`, `expand` (only
/// those fields, plus the ids, as the Hub does).
fn search(hub: &Shared, query: &str) -> Response {
    let pairs = query_pairs(query);
    let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let expand: Vec<String> =
        pairs.iter().filter(|(k, _)| k == "expand" || k == "expand[]").map(|(_, v)| v.clone()).collect();
    let needle = get("search").unwrap_or_default().to_lowercase();
    let limit = get("limit").and_then(|l| l.parse().ok()).unwrap_or(usize::MAX);
    let mut repos: Vec<&FakeRepo> = hub
        .repos
        .iter()
        .filter(|r| r.id.to_lowercase().contains(&needle))
        .filter(|r| get("filter").is_none_or(|tag| r.tags.contains(&tag)))
        .collect();
    if get("sort").as_deref() == Some("downloads") {
        repos.sort_by_key(|r| std::cmp::Reverse(r.downloads));
    }
    let models: Vec<Value> = repos
        .into_iter()
        .take(limit)
        .map(|repo| {
            let mut model = model_json(repo);
            if !expand.is_empty() {
                model.retain(|key, _| key == "id" || key == "_id" || expand.contains(key));
            }
            Value::Object(model)
        })
        .collect();
    axum::Json(models).into_response()
}

fn resolve(hub: &Arc<Shared>, id: &str, revision: &str, file: &str, headers: &HeaderMap) -> Response {
    let repo = match find_repo(hub, id)
        .and_then(|repo| check_access(hub, repo, headers, true).map(|()| repo))
        .and_then(|repo| known_revision(repo, revision).map(|()| repo))
    {
        Ok(repo) => repo,
        Err(refusal) => return refusal,
    };
    if !repo.files.contains_key(file) {
        return error(StatusCode::NOT_FOUND, Some("EntryNotFound"), "Entry not found");
    }
    if is_lfs(file) {
        // The Hub sends LFS files from its CDN with a signed URL.
        let location = format!("{}/cdn/{}/{}?X-Amz-Signature=fake", hub.cdn_url, repo.id, file);
        let mut response = StatusCode::FOUND.into_response();
        response.headers_mut().insert(header::LOCATION, HeaderValue::from_str(&location).unwrap());
        response.headers_mut().insert("x-repo-commit", HeaderValue::from_str(&repo.sha).unwrap());
        return response;
    }
    serve_file(hub, repo, file, headers)
}

fn serve_file(hub: &Arc<Shared>, repo: &FakeRepo, file: &str, headers: &HeaderMap) -> Response {
    let Some(data) = repo.files.get(file).cloned() else {
        return error(StatusCode::NOT_FOUND, Some("EntryNotFound"), "Entry not found");
    };
    let len = data.len() as u64;
    let mut knobs = hub.knobs.lock().unwrap();
    let range = if knobs.ignore_range {
        None
    } else {
        headers.get(header::RANGE).and_then(|v| v.to_str().ok()).and_then(parse_range)
    };
    let start = range.unwrap_or(0);
    if range.is_some() && start >= len {
        let mut response = error(StatusCode::RANGE_NOT_SATISFIABLE, None, "Requested range not satisfiable");
        response.headers_mut().insert(header::CONTENT_RANGE, HeaderValue::from_str(&format!("bytes */{len}")).unwrap());
        return response;
    }
    let mut body = data.slice(start as usize..);
    let corrupt = match knobs.corrupt.get(file).copied() {
        Some(Corruption::Once) => knobs.corrupt.remove(file).is_some(),
        Some(Corruption::Always) => true,
        None => false,
    };
    if corrupt && !body.is_empty() {
        let mut bytes = body.to_vec();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xFF;
        body = Bytes::from(bytes);
    }
    let cut = match knobs.cuts.get_mut(file).and_then(VecDeque::pop_front) {
        Some(cut) => Some(cut),
        None => knobs.cut_always.get(file).copied(),
    };
    let delay = knobs.chunk_delay;
    drop(knobs);

    let body_len = body.len() as u64;
    let stream = body_stream(hub.clone(), file.to_string(), body, cut, delay);
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = if range.is_some() { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    let out = response.headers_mut();
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    out.insert(header::ETAG, HeaderValue::from_str(&format!("\"{}\"", sha256_hex(&data))).unwrap());
    out.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if range.is_some() {
        out.insert(header::CONTENT_RANGE, HeaderValue::from_str(&format!("bytes {start}-{}/{len}", len - 1)).unwrap());
    }
    response
}

/// The body in 64 KiB chunks, counted as they go; with `cut`, an error after that many bytes,
/// which makes the server drop the connection mid-body.
fn body_stream(
    hub: Arc<Shared>,
    file: String,
    body: Bytes,
    cut: Option<u64>,
    delay: Option<Duration>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let limit = cut.map_or(body.len(), |cut| (cut as usize).min(body.len()));
    let cut_short = limit < body.len();
    futures_util::stream::unfold(0usize, move |sent| {
        let (hub, file, body) = (hub.clone(), file.clone(), body.clone());
        async move {
            if sent >= limit {
                return cut_short.then(|| {
                    (Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fake hub: cut")), usize::MAX)
                });
            }
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let end = (sent + CHUNK).min(limit);
            *hub.stats.lock().unwrap().bytes_served.entry(file).or_default() += (end - sent) as u64;
            Some((Ok(body.slice(sent..end)), end))
        }
    })
}

/// `bytes=N-` or `bytes=N-M` (the end is ignored: the tests only ask for tails).
fn parse_range(value: &str) -> Option<u64> {
    value.strip_prefix("bytes=")?.split_once('-')?.0.trim().parse().ok()
}

fn error(status: StatusCode, code: Option<&str>, message: &str) -> Response {
    let mut response = (status, axum::Json(json!({"error": message}))).into_response();
    if let Some(code) = code {
        response.headers_mut().insert("x-error-code", HeaderValue::from_str(code).unwrap());
    }
    response.headers_mut().insert("x-error-message", HeaderValue::from_str(message).unwrap());
    response
}

fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(&key.replace('+', " ")), percent_decode(&value.replace('+', " ")))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes.get(i + 1..i + 3).filter(|_| bytes[i] == b'%');
        let hex = escaped.and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Deterministic pseudo-random bytes (xorshift), so tests need no RNG crate.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A file shaped like safetensors (header length, JSON header, BF16 data) of exactly `len` bytes.
pub fn fake_safetensors(len: usize, seed: u64) -> Vec<u8> {
    const HEADER: usize = 128;
    let data_len = len - 8 - HEADER;
    let header = format!(
        r#"{{"__metadata__":{{"format":"mlx"}},"w":{{"dtype":"BF16","shape":[{}],"data_offsets":[0,{}]}}}}"#,
        data_len / 2,
        data_len / 2 * 2
    );
    let mut bytes = (HEADER as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(format!("{header:<HEADER$}").as_bytes());
    bytes.extend(random_bytes(data_len, seed));
    bytes
}
