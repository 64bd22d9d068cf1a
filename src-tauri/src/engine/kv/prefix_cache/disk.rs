//! The disk tier: every block the RAM tier stores is also written, by its own thread, to a
//! safetensors file in the platform cache folder (one folder per model identity), so a prompt
//! seen before a restart (or evicted from RAM) is read back instead of prefilled. This file is
//! the tier (its index, budget, writer thread); `block_file` is the format of one file.
//!
//! - Writing never stalls the engine: blocks go to a bounded queue; when it is full the write is
//!   skipped (counted), never waited for.
//! - Every file names its model identity, its parent block, its tokens and a checksum of its
//!   data; a file that is truncated, corrupt, from another model or whose key does not match
//!   its contents is removed and treated as a miss: never a wrong answer, never a crash.
//! - A block is indexed when it is queued; read before its file is written (the next turn of an
//!   agent can come within milliseconds), it is a plain miss, not a bad file.
//! - The folder is kept within a byte budget, least recently used files first out.
//! - A write that fails (disk full, folder not writable) turns the tier off with one log line;
//!   serving goes on from RAM.
//! - A model with recurrent layers (linear-attention hybrids) stores their state in the blocks
//!   that keep a snapshot, and a placeholder in the others; a block that gains a snapshot after
//!   it was written is written again.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use mlx_rs::Dtype;
use serde_json::{json, Map, Value};

use super::block_file::{
    self, check_header, expected_size, hex, is_snapshot, read_file, read_header, unhex, write_file, BlockFile,
};
use super::key::BlockKey;

/// Blocks waiting to be written at most (each a few MB); more are skipped.
const QUEUE: usize = 32;
/// In each model's folder: which model it is.
const MODEL_FILE: &str = "model.json";

/// One model's folder in the disk tier, as `fastmlx cache ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFolder {
    pub model: String,
    pub dir: PathBuf,
    pub blocks: usize,
    pub bytes: u64,
}

/// The models with blocks under `root`.
pub fn list_folders(root: &Path) -> Vec<DiskFolder> {
    let mut folders: Vec<DiskFolder> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            let dir = e.path();
            let model = fs::read_to_string(dir.join(MODEL_FILE))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v["model"].as_str().map(str::to_string))
                .unwrap_or_else(|| "(unknown model)".into());
            let files: Vec<u64> = fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|f| f.path().extension().is_some_and(|x| x == "safetensors"))
                .map(|f| f.metadata().map_or(0, |m| m.len()))
                .collect();
            DiskFolder { model, dir, blocks: files.len(), bytes: files.iter().sum() }
        })
        .collect();
    folders.sort_by(|a, b| a.model.cmp(&b.model));
    folders
}

/// What the tier knows of a file without reading its data.
struct Entry {
    parent: BlockKey,
    tokens: Vec<u32>,
    bytes: u64,
    used: u64,
    snapshot: bool,
}

/// Counters shared with the writer thread.
#[derive(Default)]
struct Shared {
    off: AtomicBool,
    write_skips: AtomicU64,
    written: AtomicU64,
    /// Blocks queued whose file is not written yet.
    queued: Mutex<HashSet<BlockKey>>,
    /// Tests: the writer waits while this is set.
    #[cfg(test)]
    paused: AtomicBool,
}

impl Shared {
    fn queued(&self) -> std::sync::MutexGuard<'_, HashSet<BlockKey>> {
        self.queued.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub enabled: bool,
    pub bytes: u64,
    pub blocks: usize,
    pub hits: u64,
    pub write_skips: u64,
    pub written: u64,
    pub removed_bad: u64,
}

pub struct DiskTier {
    dir: PathBuf,
    identity: BlockKey,
    budget: u64,
    /// Per layer: whether it keeps a recurrent state rather than keys and values.
    recurrent: Vec<bool>,
    entries: HashMap<BlockKey, Entry>,
    children: HashMap<BlockKey, Vec<BlockKey>>,
    bytes: u64,
    clock: u64,
    hits: u64,
    removed_bad: u64,
    writer: Option<SyncSender<(BlockKey, BlockFile)>>,
    thread: Option<std::thread::JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl Drop for DiskTier {
    /// Lets the writer finish what is queued (at most [`QUEUE`] blocks), so a clean shutdown
    /// leaves every accepted block on disk.
    fn drop(&mut self) {
        self.writer = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl DiskTier {
    /// The tier in `root/<identity>`, holding at most `budget` bytes, for a model whose layers
    /// keep a recurrent state where `recurrent` says; `None` (with a log line) when the folder
    /// cannot be made.
    pub fn open(root: &Path, identity: BlockKey, budget: u64, model: &str, recurrent: Vec<bool>) -> Option<DiskTier> {
        let dir = root.join(&hex(&identity)[..32]);
        // `model.json` names the model, for `fastmlx cache ls`.
        let made = fs::create_dir_all(&dir)
            .and_then(|()| fs::write(dir.join(MODEL_FILE), json!({"model": model}).to_string()));
        if let Err(e) = made {
            tracing::warn!("prefix cache: no disk tier ({}: {e})", dir.display());
            return None;
        }
        let shared = Arc::new(Shared::default());
        let (tx, rx) = sync_channel::<(BlockKey, BlockFile)>(QUEUE);
        let (thread_dir, thread_shared, thread_identity) = (dir.clone(), shared.clone(), identity);
        let spawned = std::thread::Builder::new().name("fastmlx-prefix-disk".into()).spawn(move || {
            lower_priority();
            for (key, block) in rx {
                #[cfg(test)]
                while thread_shared.paused.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                if thread_shared.off.load(Ordering::Relaxed) {
                    thread_shared.queued().remove(&key);
                    continue;
                }
                let result = write_file(&thread_dir, &thread_identity, &key, &block);
                thread_shared.queued().remove(&key);
                match result {
                    Ok(()) => {
                        thread_shared.written.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        // Disk full, folder gone or not writable: serve on from RAM.
                        thread_shared.off.store(true, Ordering::Relaxed);
                        tracing::warn!(
                            "prefix cache: disk tier turned off: cannot write to {}: {e}",
                            thread_dir.display()
                        );
                    }
                }
            }
        });
        let (writer, thread) = match spawned {
            Ok(thread) => (Some(tx), Some(thread)),
            Err(_) => (None, None),
        };
        let mut tier = DiskTier {
            dir,
            identity,
            budget,
            recurrent,
            entries: HashMap::new(),
            children: HashMap::new(),
            bytes: 0,
            clock: 0,
            hits: 0,
            removed_bad: 0,
            writer,
            thread,
            shared,
        };
        tier.scan();
        tier.shrink();
        Some(tier)
    }

    pub fn stats(&self) -> DiskStats {
        DiskStats {
            enabled: !self.shared.off.load(Ordering::Relaxed),
            bytes: self.bytes,
            blocks: self.entries.len(),
            hits: self.hits,
            write_skips: self.shared.write_skips.load(Ordering::Relaxed),
            written: self.shared.written.load(Ordering::Relaxed),
            removed_bad: self.removed_bad,
        }
    }

    fn path(&self, key: &BlockKey) -> PathBuf {
        self.dir.join(format!("{}.safetensors", hex(key)))
    }

    /// Indexes the files already there (a previous run's), oldest first; removes foreign or
    /// unreadable ones.
    fn scan(&mut self) {
        let mut found: Vec<(std::time::SystemTime, BlockKey, Entry)> = Vec::new();
        for entry in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            // A write a crash cut short.
            if name.ends_with(".tmp") {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(key) = name.strip_suffix(".safetensors").and_then(unhex) else { continue };
            let meta = entry.metadata().ok();
            let bytes = meta.as_ref().map_or(0, fs::Metadata::len);
            // A file cut short (a crash, a full disk) is caught here by its size.
            let header = read_header(&path).ok().filter(|(h, header_len)| expected_size(h, *header_len) == Some(bytes));
            match header.and_then(|(h, _)| Some((check_header(&self.identity, &key, &h)?, is_snapshot(&h)))) {
                Some(((parent, tokens), snapshot)) => {
                    let when = meta.and_then(|m| m.modified().ok()).unwrap_or(std::time::UNIX_EPOCH);
                    found.push((when, key, Entry { parent, tokens, bytes, used: 0, snapshot }));
                }
                None => {
                    self.removed_bad += 1;
                    let _ = fs::remove_file(&path);
                }
            }
        }
        found.sort_by_key(|(when, _, _)| *when);
        for (_, key, mut entry) in found {
            self.clock += 1;
            entry.used = self.clock;
            self.add(key, entry);
        }
    }

    fn add(&mut self, key: BlockKey, entry: Entry) {
        self.bytes += entry.bytes;
        self.children.entry(entry.parent).or_default().push(key);
        if let Some(old) = self.entries.insert(key, entry) {
            self.bytes -= old.bytes;
            if let Some(siblings) = self.children.get_mut(&old.parent) {
                if let Some(i) = siblings.iter().position(|k| *k == key) {
                    siblings.remove(i);
                }
            }
        }
    }

    fn remove(&mut self, key: &BlockKey) {
        if let Some(entry) = self.entries.remove(key) {
            self.bytes -= entry.bytes;
            if let Some(siblings) = self.children.get_mut(&entry.parent) {
                siblings.retain(|k| k != key);
            }
            let _ = fs::remove_file(self.path(key));
        }
    }

    /// Least recently used files out until within the budget.
    fn shrink(&mut self) {
        if self.bytes <= self.budget {
            return;
        }
        let mut by_age: Vec<(u64, BlockKey)> = self.entries.iter().map(|(k, e)| (e.used, *k)).collect();
        by_age.sort();
        for (_, key) in by_age {
            if self.bytes <= self.budget {
                break;
            }
            self.remove(&key);
        }
    }

    /// Queues a block for writing (skipped when the queue is full or the tier is off, or when
    /// the file is there already, unless this block brings the snapshot that file lacks).
    pub fn write(&mut self, key: BlockKey, block: BlockFile) {
        let written = self.entries.get(&key).is_some_and(|e| e.snapshot || !block.snapshot);
        if written || self.shared.off.load(Ordering::Relaxed) {
            return;
        }
        let Some(writer) = &self.writer else { return };
        let bytes = block.data_bytes() as u64 + 4096;
        let (parent, tokens, snapshot) = (block.parent, block.tokens.clone(), block.snapshot);
        // Marked before it is sent: the writer may be done with it before `try_send` returns.
        let fresh = self.shared.queued().insert(key);
        match writer.try_send((key, block)) {
            Ok(()) => {
                self.clock += 1;
                self.add(key, Entry { parent, tokens, bytes, used: self.clock, snapshot });
                self.shrink();
                return;
            }
            Err(TrySendError::Full(_)) => {
                self.shared.write_skips.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {
                // The writer is gone: nothing queued will be written.
                self.writer = None;
                self.shared.queued().clear();
            }
        }
        if fresh {
            self.shared.queued().remove(&key);
        }
    }

    pub fn contains(&self, key: &BlockKey) -> bool {
        self.entries.contains_key(key)
    }

    /// Whether block `key`'s file keeps the recurrent layers' state.
    pub fn has_snapshot(&self, key: &BlockKey) -> bool {
        self.entries.get(key).is_some_and(|e| e.snapshot)
    }

    /// The children of `parent` on disk, with their tokens.
    pub fn children(&self, parent: &BlockKey) -> Vec<(BlockKey, Vec<u32>)> {
        self.children
            .get(parent)
            .into_iter()
            .flatten()
            .filter_map(|k| Some((*k, self.entries.get(k)?.tokens.clone())))
            .collect()
    }

    /// Reads a block back; a bad file is removed and reads as `None`.
    pub fn read(&mut self, key: &BlockKey) -> Option<BlockFile> {
        self.entries.get(key)?;
        let path = self.path(key);
        let queued = self.is_queued(key);
        let block =
            read_file(&path).ok().and_then(|(header, file, start)| self.decode(key, &header, Arc::new(file), start));
        self.count_read(key, &path, block.is_some(), queued).then_some(block).flatten()
    }

    /// Whether `key`'s file may not be written yet. Asked before the file is opened: a block
    /// written between the two is not taken for a bad file.
    fn is_queued(&self, key: &BlockKey) -> bool {
        self.shared.queued().contains(key)
    }

    /// Counts a read of `key`'s file: a hit marks it recently used; a bad file is removed (one
    /// that was still `queued` is only a miss). Returns `ok`.
    fn count_read(&mut self, key: &BlockKey, path: &Path, ok: bool, queued: bool) -> bool {
        if !ok && queued {
            // Not written yet: a miss this time, there the next.
            return false;
        }
        if ok {
            self.hits += 1;
            self.clock += 1;
            let clock = self.clock;
            if let Some(e) = self.entries.get_mut(key) {
                e.used = clock;
            }
        } else {
            tracing::warn!("prefix cache: removed an unreadable or foreign file {}", path.display());
            self.removed_bad += 1;
            self.remove(key);
        }
        ok
    }

    /// The block in `file`, whose tensor data starts at `start`.
    fn decode(
        &self,
        key: &BlockKey,
        header: &Map<String, Value>,
        file: Arc<Vec<u8>>,
        start: usize,
    ) -> Option<BlockFile> {
        block_file::decode(&self.identity, &self.recurrent, key, header, file, start)
    }

    /// Per layer, the dtype, heads and head size of block `key`'s keys, then of its values;
    /// `None` when its file cannot be read or is not this model's block, and for a model with
    /// recurrent layers (whose blocks are read whole, by [`Self::read`]).
    pub fn layer_shapes(&self, key: &BlockKey) -> Option<Vec<(Dtype, i32, i32)>> {
        if self.recurrent.contains(&true) {
            return None;
        }
        block_file::layer_shapes(&self.identity, key, &self.path(key))
    }

    /// values' buffer, `[1, H, capacity, D]`, with their dtype): its first `used` tokens go to
    /// columns `column..column + used`, the rest is only checked. The whole file is checked
    /// (identity, key, layout, shapes, checksum); false when anything is wrong: the file is
    /// removed and what was written must not be used.
    pub fn read_into(
        &mut self,
        key: &BlockKey,
        dest: &mut [(Dtype, &mut [u8])],
        capacity: usize,
        column: usize,
        used: usize,
    ) -> bool {
        if !self.entries.contains_key(key) {
            return false;
        }
        let path = self.path(key);
        let queued = self.is_queued(key);
        let ok = block_file::read_into(&self.identity, key, &path, dest, capacity, column, used).is_some();
        self.count_read(key, &path, ok, queued)
    }

    /// Removes every file of this model.
    pub fn clear(&mut self) {
        let keys: Vec<BlockKey> = self.entries.keys().copied().collect();
        for key in keys {
            self.remove(&key);
        }
    }
}

/// The writer runs below the engine's priority: on a machine with few cores, writing (and
/// hashing) a long prompt's blocks must not slow the prefill that produces them.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: sets this thread's nice value; no memory is involved.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
    }
    #[cfg(target_vendor = "apple")]
    {
        unsafe extern "C" {
            fn pthread_set_qos_class_self_np(qos_class: u32, relative_priority: i32) -> i32;
        }
        /// `QOS_CLASS_UTILITY` (sys/qos.h): work the user is not waiting on.
        const QOS_CLASS_UTILITY: u32 = 0x11;
        // SAFETY: sets this thread's QoS class; no memory is involved.
        unsafe {
            pthread_set_qos_class_self_np(QOS_CLASS_UTILITY, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block_file::Tensor;
    use super::super::key::chain;
    use super::*;

    /// A block of `tokens` after the root, one layer of f32 keys and values.
    fn block(tokens: Vec<u32>) -> (BlockKey, BlockFile) {
        let parent = [0u8; 32];
        let key = chain(&parent, &tokens);
        let n = tokens.len();
        let tensor = |fill: f32| {
            let data: Vec<u8> = std::iter::repeat_n(fill.to_le_bytes(), n * 2).flatten().collect();
            let range = 0..data.len();
            Tensor { dtype: Dtype::Float32, shape: vec![1, 1, n as i32, 2], data: Arc::new(data), range }
        };
        (
            key,
            BlockFile {
                parent,
                tokens,
                layers: vec![(vec![tensor(1.0)], vec![tensor(2.0)])],
                snapshot: false,
                quant: None,
            },
        )
    }

    /// An agent's next turn can ask for a block its last turn queued a few milliseconds before:
    /// until the file is written that is a miss, and the block stays indexed.
    #[test]
    fn a_block_read_before_its_file_is_written_is_a_miss_not_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut tier = DiskTier::open(dir.path(), [7u8; 32], 1 << 30, "m", vec![false]).unwrap();
        tier.shared.paused.store(true, Ordering::Relaxed);
        let (key, file) = block(vec![1, 2, 3]);
        tier.write(key, file);
        let early = (tier.read(&key).is_none(), tier.stats().removed_bad, tier.contains(&key));
        // Let the writer go before asserting: a failed test must not leave it paused (its drop joins it).
        tier.shared.paused.store(false, Ordering::Relaxed);
        assert_eq!(early, (true, 0, true), "a miss, nothing removed, still indexed");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while tier.stats().written == 0 {
            assert!(std::time::Instant::now() < deadline, "the writer wrote nothing");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let back = tier.read(&key).expect("read once written");
        assert_eq!((back.tokens, tier.stats().hits), (vec![1, 2, 3], 1));

        // A file that goes missing when nothing is queued is still a bad file, removed.
        fs::remove_file(tier.path(&key)).unwrap();
        assert!(tier.read(&key).is_none());
        assert_eq!((tier.stats().removed_bad, tier.contains(&key)), (1, false));
    }
}
