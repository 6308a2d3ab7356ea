//! MLX's own distributed layer (`mlx_distributed_*`: the ring backend over TCP, MPI, JACCL over
//! Thunderbolt, NCCL): a group of processes, and point-to-point sends and receives of arrays.
//! Sends and receives run on MLX's CPU stream (the ring and MPI backends implement them there)
//! and are evaluated one at a time, in the order the two processes agree on, so a pair of calls
//! never waits on an operation the other side has not reached.
use std::ffi::CString;

use mlx_rs::{Array, Dtype};

use crate::core::error::{fail, Result};
use crate::core::mlx::device::cpu_stream;
use crate::core::mlx::eval::eval;

/// A group of processes (MLX's `Group`): this process's rank among `size`.
#[derive(Debug)]
pub struct Group {
    raw: mlx_sys::mlx_distributed_group,
}

// SAFETY: MLX's group is a shared handle to its backend, which MLX's own operations use from
// whichever thread evaluates them; the library evaluates each transfer to completion, one at a
// time, on its evaluation thread.
unsafe impl Send for Group {}
unsafe impl Sync for Group {}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: the group this value owns.
        unsafe { mlx_sys::mlx_distributed_group_free(self.raw) };
    }
}

impl Group {
    /// Joins the group MLX's `backend` ("ring", "mpi", "jaccl", "nccl" or "any") describes
    /// through its environment (for the ring: `MLX_RANK`, `MLX_HOSTFILE`). Without `strict`, a
    /// backend that is not configured gives a group of this process alone.
    pub fn init(backend: &str, strict: bool) -> Result<Group> {
        let Ok(bk) = CString::new(backend) else {
            return fail!(InvalidArgument, "a backend name with a NUL byte");
        };
        // SAFETY: a fresh group that receives the result or is freed here.
        unsafe {
            let mut raw = mlx_sys::mlx_distributed_group_new();
            if mlx_sys::mlx_distributed_init(&mut raw, strict, bk.as_ptr()) != 0 || raw.ctx.is_null() {
                mlx_sys::mlx_distributed_group_free(raw);
                return fail!(
                    Backend,
                    "MLX's distributed backend {backend:?} did not start (is it configured for this process?)"
                );
            }
            Ok(Group { raw })
        }
    }

    pub fn rank(&self) -> usize {
        // SAFETY: a live group.
        unsafe { mlx_sys::mlx_distributed_group_rank(self.raw).max(0) as usize }
    }

    pub fn size(&self) -> usize {
        // SAFETY: a live group.
        unsafe { mlx_sys::mlx_distributed_group_size(self.raw).max(0) as usize }
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.size() || peer == self.rank() {
            return fail!(
                InvalidArgument,
                "rank {peer} is not another process of this group of {} (this is {})",
                self.size(),
                self.rank()
            );
        }
        Ok(())
    }

    /// Sends `a` to rank `dst` and waits until it is sent.
    pub fn send(&self, a: &Array, dst: usize) -> Result<()> {
        self.check_peer(dst)?;
        let sent = on_cpu("send", |res, s| unsafe { mlx_sys::mlx_distributed_send(res, a.as_ptr(), dst as i32, self.raw, s) })?;
        eval([&sent])
    }

    /// Receives an array of `shape` and `dtype` from rank `src`, evaluated.
    pub fn recv(&self, shape: &[usize], dtype: Dtype, src: usize) -> Result<Array> {
        self.check_peer(src)?;
        if shape.iter().any(|&d| d > i32::MAX as usize) {
            return fail!(InvalidArgument, "a shape of {shape:?}");
        }
        let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        let got = on_cpu("recv", |res, s| unsafe {
            mlx_sys::mlx_distributed_recv(res, dims.as_ptr(), dims.len(), dtype as u32, src as i32, self.raw, s)
        })?;
        eval([&got])?;
        Ok(got)
    }
}

/// An MLX operation on the library's CPU stream (`device::cpu_stream`).
fn on_cpu(op: &str, f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32) -> Result<Array> {
    // SAFETY: a fresh result handle, freed here or handed to the result.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = f(&mut res, cpu_stream());
        if status != 0 {
            mlx_sys::mlx_array_free(res);
            return fail!(Backend, "MLX distributed {op} failed");
        }
        Ok(Array::from_ptr(res))
    }
}
