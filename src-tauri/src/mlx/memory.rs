//! How much memory the machine has, and the budgets derived from it: one place for the
//! figures the engine, the model store, the admin API and the CLI all use.

/// What a machine is taken to have when the platform does not tell.
pub const FALLBACK_MEMORY_BYTES: u64 = 8 << 30;

/// The share of the machine's memory FastMLX plans to use (weights, KV cache, MLX's buffers);
/// the OS and the app need the rest.
pub const USABLE_PERCENT: u64 = 70;

/// Physical memory in bytes, if the platform tells.
pub fn total_memory_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kb: u64 = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
    #[cfg(target_vendor = "apple")]
    {
        let mut size: u64 = 0;
        let mut len = std::mem::size_of::<u64>();
        // SAFETY: "hw.memsize" is a u64; the out-pointer and its length match.
        let rc = unsafe {
            libc::sysctlbyname(
                c"hw.memsize".as_ptr(),
                (&mut size as *mut u64).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        (rc == 0).then_some(size)
    }
    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    {
        None
    }
}

/// Physical memory in bytes, or [`FALLBACK_MEMORY_BYTES`] when the platform does not tell.
pub fn machine_memory_bytes() -> u64 {
    total_memory_bytes().unwrap_or(FALLBACK_MEMORY_BYTES)
}

/// [`USABLE_PERCENT`] of the machine's memory: the default budget for resident models.
pub fn usable_memory_bytes() -> u64 {
    usable_share(machine_memory_bytes())
}

/// [`USABLE_PERCENT`] of a machine with `memory` bytes.
pub fn usable_share(memory: u64) -> u64 {
    memory / 100 * USABLE_PERCENT
}

/// The memory ceiling when none is configured: [`USABLE_PERCENT`] of the machine, and on Metal
/// never above the GPU's recommended working set (past it macOS pages GPU memory).
pub fn default_ceiling() -> u64 {
    let usable = usable_memory_bytes();
    super::recommended_working_set().map_or(usable, |r| r.min(usable))
}

/// The KV-cache budget when none is configured: what is left of the usable memory after the
/// weights, at least 256 MiB.
pub fn default_kv_budget(weights_bytes: usize) -> usize {
    const FLOOR: usize = 256 << 20;
    (usable_memory_bytes() as usize).saturating_sub(weights_bytes).max(FLOOR)
}
