//! MLX's custom Metal kernels (`mx.fast.metal_kernel`), through mlx-c. mlx-rs wraps them only
//! in its `metal` build, which is Apple's alone; called through mlx-c directly the same code
//! compiles on every platform, and a kernel is only ever run where Metal is (`metal_available`).

use std::ffi::CString;

use mlx_rs::{Array, Dtype};

/// A template parameter of the kernel (`Dk`, `OutT`, ...).
pub enum Template {
    Dtype(Dtype),
    Int(i32),
}

/// One output: its shape and dtype.
pub struct Output {
    pub shape: Vec<i32>,
    pub dtype: Dtype,
}

/// Whether this MLX build and machine run Metal kernels.
pub fn metal_available() -> bool {
    let mut available = false;
    // SAFETY: writes one bool; queries MLX's Metal backend only.
    let status = unsafe { mlx_sys::mlx_metal_is_available(&mut available) };
    status == 0 && available && super::gpu_available()
}

/// A kernel built from its Metal body; compiled by MLX on first use and cached there.
pub struct MetalKernel {
    raw: mlx_sys::mlx_fast_metal_kernel,
}

impl Drop for MetalKernel {
    fn drop(&mut self) {
        // SAFETY: `raw` was made by `mlx_fast_metal_kernel_new` and is freed once.
        unsafe { mlx_sys::mlx_fast_metal_kernel_free(self.raw) };
    }
}

fn c_string(text: &str) -> Result<CString, String> {
    CString::new(text).map_err(|e| e.to_string())
}

/// A vector of strings mlx-c owns (it copies them).
fn strings(values: &[&str]) -> Result<mlx_sys::mlx_vector_string, String> {
    let owned = values.iter().map(|v| c_string(v)).collect::<Result<Vec<_>, _>>()?;
    let mut pointers: Vec<_> = owned.iter().map(|v| v.as_ptr()).collect();
    // SAFETY: `pointers` holds live NUL-terminated strings for the call, which copies them.
    let raw = unsafe { mlx_sys::mlx_vector_string_new_data(pointers.as_mut_ptr(), pointers.len()) };
    if raw.ctx.is_null() {
        return Err("cannot make an MLX string vector".into());
    }
    Ok(raw)
}

impl MetalKernel {
    /// `inputs` and `outputs` name the kernel's buffers in `source` (inputs copied row-major
    /// contiguous first, so the body may index them as plain arrays).
    pub fn new(name: &str, inputs: &[&str], outputs: &[&str], source: &str) -> Result<MetalKernel, String> {
        let (name, source, header) = (c_string(name)?, c_string(source)?, c_string("")?);
        let (input_names, output_names) = (strings(inputs)?, strings(outputs)?);
        // SAFETY: every pointer is live for the call; mlx-c copies what it keeps.
        let raw = unsafe {
            let raw = mlx_sys::mlx_fast_metal_kernel_new(
                name.as_ptr(),
                input_names,
                output_names,
                source.as_ptr(),
                header.as_ptr(),
                true,
                false,
            );
            mlx_sys::mlx_vector_string_free(input_names);
            mlx_sys::mlx_vector_string_free(output_names);
            raw
        };
        if raw.ctx.is_null() {
            return Err("cannot make a Metal kernel".into());
        }
        Ok(MetalKernel { raw })
    }

    /// Runs the kernel over `grid` threads in groups of `group`; the outputs are lazy arrays.
    ///
    /// # Safety
    /// For these inputs, outputs, template values and launch sizes the kernel must read only
    /// inside its inputs, write every output element and only inside its outputs, and never
    /// write an input.
    pub unsafe fn apply(
        &self,
        inputs: &[&Array],
        outputs: &[Output],
        grid: (i32, i32, i32),
        group: (i32, i32, i32),
        template: &[(&str, Template)],
    ) -> Result<Vec<Array>, String> {
        let config = Config(unsafe { mlx_sys::mlx_fast_metal_kernel_config_new() });
        if config.0.ctx.is_null() {
            return Err("cannot make a Metal kernel configuration".into());
        }
        let check = |status: i32, what: &str| if status == 0 { Ok(()) } else { Err(format!("{what} failed")) };
        for output in outputs {
            let (shape, dtype) = (&output.shape, u32::from(output.dtype));
            check(
                unsafe {
                    mlx_sys::mlx_fast_metal_kernel_config_add_output_arg(config.0, shape.as_ptr(), shape.len(), dtype)
                },
                "adding a kernel output",
            )?;
        }
        check(unsafe { mlx_sys::mlx_fast_metal_kernel_config_set_grid(config.0, grid.0, grid.1, grid.2) }, "the grid")?;
        check(
            unsafe { mlx_sys::mlx_fast_metal_kernel_config_set_thread_group(config.0, group.0, group.1, group.2) },
            "the thread group",
        )?;
        for (name, value) in template {
            let name = c_string(name)?;
            let status = match value {
                Template::Dtype(dtype) => unsafe {
                    mlx_sys::mlx_fast_metal_kernel_config_add_template_arg_dtype(
                        config.0,
                        name.as_ptr(),
                        u32::from(*dtype),
                    )
                },
                Template::Int(value) => unsafe {
                    mlx_sys::mlx_fast_metal_kernel_config_add_template_arg_int(config.0, name.as_ptr(), *value)
                },
            };
            check(status, "a template argument")?;
        }
        let arrays = VectorArray(unsafe { mlx_sys::mlx_vector_array_new() });
        for input in inputs {
            check(unsafe { mlx_sys::mlx_vector_array_append_value(arrays.0, input.as_ptr()) }, "an input")?;
        }
        let mut results = VectorArray(unsafe { mlx_sys::mlx_vector_array_new() });
        let stream = mlx_rs::Stream::new();
        check(
            unsafe {
                mlx_sys::mlx_fast_metal_kernel_apply(&mut results.0, self.raw, arrays.0, config.0, stream.as_ptr())
            },
            "running the Metal kernel",
        )?;
        let count = unsafe { mlx_sys::mlx_vector_array_size(results.0) };
        (0..count)
            .map(|i| {
                let mut raw = unsafe { mlx_sys::mlx_array_new() };
                check(unsafe { mlx_sys::mlx_vector_array_get(&mut raw, results.0, i) }, "an output")?;
                // SAFETY: `raw` is a new reference to an output array, now owned by the Array.
                Ok(unsafe { Array::from_ptr(raw) })
            })
            .collect()
    }
}

/// A kernel configuration, freed on drop.
struct Config(mlx_sys::mlx_fast_metal_kernel_config);

impl Drop for Config {
    fn drop(&mut self) {
        // SAFETY: made by `mlx_fast_metal_kernel_config_new`, freed once.
        unsafe { mlx_sys::mlx_fast_metal_kernel_config_free(self.0) };
    }
}

/// A vector of arrays, freed on drop (its arrays keep their own references).
struct VectorArray(mlx_sys::mlx_vector_array);

impl Drop for VectorArray {
    fn drop(&mut self) {
        // SAFETY: made by `mlx_vector_array_new` (or filled by mlx-c), freed once.
        unsafe { mlx_sys::mlx_vector_array_free(self.0) };
    }
}
