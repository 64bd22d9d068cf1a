//! Bicubic and bilinear resizing as Pillow does them (`Image.resize(size, BICUBIC | BILINEAR)` on
//! 8-bit RGB): the reference processors resize with Pillow, and a float resize, or pixels off by one, changes what the model
//! sees. Pillow resamples in two passes, each with its filter's weights per output pixel normalised
//! to sum to one, turned into fixed point (22 fractional bits), accumulated in integers and clipped
//! back to 8 bits between the passes. Across then down, except (Pillow 12 on; the references pin
//! 13.0.0) where the height shrinks by more than twice what the width shrinks: then down first.

/// Fractional bits of the fixed-point weights: 8 bits of pixel and 2 of headroom (weights can be
/// negative or sum past one) below 32.
const PRECISION_BITS: u32 = 32 - 8 - 2;
/// Pillow's resampling filters the reference processors use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// Keys's cubic (Qwen-VL, Gemma 4).
    Bicubic,
    /// The triangle (Gemma 3).
    Bilinear,
}

impl Filter {
    /// The filter's support, in source pixels at scale one.
    fn support(self) -> f64 {
        match self {
            Filter::Bicubic => 2.0,
            Filter::Bilinear => 1.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Bicubic => bicubic(x),
            Filter::Bilinear => (1.0 - x.abs()).max(0.0),
        }
    }
}

/// Keys's cubic convolution with a = -0.5.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// For each output position: the first source index, and its fixed-point weights.
struct Taps {
    first: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

/// The weights resizing `in_size` pixels to `out_size` (the whole extent: Pillow's default box).
fn taps(in_size: usize, out_size: usize, filter: Filter) -> Taps {
    // Pillow takes the box's edges as C floats: exact for any size an image may have.
    let scale = in_size as f32 as f64 / out_size as f64;
    let filter_scale = scale.max(1.0);
    let support = filter.support() * filter_scale;
    let mut first = Vec::with_capacity(out_size);
    let mut weights = Vec::with_capacity(out_size);
    for out in 0..out_size {
        let center = (out as f64 + 0.5) * scale;
        // Truncations as C's (int) casts: toward zero, then clamped to the image.
        let lo = ((center - support + 0.5) as i64).max(0) as usize;
        let hi = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let reciprocal = 1.0 / filter_scale;
        let raw: Vec<f64> = (lo..hi).map(|i| filter.weight((i as f64 - center + 0.5) * reciprocal)).collect();
        let sum: f64 = raw.iter().sum();
        let fixed = raw
            .iter()
            .map(|w| {
                let w = if sum != 0.0 { w / sum } else { *w };
                let scaled = w * f64::from(1u32 << PRECISION_BITS);
                // Rounded half away from zero, then truncated, as Pillow's normalisation does.
                (if w < 0.0 { scaled - 0.5 } else { scaled + 0.5 }) as i32
            })
            .collect();
        first.push(lo);
        weights.push(fixed);
    }
    Taps { first, weights }
}

/// Back to 8 bits: the integer part, clipped.
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One pass over `rows` rows of `in_w`-pixel RGB starting at row `row0` of `src`, `taps` across.
fn horizontal(src: &[u8], in_w: usize, row0: usize, rows: usize, taps: &Taps) -> Vec<u8> {
    let out_w = taps.first.len();
    let mut out = vec![0u8; out_w * rows * 3];
    for y in 0..rows {
        let line = &src[(row0 + y) * in_w * 3..(row0 + y + 1) * in_w * 3];
        for (x, (first, weights)) in taps.first.iter().zip(&taps.weights).enumerate() {
            let mut acc = [1i32 << (PRECISION_BITS - 1); 3];
            for (i, w) in weights.iter().enumerate() {
                let p = &line[(first + i) * 3..(first + i) * 3 + 3];
                for c in 0..3 {
                    acc[c] += i32::from(p[c]) * w;
                }
            }
            let o = (y * out_w + x) * 3;
            for c in 0..3 {
                out[o + c] = clip8(acc[c]);
            }
        }
    }
    out
}

/// The pass down: `src` is `width`-pixel RGB whose row 0 is source row `row0`.
fn vertical(src: &[u8], width: usize, row0: usize, taps: &Taps) -> Vec<u8> {
    let out_h = taps.first.len();
    let mut out = vec![0u8; width * out_h * 3];
    for (y, (first, weights)) in taps.first.iter().zip(&taps.weights).enumerate() {
        for x in 0..width * 3 {
            let mut acc = 1i32 << (PRECISION_BITS - 1);
            for (i, w) in weights.iter().enumerate() {
                acc += i32::from(src[(first - row0 + i) * width * 3 + x]) * w;
            }
            out[y * width * 3 + x] = clip8(acc);
        }
    }
    out
}

/// `rgb` (`width` x `height`, 3 bytes a pixel, row-major) resized to `out_w` x `out_h` as Pillow's
/// bicubic resize does, to the byte.
pub fn resize_bicubic(rgb: &[u8], width: usize, height: usize, out_w: usize, out_h: usize) -> Vec<u8> {
    resize(rgb, width, height, out_w, out_h, Filter::Bicubic)
}

/// `rgb` (`width` x `height`, 3 bytes a pixel, row-major) resized to `out_w` x `out_h` as Pillow's
/// resize with `filter` does, to the byte.
pub fn resize(rgb: &[u8], width: usize, height: usize, out_w: usize, out_h: usize, filter: Filter) -> Vec<u8> {
    assert_eq!(rgb.len(), width * height * 3, "an RGB image of {width} x {height}");
    assert!(out_w > 0 && out_h > 0 && width > 0 && height > 0, "an empty image");
    let down = taps(height, out_h, filter);
    let shrink_h = height as i64 - out_h as i64;
    let shrink_w = width as i64 - out_w as i64;
    if shrink_h > 0 && shrink_h > shrink_w * 2 {
        // Down first: the pass across then has fewer rows to do.
        let fewer = vertical(rgb, width, 0, &down);
        return if out_w != width { horizontal(&fewer, width, 0, out_h, &taps(width, out_w, filter)) } else { fewer };
    }
    // Only the source rows the vertical pass reads are resized across.
    let row0 = down.first[0];
    let row_end = down.first[out_h - 1] + down.weights[out_h - 1].len();
    let (across, across_row0) = if out_w != width {
        (horizontal(rgb, width, row0, row_end - row0, &taps(width, out_w, filter)), row0)
    } else {
        (rgb.to_vec(), 0)
    };
    if out_h != height {
        vertical(&across, out_w, across_row0, &down)
    } else {
        across
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_size_is_the_same_image() {
        let rgb: Vec<u8> = (0..4 * 3 * 3).map(|i| (i * 7) as u8).collect();
        assert_eq!(resize_bicubic(&rgb, 4, 3, 4, 3), rgb);
    }

    #[test]
    fn a_flat_image_stays_flat_at_any_size() {
        let rgb = [10u8, 200, 77].repeat(37 * 23);
        for (w, h) in [(16, 16), (64, 7), (5, 90), (37, 46)] {
            let out = resize_bicubic(&rgb, 37, 23, w, h);
            assert!(out.chunks(3).all(|p| p == [10, 200, 77]), "{w} x {h}");
        }
    }

    #[test]
    fn the_weights_sum_to_one_in_fixed_point() {
        for (n, m) in [(1000, 224), (224, 1000), (7, 3), (3, 7), (800, 800)] {
            let t = taps(n, m, Filter::Bicubic);
            for w in &t.weights {
                let sum: i32 = w.iter().sum();
                assert!((sum - (1 << PRECISION_BITS)).abs() <= w.len() as i32, "{n}->{m}: {sum}");
            }
        }
    }
}
