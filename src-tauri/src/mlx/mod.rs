//! MLX backend set-up: which device computes, in which dtype, and memory figures.
//!
//! One code path for every platform: the device is chosen from what the MLX build offers at run
//! time (Metal on Apple Silicon, CUDA on a CUDA build, otherwise the CPU), never by guess, so a
//! CPU-only build can never touch a GPU stream (which would panic inside MLX).

pub mod distributed;
mod in_place;
mod limits;
mod memory;
pub mod metal_kernel;

pub use in_place::{exclusive_bytes, exclusive_f32};
pub use limits::{
    applied_limits, apply_limits, cache_limit_for, give_back, parse_memory_size, process_resident_bytes,
    recommended_working_set, MlxLimits,
};
pub use memory::{
    default_ceiling, default_kv_budget, machine_memory_bytes, total_memory_bytes, usable_memory_bytes, usable_share,
    FALLBACK_MEMORY_BYTES, USABLE_PERCENT,
};

use mlx_rs::{Device, Dtype};

/// Where and how the model computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    pub gpu: bool,
}

impl Backend {
    /// Picks the GPU when this MLX build has a usable one, else the CPU, and makes it MLX's
    /// default device for the calling thread's work.
    pub fn init() -> Backend {
        let gpu = gpu_available();
        let device = if gpu { Device::gpu() } else { Device::cpu() };
        Device::set_default(&device);
        Backend { gpu }
    }

    /// The dtype to compute in for a model stored in `stored`.
    ///
    /// On a GPU the model's own half-precision dtype is the fast path. On a CPU, and on x86 above
    /// all, half precision has no hardware path in MLX (quantized matmul with f16 activations
    /// measured ~50x slower than f32), so everything is computed in f32.
    pub fn compute_dtype(&self, stored: Dtype) -> Dtype {
        match (self.gpu, stored) {
            (true, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32) => stored,
            (true, _) => Dtype::Float16,
            (false, _) => Dtype::Float32,
        }
    }

    pub fn name(&self) -> &'static str {
        match (self.gpu, cfg!(target_vendor = "apple")) {
            (true, true) => "gpu (metal)",
            (true, false) => "gpu",
            (false, _) => "cpu",
        }
    }
}

/// Whether MLX can run on a GPU in this build and on this machine.
pub fn gpu_available() -> bool {
    let mut available = false;
    // SAFETY: the device handle is created, queried and freed here; the out-pointer is a plain
    // bool. The query only reads MLX's backend registry and creates no stream.
    let status = unsafe {
        let device = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let status = mlx_sys::mlx_device_is_available(&mut available, device);
        mlx_sys::mlx_device_free(device);
        status
    };
    status == 0 && available
}

/// MLX memory figures in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub active: usize,
    pub peak: usize,
    pub cache: usize,
}

pub fn memory_stats() -> MemoryStats {
    use mlx_rs::memory;
    MemoryStats {
        active: memory::active_memory().unwrap_or(0),
        peak: memory::peak_memory().unwrap_or(0),
        cache: memory::cache_memory().unwrap_or(0),
    }
}

pub fn reset_peak_memory() {
    let _ = mlx_rs::memory::reset_peak_memory();
}
