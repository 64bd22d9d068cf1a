//! The disk tier: every block the RAM tier stores is also written, by its own thread, to a
//! safetensors file in the platform cache folder (one folder per model identity), so a prompt
//! seen before a restart (or evicted from RAM) is read back instead of prefilled.
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
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use mlx_rs::{Array, Dtype};
use serde_json::{json, Map, Value};

use super::key::{chain, BlockKey};

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

/// A block as bytes, ready for a file (or read from one).
pub struct BlockFile {
    pub parent: BlockKey,
    pub tokens: Vec<u32>,
    /// Per layer: keys and values, or a recurrent layer's state (or placeholder).
    pub layers: Vec<(Tensor, Tensor)>,
    /// Whether the recurrent layers' entries are their state at the block's end.
    pub snapshot: bool,
}

/// A tensor's bytes: its own, or a range of a file read whole (shared by the block's tensors,
/// so a read copies the file once, not once more per tensor).
pub struct Tensor {
    pub dtype: Dtype,
    pub shape: Vec<i32>,
    data: Arc<Vec<u8>>,
    range: std::ops::Range<usize>,
}

impl Tensor {
    /// The bytes of an evaluated, contiguous array.
    pub fn from_array(a: &Array) -> Option<Tensor> {
        fn bytes<T: mlx_rs::ArrayElement>(a: &Array) -> Option<Vec<u8>> {
            let s = a.try_as_slice::<T>().ok()?;
            // SAFETY: a plain-old-data slice viewed as its bytes.
            Some(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }.to_vec())
        }
        // A view (a block of a shared segment) is laid out as its own row-major copy first.
        let a = &a.contiguous().ok()?;
        a.eval().ok()?;
        let data = match a.dtype() {
            Dtype::Float32 => bytes::<f32>(a)?,
            Dtype::Float16 => bytes::<half::f16>(a)?,
            Dtype::Bfloat16 => bytes::<half::bf16>(a)?,
            _ => return None,
        };
        let range = 0..data.len();
        Some(Tensor { dtype: a.dtype(), shape: a.shape().to_vec(), data: Arc::new(data), range })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data[self.range.clone()]
    }

    pub fn to_array(&self) -> Array {
        // SAFETY: `data` holds exactly shape's elements of `dtype` (checked when read).
        unsafe { Array::from_raw_data(self.bytes().as_ptr().cast(), &self.shape, self.dtype) }
    }

    fn element_size(dtype: Dtype) -> Option<usize> {
        match dtype {
            Dtype::Float32 => Some(4),
            Dtype::Float16 | Dtype::Bfloat16 => Some(2),
            _ => None,
        }
    }
}

fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Float16 => "F16",
        Dtype::Bfloat16 => "BF16",
        _ => "F32",
    }
}

fn dtype_of(name: &str) -> Option<Dtype> {
    match name {
        "F32" => Some(Dtype::Float32),
        "F16" => Some(Dtype::Float16),
        "BF16" => Some(Dtype::Bfloat16),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<BlockKey> {
    if text.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
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
            match header.and_then(|(h, _)| Some((self.check_header(&key, &h)?, is_snapshot(&h)))) {
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

    /// `(parent, tokens)` when the header belongs to this model and to this key.
    fn check_header(&self, key: &BlockKey, header: &Map<String, Value>) -> Option<(BlockKey, Vec<u32>)> {
        let meta = header.get("__metadata__")?.as_object()?;
        if meta.get("identity")?.as_str()? != hex(&self.identity) {
            return None;
        }
        let parent = unhex(meta.get("parent")?.as_str()?)?;
        let tokens: Vec<u32> = meta
            .get("tokens")?
            .as_str()?
            .split(',')
            .filter(|t| !t.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        (chain(&parent, &tokens) == *key).then_some((parent, tokens))
    }

    /// Queues a block for writing (skipped when the queue is full or the tier is off, or when
    /// the file is there already, unless this block brings the snapshot that file lacks).
    pub fn write(&mut self, key: BlockKey, block: BlockFile) {
        let written = self.entries.get(&key).is_some_and(|e| e.snapshot || !block.snapshot);
        if written || self.shared.off.load(Ordering::Relaxed) {
            return;
        }
        let Some(writer) = &self.writer else { return };
        let bytes = block.layers.iter().map(|(k, v)| (k.bytes().len() + v.bytes().len()) as u64).sum::<u64>() + 4096;
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
        let (parent, tokens) = self.check_header(key, header)?;
        let (data, start_of_data) = (file.get(start..)?, start);
        let meta = header.get("__metadata__")?.as_object()?;
        let sum: u64 = meta.get("xxh3")?.as_str()?.parse().ok()?;
        if xxhash_rust::xxh3::xxh3_64(data) != sum {
            return None;
        }
        let layers: usize = meta.get("layers")?.as_str()?.parse().ok()?;
        let snapshot = is_snapshot(header);
        (layers == self.recurrent.len()).then_some(())?;
        let tensor = |name: &str, recurrent: bool| -> Option<Tensor> {
            let t = header.get(name)?.as_object()?;
            let dtype = dtype_of(t.get("dtype")?.as_str()?)?;
            let shape: Vec<i32> = t
                .get("shape")?
                .as_array()?
                .iter()
                .map(|d| d.as_i64().and_then(|d| i32::try_from(d).ok()))
                .collect::<Option<_>>()?;
            let offsets = t.get("data_offsets")?.as_array()?;
            let (start, end) = (offsets.first()?.as_u64()? as usize, offsets.get(1)?.as_u64()? as usize);
            // Checked: a crafted header's dimensions must not overflow.
            let count = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))?;
            let bytes = count.checked_mul(Tensor::element_size(dtype)?)?;
            if end < start || end > data.len() || end - start != bytes {
                return None;
            }
            // Keys and values of this block's tokens: [1, H, tokens, D]; a recurrent layer's
            // state (`[1, ...]`, at most 4 dimensions) when the block keeps a snapshot, else a
            // one-element placeholder.
            let fits = if !recurrent {
                shape.len() == 4 && shape[2] as usize == tokens.len()
            } else if snapshot {
                (1..=4).contains(&shape.len()) && shape[0] == 1
            } else {
                shape == [1]
            };
            if !fits {
                return None;
            }
            let (data, range) = (file.clone(), start_of_data + start..start_of_data + end);
            Some(Tensor { dtype, shape, data, range })
        };
        let layers = (0..layers)
            .map(|l| {
                let recurrent = self.recurrent[l];
                let (k, v) = (tensor(&format!("k.{l}"), recurrent)?, tensor(&format!("v.{l}"), recurrent)?);
                // A snapshot's first state is the state itself, never a placeholder.
                (!(recurrent && snapshot) || k.shape.len() > 1).then_some((k, v))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(BlockFile { parent, tokens, layers, snapshot })
    }

    /// Per layer, the dtype, heads and head size of block `key`'s keys, then of its values;
    /// `None` when its file cannot be read or is not this model's block, and for a model with
    /// recurrent layers (whose blocks are read whole, by [`Self::read`]).
    pub fn layer_shapes(&self, key: &BlockKey) -> Option<Vec<(Dtype, i32, i32)>> {
        if self.recurrent.contains(&true) {
            return None;
        }
        let (header, _) = read_header(&self.path(key)).ok()?;
        let (_, tokens) = self.check_header(key, &header)?;
        let layers: usize = header.get("__metadata__")?.get("layers")?.as_str()?.parse().ok()?;
        (0..layers)
            .flat_map(|l| [format!("k.{l}"), format!("v.{l}")])
            .map(|name| TensorEntry::parse(header.get(&name)?, tokens.len()).map(|t| (t.dtype, t.shape[1], t.shape[3])))
            .collect()
    }

    /// Reads block `key` from its file straight into `dest` (per layer, its keys' and then its
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
        let ok = self.read_checked(key, &path, dest, capacity, column, used).is_some();
        self.count_read(key, &path, ok, queued)
    }

    fn read_checked(
        &self,
        key: &BlockKey,
        path: &Path,
        dest: &mut [(Dtype, &mut [u8])],
        capacity: usize,
        column: usize,
        used: usize,
    ) -> Option<()> {
        use std::io::Read;
        let mut file = fs::File::open(path).ok()?;
        let (header, header_len) = read_header_from(&mut file).ok()?;
        let (_, tokens) = self.check_header(key, &header)?;
        let meta = header.get("__metadata__")?.as_object()?;
        let sum: u64 = meta.get("xxh3")?.as_str()?.parse().ok()?;
        let layers: usize = meta.get("layers")?.as_str()?.parse().ok()?;
        (layers * 2 == dest.len() && used <= tokens.len()).then_some(())?;
        let data_len = file.metadata().ok()?.len().checked_sub(8 + header_len)?;
        // Keys and values of every layer, in file order; they must fill the data exactly, one
        // after the other, as `write_file` lays them out.
        let mut tensors = (0..layers)
            .flat_map(|l| [format!("k.{l}"), format!("v.{l}")])
            .enumerate()
            .map(|(i, name)| Some((i, TensorEntry::parse(header.get(&name)?, tokens.len())?)))
            .collect::<Option<Vec<_>>>()?;
        tensors.sort_by_key(|(_, t)| t.start);
        let mut end = 0;
        for (_, t) in &tensors {
            (t.start == end).then_some(())?;
            end = t.end;
        }
        (end == data_len).then_some(())?;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut unused = Vec::new();
        for (i, t) in &tensors {
            let (dtype, dest) = &mut dest[*i];
            let (heads, row) = (t.shape[1] as usize, t.shape[3] as usize * Tensor::element_size(t.dtype)?);
            (*dtype == t.dtype && dest.len() == heads * capacity * row && column + used <= capacity).then_some(())?;
            // Each head's tokens are contiguous in the file and in the buffer.
            for head in 0..heads {
                let at = (head * capacity + column) * row;
                let part = &mut dest[at..at + used * row];
                file.read_exact(part).ok()?;
                hasher.update(part);
                unused.resize((tokens.len() - used) * row, 0);
                file.read_exact(&mut unused).ok()?;
                hasher.update(&unused);
            }
        }
        (hasher.digest() == sum).then_some(())
    }

    /// Removes every file of this model.
    pub fn clear(&mut self) {
        let keys: Vec<BlockKey> = self.entries.keys().copied().collect();
        for key in keys {
            self.remove(&key);
        }
    }
}

/// Whether a block file's header says it keeps the recurrent layers' state.
fn is_snapshot(header: &Map<String, Value>) -> bool {
    header.get("__metadata__").and_then(|m| m.get("snapshot")).and_then(Value::as_str) == Some("1")
}

/// The size a safetensors file with this header must have.
fn expected_size(header: &Map<String, Value>, header_len: u64) -> Option<u64> {
    let data_end = header
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(_, t)| t.get("data_offsets")?.as_array()?.get(1)?.as_u64())
        .collect::<Option<Vec<u64>>>()?
        .into_iter()
        .max()
        .unwrap_or(0);
    Some(8 + header_len + data_end)
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

/// The header of a safetensors file, and its length.
fn read_header(path: &Path) -> std::io::Result<(Map<String, Value>, u64)> {
    read_header_from(&mut fs::File::open(path)?)
}

/// The header of the safetensors file `file` (read from its start), and its length; the file
/// is left at the start of the data.
fn read_header_from(file: &mut fs::File) -> std::io::Result<(Map<String, Value>, u64)> {
    use std::io::Read;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > 16 << 20 {
        return Err(std::io::Error::other("header too large"));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header)?;
    let header = serde_json::from_slice::<Value>(&header).ok().and_then(|v| v.as_object().cloned());
    header.map(|h| (h, len)).ok_or_else(|| std::io::Error::other("not a safetensors header"))
}

/// One tensor of a block file as its header describes it.
struct TensorEntry {
    dtype: Dtype,
    shape: Vec<i32>,
    start: u64,
    end: u64,
}

impl TensorEntry {
    /// A block's keys or values, `[1, H, tokens, D]`, whose byte range matches the shape.
    fn parse(entry: &Value, tokens: usize) -> Option<TensorEntry> {
        let t = entry.as_object()?;
        let dtype = dtype_of(t.get("dtype")?.as_str()?)?;
        let shape: Vec<i32> = t
            .get("shape")?
            .as_array()?
            .iter()
            .map(|d| d.as_i64().and_then(|d| i32::try_from(d).ok()))
            .collect::<Option<_>>()?;
        let offsets = t.get("data_offsets")?.as_array()?;
        let (start, end) = (offsets.first()?.as_u64()?, offsets.get(1)?.as_u64()?);
        let count = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))?;
        let sized = end >= start && Some(end - start) == count.checked_mul(Tensor::element_size(dtype)? as u64);
        (sized && shape.len() == 4 && shape[0] == 1 && shape[2] as usize == tokens).then_some(TensorEntry {
            dtype,
            shape,
            start,
            end,
        })
    }
}

/// The header and the data of a safetensors file.
/// A safetensors file's header, its bytes, and where its data starts in them.
fn read_file(path: &Path) -> std::io::Result<(Map<String, Value>, Vec<u8>, usize)> {
    let bytes = fs::read(path)?;
    let len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| std::io::Error::other("truncated"))?;
    let start = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(8))
        .filter(|&s| s <= bytes.len())
        .ok_or_else(|| std::io::Error::other("truncated"))?;
    let header = serde_json::from_slice::<Value>(&bytes[8..start])
        .ok()
        .and_then(|v| v.as_object().cloned())
        .ok_or_else(|| std::io::Error::other("bad header"))?;
    Ok((header, bytes, start))
}

/// Writes a block as `<key>.safetensors` (through a temporary file, so a crash leaves no half file
/// under the real name).
fn write_file(dir: &Path, identity: &BlockKey, key: &BlockKey, block: &BlockFile) -> std::io::Result<()> {
    let mut header = Map::new();
    let mut data: Vec<u8> =
        Vec::with_capacity(block.layers.iter().map(|(k, v)| k.bytes().len() + v.bytes().len()).sum());
    for (l, (k, v)) in block.layers.iter().enumerate() {
        for (name, t) in [(format!("k.{l}"), k), (format!("v.{l}"), v)] {
            let start = data.len();
            data.extend_from_slice(t.bytes());
            header.insert(
                name,
                json!({"dtype": dtype_name(t.dtype), "shape": t.shape, "data_offsets": [start, data.len()]}),
            );
        }
    }
    let tokens: Vec<String> = block.tokens.iter().map(u32::to_string).collect();
    header.insert(
        "__metadata__".into(),
        json!({
            "format": "fastmlx-prefix-cache-v1",
            "identity": hex(identity),
            "parent": hex(&block.parent),
            "tokens": tokens.join(","),
            "layers": block.layers.len().to_string(),
            "snapshot": if block.snapshot { "1" } else { "0" },
            "xxh3": xxhash_rust::xxh3::xxh3_64(&data).to_string(),
        }),
    );
    let mut header = serde_json::to_vec(&Value::Object(header))?;
    // safetensors pads the header with spaces to 8 bytes.
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let path = dir.join(format!("{}.safetensors", hex(key)));
    let tmp = dir.join(format!("{}.safetensors.tmp", hex(key)));
    let mut file = fs::File::create(&tmp)?;
    file.write_all(&(header.len() as u64).to_le_bytes())?;
    file.write_all(&header)?;
    file.write_all(&data)?;
    file.sync_data().ok();
    drop(file);
    fs::rename(&tmp, &path)
}

#[cfg(test)]
mod tests {
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
        (key, BlockFile { parent, tokens, layers: vec![(tensor(1.0), tensor(2.0))], snapshot: false })
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
