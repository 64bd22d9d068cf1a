//! The Hugging Face Hub's HTTP API, the part the model store needs: a repo's files with sizes and
//! LFS hashes, model search, and file bodies from a byte offset. Every failure becomes a
//! [`HubError`] that says what to do about it.
//!
//! Authorization: the token goes with every request to the Hub's own host. File downloads of LFS
//! files are redirected to a CDN on another host with a signed URL; reqwest drops the
//! `Authorization` header on such cross-host redirects (and keeps it on same-host ones, e.g. a
//! renamed repo), which is what the Hub expects.

use super::human_bytes;
use std::error::Error as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{HeaderMap, CONTENT_RANGE, RANGE};
use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HubError {
    #[error("{repo}: the Hub wants a valid access token (the repo is private or gated, or does not exist); set HF_TOKEN to a token from https://huggingface.co/settings/tokens")]
    Unauthorized { repo: String },
    #[error("{repo}: access denied: the repo is gated; accept its license on https://huggingface.co/{repo} with the account of your HF_TOKEN")]
    Forbidden { repo: String },
    #[error("{what} was not found on the Hub")]
    NotFound { what: String },
    #[error("the Hub answered HTTP {status}: {message}")]
    Http { status: u16, message: String },
    #[error("network error talking to the Hub: {0}")]
    Network(String),
    #[error("invalid Hub endpoint {endpoint:?} (HF_ENDPOINT): {reason}")]
    BadEndpoint { endpoint: String, reason: String },
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("not enough disk space: {} more needed, {} available", human_bytes(*needed), human_bytes(*available))]
    DiskFull { needed: u64, available: u64 },
    #[error("{file} is corrupt even after downloading it again: expected {expected}, got {actual}")]
    Corrupt { file: String, expected: String, actual: String },
    #[error("{repo}: {message}")]
    Selection { repo: String, message: String },
    #[error("the download was cancelled")]
    Cancelled,
}

impl HubError {
    /// Worth retrying: the connection failed, or the Hub is overloaded or briefly broken.
    pub fn is_transient(&self) -> bool {
        match self {
            HubError::Network(_) => true,
            HubError::Http { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

/// One file of a repo, as the Hub lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RemoteFile {
    /// Path inside the repo, `/`-separated.
    pub name: String,
    pub size: Option<u64>,
    /// Lowercase hex; only LFS files have one.
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepoInfo {
    pub id: String,
    /// The commit the listing describes: download from it so every file comes from one commit.
    pub sha: String,
    pub files: Vec<RemoteFile>,
    pub gated: bool,
    pub tags: Vec<String>,
    pub library: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchHit {
    pub id: String,
    pub downloads: u64,
    pub likes: u64,
    pub tags: Vec<String>,
    pub last_modified: Option<String>,
    pub library: Option<String>,
    pub gated: bool,
    /// Elements stored in the weights as the Hub counts them (safetensors or GGUF metadata); for
    /// packed quantized weights this is below the real parameter count.
    pub parameters: Option<u64>,
    /// Size of the safetensors weights, from the Hub's per-dtype element counts.
    pub storage_bytes: Option<u64>,
    /// How the weights are stored (`4-bit`, `BF16`, `GGUF Q4_K_M, Q8_0`), from the names, tags and
    /// dtypes the listing carries.
    pub quantization: Option<String>,
}

/// How a download retries a connection that fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Failed requests in a row, none of them fetching a byte, before giving up.
    pub attempts: u32,
    /// Wait after the first failure; doubled after each further one, up to 8 s.
    pub first_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 5, first_backoff: Duration::from_millis(500) }
    }
}

impl RetryPolicy {
    /// The wait after `failures` failed requests in a row (1 = the first failure).
    pub fn backoff(&self, failures: u32) -> Duration {
        let doubled = self.first_backoff.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
        doubled.min(Duration::from_secs(8))
    }
}

/// What the Hub sent for a file asked from some offset.
pub enum FileBody {
    Stream(FileStream),
    /// 416: nothing lies past the offset: the partial file is complete, or the file changed.
    PastEnd {
        file_size: Option<u64>,
    },
}

/// A file's bytes from `start` to its end, pulled chunk by chunk.
pub struct FileStream {
    /// Where the bytes begin: the offset asked for, or 0 when the server ignored the Range.
    pub start: u64,
    /// The whole file's size, when the server said.
    pub file_size: Option<u64>,
    response: reqwest::Response,
}

impl FileStream {
    /// The next bytes, `None` at the end; a connection cut mid-body is a [`HubError::Network`].
    pub async fn next_chunk(&mut self) -> Result<Option<impl AsRef<[u8]>>, HubError> {
        self.response.chunk().await.map_err(network_error)
    }
}

#[derive(Clone)]
pub struct HubClient {
    http: reqwest::Client,
    endpoint: String,
    token: Option<String>,
    retry: RetryPolicy,
}

impl HubClient {
    pub fn new(endpoint: &str, token: Option<String>) -> HubClient {
        let http = reqwest::Client::builder()
            .user_agent(concat!("fastmlx/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(20))
            // A stalled transfer errors out and is resumed rather than hanging forever.
            .read_timeout(Duration::from_secs(60))
            .build()
            .expect("the HTTP client builds (TLS backend available)");
        let token = token.map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
        HubClient { http, endpoint: endpoint.trim_end_matches('/').to_string(), token, retry: RetryPolicy::default() }
    }

    /// `HF_ENDPOINT` (default huggingface.co) and the token `huggingface-cli login` would use.
    pub fn from_env() -> HubClient {
        let env = |key: &str| std::env::var(key).ok();
        let endpoint =
            env("HF_ENDPOINT").filter(|e| !e.trim().is_empty()).unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        HubClient::new(&endpoint, find_token(&env, &|path| std::fs::read_to_string(path).ok()))
    }

    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> HubClient {
        self.retry = retry;
        self
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    /// Whether the Hub answers at all (any HTTP status counts) within `wait`: Discover says
    /// so when it does not (offline, a proxy), since only downloads need it.
    pub async fn reachable(&self, wait: Duration) -> Result<(), String> {
        let mut url = self.url(&["api", "models"]).map_err(|e| e.to_string())?;
        url.query_pairs_mut().append_pair("limit", "1");
        match tokio::time::timeout(wait, self.http.get(url).send()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                // The deepest cause says what happened ("failed to lookup address ...").
                let mut cause: &dyn std::error::Error = &e;
                while let Some(inner) = cause.source() {
                    cause = inner;
                }
                Err(cause.to_string())
            }
            Err(_) => Err(format!("no answer within {} s", wait.as_secs())),
        }
    }

    /// The repo's files (sizes, LFS sha256) at `revision`, and the commit that names.
    pub async fn repo_info(&self, repo: &str, revision: &str) -> Result<RepoInfo, HubError> {
        let mut url = self.url(&["api", "models"])?;
        push_path(&mut url, repo);
        url.path_segments_mut().expect("base URL").extend(["revision", revision]);
        url.query_pairs_mut().append_pair("blobs", "true");
        let what = format!("{repo} at revision {revision}");
        let response = self.send_expecting_success(self.http.get(url), repo, &what).await?;
        let model: WireModel = response.json().await.map_err(|e| unexpected_answer(&what, e))?;
        Ok(model.into_repo_info())
    }

    /// Models matching `query`, most downloaded first; `mlx_only` keeps those tagged `mlx`.
    pub async fn search(&self, query: &str, limit: usize, mlx_only: bool) -> Result<Vec<SearchHit>, HubError> {
        let mut url = self.url(&["api", "models"])?;
        {
            let mut pairs = url.query_pairs_mut();
            if !query.trim().is_empty() {
                pairs.append_pair("search", query.trim());
            }
            if mlx_only {
                pairs.append_pair("filter", "mlx");
            }
            pairs.append_pair("sort", "downloads");
            pairs.append_pair("limit", &limit.clamp(1, 1000).to_string());
            // With `expand` the Hub returns only these fields (and the id).
            for field in [
                "downloads",
                "likes",
                "tags",
                "lastModified",
                "library_name",
                "gated",
                "safetensors",
                "gguf",
                "siblings",
            ] {
                pairs.append_pair("expand", field);
            }
        }
        let response = self.send_expecting_success(self.http.get(url), "model search", "the model search").await?;
        let models: Vec<WireModel> = response.json().await.map_err(|e| unexpected_answer("the model search", e))?;
        Ok(models.into_iter().map(WireModel::into_search_hit).collect())
    }

    /// A file's bytes from `offset` on (`Range: bytes=offset-` when `offset > 0`).
    pub async fn open_file(&self, repo: &str, revision: &str, file: &str, offset: u64) -> Result<FileBody, HubError> {
        let mut url = self.url(&[])?;
        push_path(&mut url, repo);
        url.path_segments_mut().expect("base URL").extend(["resolve", revision]);
        push_path(&mut url, file);
        let mut request = self.http.get(url);
        if offset > 0 {
            request = request.header(RANGE, format!("bytes={offset}-"));
        }
        let what = format!("{file} in {repo} at revision {revision}");
        let response = self.send(request).await?;
        match response.status() {
            StatusCode::PARTIAL_CONTENT => {
                let range = content_range(response.headers()).ok_or_else(|| HubError::Http {
                    status: 206,
                    message: format!("{what}: a partial answer without a valid Content-Range"),
                })?;
                Ok(FileBody::Stream(FileStream { start: range.start, file_size: range.file_size, response }))
            }
            StatusCode::RANGE_NOT_SATISFIABLE if offset > 0 => {
                Ok(FileBody::PastEnd { file_size: content_range(response.headers()).and_then(|r| r.file_size) })
            }
            // 200: the whole file, also when a Range was asked for and ignored.
            status if status.is_success() => {
                Ok(FileBody::Stream(FileStream { start: 0, file_size: response.content_length(), response }))
            }
            _ => Err(refusal(response, repo, &what).await),
        }
    }

    /// A small file read whole (an index, a config), refused above `max_bytes`.
    pub async fn fetch_small_file(
        &self,
        repo: &str,
        revision: &str,
        file: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, HubError> {
        let FileBody::Stream(mut stream) = self.open_file(repo, revision, file, 0).await? else {
            return Err(HubError::Http { status: 416, message: format!("{file}: the Hub refused to send it") });
        };
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next_chunk().await? {
            bytes.extend_from_slice(chunk.as_ref());
            if bytes.len() as u64 > max_bytes {
                return Err(HubError::Http {
                    status: 200,
                    message: format!("{file} in {repo} is larger than {}", human_bytes(max_bytes)),
                });
            }
        }
        Ok(bytes)
    }

    fn url(&self, segments: &[&str]) -> Result<Url, HubError> {
        let bad = |reason: String| HubError::BadEndpoint { endpoint: self.endpoint.clone(), reason };
        let mut url = Url::parse(&self.endpoint).map_err(|e| bad(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("not an http(s) URL".into()));
        }
        url.path_segments_mut().expect("checked above").pop_if_empty().extend(segments);
        Ok(url)
    }

    /// Sends, with the token when there is one.
    async fn send(&self, mut request: reqwest::RequestBuilder) -> Result<reqwest::Response, HubError> {
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        request.send().await.map_err(network_error)
    }

    /// Sends; anything but a 2xx becomes an error about `repo` / `what`.
    async fn send_expecting_success(
        &self,
        request: reqwest::RequestBuilder,
        repo: &str,
        what: &str,
    ) -> Result<reqwest::Response, HubError> {
        let response = self.send(request).await?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(refusal(response, repo, what).await)
        }
    }
}

async fn refusal(response: reqwest::Response, repo: &str, what: &str) -> HubError {
    let (status, headers) = (response.status(), response.headers().clone());
    let body = response.text().await.unwrap_or_default();
    status_error(status, &headers, &body, repo, what)
}

/// Maps a refusal to an error, using the Hub's `X-Error-Code` where it sends one. The Hub answers
/// 401 also for repos that do not exist when no token is sent, so a 401 says both.
fn status_error(status: StatusCode, headers: &HeaderMap, body: &str, repo: &str, what: &str) -> HubError {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let code = header("x-error-code");
    match (status.as_u16(), code.as_str()) {
        (_, "RevisionNotFound" | "EntryNotFound") | (404, _) => HubError::NotFound { what: what.to_string() },
        (401, _) => HubError::Unauthorized { repo: repo.to_string() },
        (403, _) | (_, "GatedRepo") => HubError::Forbidden { repo: repo.to_string() },
        (status, _) => {
            let message = match header("x-error-message") {
                m if !m.is_empty() => m,
                _ => body.trim().chars().take(300).collect(),
            };
            HubError::Http { status, message: format!("{what}: {message}") }
        }
    }
}

/// Connection refused/reset, timeouts, DNS, a body cut short: the message with its causes.
fn network_error(error: reqwest::Error) -> HubError {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    HubError::Network(message)
}

fn unexpected_answer(what: &str, error: reqwest::Error) -> HubError {
    if error.is_decode() && error.source().is_some_and(|s| s.is::<serde_json::Error>()) {
        HubError::Http { status: 200, message: format!("unexpected answer for {what}: {error}") }
    } else {
        network_error(error)
    }
}

/// Appends a `/`-separated repo id or file path, each part percent-encoded on its own.
fn push_path(url: &mut Url, path: &str) {
    url.path_segments_mut().expect("base URL").extend(path.split('/'));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ContentRange {
    start: u64,
    file_size: Option<u64>,
}

/// `bytes 100-199/200` (and `bytes */200` for a 416, where start is meaningless).
fn parse_content_range(value: &str) -> Option<ContentRange> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    let (range, size) = rest.split_once('/')?;
    let file_size = match size.trim() {
        "*" => None,
        n => Some(n.parse().ok()?),
    };
    let start = match range.trim() {
        "*" => 0,
        r => r.split_once('-')?.0.trim().parse().ok()?,
    };
    Some(ContentRange { start, file_size })
}

fn content_range(headers: &HeaderMap) -> Option<ContentRange> {
    parse_content_range(headers.get(CONTENT_RANGE)?.to_str().ok()?)
}

/// The token the official client would use: `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, then the file
/// `huggingface-cli login` writes (`HF_TOKEN_PATH`, else `$HF_HOME/token`, else
/// `~/.cache/huggingface/token`). Blank values count as unset.
pub fn find_token(env: &dyn Fn(&str) -> Option<String>, read_file: &dyn Fn(&Path) -> Option<String>) -> Option<String> {
    let clean = |token: String| Some(token.trim().to_string()).filter(|t| !t.is_empty());
    env("HF_TOKEN")
        .and_then(clean)
        .or_else(|| env("HUGGING_FACE_HUB_TOKEN").and_then(clean))
        .or_else(|| token_path(env).and_then(|path| read_file(&path)).and_then(clean))
}

fn token_path(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |key: &str| env(key).filter(|v| !v.trim().is_empty());
    if let Some(path) = set("HF_TOKEN_PATH") {
        return Some(PathBuf::from(path));
    }
    if let Some(home) = set("HF_HOME") {
        return Some(PathBuf::from(home).join("token"));
    }
    let cache = set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(cache.join("huggingface").join("token"))
}

/// The Hub's model JSON, the fields used here (all optional: `expand` trims the answer).
#[derive(Deserialize)]
struct WireModel {
    id: String,
    sha: Option<String>,
    /// `false`, `"auto"` or `"manual"`.
    gated: Option<serde_json::Value>,
    tags: Option<Vec<String>>,
    library_name: Option<String>,
    siblings: Option<Vec<WireSibling>>,
    downloads: Option<u64>,
    likes: Option<u64>,
    #[serde(rename = "lastModified")]
    last_modified: Option<String>,
    safetensors: Option<WireSafetensors>,
    gguf: Option<WireGguf>,
}

#[derive(Deserialize)]
struct WireSibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<WireLfs>,
}

#[derive(Deserialize)]
struct WireLfs {
    sha256: Option<String>,
    size: Option<u64>,
}

#[derive(Deserialize)]
struct WireSafetensors {
    #[serde(default)]
    parameters: std::collections::BTreeMap<String, u64>,
    total: Option<u64>,
}

#[derive(Deserialize)]
struct WireGguf {
    total: Option<u64>,
}

impl WireModel {
    fn is_gated(&self) -> bool {
        !matches!(self.gated, None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)))
    }

    fn into_repo_info(self) -> RepoInfo {
        let gated = self.is_gated();
        let files = self
            .siblings
            .unwrap_or_default()
            .into_iter()
            .map(|s| {
                let lfs_size = s.lfs.as_ref().and_then(|l| l.size);
                let sha256 = s.lfs.and_then(|l| l.sha256).map(|h| h.to_ascii_lowercase());
                RemoteFile { name: s.rfilename, size: s.size.or(lfs_size), sha256 }
            })
            .collect();
        RepoInfo {
            id: self.id,
            sha: self.sha.unwrap_or_default(),
            files,
            gated,
            tags: self.tags.unwrap_or_default(),
            library: self.library_name,
        }
    }

    fn into_search_hit(self) -> SearchHit {
        let gated = self.is_gated();
        let storage_bytes = self.safetensors.as_ref().and_then(|s| {
            let bytes: Option<u64> =
                s.parameters.iter().map(|(dtype, count)| dtype_bytes(dtype).map(|b| b * count)).sum();
            bytes.filter(|b| *b > 0)
        });
        let tags = self.tags.unwrap_or_default();
        let files: Vec<String> = self.siblings.unwrap_or_default().into_iter().map(|s| s.rfilename).collect();
        let dtypes = self.safetensors.as_ref().map(|s| s.parameters.clone()).unwrap_or_default();
        let quantization = super::quant_label::quantization_label(&self.id, &tags, &dtypes, &files);
        let parameters = self.safetensors.and_then(|s| s.total).or(self.gguf.and_then(|g| g.total));
        SearchHit {
            id: self.id,
            downloads: self.downloads.unwrap_or(0),
            likes: self.likes.unwrap_or(0),
            tags,
            last_modified: self.last_modified,
            library: self.library_name,
            gated,
            parameters,
            storage_bytes,
            quantization,
        }
    }
}

/// Bytes per element of a safetensors dtype.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)], files: &[(&str, &str)]) -> Option<String> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let files: HashMap<PathBuf, String> = files.iter().map(|(k, v)| (PathBuf::from(k), v.to_string())).collect();
        find_token(&|key| vars.get(key).cloned(), &|path| files.get(path).cloned())
    }

    #[test]
    fn token_lookup_order() {
        let file = [("/home/me/.cache/huggingface/token", "hf_file\n")];
        assert_eq!(
            lookup(&[("HF_TOKEN", "hf_a"), ("HUGGING_FACE_HUB_TOKEN", "hf_b"), ("HOME", "/home/me")], &file).as_deref(),
            Some("hf_a")
        );
        assert_eq!(
            lookup(&[("HF_TOKEN", "  "), ("HUGGING_FACE_HUB_TOKEN", "hf_b"), ("HOME", "/home/me")], &file).as_deref(),
            Some("hf_b")
        );
        assert_eq!(lookup(&[("HOME", "/home/me")], &file).as_deref(), Some("hf_file"));
        assert_eq!(
            lookup(&[("HOME", "/home/me"), ("XDG_CACHE_HOME", "/xdg")], &[("/xdg/huggingface/token", "hf_xdg")])
                .as_deref(),
            Some("hf_xdg")
        );
        let hf_home = [("/hf/token", "hf_home"), ("/custom/tok", "hf_custom")];
        assert_eq!(lookup(&[("HF_HOME", "/hf"), ("HOME", "/home/me")], &hf_home).as_deref(), Some("hf_home"));
        assert_eq!(
            lookup(&[("HF_TOKEN_PATH", "/custom/tok"), ("HF_HOME", "/hf")], &hf_home).as_deref(),
            Some("hf_custom")
        );
        assert_eq!(lookup(&[("HOME", "/home/me")], &[("/home/me/.cache/huggingface/token", "\n")]), None);
        assert_eq!(lookup(&[], &file), None);
    }

    #[test]
    fn content_ranges() {
        assert_eq!(parse_content_range("bytes 100-199/200"), Some(ContentRange { start: 100, file_size: Some(200) }));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some(ContentRange { start: 5, file_size: None }));
        assert_eq!(parse_content_range("bytes */4096"), Some(ContentRange { start: 0, file_size: Some(4096) }));
        assert_eq!(parse_content_range("items 1-2/3"), None);
        assert_eq!(parse_content_range("bytes x-2/3"), None);
    }

    #[test]
    fn refusals_map_to_errors() {
        let with_code = |code: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("x-error-code", code.parse().unwrap());
            headers
        };
        let none = HeaderMap::new();
        let map = |status: u16, headers: &HeaderMap| {
            status_error(StatusCode::from_u16(status).unwrap(), headers, "nope", "org/m", "thing")
        };
        assert_eq!(map(401, &with_code("RepoNotFound")), HubError::Unauthorized { repo: "org/m".into() });
        assert_eq!(map(401, &with_code("GatedRepo")), HubError::Unauthorized { repo: "org/m".into() });
        assert_eq!(map(403, &with_code("GatedRepo")), HubError::Forbidden { repo: "org/m".into() });
        assert_eq!(map(404, &with_code("RepoNotFound")), HubError::NotFound { what: "thing".into() });
        assert_eq!(map(401, &with_code("EntryNotFound")), HubError::NotFound { what: "thing".into() });
        assert_eq!(map(400, &with_code("RevisionNotFound")), HubError::NotFound { what: "thing".into() });
        assert_eq!(map(503, &none), HubError::Http { status: 503, message: "thing: nope".into() });
        assert!(map(503, &none).is_transient() && map(429, &none).is_transient() && !map(400, &none).is_transient());
    }

    #[test]
    fn urls_keep_slashes_between_parts_and_encode_inside() {
        let client = HubClient::new("https://hub.example/mirror/", None);
        let mut url = client.url(&["api", "models"]).unwrap();
        push_path(&mut url, "org/model name");
        url.path_segments_mut().unwrap().extend(["revision", "refs/pr/1"]);
        assert_eq!(url.as_str(), "https://hub.example/mirror/api/models/org/model%20name/revision/refs%2Fpr%2F1");
        assert!(matches!(HubClient::new("not a url", None).url(&[]), Err(HubError::BadEndpoint { .. })));
        assert!(matches!(HubClient::new("mailto:me@example.com", None).url(&[]), Err(HubError::BadEndpoint { .. })));
    }

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        let policy = RetryPolicy { attempts: 5, first_backoff: Duration::from_millis(500) };
        let waits: Vec<u128> = (1..=6).map(|n| policy.backoff(n).as_millis()).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 8000]);
    }

    #[test]
    fn model_json_in_the_hubs_shapes() {
        let json = serde_json::json!({
            "id": "org/m", "sha": "abc", "gated": "manual", "tags": ["mlx"], "library_name": "mlx",
            "siblings": [
                {"rfilename": "config.json", "size": 10, "blobId": "x"},
                {"rfilename": "model.safetensors", "size": 20, "lfs": {"sha256": "ABCD", "size": 20, "pointerSize": 134}},
                {"rfilename": "old.bin"}
            ]
        });
        let info = serde_json::from_value::<WireModel>(json).unwrap().into_repo_info();
        assert!(info.gated);
        assert_eq!(info.sha, "abc");
        assert_eq!(
            info.files[1],
            RemoteFile { name: "model.safetensors".into(), size: Some(20), sha256: Some("abcd".into()) }
        );
        assert_eq!(info.files[2].size, None);
        let hit = serde_json::json!({"id": "org/m", "gated": false, "safetensors": {"parameters": {"BF16": 10, "U32": 5}, "total": 15}});
        let hit = serde_json::from_value::<WireModel>(hit).unwrap().into_search_hit();
        assert_eq!((hit.gated, hit.parameters, hit.storage_bytes), (false, Some(15), Some(40)));
    }
}
