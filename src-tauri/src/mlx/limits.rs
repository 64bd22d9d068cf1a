//! The process's memory ceiling as MLX enforces it, and what the process holds: MLX's memory
//! limit, its buffer-cache limit and (on Metal) the wired limit are set from the one ceiling;
//! `give_back` returns freed memory to the system when the engine is idle.

/// A memory size as people write it: `1.1GB` (decimal units), `800MiB` (binary), `60%` (of the
/// machine's memory), or bare bytes.
pub fn parse_memory_size(text: &str, machine: u64) -> Result<u64, String> {
    let t = text.trim();
    let bad = || format!("{text:?} is not a memory size (examples: 12GB, 800MiB, 60%, 1073741824)");
    if let Some(percent) = t.strip_suffix('%') {
        let p: f64 = percent.trim().parse().map_err(|_| bad())?;
        if !(p > 0.0 && p <= 100.0) {
            return Err(format!("{text:?}: a share of the machine's memory must be above 0% and at most 100%"));
        }
        return Ok((machine as f64 * p / 100.0) as u64);
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number.parse().map_err(|_| bad())?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => (1u64 << 20) as f64,
        "gib" => (1u64 << 30) as f64,
        "tib" => (1u64 << 40) as f64,
        _ => return Err(bad()),
    };
    let bytes = n * scale;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Bytes of memory this process holds now, as the system counts it: resident pages on Linux,
/// the physical footprint on macOS (which counts GPU memory too, the memory being unified).
pub fn process_resident_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Some(pages * page.max(4096) as u64)
    }
    #[cfg(target_vendor = "apple")]
    {
        let mut info: libc::rusage_info_v2 = unsafe { std::mem::zeroed() };
        // SAFETY: the buffer is a rusage_info_v2, as the flavour says; the pid is our own.
        let rc = unsafe {
            libc::proc_pid_rusage(
                libc::getpid(),
                libc::RUSAGE_INFO_V2,
                (&mut info as *mut libc::rusage_info_v2).cast::<libc::rusage_info_t>(),
            )
        };
        (rc == 0).then_some(info.ri_phys_footprint)
    }
    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    {
        None
    }
}

/// The limits set on MLX, as `/metrics` and the Live page show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MlxLimits {
    pub ceiling: u64,
    pub memory_limit: u64,
    pub cache_limit: u64,
    /// 0: not set (no Metal, or the system refused it).
    pub wired_limit: u64,
}

/// MLX's buffer cache (freed buffers kept for reuse) under a ceiling: a sixteenth of it, between
/// 64 MiB and 1 GiB. Enough to reuse a step's buffers on the next step; small enough that it
/// never holds gigabytes after a burst.
pub fn cache_limit_for(ceiling: u64) -> u64 {
    (ceiling / 16).clamp(64 << 20, 1 << 30)
}

/// Sets MLX's memory limit to the ceiling, its buffer-cache limit below it, and on Metal the
/// wired limit (memory kept resident for the GPU) to the ceiling, never above the device's
/// recommended working set (MLX refuses more than the system's wired limit). Process-wide.
pub fn apply_limits(ceiling: u64, gpu: bool) -> MlxLimits {
    use mlx_rs::memory;
    let cache_limit = cache_limit_for(ceiling);
    let _ = memory::set_memory_limit(ceiling as usize);
    let _ = memory::set_cache_limit(cache_limit as usize);
    let mut wired_limit = 0;
    if gpu && cfg!(target_vendor = "apple") {
        let wanted = recommended_working_set().map_or(ceiling, |r| r.min(ceiling));
        match memory::set_wired_limit(wanted as usize) {
            Ok(_) => wired_limit = wanted,
            Err(e) => tracing::warn!("MLX refused a wired limit of {wanted} bytes: {e}"),
        }
    }
    let limits = MlxLimits { ceiling, memory_limit: ceiling, cache_limit, wired_limit };
    *APPLIED.lock().unwrap_or_else(|e| e.into_inner()) = limits;
    limits
}

/// The limits last set (MLX's are process-wide, so this is too); all zero before any.
static APPLIED: std::sync::Mutex<MlxLimits> =
    std::sync::Mutex::new(MlxLimits { ceiling: 0, memory_limit: 0, cache_limit: 0, wired_limit: 0 });

pub fn applied_limits() -> MlxLimits {
    *APPLIED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Metal's recommended working set for this GPU (what it can keep resident without paging),
/// when MLX reports it. Only asked of a GPU device, never on a CPU-only build.
pub fn recommended_working_set() -> Option<u64> {
    if !super::gpu_available() {
        return None;
    }
    let mut size: usize = 0;
    // SAFETY: the device and its info are created, read and freed here; the key is a C string
    // and the out-pointer a plain size_t.
    let status = unsafe {
        let device = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let mut info = mlx_sys::mlx_device_info_new();
        let mut status = mlx_sys::mlx_device_info_get(&mut info, device);
        if status == 0 {
            status = mlx_sys::mlx_device_info_get_size(&mut size, info, c"max_recommended_working_set_size".as_ptr());
        }
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(device);
        status
    };
    (status == 0 && size > 0).then_some(size as u64)
}

/// Returns memory nothing uses to the system: MLX's buffer cache, and on glibc the heap's free
/// pages (freed buffers below the mmap threshold otherwise stay resident).
pub fn give_back() {
    let _ = mlx_rs::memory::clear_cache();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        let machine = 16_000_000_000;
        assert_eq!(parse_memory_size("1.1GB", machine), Ok(1_100_000_000));
        assert_eq!(parse_memory_size("800MiB", machine), Ok(800 << 20));
        assert_eq!(parse_memory_size(" 2 gib ", machine), Ok(2 << 30));
        assert_eq!(parse_memory_size("50%", machine), Ok(8_000_000_000));
        assert_eq!(parse_memory_size("1073741824", machine), Ok(1 << 30));
        for bad in ["", "GB", "12 parsecs", "-1GB", "0", "0%", "150%", "1e400", "NaNGB"] {
            assert!(parse_memory_size(bad, machine).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_buffer_cache_is_a_small_bounded_share_of_the_ceiling() {
        assert_eq!(cache_limit_for(1 << 30), 64 << 20);
        assert_eq!(cache_limit_for(8 << 30), 512 << 20);
        assert_eq!(cache_limit_for(128 << 30), 1 << 30);
    }

    #[test]
    fn this_process_is_measured() {
        let rss = process_resident_bytes().expect("Linux and macOS tell");
        assert!(rss > 1 << 20 && rss < 1 << 40, "{rss}");
    }
}
