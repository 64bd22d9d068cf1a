//! llama.cpp's K-quant blocks (256 weights each), decoded on the host. MLX's own GGUF reader
//! dequantizes Q4_K wrongly (the odd 32-weight sub-blocks get another sub-block's scale:
//! measured against gguf-py, which follows ggml) and cannot read Q3_K or Q5_K, so the tensors of
//! these types are read from the file here, as ggml's `dequantize_row_q*_K` defines them.
//!
//! Q4_K and Q5_K are, per 32 weights, `d·sc·q − dmin·m` with 4- or 5-bit `q`: exactly MLX's
//! affine 4- and 5-bit with group 32, so they are repacked without loss ([`q4_k_as_mlx`],
//! [`q5_k_as_mlx`]). The others are decoded to f32.

/// Weights per block, and bytes per block of each type.
pub const QK_K: usize = 256;
pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;

/// Weights as MLX's affine quantization stores them: `bits`-bit codes packed into words (row
/// by row, each row a little-endian bit stream), one scale and bias per 32 weights.
pub struct Packed {
    pub words: Vec<u32>,
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
}

/// Packs codes (each below `2^bits`) as MLX does: a little-endian bit stream per row, read as
/// 32-bit words (the first code in the lowest bits). `codes.len() * bits` must be a multiple
/// of 32 (true of whole groups of 32).
pub fn pack_codes(codes: &[u8], bits: u32) -> Vec<u32> {
    let mut words = vec![0u32; codes.len() * bits as usize / 32];
    for (i, &code) in codes.iter().enumerate() {
        let at = i * bits as usize;
        let (word, shift) = (at / 32, at % 32);
        words[word] |= (code as u32) << shift;
        if shift + bits as usize > 32 {
            words[word + 1] |= (code as u32) >> (32 - shift);
        }
    }
    words
}

pub(crate) fn f16(bytes: &[u8]) -> f32 {
    half_to_f32(u16::from_le_bytes([bytes[0], bytes[1]]))
}

/// IEEE half to single, including subnormals.
fn half_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise.
            let shift = m.leading_zeros() - 21;
            let m = (m << shift) & 0x3ff;
            sign | ((113 - shift) << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Q4_K/Q5_K's eight 6-bit scales and mins, packed in 12 bytes (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// `blocks` of Q4_K as MLX affine 4-bit, group 32: packed words (8 weights each, the first in
/// the low bits), and one scale and bias per 32 weights (`w = scale·q + bias`), in order.
pub fn q4_k_as_mlx(blocks: &[u8]) -> Packed {
    let n = blocks.len() / Q4_K_BYTES;
    let (mut words, mut scales, mut biases) =
        (Vec::with_capacity(n * QK_K / 8), Vec::with_capacity(n * 8), Vec::with_capacity(n * 8));
    for block in blocks.chunks_exact(Q4_K_BYTES) {
        let (d, dmin) = (f16(&block[0..2]), f16(&block[2..4]));
        let sc = &block[4..16];
        let qs = &block[16..];
        for chunk in 0..4 {
            let q = &qs[chunk * 32..][..32];
            for (half, shift) in [(0, 0), (1, 4)] {
                let (s, m) = scale_min_k4(chunk * 2 + half, sc);
                scales.push(d * s as f32);
                biases.push(-dmin * m as f32);
                for eight in q.chunks_exact(8) {
                    let word =
                        eight.iter().enumerate().fold(0u32, |w, (i, b)| w | (((b >> shift) & 0xf) as u32) << (4 * i));
                    words.push(word);
                }
            }
        }
    }
    Packed { words, scales, biases }
}

/// `blocks` of Q5_K as MLX affine 5-bit, group 32: per 32 weights `d·sc·q − dmin·m` with the
/// low 4 bits of `q` in `qs` and the fifth in `qh` (ggml's `dequantize_row_q5_K`).
pub fn q5_k_as_mlx(blocks: &[u8]) -> Packed {
    let n = blocks.len() / Q5_K_BYTES;
    let (mut codes, mut scales, mut biases) = (Vec::with_capacity(n * QK_K), Vec::new(), Vec::new());
    for block in blocks.chunks_exact(Q5_K_BYTES) {
        let (d, dmin) = (f16(&block[0..2]), f16(&block[2..4]));
        let (sc, qh, qs) = (&block[4..16], &block[16..48], &block[48..176]);
        for chunk in 0..4 {
            let ql = &qs[chunk * 32..][..32];
            for (half, shift) in [(0, 0), (1, 4)] {
                let (s, m) = scale_min_k4(chunk * 2 + half, sc);
                scales.push(d * s as f32);
                biases.push(-dmin * m as f32);
                let high_bit = 1u8 << (2 * chunk + half);
                codes.extend((0..32).map(|l| ((ql[l] >> shift) & 0xf) | if qh[l] & high_bit != 0 { 16 } else { 0 }));
            }
        }
    }
    Packed { words: pack_codes(&codes, 5), scales, biases }
}

/// `blocks` of Q5_K as f32 weights.
pub fn dequantize_q5_k(blocks: &[u8]) -> Vec<f32> {
    unpack(&q5_k_as_mlx(blocks), 5)
}

/// `blocks` of Q3_K as f32 weights: per 16 weights `d·(sc − 32)·(q − 4)`, 3-bit `q` as 2 low
/// bits (`qs`) and a high bit (`hmask`, set meaning no `− 4`), 6-bit `sc` packed in 12 bytes
/// (ggml's `dequantize_row_q3_K`).
pub fn dequantize_q3_k(blocks: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(blocks.len() / Q3_K_BYTES * QK_K);
    for block in blocks.chunks_exact(Q3_K_BYTES) {
        let (hmask, qs, packed) = (&block[..32], &block[32..96], &block[96..108]);
        let d = f16(&block[108..110]);
        let scales = q3_k_scales(packed);
        let mut is = 0;
        let mut m = 1u8;
        for n in 0..2 {
            let q = &qs[n * 32..][..32];
            for shift in [0, 2, 4, 6] {
                for sixteen in 0..2 {
                    let dl = d * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for l in sixteen * 16..sixteen * 16 + 16 {
                        let low = ((q[l] >> shift) & 3) as i32;
                        let minus = if hmask[l] & m != 0 { 0 } else { 4 };
                        out.push(dl * (low - minus) as f32);
                    }
                }
                m <<= 1;
            }
        }
    }
    out
}

/// Q3_K's sixteen 6-bit scales from their 12 bytes: the low 4 bits of scale `j` are nibble
/// `j % 8` of bytes 0-7 (low nibbles first), the high 2 bits are in bytes 8-11.
fn q3_k_scales(packed: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (j, scale) in out.iter_mut().enumerate() {
        let low = if j < 8 { packed[j] & 0xf } else { packed[j - 8] >> 4 };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *scale = low | (high << 4);
    }
    out
}

/// Packed codes back to f32 weights (`scale·q + bias`).
fn unpack(p: &Packed, bits: u32) -> Vec<f32> {
    let n = p.scales.len() * 32;
    (0..n)
        .map(|i| {
            let at = i * bits as usize;
            let (word, shift) = (at / 32, at % 32);
            let mut code = (p.words[word] >> shift) as u64;
            if shift + bits as usize > 32 {
                code |= (p.words[word + 1] as u64) << (32 - shift);
            }
            let code = (code & ((1 << bits) - 1)) as f32;
            p.scales[i / 32] * code + p.biases[i / 32]
        })
        .collect()
}

/// `blocks` of Q4_K as f32 weights.
pub fn dequantize_q4_k(blocks: &[u8]) -> Vec<f32> {
    unpack(&q4_k_as_mlx(blocks), 4)
}

/// `blocks` of Q6_K as f32 weights: per 16 weights `d·sc·(q − 32)`, 6-bit `q` in 4 low bits
/// (`ql`) and 2 high bits (`qh`), int8 `sc`.
pub fn dequantize_q6_k(blocks: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(blocks.len() / Q6_K_BYTES * QK_K);
    for block in blocks.chunks_exact(Q6_K_BYTES) {
        let (ql, qh, sc) = (&block[..128], &block[128..192], &block[192..208]);
        let d = f16(&block[208..210]);
        let mut y = [0f32; QK_K];
        for half in 0..2 {
            let (ql, qh, sc) = (&ql[half * 64..], &qh[half * 32..], &sc[half * 8..]);
            let y = &mut y[half * 128..];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
        out.extend_from_slice(&y);
    }
    out
}

/// `blocks` of Q2_K as f32 weights: per 16 weights `d·(sc & 15)·q − dmin·(sc >> 4)`, 2-bit `q`.
pub fn dequantize_q2_k(blocks: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(blocks.len() / Q2_K_BYTES * QK_K);
    for block in blocks.chunks_exact(Q2_K_BYTES) {
        let (scales, qs) = (&block[..16], &block[16..80]);
        let (d, dmin) = (f16(&block[80..82]), f16(&block[82..84]));
        let mut is = 0;
        for half in 0..2 {
            let q = &qs[half * 32..][..32];
            for shift in [0, 2, 4, 6] {
                for sixteen in 0..2 {
                    let sc = scales[is];
                    is += 1;
                    let (dl, ml) = (d * (sc & 0xf) as f32, dmin * (sc >> 4) as f32);
                    out.extend(q[sixteen * 16..][..16].iter().map(|b| dl * ((b >> shift) & 3) as f32 - ml));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packing is MLX's: its dequantize reads the codes back (scale 1, bias 0).
    #[test]
    fn codes_pack_as_mlx_reads_them() {
        use mlx_rs::Array;
        for bits in [2u32, 3, 4, 5, 6, 8] {
            let top = (1u32 << bits) - 1;
            let codes: Vec<u8> = (0..128u32).map(|i| ((i * 7 + i / 32) % (top + 1)) as u8).collect();
            let words = Array::from_slice(&pack_codes(&codes, bits), &[2, (64 * bits / 32) as i32]);
            let (ones, zeros) = (Array::from_slice(&[1f32; 4], &[2, 2]), Array::from_slice(&[0f32; 4], &[2, 2]));
            let w = mlx_rs::ops::dequantize(&words, &ones, &zeros, 32, bits as i32).unwrap();
            w.eval().unwrap();
            let want: Vec<f32> = codes.iter().map(|&c| c as f32).collect();
            assert_eq!(w.as_slice::<f32>(), want.as_slice(), "{bits} bits");
        }
    }

    #[test]
    fn halves_decode_like_ieee() {
        for (h, f) in [(0x3c00u16, 1.0f32), (0xc000, -2.0), (0x0001, 5.960_464_5e-8), (0x7bff, 65504.0), (0, 0.0)] {
            assert_eq!(half_to_f32(h), f, "{h:#x}");
        }
    }

    /// One Q4_K block written by hand: sub-block j has scale j+1 (high bits set for j >= 4) and
    /// min j, weights 0..15 cycling; decoded as ggml defines it.
    #[test]
    fn q4_k_follows_ggml() {
        let mut block = vec![0u8; Q4_K_BYTES];
        block[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
        block[2..4].copy_from_slice(&0x3800u16.to_le_bytes()); // dmin = 0.5
        let sc = &mut block[4..16];
        // j < 4: scale in sc[j] (low 6 bits), min in sc[j + 4]; j >= 4: low 4 bits in sc[j + 4]
        // (scale) / high nibble (min), top 2 bits in sc[j - 4] / sc[j] bits 6-7.
        let (scales, mins): ([u8; 8], [u8; 8]) = ([1, 2, 3, 4, 21, 38, 55, 63], [0, 1, 2, 3, 20, 37, 54, 62]);
        for j in 0..4 {
            sc[j] = scales[j] | ((scales[j + 4] >> 4) << 6);
            sc[j + 4] = mins[j] | ((mins[j + 4] >> 4) << 6);
            sc[j + 8] = (scales[j + 4] & 0xf) | ((mins[j + 4] & 0xf) << 4);
        }
        for (i, b) in block[16..].iter_mut().enumerate() {
            *b = (i % 16) as u8 | (((i + 3) % 16) as u8) << 4;
        }
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &block[4..16]), (scales[j], mins[j]), "sub-block {j}");
        }
        let w = dequantize_q4_k(&block);
        for (i, got) in w.iter().enumerate() {
            let (sub, l) = (i / 32, i % 32);
            let byte = (sub / 2) * 32 + l;
            let q = if sub % 2 == 0 { byte % 16 } else { (byte + 3) % 16 };
            let want = scales[sub] as f32 * q as f32 - 0.5 * mins[sub] as f32;
            assert_eq!(*got, want, "weight {i}");
        }
    }
}
