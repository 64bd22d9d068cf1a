//! A GGUF file's tensors read into MLX arrays, one at a time straight from the file (nothing
//! is held twice: MLX's own reader makes an f16 copy of every K-quant tensor, and cannot read
//! Q3_K or Q5_K at all).
//!
//! Floats stay as they are (F32, F16, BF16). Blocks MLX can use as they are become MLX affine
//! quantization with group 32, as MLX's reader makes them (`x.weight` packed, `x.scales`,
//! `x.biases` in f16): Q4_0, Q4_1 and Q8_0 exactly, and Q4_K and Q5_K exactly at 4 and 5 bits.
//! The other K-quants are decoded and quantized again ([`KQUANTS`]), or all of them decoded to
//! f32 when the model is to be expanded anyway.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use mlx_rs::{Array, Dtype};

use super::gguf_header::GgufHeader;
use super::gguf_kquants::{self as kq, Packed};
use crate::model::error::{ModelError, Result};

/// Values per quantization group in every block type read here.
pub const GROUP: usize = 32;

/// How one ggml type is read.
#[derive(Clone, Copy)]
enum Reading {
    F32,
    F16,
    BF16,
    /// 32 weights a block, kept packed exactly: Q4_0, Q4_1, Q8_0.
    Legacy {
        block_bytes: usize,
        bits: u32,
        decode: fn(&[u8]) -> Packed,
    },
    /// 256 weights a block: repacked exactly (`exact`), else decoded and quantized at `bits`.
    KQuant {
        block_bytes: usize,
        bits: i32,
        exact: Option<fn(&[u8]) -> Packed>,
        decode: fn(&[u8]) -> Vec<f32>,
    },
}

/// A ggml type this build reads.
struct TensorType {
    id: u32,
    name: &'static str,
    reading: Reading,
}

/// Every type read, and how. The K-quants not on MLX's grid (groups of 16) are packed again in
/// groups of 32 at about their size: Q6_K into 6 bits, Q3_K (3.4 bits a weight) into 3 (4 bits
/// lose as much, off its grid), Q2_K (2.6) into 3 (2 lose too much). Their cost, measured
/// against the dequantized weights, is in tests/gguf_kquants.rs and docs/benchmarks.md.
const TYPES: [TensorType; 11] = [
    TensorType { id: 0, name: "F32", reading: Reading::F32 },
    TensorType { id: 1, name: "F16", reading: Reading::F16 },
    TensorType { id: 30, name: "BF16", reading: Reading::BF16 },
    TensorType { id: 2, name: "Q4_0", reading: Reading::Legacy { block_bytes: 18, bits: 4, decode: q4_0 } },
    TensorType { id: 3, name: "Q4_1", reading: Reading::Legacy { block_bytes: 20, bits: 4, decode: q4_1 } },
    TensorType { id: 8, name: "Q8_0", reading: Reading::Legacy { block_bytes: 34, bits: 8, decode: q8_0 } },
    TensorType {
        id: 10,
        name: "Q2_K",
        reading: Reading::KQuant { block_bytes: kq::Q2_K_BYTES, bits: 3, exact: None, decode: kq::dequantize_q2_k },
    },
    TensorType {
        id: 11,
        name: "Q3_K",
        reading: Reading::KQuant { block_bytes: kq::Q3_K_BYTES, bits: 3, exact: None, decode: kq::dequantize_q3_k },
    },
    TensorType {
        id: 12,
        name: "Q4_K",
        reading: Reading::KQuant {
            block_bytes: kq::Q4_K_BYTES,
            bits: 4,
            exact: Some(kq::q4_k_as_mlx),
            decode: kq::dequantize_q4_k,
        },
    },
    TensorType {
        id: 13,
        name: "Q5_K",
        reading: Reading::KQuant {
            block_bytes: kq::Q5_K_BYTES,
            bits: 5,
            exact: Some(kq::q5_k_as_mlx),
            decode: kq::dequantize_q5_k,
        },
    },
    TensorType {
        id: 14,
        name: "Q6_K",
        reading: Reading::KQuant { block_bytes: kq::Q6_K_BYTES, bits: 6, exact: None, decode: kq::dequantize_q6_k },
    },
];

/// Whether this build reads ggml type `id`.
pub fn is_readable(id: u32) -> bool {
    TYPES.iter().any(|t| t.id == id)
}

/// Bytes one weight of type `id` takes once loaded packed, when floats are computed in
/// `compute_bytes`-byte floats (scales and biases are converted to that type, as dense floats).
pub fn loaded_bytes_per_weight(id: u32, compute_bytes: f64) -> Option<f64> {
    let t = TYPES.iter().find(|t| t.id == id)?;
    let group = 2.0 * compute_bytes / GROUP as f64;
    Some(match t.reading {
        Reading::F32 | Reading::F16 | Reading::BF16 => compute_bytes,
        Reading::Legacy { bits, .. } => bits as f64 / 8.0 + group,
        Reading::KQuant { bits, .. } => bits as f64 / 8.0 + group,
    })
}

/// The names of the types read, for messages.
pub fn readable_names() -> Vec<&'static str> {
    TYPES.iter().map(|t| t.name).collect()
}

/// Every tensor of the file, by its GGUF name (packed ones as `x.weight`, `x.scales`,
/// `x.biases`); decoded to f32 when `expand` and not exact.
pub fn read(path: &Path, header: &GgufHeader, expand: bool) -> Result<HashMap<String, Array>> {
    let bad = |message: String| ModelError::Weights { path: path.to_path_buf(), message };
    let io = |source| ModelError::Io { path: path.to_path_buf(), source };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut out = HashMap::new();
    for (i, name) in header.tensor_names.iter().enumerate() {
        let id = header.tensor_types[i];
        let Some(t) = TYPES.iter().find(|t| t.id == id) else {
            return Err(bad(format!("{name}: ggml type {id} is not read")));
        };
        // GGUF lists dimensions fastest first; MLX's shape is the reverse. A hostile header's
        // sizes must not overflow anything below (MLX's shapes are i32).
        let shape: Vec<i32> = header.tensor_dims[i]
            .iter()
            .rev()
            .map(|&d| i32::try_from(d).ok().filter(|&d| d > 0))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(format!("{name}: dimensions {:?} are out of range", header.tensor_dims[i])))?;
        let elements = shape
            .iter()
            .try_fold(1i32, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad(format!("{name}: {:?} holds more values than MLX can", header.tensor_dims[i])))?
            as usize;
        let cols = *shape.last().unwrap_or(&1) as usize;
        let per_block = match t.reading {
            Reading::F32 => 0,
            Reading::F16 | Reading::BF16 => 0,
            Reading::Legacy { .. } => GROUP,
            Reading::KQuant { .. } => kq::QK_K,
        };
        if per_block > 0 && !cols.is_multiple_of(per_block) {
            return Err(bad(format!(
                "{} tensor {name}: rows of {cols} are not whole {per_block}-weight blocks",
                t.name
            )));
        }
        // At most 2^31 values: no product below overflows a 64-bit usize.
        let len = match t.reading {
            Reading::F32 => elements * 4,
            Reading::F16 | Reading::BF16 => elements * 2,
            Reading::Legacy { block_bytes, .. } | Reading::KQuant { block_bytes, .. } => {
                elements / per_block * block_bytes
            }
        };
        let start = header.tensor_offsets[i];
        if start.saturating_add(len as u64) > file_len {
            return Err(bad(format!(
                "{} tensor {name}: its {len} bytes at {start} run past the end of the file ({file_len} bytes): \
                 the file is truncated",
                t.name
            )));
        }
        let mut bytes = vec![0u8; len];
        file.seek(SeekFrom::Start(header.tensor_offsets[i]))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| bad(format!("{} tensor {name}: {e}", t.name)))?;
        let base = name.strip_suffix(".weight").unwrap_or(name);
        let insert_packed = |p: Packed, bits: u32, out: &mut HashMap<String, Array>| {
            let mut packed_shape = shape.clone();
            let mut group_shape = shape.clone();
            *packed_shape.last_mut().expect("a dimension") = (cols * bits as usize / 32) as i32;
            *group_shape.last_mut().expect("a dimension") = (cols / GROUP) as i32;
            out.insert(name.clone(), Array::from_slice(&p.words, &packed_shape));
            out.insert(format!("{base}.scales"), Array::from_slice(&p.scales, &group_shape));
            out.insert(format!("{base}.biases"), Array::from_slice(&p.biases, &group_shape));
        };
        match t.reading {
            Reading::F32 => {
                let values: Vec<f32> =
                    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                out.insert(name.clone(), Array::from_slice(&values, &shape));
            }
            Reading::F16 | Reading::BF16 => {
                let halves: Vec<u16> = bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
                let dtype = if matches!(t.reading, Reading::F16) { Dtype::Float16 } else { Dtype::Bfloat16 };
                out.insert(name.clone(), Array::from_slice(&halves, &shape).view_dtype(dtype)?);
            }
            Reading::Legacy { bits, decode, .. } => {
                let p = decode(&bytes);
                insert_packed(p, bits, &mut out);
                // As MLX's reader: scales and biases in f16 (the blocks' own precision).
                for part in ["scales", "biases"] {
                    let key = format!("{base}.{part}");
                    let a = out.remove(&key).expect("inserted above").as_dtype(Dtype::Float16)?;
                    out.insert(key, a);
                }
            }
            Reading::KQuant { exact: Some(exact), bits, .. } if !expand => {
                insert_packed(exact(&bytes), bits as u32, &mut out)
            }
            Reading::KQuant { decode, bits, .. } => {
                let dense = Array::from_slice(&decode(&bytes), &shape);
                if expand || !name.ends_with(".weight") {
                    out.insert(name.clone(), dense);
                } else {
                    let (w, scales, biases) = mlx_rs::ops::quantize(&dense, GROUP as i32, bits)?;
                    out.insert(name.clone(), w);
                    out.insert(format!("{base}.scales"), scales);
                    out.insert(format!("{base}.biases"), biases);
                }
            }
        }
    }
    Ok(out)
}

/// Q4_0: per 32 weights an f16 `d`, then 16 bytes: weight `j` in the low nibble of byte `j`,
/// weight `j + 16` in its high nibble; `w = d·(q − 8)`.
fn q4_0(blocks: &[u8]) -> Packed {
    nibble_blocks(blocks, 18, |b| {
        let d = kq::f16(&b[0..2]);
        (d, -8.0 * d, &b[2..18])
    })
}

/// Q4_1: an f16 `d` and `m`, then Q4_0's nibbles; `w = d·q + m`.
fn q4_1(blocks: &[u8]) -> Packed {
    nibble_blocks(blocks, 20, |b| (kq::f16(&b[0..2]), kq::f16(&b[2..4]), &b[4..20]))
}

fn nibble_blocks(blocks: &[u8], size: usize, parts: impl Fn(&[u8]) -> (f32, f32, &[u8])) -> Packed {
    let n = blocks.len() / size;
    let (mut codes, mut scales, mut biases) =
        (Vec::with_capacity(n * GROUP), Vec::with_capacity(n), Vec::with_capacity(n));
    for block in blocks.chunks_exact(size) {
        let (scale, bias, qs) = parts(block);
        scales.push(scale);
        biases.push(bias);
        codes.extend(qs.iter().map(|b| b & 0xf));
        codes.extend(qs.iter().map(|b| b >> 4));
    }
    Packed { words: kq::pack_codes(&codes, 4), scales, biases }
}

/// Q8_0: an f16 `d`, then 32 signed bytes; `w = d·q`, stored unsigned as `q + 128` with bias
/// `−128·d`.
fn q8_0(blocks: &[u8]) -> Packed {
    let n = blocks.len() / 34;
    let (mut codes, mut scales, mut biases) =
        (Vec::with_capacity(n * GROUP), Vec::with_capacity(n), Vec::with_capacity(n));
    for block in blocks.chunks_exact(34) {
        let d = kq::f16(&block[0..2]);
        scales.push(d);
        biases.push(-128.0 * d);
        codes.extend(block[2..34].iter().map(|&q| (q as i8 as i16 + 128) as u8));
    }
    Packed { words: kq::pack_codes(&codes, 8), scales, biases }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header whose one tensor has `dims` (GGUF order) of `ggml` type, over a file of `bytes`.
    fn read_one(dims: Vec<u64>, ggml: u32, bytes: usize) -> Result<HashMap<String, Array>> {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), vec![0u8; bytes]).unwrap();
        let header = GgufHeader {
            metadata: HashMap::new(),
            tensor_elements: vec![dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))],
            tensor_types: vec![ggml],
            tensor_names: vec!["blk.0.attn_q.weight".into()],
            tensor_dims: vec![dims],
            tensor_offsets: vec![0],
        };
        read(file.path(), &header, false)
    }

    #[test]
    fn hostile_sizes_are_errors_not_panics() {
        let err = |r: Result<HashMap<String, Array>>| match r {
            Ok(_) => panic!("read a hostile tensor"),
            Err(e) => e.to_string(),
        };
        // Too large for MLX's shapes, alone or multiplied out.
        assert!(err(read_one(vec![1 << 40, 2], 0, 64)).contains("out of range"));
        assert!(err(read_one(vec![1 << 20, 1 << 20], 0, 64)).contains("more values than MLX can"));
        assert!(err(read_one(vec![0, 4], 0, 64)).contains("out of range"));
        // Sizes that fit, data that does not: the file is truncated.
        assert!(err(read_one(vec![256, 4], 12, 100)).contains("run past the end"));
        // Rows that are not whole blocks.
        assert!(err(read_one(vec![100, 4], 12, 10_000)).contains("not whole 256-weight blocks"));
        // And a tensor that fits reads.
        let ok = read_one(vec![32, 2], 8, 68).unwrap();
        assert_eq!(ok["blk.0.attn_q.weight"].shape(), &[2, 8]);
        assert_eq!(ok["blk.0.attn_q.scales"].shape(), &[2, 1]);
    }
}
