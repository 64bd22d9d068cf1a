//! How much memory the machine has, and the default KV-cache budget derived from it.

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
            libc::sysctlbyname(c"hw.memsize".as_ptr(), (&mut size as *mut u64).cast(), &mut len, std::ptr::null_mut(), 0)
        };
        (rc == 0).then_some(size)
    }
    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    {
        None
    }
}

/// The KV-cache budget when none is configured: what is left of 70% of the machine's memory
/// after the weights (the OS, the app and MLX's buffers need the rest), at least 256 MiB.
pub fn default_kv_budget(weights_bytes: usize) -> usize {
    const FLOOR: usize = 256 << 20;
    let total = total_memory_bytes().unwrap_or(8 << 30) as usize;
    (total / 10 * 7).saturating_sub(weights_bytes).max(FLOOR)
}
