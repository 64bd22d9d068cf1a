//! MLX's quantized kernels in every quantization mode. mlx-rs binds them for MLX's affine mode
//! only; checkpoints also come in `mxfp4` (gpt-oss), `nvfp4` and `mxfp8`, whose scales are
//! 8-bit floats and which have no biases. These call mlx-c with the mode named.

use std::ffi::CStr;

use mlx_rs::{Array, Stream};

use crate::model::config::{QuantMode, QuantSpec};
use crate::model::error::{ModelError, Result};

fn mode_name(mode: QuantMode) -> &'static CStr {
    match mode {
        QuantMode::Affine => c"affine",
        QuantMode::Mxfp4 => c"mxfp4",
        QuantMode::Nvfp4 => c"nvfp4",
        QuantMode::Mxfp8 => c"mxfp8",
    }
}

fn int(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int { value, has_value: true }
}

/// An absent optional array argument (mlx-c reads a null array as "none").
fn none() -> mlx_sys::mlx_array {
    // SAFETY: creates an empty handle; nothing is allocated.
    unsafe { mlx_sys::mlx_array_new() }
}

fn ptr_or_none(a: Option<&Array>) -> mlx_sys::mlx_array {
    a.map_or_else(none, Array::as_ptr)
}

/// Runs one mlx-c operation that writes an array.
fn run(
    op: &str,
    spec: QuantSpec,
    f: impl FnOnce(&mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
) -> Result<Array> {
    let stream = Stream::thread_local_or_default();
    let mut out = none();
    let status = f(&mut out, stream.as_ptr());
    if status != 0 {
        // SAFETY: `out` is a handle mlx-c created or left empty; freeing either is sound.
        unsafe { mlx_sys::mlx_array_free(out) };
        return Err(ModelError::Mlx(format!(
            "{op} failed ({:?}, {} bits, group size {})",
            spec.mode, spec.bits, spec.group_size
        )));
    }
    // SAFETY: on success `out` is a new array owned by us.
    Ok(unsafe { Array::from_ptr(out) })
}

/// `x W^T` for a packed `W`, as `mx.quantized_matmul`.
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    spec: QuantSpec,
) -> Result<Array> {
    quantized_matmul_as(x, w, scales, biases, true, spec)
}

/// `x W^T` (`transpose`) or `x W` for a packed `W`, as `mx.quantized_matmul(.., transpose=..)`.
pub fn quantized_matmul_as(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    spec: QuantSpec,
) -> Result<Array> {
    run("quantized_matmul", spec, |out, stream| unsafe {
        // SAFETY: every handle is a live array (or an empty one for "none") for the call.
        mlx_sys::mlx_quantized_matmul(
            out,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            ptr_or_none(biases),
            transpose,
            int(spec.group_size),
            int(spec.bits),
            mode_name(spec.mode).as_ptr(),
            stream,
        )
    })
}

/// `x` rows times the packed matrices `experts` picks (`[.., 1, in]` -> `[.., 1, out]`), as
/// `mx.gather_qmm(..., rhs_indices=experts, transpose=True)`.
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    experts: &Array,
    sorted: bool,
    spec: QuantSpec,
) -> Result<Array> {
    run("gather_qmm", spec, |out, stream| unsafe {
        // SAFETY: as in `quantized_matmul`.
        mlx_sys::mlx_gather_qmm(
            out,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            ptr_or_none(biases),
            none(),
            experts.as_ptr(),
            true,
            int(spec.group_size),
            int(spec.bits),
            mode_name(spec.mode).as_ptr(),
            sorted,
            stream,
        )
    })
}

/// The dense matrix a packed one stands for.
pub fn dequantize(w: &Array, scales: &Array, biases: Option<&Array>, spec: QuantSpec) -> Result<Array> {
    let no_dtype = mlx_sys::mlx_optional_dtype { value: mlx_sys::mlx_dtype__MLX_FLOAT32, has_value: false };
    run("dequantize", spec, |out, stream| unsafe {
        // SAFETY: as in `quantized_matmul`.
        mlx_sys::mlx_dequantize(
            out,
            w.as_ptr(),
            scales.as_ptr(),
            ptr_or_none(biases),
            int(spec.group_size),
            int(spec.bits),
            mode_name(spec.mode).as_ptr(),
            none(),
            no_dtype,
            stream,
        )
    })
}

/// Packs `w` (`[.., out, in]`) as MLX does: `(weight, scales, biases)`, biases only in affine mode.
pub fn quantize(w: &Array, spec: QuantSpec) -> Result<(Array, Array, Option<Array>)> {
    if spec.mode == QuantMode::Affine {
        let (q, s, b) = mlx_rs::ops::quantize(w, spec.group_size, spec.bits)?;
        return Ok((q, s, Some(b)));
    }
    // SAFETY: a fresh, empty vector handle.
    let mut parts = unsafe { mlx_sys::mlx_vector_array_new() };
    let stream = Stream::thread_local_or_default();
    // SAFETY: live handles for the call; `parts` receives new arrays.
    let status = unsafe {
        mlx_sys::mlx_quantize(
            &mut parts,
            w.as_ptr(),
            int(spec.group_size),
            int(spec.bits),
            mode_name(spec.mode).as_ptr(),
            none(),
            stream.as_ptr(),
        )
    };
    let take = |i: usize| -> Option<Array> {
        let mut a = none();
        // SAFETY: reads element `i` (< the vector's size) of a vector mlx-c filled; `a` then
        // owns a new reference.
        (unsafe { mlx_sys::mlx_vector_array_get(&mut a, parts, i) } == 0).then(|| unsafe { Array::from_ptr(a) })
    };
    // SAFETY: `parts` is a live vector handle.
    let n = if status == 0 { unsafe { mlx_sys::mlx_vector_array_size(parts) } } else { 0 };
    let packed = if n >= 2 { take(0).zip(take(1)) } else { None };
    let result = packed
        .map(|(q, s)| (q, s, None))
        .ok_or_else(|| ModelError::Mlx(format!("quantize failed ({:?}, {} bits)", spec.mode, spec.bits)));
    // SAFETY: the arrays taken hold their own references.
    unsafe { mlx_sys::mlx_vector_array_free(parts) };
    result
}
