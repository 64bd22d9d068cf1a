//! The Hub client and resumable, verified downloads over real HTTP against a fake Hub
//! (`tests/common/fake_hub.rs`): file selection, progress, resume after a cut and after a
//! restart, corruption, cancellation, auth errors, servers ignoring Range, search, and a full disk
//! (a 1 MiB tmpfs: those two tests mount one, so they need root; they are ignored, with that
//! reason shown, and `scripts/test.sh` runs them when it runs as root, as CI does).

mod common;

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::fake_hub::{fake_safetensors, random_bytes, sha256_hex, Corruption, FakeHub, FakeRepo, Logged};
use fastmlx::store::download::{download_files, Progress};
use fastmlx::store::hub::{HubClient, HubError, RemoteFile, RetryPolicy};
use fastmlx::store::select::{select_files, select_model_files};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const MLX: &str = "org/tiny-mlx";
const GGUF: &str = "org/tiny-gguf";
const GATED: &str = "org/gated-mlx";
const CHAT: &str = "other/Tiny-Chat-mlx";
const SHARD1: &str = "model-00001-of-00002.safetensors";
const SHARD2: &str = "model-00002-of-00002.safetensors";
const SHARD1_SIZE: usize = 3_000_000;
const SHARD2_SIZE: usize = 1_200_000;

fn mlx_repo() -> FakeRepo {
    let index = format!(
        r#"{{"metadata": {{"total_size": 4199000}}, "weight_map": {{"a.weight": "{SHARD1}", "b.weight": "{SHARD2}", "c.weight": "{SHARD1}"}}}}"#
    );
    let mut repo = FakeRepo::new(
        MLX,
        vec![
            (".gitattributes", b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n".to_vec()),
            ("README.md", b"# tiny\n".to_vec()),
            ("config.json", br#"{"model_type": "llama", "hidden_size": 64}"#.to_vec()),
            ("tokenizer.json", random_bytes(40_000, 1)),
            ("tokenizer_config.json", br#"{"eos_token": "</s>"}"#.to_vec()),
            ("generation_config.json", br#"{"temperature": 0.7}"#.to_vec()),
            ("chat_template.jinja", b"{% for m in messages %}{{ m.content }}{% endfor %}".to_vec()),
            ("model.safetensors.index.json", index.into_bytes()),
            (SHARD1, fake_safetensors(SHARD1_SIZE, 2)),
            (SHARD2, fake_safetensors(SHARD2_SIZE, 3)),
            ("consolidated.safetensors", fake_safetensors(500_000, 4)),
            ("pytorch_model.bin", random_bytes(200_000, 5)),
            ("original/params.json", b"{}".to_vec()),
        ],
    );
    repo.tags = vec!["mlx".into(), "safetensors".into(), "llama".into()];
    repo.library = Some("mlx".into());
    repo.downloads = 500;
    repo.likes = 7;
    repo
}

fn gguf_repo() -> FakeRepo {
    let mut repo = FakeRepo::new(
        GGUF,
        vec![
            ("README.md", b"# gguf\n".to_vec()),
            ("Model-Q4_K_M.gguf", random_bytes(1_500_000, 6)),
            ("Model-Q8_0.gguf", random_bytes(2_000_000, 7)),
        ],
    );
    repo.tags = vec!["gguf".into()];
    repo.downloads = 900;
    repo
}

fn gated_repo() -> FakeRepo {
    let mut repo = FakeRepo::new(
        GATED,
        vec![("config.json", b"{}".to_vec()), ("model.safetensors", fake_safetensors(800_000, 8))],
    );
    repo.gated = true;
    repo.tags = vec!["mlx".into()];
    repo.downloads = 100;
    repo
}

fn chat_repo() -> FakeRepo {
    let mut repo =
        FakeRepo::new(CHAT, vec![("config.json", b"{}".to_vec()), ("model.safetensors", fake_safetensors(100_000, 9))]);
    repo.tags = vec!["mlx".into()];
    repo.library = Some("mlx".into());
    repo.downloads = 2000;
    repo
}

async fn start_hub() -> FakeHub {
    FakeHub::start(vec![mlx_repo(), gguf_repo(), gated_repo(), chat_repo()]).await
}

/// Retries fast enough for tests: 3 failed requests in a row, 10 ms apart at first.
fn quick_client(fake: &FakeHub, token: Option<&str>) -> HubClient {
    HubClient::new(&fake.url, token.map(str::to_string))
        .with_retry_policy(RetryPolicy { attempts: 3, first_backoff: Duration::from_millis(10) })
}

async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), future).await.expect("the download hung")
}

/// The MLX repo's files as FastMLX selects them (the index narrows the shards).
async fn mlx_files(client: &HubClient) -> Vec<RemoteFile> {
    let info = client.repo_info(MLX, "main").await.unwrap();
    select_model_files(client, &info, "main", None).await.unwrap()
}

struct Outcome {
    result: Result<(), HubError>,
    /// Every progress value a watcher saw, in order.
    seen: Vec<Progress>,
    last: Progress,
}

async fn download(client: &HubClient, repo: &str, files: &[RemoteFile], staging: &Path) -> Outcome {
    download_with(client, repo, files, staging, &CancellationToken::new()).await
}

async fn download_with(
    client: &HubClient,
    repo: &str,
    files: &[RemoteFile],
    staging: &Path,
    cancel: &CancellationToken,
) -> Outcome {
    let (sender, mut receiver) = watch::channel(Progress::default());
    let watcher = tokio::spawn(async move {
        let mut seen = Vec::new();
        while receiver.changed().await.is_ok() {
            seen.push(receiver.borrow_and_update().clone());
        }
        seen
    });
    let result = within(download_files(client, repo, "main", files, staging, &sender, cancel)).await;
    let last = sender.borrow().clone();
    drop(sender);
    Outcome { result, seen: watcher.await.unwrap(), last }
}

fn assert_files_match(fake: &FakeHub, repo: &str, files: &[RemoteFile], staging: &Path) {
    for file in files {
        let on_disk = std::fs::read(staging.join(&file.name)).unwrap_or_else(|e| panic!("{}: {e}", file.name));
        assert!(on_disk == fake.repo(repo).file(&file.name), "{} differs from the Hub's", file.name);
    }
    let parts: Vec<PathBuf> =
        common::walk(staging).into_iter().filter(|p| p.to_string_lossy().ends_with(".part")).collect();
    assert!(parts.is_empty(), "left-over parts: {parts:?}");
}

/// The requests that carried a file's bytes (the CDN for LFS files, `resolve` for others).
fn byte_requests(fake: &FakeHub, file: &str) -> Vec<Logged> {
    fake.file_requests(file).into_iter().filter(|r| r.status == 200 || r.status == 206).collect()
}

fn part_len(staging: &Path, file: &str) -> Option<u64> {
    std::fs::metadata(staging.join(format!("{file}.part"))).ok().map(|m| m.len())
}

fn total_size(files: &[RemoteFile]) -> u64 {
    files.iter().map(|f| f.size.expect("the Hub lists sizes")).sum()
}

fn names(files: &[RemoteFile]) -> BTreeSet<&str> {
    files.iter().map(|f| f.name.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_a_model_folder_verified_with_progress_to_the_end() {
    let fake = start_hub().await;
    let client = HubClient::new(&fake.url, Some("hf_test".into()));
    let info = client.repo_info(MLX, "main").await.unwrap();
    assert_eq!(info.sha, fake.repo(MLX).sha);
    assert_eq!((info.gated, info.library.as_deref()), (false, Some("mlx")));
    let shard = info.files.iter().find(|f| f.name == SHARD1).unwrap();
    assert_eq!(
        (shard.size, shard.sha256.clone()),
        (Some(SHARD1_SIZE as u64), Some(sha256_hex(fake.repo(MLX).file(SHARD1))))
    );

    let files = select_model_files(&client, &info, &info.sha, None).await.unwrap();
    let expected = [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "chat_template.jinja",
        "model.safetensors.index.json",
        SHARD1,
        SHARD2,
    ];
    assert_eq!(names(&files), expected.into_iter().collect());

    let staging = tempfile::tempdir().unwrap();
    let outcome = download(&client, MLX, &files, staging.path()).await;
    outcome.result.unwrap();
    let total = total_size(&files);
    let last = &outcome.last;
    assert_eq!((last.done, last.total, last.files_done, last.files_total), (total, total, files.len(), files.len()));
    assert_eq!(last.eta_secs, Some(0.0));
    assert_eq!(outcome.seen.last().map(|p| p.done), Some(total), "the watcher saw the end");
    assert!(outcome.seen.windows(2).all(|w| w[0].done <= w[1].done), "progress went backwards without a fault");
    assert!(outcome.seen.iter().any(|p| p.file == SHARD1 && p.file_total == SHARD1_SIZE as u64));
    assert_files_match(&fake, MLX, &files, staging.path());
    assert!(staging.path().join(".verified.json").exists());

    // The token goes to the Hub, not to the CDN the LFS files are redirected to.
    let requests = fake.requests();
    assert!(requests
        .iter()
        .filter(|r| r.path.contains("/resolve/") || r.path.starts_with("/api/"))
        .all(|r| r.authorization.as_deref() == Some("Bearer hf_test")));
    let cdn: Vec<&Logged> = requests.iter().filter(|r| r.path.starts_with("/cdn/")).collect();
    assert_eq!(cdn.len(), 2, "the two shards come from the CDN");
    assert!(cdn.iter().all(|r| r.authorization.is_none()), "the token leaked to the CDN: {cdn:?}");
    for unwanted in ["README.md", "pytorch_model.bin", "consolidated.safetensors", "original/params.json"] {
        assert!(fake.file_requests(unwanted).is_empty(), "{unwanted} was fetched");
    }

    // A second call finds everything verified and fetches nothing.
    fake.reset_stats();
    let again = download(&client, MLX, &files, staging.path()).await;
    again.result.unwrap();
    assert_eq!((again.last.done, again.last.files_done), (total, files.len()));
    assert_eq!(fake.total_bytes_served(), 0);
    assert!(fake.requests().is_empty(), "{:?}", fake.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selects_one_gguf_file_by_quantization() {
    let fake = start_hub().await;
    let client = HubClient::new(&fake.url, None);
    let info = client.repo_info(GGUF, "main").await.unwrap();
    let files = select_model_files(&client, &info, "main", Some("q4_k_m")).await.unwrap();
    assert_eq!(names(&files), ["Model-Q4_K_M.gguf"].into_iter().collect());
    assert_eq!(files[0].sha256.as_deref(), Some(sha256_hex(fake.repo(GGUF).file("Model-Q4_K_M.gguf")).as_str()));

    let several = select_files(&info, Some("model")).unwrap_err().to_string();
    assert!(
        several.contains(GGUF) && several.contains("Model-Q4_K_M.gguf") && several.contains("Model-Q8_0.gguf"),
        "{several}"
    );
    let as_folder = select_files(&info, None).unwrap_err().to_string();
    assert!(as_folder.contains("config.json") && as_folder.contains("Model-Q8_0.gguf"), "{as_folder}");

    let staging = tempfile::tempdir().unwrap();
    download(&client, GGUF, &files, staging.path()).await.result.unwrap();
    assert_files_match(&fake, GGUF, &files, staging.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_after_a_cut_connection() {
    let fake = start_hub().await;
    fake.knobs().cuts.insert(SHARD1.into(), [1_500_000].into());
    let client = quick_client(&fake, None);
    let files = mlx_files(&client).await;
    let staging = tempfile::tempdir().unwrap();
    download(&client, MLX, &files, staging.path()).await.result.unwrap();
    assert_files_match(&fake, MLX, &files, staging.path());

    let requests = byte_requests(&fake, SHARD1);
    assert_eq!(requests.len(), 2, "{requests:?}");
    let resumed_at: u64 = requests[1]
        .range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
        .expect("a Range request");
    assert!(resumed_at > 0 && resumed_at <= 1_500_000, "resumed at {resumed_at}");
    assert_eq!(requests[1].status, 206);
    let served = fake.bytes_served(SHARD1);
    assert!(served < SHARD1_SIZE as u64 * 3 / 2, "{served} bytes served for a {SHARD1_SIZE}-byte file");
    assert!(fake.total_bytes_served() < total_size(&files) * 3 / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_a_part_left_by_an_earlier_run() {
    let fake = start_hub().await;
    // One response cut after 1 MB, then every retry dies at once: the retries run out.
    fake.knobs().cuts.insert(SHARD1.into(), [1_000_000].into());
    fake.knobs().cut_always.insert(SHARD1.into(), 0);
    let client = quick_client(&fake, None);
    let files = mlx_files(&client).await;
    let staging = tempfile::tempdir().unwrap();
    let failed = download(&client, MLX, &files, staging.path()).await;
    assert!(matches!(failed.result, Err(HubError::Network(_))), "{:?}", failed.result);
    assert_eq!(
        fake.file_requests(SHARD1).iter().filter(|r| r.path.starts_with("/cdn/")).count(),
        4,
        "one cut request, then 3 attempts without progress"
    );
    let kept = part_len(staging.path(), SHARD1).expect("the part is kept");
    assert!(kept > 0 && kept <= 1_000_000, "{kept}");
    assert!(!staging.path().join(SHARD1).exists());

    // A new process: a new client, a new call.
    fake.knobs().cuts.clear();
    fake.knobs().cut_always.clear();
    fake.reset_stats();
    let client = HubClient::new(&fake.url, None);
    download(&client, MLX, &files, staging.path()).await.result.unwrap();
    assert_files_match(&fake, MLX, &files, staging.path());
    let requests = byte_requests(&fake, SHARD1);
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].range.as_deref(), Some(format!("bytes={kept}-").as_str()));
    assert_eq!(fake.bytes_served(SHARD1), SHARD1_SIZE as u64 - kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_promptly_and_keeps_the_part() {
    let fake = start_hub().await;
    fake.knobs().chunk_delay = Some(Duration::from_millis(20));
    let client = HubClient::new(&fake.url, None);
    let files = mlx_files(&client).await;
    let staging = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let (sender, mut receiver) = watch::channel(Progress::default());
    let task = {
        let (client, files, staging, cancel) =
            (client.clone(), files.clone(), staging.path().to_path_buf(), cancel.clone());
        tokio::spawn(async move { download_files(&client, MLX, "main", &files, &staging, &sender, &cancel).await })
    };
    within(receiver.wait_for(|p| p.file == SHARD1 && p.file_done >= 300_000)).await.unwrap();
    let cancelled_at = Instant::now();
    cancel.cancel();
    let result = within(task).await.unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_millis(500), "took {:?}", cancelled_at.elapsed());
    assert_eq!(result, Err(HubError::Cancelled));
    let kept = part_len(staging.path(), SHARD1).expect("the part is kept");
    assert!(kept >= 300_000 && kept < SHARD1_SIZE as u64, "{kept}");
    assert!(!staging.path().join(SHARD1).exists());

    fake.knobs().chunk_delay = None;
    fake.reset_stats();
    download(&client, MLX, &files, staging.path()).await.result.unwrap();
    assert_files_match(&fake, MLX, &files, staging.path());
    assert_eq!(byte_requests(&fake, SHARD1)[0].range.as_deref(), Some(format!("bytes={kept}-").as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_corrupted_once_is_fetched_again() {
    let fake = start_hub().await;
    fake.knobs().corrupt.insert(SHARD2.into(), Corruption::Once);
    let client = HubClient::new(&fake.url, None);
    let files = mlx_files(&client).await;
    let staging = tempfile::tempdir().unwrap();
    download(&client, MLX, &files, staging.path()).await.result.unwrap();
    assert_files_match(&fake, MLX, &files, staging.path());
    assert_eq!(fake.bytes_served(SHARD2), 2 * SHARD2_SIZE as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_corrupted_every_time_fails_as_corrupt() {
    let fake = start_hub().await;
    fake.knobs().corrupt.insert(SHARD2.into(), Corruption::Always);
    let client = HubClient::new(&fake.url, None);
    let files = mlx_files(&client).await;
    let staging = tempfile::tempdir().unwrap();
    let outcome = download(&client, MLX, &files, staging.path()).await;
    match outcome.result {
        Err(HubError::Corrupt { file, expected, actual }) => {
            assert_eq!(file, SHARD2);
            assert_eq!(expected, format!("sha256 {}", sha256_hex(fake.repo(MLX).file(SHARD2))));
            assert!(actual.starts_with("sha256 ") && actual != expected);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(fake.bytes_served(SHARD2), 2 * SHARD2_SIZE as u64);
    assert!(!staging.path().join(SHARD2).exists(), "an unverified file under its final name");
    assert_eq!(part_len(staging.path(), SHARD2), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_refused_tokens_and_gated_repos() {
    let fake = start_hub().await;
    fake.knobs().require_token = Some("hf_good".into());
    let no_token = HubClient::new(&fake.url, None).repo_info(MLX, "main").await.unwrap_err();
    assert_eq!(no_token, HubError::Unauthorized { repo: MLX.into() });
    assert!(no_token.to_string().contains("HF_TOKEN"), "{no_token}");
    let wrong_token = HubClient::new(&fake.url, Some("hf_bad".into())).repo_info(MLX, "main").await.unwrap_err();
    assert_eq!(wrong_token, HubError::Unauthorized { repo: MLX.into() });
    HubClient::new(&fake.url, Some("hf_good".into())).repo_info(MLX, "main").await.unwrap();

    // Gated: the listing is public, the files need a token that accepted the license.
    let client = HubClient::new(&fake.url, Some("hf_good".into()));
    let info = client.repo_info(GATED, "main").await.unwrap();
    assert!(info.gated);
    let files = select_files(&info, None).unwrap();
    let staging = tempfile::tempdir().unwrap();
    let forbidden = download(&client, GATED, &files, staging.path()).await.result.unwrap_err();
    assert_eq!(forbidden, HubError::Forbidden { repo: GATED.into() });
    assert!(forbidden.to_string().contains("accept its license"), "{forbidden}");

    fake.knobs().require_token = None;
    let anonymous = download(&HubClient::new(&fake.url, None), GATED, &files, staging.path()).await.result;
    assert_eq!(anonymous, Err(HubError::Unauthorized { repo: GATED.into() }));

    fake.knobs().gated_access.push("hf_good".into());
    download(&client, GATED, &files, staging.path()).await.result.unwrap();
    assert_files_match(&fake, GATED, &files, staging.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_repos_revisions_and_files_are_not_found() {
    let fake = start_hub().await;
    let client = HubClient::new(&fake.url, None);
    match client.repo_info("org/nope", "main").await {
        Err(HubError::NotFound { what }) => assert!(what.contains("org/nope"), "{what}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    match client.repo_info(MLX, "v9").await {
        Err(HubError::NotFound { what }) => assert!(what.contains("v9"), "{what}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    let staging = tempfile::tempdir().unwrap();
    let missing = [RemoteFile { name: "missing.json".into(), size: Some(10), sha256: None }];
    match download(&client, MLX, &missing, staging.path()).await.result {
        Err(HubError::NotFound { what }) => assert!(what.contains("missing.json"), "{what}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_ignoring_range_still_ends_verified() {
    let fake = start_hub().await;
    fake.knobs().ignore_range = true;
    fake.knobs().cuts.insert(SHARD1.into(), [1_000_000].into());
    let client = quick_client(&fake, None);
    let files = mlx_files(&client).await;
    let staging = tempfile::tempdir().unwrap();
    download(&client, MLX, &files, staging.path()).await.result.unwrap();
    assert_files_match(&fake, MLX, &files, staging.path());
    let requests = byte_requests(&fake, SHARD1);
    assert_eq!(requests.len(), 2);
    assert!(requests[1].range.is_some() && requests[1].status == 200, "{requests:?}");
    assert_eq!(fake.bytes_served(SHARD1), 1_000_000 + SHARD1_SIZE as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_fetched_again_and_the_rest_skipped() {
    let fake = start_hub().await;
    let client = HubClient::new(&fake.url, None);
    let files = mlx_files(&client).await;
    let staging = tempfile::tempdir().unwrap();
    download(&client, MLX, &files, staging.path()).await.result.unwrap();

    // Same size, other bytes, a later modification time: the sidecar no longer vouches for it.
    let path = staging.path().join(SHARD2);
    std::fs::write(&path, random_bytes(SHARD2_SIZE, 99)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(10))
        .unwrap();
    fake.reset_stats();
    download(&client, MLX, &files, staging.path()).await.result.unwrap();
    assert_files_match(&fake, MLX, &files, staging.path());
    let fetched: BTreeSet<String> = fake
        .requests()
        .iter()
        .filter(|r| r.path.contains("/resolve/"))
        .map(|r| r.path.rsplit('/').next().unwrap().to_string())
        .collect();
    assert_eq!(fetched, [SHARD2.to_string()].into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_returns_hits_by_downloads() {
    let fake = start_hub().await;
    let client = HubClient::new(&fake.url, None);
    let hits = client.search("tiny", 10, false).await.unwrap();
    let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids, [CHAT, GGUF, MLX]);
    let mlx = &hits[2];
    let safetensor_bytes = (SHARD1_SIZE + SHARD2_SIZE + 500_000) as u64;
    assert_eq!((mlx.downloads, mlx.likes, mlx.library.as_deref(), mlx.gated), (500, 7, Some("mlx"), false));
    assert_eq!((mlx.parameters, mlx.storage_bytes), (Some(safetensor_bytes / 2), Some(safetensor_bytes / 2 * 2)));
    assert!(mlx.tags.contains(&"mlx".to_string()) && mlx.last_modified.is_some());
    assert_eq!((hits[1].parameters, hits[1].storage_bytes), (Some(135_000_000), None));
    // The GGUF repo's quantizations come from its file names; the others' listings tell nothing
    // but BF16 dtypes.
    assert_eq!(hits[1].quantization.as_deref(), Some("GGUF Q4_K_M, Q8_0"));
    assert_eq!(mlx.quantization.as_deref(), Some("BF16"));

    let mlx_only: Vec<String> = client.search("tiny", 10, true).await.unwrap().into_iter().map(|h| h.id).collect();
    assert_eq!(mlx_only, [CHAT, MLX]);
    let query = fake.requests().last().unwrap().query.clone();
    assert!(
        query.contains("filter=mlx")
            && query.contains("sort=downloads")
            && query.contains("expand=safetensors")
            && query.contains("expand=siblings"),
        "{query}"
    );
    assert_eq!(client.search("tiny", 1, false).await.unwrap().len(), 1);
    assert!(client.search("no-such-model", 10, false).await.unwrap().is_empty());
}

/// A tmpfs of `size` mounted on a fresh folder, unmounted when dropped (also when a test fails).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t tmpfs failed: the disk-full tests need root (CI runs them as root)");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        match Command::new("umount").arg(self.dir.path()).status() {
            Ok(status) if status.success() => {}
            other => eprintln!("umount {}: {other:?}", self.dir.path().display()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a 1 MiB tmpfs: needs root (scripts/test.sh runs it as root)"]
async fn a_full_disk_is_refused_before_any_byte() {
    let fake = start_hub().await;
    let client = HubClient::new(&fake.url, None);
    let files = mlx_files(&client).await;
    fake.reset_stats();
    let tmpfs = Tmpfs::mount("1m");
    let staging = tmpfs.path().join("staging");
    match download(&client, MLX, &files, &staging).await.result {
        Err(HubError::DiskFull { needed, available }) => {
            assert!(needed > total_size(&files) && available <= 1 << 20, "needed {needed}, available {available}");
        }
        other => panic!("expected DiskFull, got {other:?}"),
    }
    assert!(fake.requests().is_empty(), "fetched before checking the space: {:?}", fake.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a 1 MiB tmpfs: needs root (scripts/test.sh runs it as root)"]
async fn a_disk_filling_up_while_writing_is_disk_full() {
    let fake = start_hub().await;
    let client = HubClient::new(&fake.url, None);
    let tmpfs = Tmpfs::mount("1m");
    // An unlisted size: the check before the start cannot count it, so the writes hit ENOSPC.
    let files = [RemoteFile { name: SHARD1.into(), size: None, sha256: None }];
    match download(&client, MLX, &files, tmpfs.path()).await.result {
        Err(HubError::DiskFull { needed, .. }) => assert!(needed > 0),
        other => panic!("expected DiskFull, got {other:?}"),
    }
    assert!(fake.bytes_served(SHARD1) > 0);
    assert!(!tmpfs.path().join(SHARD1).exists());
    assert!(part_len(tmpfs.path(), SHARD1).is_some_and(|len| len <= 1 << 20));
}
