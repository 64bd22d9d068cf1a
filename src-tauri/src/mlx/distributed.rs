//! MLX's own distributed layer (mlx-c's `mlx_distributed_*`), as FastMLX's cluster uses it: one
//! process per machine in a group, ranks talking over the `ring` backend (TCP, any network,
//! Thunderbolt bridge included) or `jaccl` (RDMA over Thunderbolt 5, macOS 26.2+). MLX reads the
//! group's layout from its environment: `MLX_HOSTFILE` (each rank's `ip:port` addresses) and
//! `MLX_RANK`. Collectives are graph ops: they run when their result is evaluated.

use std::ffi::CString;

use mlx_rs::{Array, Dtype, Stream};

/// MLX's backends for a group across machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DistributedBackend {
    Ring,
    Jaccl,
}

impl DistributedBackend {
    pub fn name(self) -> &'static str {
        match self {
            DistributedBackend::Ring => "ring",
            DistributedBackend::Jaccl => "jaccl",
        }
    }

    pub fn parse(name: &str) -> Result<DistributedBackend, String> {
        match name {
            "ring" => Ok(DistributedBackend::Ring),
            "jaccl" => Ok(DistributedBackend::Jaccl),
            other => Err(format!("unknown distributed backend {other:?} (ring or jaccl)")),
        }
    }

    /// Whether this MLX build has the backend.
    pub fn is_available(self) -> bool {
        let name = CString::new(self.name()).expect("no NUL in a backend's name");
        // SAFETY: a NUL-terminated name; mlx-c only reads it.
        unsafe { mlx_sys::mlx_distributed_is_available(name.as_ptr()) }
    }
}

/// This process's group: its rank among `size` processes.
pub struct Group {
    raw: mlx_sys::mlx_distributed_group,
}

// SAFETY: the group is an immutable handle to MLX's communicator, which MLX uses from any thread.
unsafe impl Send for Group {}
unsafe impl Sync for Group {}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: `raw` was created by mlx-c and is freed once.
        unsafe { mlx_sys::mlx_distributed_group_free(self.raw) };
    }
}

impl Group {
    /// Joins the group the environment describes with `backend` (blocking until every rank has
    /// connected; MLX's ring retries its connections for a while, then fails).
    pub fn init(backend: DistributedBackend) -> Result<Group, String> {
        if !backend.is_available() {
            return Err(format!("this MLX build has no {} backend", backend.name()));
        }
        let name = CString::new(backend.name()).expect("no NUL in a backend's name");
        // SAFETY: `raw` is a fresh handle for mlx-c to fill; the name is NUL-terminated.
        let mut raw = unsafe { mlx_sys::mlx_distributed_group_new() };
        let status = unsafe { mlx_sys::mlx_distributed_init(&mut raw, true, name.as_ptr()) };
        if status != 0 {
            // SAFETY: the handle mlx-c created or left empty is freed once.
            unsafe { mlx_sys::mlx_distributed_group_free(raw) };
            return Err(format!("MLX could not join the {} group (see MLX's message above)", backend.name()));
        }
        Ok(Group { raw })
    }

    /// A group of this process alone (MLX's own, when no backend is set up), whose sums are
    /// the arrays themselves: for tests of what runs the collectives.
    #[cfg(test)]
    pub fn alone() -> Group {
        let name = CString::new("ring").expect("no NUL");
        // SAFETY: as in `init`; not strict, so MLX falls back to a group of one.
        let mut raw = unsafe { mlx_sys::mlx_distributed_group_new() };
        let status = unsafe { mlx_sys::mlx_distributed_init(&mut raw, false, name.as_ptr()) };
        assert_eq!(status, 0, "MLX's group of one");
        Group { raw }
    }

    pub fn rank(&self) -> usize {
        // SAFETY: a live group handle.
        unsafe { mlx_sys::mlx_distributed_group_rank(self.raw) as usize }
    }

    pub fn size(&self) -> usize {
        // SAFETY: a live group handle.
        unsafe { mlx_sys::mlx_distributed_group_size(self.raw) as usize }
    }

    /// The element-wise sum of `x` over the ranks.
    pub fn all_sum(&self, x: &Array) -> Result<Array, String> {
        self.op("all_sum", |out, s| unsafe { mlx_sys::mlx_distributed_all_sum(out, x.as_ptr(), self.raw, s) })
    }

    /// Every rank's `x`, concatenated along the first axis in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array, String> {
        self.op("all_gather", |out, s| unsafe { mlx_sys::mlx_distributed_all_gather(out, x.as_ptr(), self.raw, s) })
    }

    /// Sends `x` to rank `to` (done when the returned array is evaluated).
    pub fn send(&self, x: &Array, to: usize) -> Result<Array, String> {
        self.op("send", |out, s| unsafe { mlx_sys::mlx_distributed_send(out, x.as_ptr(), to as i32, self.raw, s) })
    }

    /// An array of `shape` and `dtype` from rank `from`.
    pub fn recv(&self, shape: &[i32], dtype: Dtype, from: usize) -> Result<Array, String> {
        self.op("recv", |out, s| unsafe {
            mlx_sys::mlx_distributed_recv(out, shape.as_ptr(), shape.len(), dtype.into(), from as i32, self.raw, s)
        })
    }

    fn op(
        &self,
        name: &str,
        f: impl FnOnce(&mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
    ) -> Result<Array, String> {
        // Collectives run on the CPU stream (MLX's ring and jaccl backends are CPU ops).
        let stream = Stream::cpu();
        // SAFETY: a fresh handle for mlx-c to fill.
        let mut out = unsafe { mlx_sys::mlx_array_new() };
        let status = f(&mut out, stream.as_ptr());
        if status != 0 {
            // SAFETY: the handle mlx-c created or left empty is freed once.
            unsafe { mlx_sys::mlx_array_free(out) };
            return Err(format!("MLX's distributed {name} failed"));
        }
        // SAFETY: on success `out` is a new array owned by us.
        Ok(unsafe { Array::from_ptr(out) })
    }
}
