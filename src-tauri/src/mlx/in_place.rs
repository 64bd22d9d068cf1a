//! Writing into an array MLX has just computed, instead of building a new one from host
//! memory: the buffer is used in place, without the allocation and copy `Array::from_slice`
//! makes.

use mlx_rs::Array;

/// `array`'s buffer (evaluated first) as bytes to overwrite; `None` when it is not one
/// row-major contiguous buffer. The caller must hold the only reference to the buffer: an
/// array it just computed or allocated, of which no view or other array shares the data.
pub fn exclusive_bytes(array: &mut Array) -> Option<&mut [u8]> {
    array.eval().ok()?;
    let mut contiguous = false;
    // SAFETY: queries on a valid, evaluated array; the out-pointer is a plain bool.
    let (status, data) = unsafe {
        (
            mlx_sys::_mlx_array_is_row_contiguous(&mut contiguous, array.as_ptr()),
            mlx_sys::mlx_array_data_uint8(array.as_ptr()),
        )
    };
    if status != 0 || !contiguous || data.is_null() {
        return None;
    }
    // SAFETY: the pointer comes from MLX (not from a Rust reference) and addresses the
    // array's `nbytes` contiguous bytes; nothing else uses the buffer (the caller's promise),
    // and `array` stays mutably borrowed while the slice lives.
    Some(unsafe { std::slice::from_raw_parts_mut(data.cast_mut(), array.nbytes()) })
}

/// [`exclusive_bytes`] of an f32 array, as f32s.
pub fn exclusive_f32(array: &mut Array) -> Option<&mut [f32]> {
    if array.dtype() != mlx_rs::Dtype::Float32 {
        return None;
    }
    // SAFETY: any bytes are valid f32s; MLX aligns its buffers beyond 4 bytes (checked below).
    let (before, floats, after) = unsafe { exclusive_bytes(array)?.align_to_mut::<f32>() };
    (before.is_empty() && after.is_empty()).then_some(floats)
}
