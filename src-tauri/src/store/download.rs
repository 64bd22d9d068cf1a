//! Downloading a model's files from the Hub into a staging folder (which files: `select`):
//! resumable transfers, verification, disk-space checks, progress and cancellation.
//!
//! On disk: `<staging>/<name>.part` holds a file being fetched; a later call (or a later process)
//! resumes it from its length with a Range request. It becomes `<staging>/<name>` only once its
//! size and sha256 check out. `<staging>/.verified.json` remembers which finished files were
//! hashed, so a resumed download does not rehash gigabytes.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::hub::{FileBody, HubClient, HubError, RemoteFile};

/// Where the hashes of finished files are remembered, in the staging folder.
pub const VERIFIED_FILE: &str = ".verified.json";
pub const PART_SUFFIX: &str = ".part";
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);
const RATE_WINDOW: Duration = Duration::from_secs(5);

/// Where a download stands; sent on a watch channel as bytes arrive (at most ~10 times a second).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Progress {
    /// The file being fetched (or just checked).
    pub file: String,
    pub file_done: u64,
    /// 0 when the Hub did not give the size.
    pub file_total: u64,
    /// Bytes of finished files plus the current file's.
    pub done: u64,
    pub total: u64,
    /// Over the last few seconds.
    pub bytes_per_sec: f64,
    pub eta_secs: Option<f64>,
    pub files_done: usize,
    pub files_total: usize,
}

/// Fetches `files` of `repo` at `revision` (best: the commit of [`RepoInfo::sha`]) into
/// `staging`, resuming `.part` files, skipping verified ones, checking each file's size and
/// sha256. On error or cancellation, `.part` files stay for a later call.
pub async fn download_files(
    client: &HubClient,
    repo: &str,
    revision: &str,
    files: &[RemoteFile],
    staging: &Path,
    progress: &watch::Sender<Progress>,
    cancel: &CancellationToken,
) -> Result<(), HubError> {
    if cancel.is_cancelled() {
        return Err(HubError::Cancelled);
    }
    fs::create_dir_all(staging).map_err(|e| io_error(staging, e))?;
    let mut job = Job { client, repo, revision, staging, cancel, verified: VerifiedLog::load(staging) };
    let mut reporter = Reporter::new(progress, files);

    // Survey first: the disk-space check counts only what is still missing.
    let mut finished = Vec::new();
    let mut pending = Vec::new();
    let mut still_needed = 0;
    for file in files {
        let path = staging.join(relative_path(repo, &file.name)?);
        match finished_size(&path, file, &mut job.verified).await? {
            Some(size) => finished.push((file, size)),
            None => {
                let on_disk = fs::metadata(part_path(&path)).map(|m| m.len()).unwrap_or(0);
                still_needed += file.size.map_or(0, |size| size.saturating_sub(on_disk));
                pending.push(file);
            }
        }
    }
    job.verified.save(staging)?;
    check_space(staging, still_needed)?;

    for (file, size) in finished {
        reporter.start_file(file, size);
        reporter.finish_file(size);
    }
    for file in pending {
        fetch_file(&mut job, file, &mut reporter).await?;
    }
    reporter.send(true);
    Ok(())
}

struct Job<'a> {
    client: &'a HubClient,
    repo: &'a str,
    revision: &'a str,
    staging: &'a Path,
    cancel: &'a CancellationToken,
    verified: VerifiedLog,
}

/// One file to its final name, verified; fetched once more from zero if it does not verify.
async fn fetch_file(job: &mut Job<'_>, file: &RemoteFile, reporter: &mut Reporter<'_>) -> Result<(), HubError> {
    let final_path = job.staging.join(relative_path(job.repo, &file.name)?);
    let part_path = part_path(&final_path);
    if let Some(parent) = final_path.parent() {
        fs::create_dir_all(parent).map_err(|e| io_error(parent, e))?;
    }
    let mut refetched = false;
    loop {
        let mut part = open_part(part_path.clone(), file.sha256.is_some()).await?;
        if file.size.is_some_and(|size| part.len > size) {
            part.truncate()?; // longer than the file: not a prefix of it
        }
        reporter.start_file(file, part.len);
        transfer(job, file, &mut part, reporter).await?;
        part.file.sync_all().map_err(|e| io_error(&part.path, e))?;
        match mismatch(file, &part) {
            None => {
                let PartFile { file: handle, len, hasher, .. } = part;
                drop(handle);
                fs::rename(&part_path, &final_path).map_err(|e| io_error(&final_path, e))?;
                if let Some(hasher) = hasher {
                    job.verified.record(&file.name, &final_path, hex(&hasher.finalize()));
                    job.verified.save(job.staging)?;
                }
                reporter.finish_file(len);
                return Ok(());
            }
            Some((expected, actual)) => {
                drop(part);
                fs::remove_file(&part_path).map_err(|e| io_error(&part_path, e))?;
                if refetched {
                    return Err(HubError::Corrupt { file: file.name.clone(), expected, actual });
                }
                tracing::warn!("{}: expected {expected}, got {actual}; downloading it again", file.name);
                refetched = true;
            }
        }
    }
}

/// Brings the part to the end of the file, resuming after connection failures.
async fn transfer(
    job: &Job<'_>,
    file: &RemoteFile,
    part: &mut PartFile,
    reporter: &mut Reporter<'_>,
) -> Result<(), HubError> {
    let policy = job.client.retry_policy();
    let mut failures = 0; // in a row, none of them fetching a byte
    let mut restarts = 0;
    loop {
        if file.size == Some(part.len) {
            return Ok(());
        }
        let before = part.len;
        match fetch_rest(job, file, part, reporter).await {
            Ok(Fetched::ToTheEnd) => return Ok(()),
            Ok(Fetched::StartOver) => {
                restarts += 1;
                if restarts > 2 {
                    return Err(HubError::Http {
                        status: 416,
                        message: format!("{}: the Hub keeps refusing to resume it", file.name),
                    });
                }
                part.truncate()?;
                reporter.set_file_done(0);
            }
            Err(e) if e.is_transient() => {
                failures = if part.len > before { 0 } else { failures + 1 };
                if failures >= policy.attempts {
                    return Err(e);
                }
                let wait = policy.backoff(failures.max(1));
                tracing::warn!("{}: {e}; resuming at byte {} in {wait:?}", file.name, part.len);
                tokio::select! {
                    biased;
                    _ = job.cancel.cancelled() => return Err(HubError::Cancelled),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            Err(e) => return Err(e),
        }
    }
}

enum Fetched {
    ToTheEnd,
    /// The server cannot continue from the part's length: fetch the file from zero.
    StartOver,
}

/// One request: the file from the part's length to its end, appended to the part.
async fn fetch_rest(
    job: &Job<'_>,
    file: &RemoteFile,
    part: &mut PartFile,
    reporter: &mut Reporter<'_>,
) -> Result<Fetched, HubError> {
    let offset = part.len;
    let opened = tokio::select! {
        biased;
        _ = job.cancel.cancelled() => return Err(HubError::Cancelled),
        opened = job.client.open_file(job.repo, job.revision, &file.name, offset) => opened?,
    };
    let mut stream = match opened {
        // 416: complete if the sizes agree; otherwise the file changed under the part.
        FileBody::PastEnd { file_size } => {
            return Ok(if file_size.or(file.size).is_none_or(|size| size == offset) {
                Fetched::ToTheEnd
            } else {
                Fetched::StartOver
            });
        }
        FileBody::Stream(stream) => stream,
    };
    if stream.start != offset {
        if stream.start != 0 {
            return Ok(Fetched::StartOver);
        }
        // 200 to a Range request: the server sends the whole file again.
        part.truncate()?;
        reporter.set_file_done(0);
    }
    let expected_size = file.size.or(stream.file_size);
    loop {
        let chunk = tokio::select! {
            biased;
            _ = job.cancel.cancelled() => return Err(HubError::Cancelled),
            chunk = stream.next_chunk() => chunk?,
        };
        let Some(chunk) = chunk else { break };
        let bytes = chunk.as_ref();
        part.append(bytes)
            .map_err(|e| write_error(&part.path, e, reporter.still_needed().max(bytes.len() as u64), job.staging))?;
        reporter.received(bytes.len() as u64);
        if expected_size.is_some_and(|size| part.len > size) {
            return Ok(Fetched::ToTheEnd); // too long: verification rejects it
        }
    }
    match expected_size {
        Some(size) if part.len < size => {
            Err(HubError::Network(format!("the connection ended at byte {} of {size} of {}", part.len, file.name)))
        }
        _ => Ok(Fetched::ToTheEnd),
    }
}

/// `(expected, actual)` when the fetched bytes are not the file the Hub listed.
fn mismatch(file: &RemoteFile, part: &PartFile) -> Option<(String, String)> {
    if let Some(size) = file.size.filter(|size| *size != part.len) {
        return Some((format!("{size} bytes"), format!("{} bytes", part.len)));
    }
    let expected = file.sha256.as_ref()?;
    let actual = hex(&part.hasher.clone()?.finalize());
    (!actual.eq_ignore_ascii_case(expected)).then(|| (format!("sha256 {expected}"), format!("sha256 {actual}")))
}

/// The size of the file already at `path` when it is complete and verified; a file there that
/// does not verify is deleted.
async fn finished_size(path: &Path, file: &RemoteFile, verified: &mut VerifiedLog) -> Result<Option<u64>, HubError> {
    let Ok(metadata) = fs::metadata(path) else { return Ok(None) };
    let complete = metadata.is_file()
        && file.size.is_none_or(|size| size == metadata.len())
        && match &file.sha256 {
            None => true,
            Some(_) if verified.vouches_for(&file.name, file, &metadata) => true,
            Some(expected) => {
                let owned = path.to_path_buf();
                let actual = tokio::task::spawn_blocking(move || hash_file(&owned))
                    .await
                    .map_err(|e| io_error(path, io::Error::other(e)))?
                    .map_err(|e| io_error(path, e))?;
                let matches = actual.eq_ignore_ascii_case(expected);
                if matches {
                    verified.record(&file.name, path, actual);
                }
                matches
            }
        };
    if complete {
        return Ok(Some(metadata.len()));
    }
    if metadata.is_file() {
        fs::remove_file(path).map_err(|e| io_error(path, e))?;
    }
    Ok(None)
}

/// Refuses a start that could not finish: less free space than the bytes still to fetch plus a
/// margin for the filesystem's own overhead.
fn check_space(staging: &Path, still_needed: u64) -> Result<(), HubError> {
    let needed = space_needed(still_needed);
    match available_space(staging) {
        Some(available) if available < needed => Err(HubError::DiskFull { needed, available }),
        _ => Ok(()),
    }
}

fn space_needed(still_needed: u64) -> u64 {
    if still_needed == 0 {
        0
    } else {
        still_needed + still_needed / 100 + (1 << 20)
    }
}

/// Bytes an unprivileged process may still write on the filesystem holding `path`.
#[cfg(unix)]
pub fn available_space(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs only writes into the zeroed struct we own; the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ between Linux and macOS
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(not(unix))]
pub fn available_space(_path: &Path) -> Option<u64> {
    None
}

fn write_error(path: &Path, error: io::Error, still_needed: u64, staging: &Path) -> HubError {
    match error.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::FileTooLarge => {
            HubError::DiskFull { needed: still_needed, available: available_space(staging).unwrap_or(0) }
        }
        _ => io_error(path, error),
    }
}

fn io_error(path: &Path, error: io::Error) -> HubError {
    HubError::Io { path: path.display().to_string(), message: error.to_string() }
}

/// A repo file name as a path under the staging folder; names that would leave it are refused.
fn relative_path(repo: &str, name: &str) -> Result<PathBuf, HubError> {
    let path = Path::new(name);
    if name.is_empty() || name.contains('\\') || !path.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(HubError::Selection {
            repo: repo.to_string(),
            message: format!("refusing the file name {name:?}: it would land outside the model folder"),
        });
    }
    Ok(path.to_path_buf())
}

fn part_path(final_path: &Path) -> PathBuf {
    let mut name = final_path.as_os_str().to_owned();
    name.push(PART_SUFFIX);
    PathBuf::from(name)
}

/// A `.part` file open for appending, and the sha256 of what it holds so far.
struct PartFile {
    path: PathBuf,
    file: File,
    len: u64,
    hasher: Option<Sha256>,
}

impl PartFile {
    /// Opens or creates the part; reads it through the hasher when the file has a known sha256.
    fn open(path: PathBuf, hashed: bool) -> io::Result<PartFile> {
        let mut file = OpenOptions::new().create(true).read(true).append(true).open(&path)?;
        let mut hasher = hashed.then(Sha256::new);
        let len = match hasher.as_mut() {
            Some(hasher) => hash_reader(&mut file, hasher)?,
            None => file.metadata()?.len(),
        };
        Ok(PartFile { path, file, len, hasher })
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)?;
        if let Some(hasher) = self.hasher.as_mut() {
            hasher.update(bytes);
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    fn truncate(&mut self) -> Result<(), HubError> {
        self.file.set_len(0).map_err(|e| io_error(&self.path, e))?;
        self.len = 0;
        if let Some(hasher) = self.hasher.as_mut() {
            *hasher = Sha256::new();
        }
        Ok(())
    }
}

/// Opening may hash gigabytes: off the async threads.
async fn open_part(path: PathBuf, hashed: bool) -> Result<PartFile, HubError> {
    let shown = path.clone();
    tokio::task::spawn_blocking(move || PartFile::open(path, hashed))
        .await
        .map_err(|e| io_error(&shown, io::Error::other(e)))?
        .map_err(|e| io_error(&shown, e))
}

fn hash_reader(reader: &mut impl Read, hasher: &mut Sha256) -> io::Result<u64> {
    let mut buffer = vec![0u8; 1 << 20];
    let mut len = 0;
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => return Ok(len),
            Ok(n) => {
                hasher.update(&buffer[..n]);
                len += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn hash_file(path: &Path) -> io::Result<String> {
    let mut hasher = Sha256::new();
    hash_reader(&mut File::open(path)?, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Finished files whose sha256 was checked, keyed by repo file name; an entry counts only while
/// the file keeps the size and modification time it had when hashed.
#[derive(Default, Serialize, Deserialize)]
struct VerifiedLog {
    files: BTreeMap<String, VerifiedEntry>,
    #[serde(skip)]
    changed: bool,
}

#[derive(Serialize, Deserialize, PartialEq, Eq)]
struct VerifiedEntry {
    size: u64,
    sha256: String,
    modified_ns: u64,
}

impl VerifiedLog {
    fn load(staging: &Path) -> VerifiedLog {
        fs::read(staging.join(VERIFIED_FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    fn save(&mut self, staging: &Path) -> Result<(), HubError> {
        if !self.changed {
            return Ok(());
        }
        let path = staging.join(VERIFIED_FILE);
        let temporary = part_path(&path);
        let json = serde_json::to_vec_pretty(&*self).expect("the log serializes");
        fs::write(&temporary, json).and_then(|()| fs::rename(&temporary, &path)).map_err(|e| io_error(&path, e))?;
        self.changed = false;
        Ok(())
    }

    fn vouches_for(&self, name: &str, file: &RemoteFile, metadata: &Metadata) -> bool {
        let (Some(entry), Some(expected)) = (self.files.get(name), &file.sha256) else { return false };
        entry.sha256.eq_ignore_ascii_case(expected)
            && entry.size == metadata.len()
            && Some(entry.modified_ns) == modified_ns(metadata)
    }

    fn record(&mut self, name: &str, path: &Path, sha256: String) {
        let Ok(metadata) = fs::metadata(path) else { return };
        let Some(modified_ns) = modified_ns(&metadata) else { return };
        self.files.insert(name.to_string(), VerifiedEntry { size: metadata.len(), sha256, modified_ns });
        self.changed = true;
    }
}

fn modified_ns(metadata: &Metadata) -> Option<u64> {
    let since_epoch = metadata.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since_epoch.as_nanos()).ok()
}

/// Bytes per second over a sliding window.
struct RateMeter {
    window: Duration,
    /// (when, bytes received so far)
    samples: VecDeque<(Instant, u64)>,
}

impl RateMeter {
    fn new(window: Duration) -> RateMeter {
        RateMeter { window, samples: VecDeque::new() }
    }

    fn record(&mut self, now: Instant, received: u64) {
        self.samples.push_back((now, received));
        // Keep one sample from before the window so the rate spans all of it.
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= self.window {
            self.samples.pop_front();
        }
    }

    fn bytes_per_sec(&self) -> f64 {
        let (Some(&(first_at, first)), Some(&(last_at, last))) = (self.samples.front(), self.samples.back()) else {
            return 0.0;
        };
        let seconds = last_at.duration_since(first_at).as_secs_f64();
        // Too short a span gives wild numbers.
        if seconds < 0.2 {
            0.0
        } else {
            last.saturating_sub(first) as f64 / seconds
        }
    }
}

fn eta_secs(remaining: u64, bytes_per_sec: f64) -> Option<f64> {
    if remaining == 0 {
        Some(0.0)
    } else if bytes_per_sec > 0.0 {
        Some(remaining as f64 / bytes_per_sec)
    } else {
        None
    }
}

/// Keeps the [`Progress`] and sends it, at most every [`PROGRESS_INTERVAL`] unless forced.
struct Reporter<'a> {
    sender: &'a watch::Sender<Progress>,
    progress: Progress,
    /// Bytes of the files finished so far.
    finished_bytes: u64,
    /// Bytes fetched by this call, for the rate.
    received: u64,
    meter: RateMeter,
    last_sent: Option<Instant>,
}

impl<'a> Reporter<'a> {
    fn new(sender: &'a watch::Sender<Progress>, files: &[RemoteFile]) -> Reporter<'a> {
        let total = files.iter().filter_map(|f| f.size).sum();
        let progress = Progress { total, files_total: files.len(), ..Progress::default() };
        Reporter {
            sender,
            progress,
            finished_bytes: 0,
            received: 0,
            meter: RateMeter::new(RATE_WINDOW),
            last_sent: None,
        }
    }

    fn start_file(&mut self, file: &RemoteFile, on_disk: u64) {
        self.progress.file = file.name.clone();
        self.progress.file_total = file.size.unwrap_or(0);
        self.set_file_done(on_disk);
        self.send(true);
    }

    fn set_file_done(&mut self, bytes: u64) {
        self.progress.file_done = bytes;
        self.progress.done = self.finished_bytes + bytes;
    }

    fn received(&mut self, bytes: u64) {
        self.set_file_done(self.progress.file_done + bytes);
        self.received += bytes;
        self.meter.record(Instant::now(), self.received);
        self.send(false);
    }

    fn finish_file(&mut self, size: u64) {
        if self.progress.file_total == 0 {
            self.progress.total += size; // the size was not listed: known now
        }
        self.finished_bytes += size;
        self.progress.files_done += 1;
        self.progress.file_done = size;
        self.progress.done = self.finished_bytes;
        self.send(true);
    }

    /// Bytes of listed sizes not fetched yet.
    fn still_needed(&self) -> u64 {
        self.progress.total.saturating_sub(self.progress.done)
    }

    fn send(&mut self, force: bool) {
        let now = Instant::now();
        if !force && self.last_sent.is_some_and(|at| now.duration_since(at) < PROGRESS_INTERVAL) {
            return;
        }
        self.progress.bytes_per_sec = self.meter.bytes_per_sec();
        self.progress.eta_secs = eta_secs(self.still_needed(), self.progress.bytes_per_sec);
        self.sender.send_replace(self.progress.clone());
        self.last_sent = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_stay_inside_the_folder() {
        assert_eq!(relative_path("r", "sub/dir/file.json").unwrap(), PathBuf::from("sub/dir/file.json"));
        for bad in ["", "../x", "a/../../x", "/etc/passwd", "./a", "a\\..\\b"] {
            assert!(matches!(relative_path("r", bad), Err(HubError::Selection { .. })), "{bad:?}");
        }
        assert_eq!(part_path(Path::new("/s/sub/m.safetensors")), PathBuf::from("/s/sub/m.safetensors.part"));
    }

    #[test]
    fn rate_over_a_sliding_window_and_eta() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut meter = RateMeter::new(Duration::from_secs(5));
        meter.record(at(0), 0);
        assert_eq!(meter.bytes_per_sec(), 0.0);
        meter.record(at(100), 1000);
        assert_eq!(meter.bytes_per_sec(), 0.0, "under 0.2 s: no estimate yet");
        meter.record(at(1000), 10_000);
        assert_eq!(meter.bytes_per_sec(), 10_000.0);
        // A fast start, then 1000 B/s for 10 s: the window forgets the fast start.
        for s in 1..=10 {
            meter.record(at(1000 + s * 1000), 10_000 + s * 1000);
        }
        assert!((meter.bytes_per_sec() - 1000.0).abs() < 1e-9, "{}", meter.bytes_per_sec());
        assert!(meter.samples.len() <= 7);
        assert_eq!(eta_secs(5000, 1000.0), Some(5.0));
        assert_eq!(eta_secs(5000, 0.0), None);
        assert_eq!(eta_secs(0, 0.0), Some(0.0));
    }

    #[test]
    fn space_margin() {
        assert_eq!(space_needed(0), 0);
        assert_eq!(space_needed(100 << 20), (100 << 20) + (1 << 20) + (1 << 20));
        let dir = tempfile::tempdir().unwrap();
        assert!(available_space(dir.path()).is_some_and(|free| free > 0));
        assert!(matches!(check_space(dir.path(), u64::MAX / 2), Err(HubError::DiskFull { .. })));
        assert!(check_space(dir.path(), 0).is_ok());
    }

    #[test]
    fn a_resumed_part_hashes_like_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.part");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(&path, &data[..1_234_567]).unwrap();
        let mut part = PartFile::open(path.clone(), true).unwrap();
        assert_eq!(part.len, 1_234_567);
        part.append(&data[1_234_567..]).unwrap();
        assert_eq!(hex(&part.hasher.clone().unwrap().finalize()), hex(&Sha256::digest(&data)));
        assert_eq!(fs::read(&path).unwrap(), data);
        part.truncate().unwrap();
        part.append(b"abc").unwrap();
        assert_eq!(
            hex(&part.hasher.unwrap().finalize()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(fs::read(&path).unwrap(), b"abc");
    }

    #[test]
    fn verified_log_vouches_only_for_unchanged_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        fs::write(&path, b"weights").unwrap();
        let listed = RemoteFile { name: "w.safetensors".into(), size: Some(7), sha256: Some("AB".into()) };
        let mut log = VerifiedLog::default();
        log.record("w.safetensors", &path, "ab".into());
        log.save(dir.path()).unwrap();
        let log = VerifiedLog::load(dir.path());
        assert!(log.vouches_for("w.safetensors", &listed, &fs::metadata(&path).unwrap()));
        let other_hash = RemoteFile { sha256: Some("cd".into()), ..listed.clone() };
        assert!(!log.vouches_for("w.safetensors", &other_hash, &fs::metadata(&path).unwrap()));
        fs::write(&path, b"weightz").unwrap();
        let later = std::time::SystemTime::now() + Duration::from_secs(5);
        File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
        assert!(!log.vouches_for("w.safetensors", &listed, &fs::metadata(&path).unwrap()));
    }
}
