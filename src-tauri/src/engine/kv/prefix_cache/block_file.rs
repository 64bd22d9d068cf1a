//! The disk tier's file format: one block per safetensors file, `<key>.safetensors`. Its
//! metadata names the model identity, the parent block, the block's tokens, the layer count,
//! whether the recurrent layers' entries are a snapshot of their state, and a checksum of the
//! data; per layer `k.<l>` and `v.<l>` hold the keys and values (`[1, H, tokens, D]`), or a
//! recurrent layer's state (or a one-element placeholder). Quantized keys and values (the
//! metadata's `kv_bits` and `kv_group_size`) are three tensors each: the packed words `k.<l>`,
//! `k.<l>.scales` and `k.<l>.biases`. Every read checks all of it: a file that is cut short,
//! corrupt, from another model or under another key reads as nothing.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use mlx_rs::{Array, Dtype};
use serde_json::{json, Map, Value};

use super::key::{chain, BlockKey};
use crate::model::KvQuant;

/// A block as bytes, ready for a file (or read from one).
pub struct BlockFile {
    pub parent: BlockKey,
    pub tokens: Vec<u32>,
    /// Per layer: keys and values (one tensor each, or three when quantized: packed words,
    /// scales, biases), or a recurrent layer's state (or placeholder), one tensor each.
    pub layers: Vec<(Vec<Tensor>, Vec<Tensor>)>,
    /// Whether the recurrent layers' entries are their state at the block's end.
    pub snapshot: bool,
    /// How the keys and values are quantized (`None`: at full precision).
    pub quant: Option<KvQuant>,
}

impl BlockFile {
    /// Bytes of its tensors.
    pub fn data_bytes(&self) -> usize {
        self.layers.iter().flat_map(|(k, v)| k.iter().chain(v)).map(|t| t.bytes().len()).sum()
    }
}

/// The names of a layer's keys (`k`) or values (`v`) tensors: one, or three when quantized.
fn part_names(side: &str, layer: usize, parts: usize) -> Vec<String> {
    let name = format!("{side}.{layer}");
    match parts {
        3 => vec![name.clone(), format!("{name}.scales"), format!("{name}.biases")],
        _ => vec![name],
    }
}

/// A tensor's bytes: its own, or a range of a file read whole (shared by the block's tensors,
/// so a read copies the file once, not once more per tensor).
pub struct Tensor {
    pub dtype: Dtype,
    pub shape: Vec<i32>,
    pub(super) data: Arc<Vec<u8>>,
    pub(super) range: std::ops::Range<usize>,
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
            Dtype::Uint32 => bytes::<u32>(a)?,
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
            Dtype::Float32 | Dtype::Uint32 => Some(4),
            Dtype::Float16 | Dtype::Bfloat16 => Some(2),
            _ => None,
        }
    }
}

fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Float16 => "F16",
        Dtype::Bfloat16 => "BF16",
        Dtype::Uint32 => "U32",
        _ => "F32",
    }
}

fn dtype_of(name: &str) -> Option<Dtype> {
    match name {
        "F32" => Some(Dtype::Float32),
        "F16" => Some(Dtype::Float16),
        "BF16" => Some(Dtype::Bfloat16),
        "U32" => Some(Dtype::Uint32),
        _ => None,
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(text: &str) -> Option<BlockKey> {
    if text.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

/// `(parent, tokens)` when the header belongs to the model `identity` and to this key.
pub fn check_header(identity: &BlockKey, key: &BlockKey, header: &Map<String, Value>) -> Option<(BlockKey, Vec<u32>)> {
    let meta = header.get("__metadata__")?.as_object()?;
    if meta.get("identity")?.as_str()? != hex(identity) {
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

/// The block in `file`, whose tensor data starts at `start`, checked whole (identity, key,
/// checksum, layers, shapes) for a model whose layers keep a recurrent state where `recurrent`
/// says; `None` when anything is wrong.
pub fn decode(
    identity: &BlockKey,
    recurrent: &[bool],
    key: &BlockKey,
    header: &Map<String, Value>,
    file: Arc<Vec<u8>>,
    start: usize,
) -> Option<BlockFile> {
    let (parent, tokens) = check_header(identity, key, header)?;
    let (data, start_of_data) = (file.get(start..)?, start);
    let meta = header.get("__metadata__")?.as_object()?;
    let sum: u64 = meta.get("xxh3")?.as_str()?.parse().ok()?;
    if xxhash_rust::xxh3::xxh3_64(data) != sum {
        return None;
    }
    let layers: usize = meta.get("layers")?.as_str()?.parse().ok()?;
    let snapshot = is_snapshot(header);
    let quant = quant_of(meta)?;
    (layers == recurrent.len()).then_some(())?;
    let tensor = |name: &str, recurrent: bool| -> Option<Tensor> {
        let TensorEntry { dtype, shape, start, end } = TensorEntry::read(header.get(name)?)?;
        let (start, end) = (usize::try_from(start).ok()?, usize::try_from(end).ok()?);
        if end > data.len() {
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
            let recurrent = recurrent[l];
            let parts = if quant.is_some() && !recurrent { 3 } else { 1 };
            let side = |side: &str| -> Option<Vec<Tensor>> {
                part_names(side, l, parts).iter().map(|name| tensor(name, recurrent)).collect()
            };
            let (k, v) = (side("k")?, side("v")?);
            // A snapshot's first state is the state itself, never a placeholder.
            (!(recurrent && snapshot) || k[0].shape.len() > 1).then_some((k, v))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(BlockFile { parent, tokens, layers, snapshot, quant })
}

/// The quantization a block's metadata names: `Some(None)` for none, `None` when malformed.
fn quant_of(meta: &Map<String, Value>) -> Option<Option<KvQuant>> {
    let number = |name: &str| -> Option<Option<i32>> {
        match meta.get(name) {
            None => Some(None),
            Some(v) => Some(Some(v.as_str()?.parse().ok()?)),
        }
    };
    match (number("kv_bits")?, number("kv_group_size")?) {
        (None, None) => Some(None),
        (Some(bits), Some(group_size)) => Some(Some(KvQuant { bits, group_size })),
        _ => None,
    }
}

/// Per layer, the dtype, heads and head size of block `key`'s keys, then of its values, from
/// the header of its file at `path`; `None` when it cannot be read or is not the block `key` of
/// the model `identity`.
pub fn layer_shapes(identity: &BlockKey, key: &BlockKey, path: &Path) -> Option<Vec<(Dtype, i32, i32)>> {
    let (header, _) = read_header(path).ok()?;
    let (_, tokens) = check_header(identity, key, &header)?;
    let meta = header.get("__metadata__")?.as_object()?;
    // Quantized blocks are read whole (`decode`), not straight into buffers.
    quant_of(meta)?.is_none().then_some(())?;
    let layers: usize = meta.get("layers")?.as_str()?.parse().ok()?;
    (0..layers)
        .flat_map(|l| [format!("k.{l}"), format!("v.{l}")])
        .map(|name| TensorEntry::parse(header.get(&name)?, tokens.len()).map(|t| (t.dtype, t.shape[1], t.shape[3])))
        .collect()
}

/// Reads block `key` of the model `identity` from its file at `path` straight into `dest` (per
/// layer, its keys' and then its values' buffer, `[1, H, capacity, D]`, with their dtype): its
/// first `used` tokens go to columns `column..column + used`, the rest is only checked. The
/// whole file is checked (identity, key, layout, shapes, checksum); `None` when anything is
/// wrong, and then what was written must not be used.
pub fn read_into(
    identity: &BlockKey,
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
    let (_, tokens) = check_header(identity, key, &header)?;
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

/// Whether a block file's header says it keeps the recurrent layers' state.
pub fn is_snapshot(header: &Map<String, Value>) -> bool {
    header.get("__metadata__").and_then(|m| m.get("snapshot")).and_then(Value::as_str) == Some("1")
}

/// The size a safetensors file with this header must have.
pub fn expected_size(header: &Map<String, Value>, header_len: u64) -> Option<u64> {
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

/// The header of a safetensors file, and its length.
pub fn read_header(path: &Path) -> std::io::Result<(Map<String, Value>, u64)> {
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
        let t = TensorEntry::read(entry)?;
        (t.shape.len() == 4 && t.shape[0] == 1 && t.shape[2] as usize == tokens).then_some(t)
    }

    /// A tensor whose byte range is as long as its dtype and shape say (a crafted header's
    /// dimensions checked not to overflow).
    fn read(entry: &Value) -> Option<TensorEntry> {
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
        sized.then_some(TensorEntry { dtype, shape, start, end })
    }
}

/// A safetensors file's header, its bytes, and where its data starts in them.
pub fn read_file(path: &Path) -> std::io::Result<(Map<String, Value>, Vec<u8>, usize)> {
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
pub fn write_file(dir: &Path, identity: &BlockKey, key: &BlockKey, block: &BlockFile) -> std::io::Result<()> {
    let mut header = Map::new();
    let mut data: Vec<u8> = Vec::with_capacity(block.data_bytes());
    for (l, (k, v)) in block.layers.iter().enumerate() {
        let named =
            part_names("k", l, k.len()).into_iter().zip(k).chain(part_names("v", l, v.len()).into_iter().zip(v));
        for (name, t) in named {
            let start = data.len();
            data.extend_from_slice(t.bytes());
            header.insert(
                name,
                json!({"dtype": dtype_name(t.dtype), "shape": t.shape, "data_offsets": [start, data.len()]}),
            );
        }
    }
    let tokens: Vec<String> = block.tokens.iter().map(u32::to_string).collect();
    let mut meta = json!({
        "format": "fastmlx-prefix-cache-v1",
        "identity": hex(identity),
        "parent": hex(&block.parent),
        "tokens": tokens.join(","),
        "layers": block.layers.len().to_string(),
        "snapshot": if block.snapshot { "1" } else { "0" },
        "xxh3": xxhash_rust::xxh3::xxh3_64(&data).to_string(),
    });
    if let Some(q) = block.quant {
        meta["kv_bits"] = json!(q.bits.to_string());
        meta["kv_group_size"] = json!(q.group_size.to_string());
    }
    header.insert("__metadata__".into(), meta);
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
