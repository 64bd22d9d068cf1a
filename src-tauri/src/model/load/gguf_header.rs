//! The key/value metadata and tensor shapes at the start of a GGUF file, read without loading
//! any weights: without the metadata arrays for model listings, which look at many files
//! ([`read`]); with them (the vocabulary) for loading ([`read_all`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    /// An array skipped by [`read`] (the vocabulary is large): only its length.
    Array(u64),
    /// An array as [`read_all`] keeps it.
    List(Vec<MetaValue>),
}

pub struct GgufHeader {
    pub metadata: HashMap<String, MetaValue>,
    /// Elements of each tensor.
    pub tensor_elements: Vec<u64>,
    /// Each tensor's ggml type id.
    pub tensor_types: Vec<u32>,
    pub tensor_names: Vec<String>,
    /// Each tensor's dimensions, GGUF's order (the fastest-varying first).
    pub tensor_dims: Vec<Vec<u64>>,
    /// Where each tensor's data starts in the file.
    pub tensor_offsets: Vec<u64>,
}

impl GgufHeader {
    pub fn string(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key) {
            Some(MetaValue::Str(s)) => Some(s),
            _ => None,
        }
    }

    pub fn int(&self, key: &str) -> Option<i128> {
        match self.metadata.get(key) {
            Some(MetaValue::Int(i)) => Some(*i),
            _ => None,
        }
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }
}

const MAX_STRING: u64 = 16 << 20;
const MAX_ENTRIES: u64 = 1 << 20;

/// The header, arrays skipped.
pub fn read(path: &Path) -> std::io::Result<GgufHeader> {
    read_with(path, false)
}

/// The header with every metadata array.
pub fn read_all(path: &Path) -> std::io::Result<GgufHeader> {
    read_with(path, true)
}

fn read_with(path: &Path, keep_arrays: bool) -> std::io::Result<GgufHeader> {
    let mut r = BufReader::new(File::open(path)?);
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if &magic != b"GGUF" {
        return Err(invalid("not a GGUF file"));
    }
    let version = u32_(&mut r)?;
    if !(2..=3).contains(&version) {
        return Err(invalid(&format!("GGUF version {version} is not supported")));
    }
    let tensors = u64_(&mut r)?;
    let entries = u64_(&mut r)?;
    if tensors > MAX_ENTRIES || entries > MAX_ENTRIES {
        return Err(invalid("implausible GGUF header counts"));
    }
    let mut metadata = HashMap::new();
    for _ in 0..entries {
        let key = string(&mut r)?;
        let kind = u32_(&mut r)?;
        metadata.insert(key, value(&mut r, kind, keep_arrays, 0)?);
    }
    let (mut tensor_elements, mut tensor_types, mut tensor_names) = (Vec::new(), Vec::new(), Vec::new());
    let (mut tensor_dims, mut offsets) = (Vec::new(), Vec::new());
    for _ in 0..tensors {
        tensor_names.push(string(&mut r)?);
        let n = u32_(&mut r)?;
        if n > 8 {
            return Err(invalid("a tensor with more than 8 dimensions"));
        }
        let dims = (0..n).map(|_| u64_(&mut r)).collect::<std::io::Result<Vec<u64>>>()?;
        tensor_elements.push(dims.iter().fold(1u64, |a, &d| a.saturating_mul(d)));
        tensor_dims.push(dims);
        tensor_types.push(u32_(&mut r)?);
        offsets.push(u64_(&mut r)?);
    }
    // The data section starts at the next multiple of the alignment; offsets count from there.
    let alignment = match metadata.get("general.alignment") {
        Some(MetaValue::Int(a)) if *a > 0 => *a as u64,
        _ => 32,
    };
    let end = r.stream_position()?;
    let data = end.div_ceil(alignment) * alignment;
    let tensor_offsets = offsets.iter().map(|o| data.saturating_add(*o)).collect();
    Ok(GgufHeader { metadata, tensor_elements, tensor_types, tensor_names, tensor_dims, tensor_offsets })
}

fn invalid(message: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message.to_string())
}

fn bytes<const N: usize>(r: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn u32_(r: &mut impl Read) -> std::io::Result<u32> {
    Ok(u32::from_le_bytes(bytes(r)?))
}

fn u64_(r: &mut impl Read) -> std::io::Result<u64> {
    Ok(u64::from_le_bytes(bytes(r)?))
}

fn string(r: &mut impl Read) -> std::io::Result<String> {
    let len = u64_(r)?;
    if len > MAX_STRING {
        return Err(invalid("implausible GGUF string length"));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// GGUF value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array,
/// 10 u64, 11 i64, 12 f64.
/// Arrays nest at most this deep (GGUF's own use nests none; a hostile file must not exhaust
/// the stack).
const MAX_NESTING: u32 = 4;

fn value(r: &mut impl Read, kind: u32, keep_arrays: bool, depth: u32) -> std::io::Result<MetaValue> {
    Ok(match kind {
        0 => MetaValue::Int(u8::from_le_bytes(bytes(r)?).into()),
        1 => MetaValue::Int(i8::from_le_bytes(bytes(r)?).into()),
        2 => MetaValue::Int(u16::from_le_bytes(bytes(r)?).into()),
        3 => MetaValue::Int(i16::from_le_bytes(bytes(r)?).into()),
        4 => MetaValue::Int(u32::from_le_bytes(bytes(r)?).into()),
        5 => MetaValue::Int(i32::from_le_bytes(bytes(r)?).into()),
        6 => MetaValue::Float(f32::from_le_bytes(bytes(r)?).into()),
        7 => MetaValue::Bool(bytes::<1>(r)?[0] != 0),
        8 => MetaValue::Str(string(r)?),
        9 => {
            if depth >= MAX_NESTING {
                return Err(invalid("GGUF arrays nested too deep"));
            }
            let item = u32_(r)?;
            let len = u64_(r)?;
            if len > 1 << 24 {
                return Err(invalid("implausible GGUF array length"));
            }
            if keep_arrays {
                MetaValue::List((0..len).map(|_| value(r, item, false, depth + 1)).collect::<std::io::Result<_>>()?)
            } else {
                for _ in 0..len {
                    value(r, item, false, depth + 1)?;
                }
                MetaValue::Array(len)
            }
        }
        10 => MetaValue::Int(u64::from_le_bytes(bytes(r)?).into()),
        11 => MetaValue::Int(i64::from_le_bytes(bytes(r)?).into()),
        12 => MetaValue::Float(f64::from_le_bytes(bytes(r)?)),
        other => return Err(invalid(&format!("unknown GGUF value type {other}"))),
    })
}
