//! Process-wide evaluation settings: the engine's own evaluation lock, so one lock serializes
//! every MLX evaluation in the process, and where the library's evaluations run (see the
//! header's thread-safety notes).
use std::ffi::c_void;
use std::sync::Arc;

use super::error::Failure;
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::mlx::eval::{set_eval_lock, set_evaluation_thread, EvalLock};

/// A lock or unlock callback; receives the `ctx` given to `latent_cache_set_eval_lock`.
pub type latent_cache_lock_fn = Option<unsafe extern "C" fn(ctx: *mut c_void)>;

struct EngineLock {
    lock: unsafe extern "C" fn(*mut c_void),
    unlock: unsafe extern "C" fn(*mut c_void),
    ctx: *mut c_void,
}

// SAFETY: the caller promises the callbacks and ctx may be used from any thread (documented).
unsafe impl Send for EngineLock {}
unsafe impl Sync for EngineLock {}

impl EvalLock for EngineLock {
    fn lock(&self) {
        unsafe { (self.lock)(self.ctx) }
    }

    fn unlock(&self) {
        unsafe { (self.unlock)(self.ctx) }
    }
}

/// Makes every MLX evaluation the library performs (appends through the host path, host reads,
/// `latent_cache_eval`, `latent_cache_eval_async`, and the synchronisation an append may run
/// while it waits for the previous step's reads of its buffer) run between `lock(ctx)` and
/// `unlock(ctx)`, instead of under the library's own process-wide lock. Do not hold the lock
/// while calling the library: any call that allocates or appends may take it. Give it the lock
/// your engine holds around its own evaluations, so one lock covers the process. Pass both as NULL to go back to the library's
/// lock.
///
/// The callbacks are called on the thread that evaluates (the library's evaluation thread, see
/// latent_cache_set_evaluation_thread; lock and unlock always on the same thread), must be safe
/// to call from any thread, must not call back into this library, and must stay valid (with
/// `ctx`) until replaced.
/// Install the lock before other threads use the library, or while none of them is evaluating.
///
/// Returns `OK`, or `INVALID_ARGUMENT` when exactly one of the two is NULL (nothing changes).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_eval_lock(
    lock: latent_cache_lock_fn,
    unlock: latent_cache_lock_fn,
    ctx: *mut c_void,
) -> latent_cache_status {
    ffi_boundary! {
        match (lock, unlock) {
            (Some(lock), Some(unlock)) => set_eval_lock(Some(Arc::new(EngineLock { lock, unlock, ctx }))),
            (None, None) => set_eval_lock(None),
            _ => {
                return Err(Failure::new(
                    latent_cache_status::InvalidArgument,
                    "lock and unlock must both be set, or both be NULL",
                ))
            }
        }
        Ok(())
    }
}

/// Chooses where the library's evaluations run. `true` (the default): on one thread the library
/// owns, which the calling thread waits for; caller threads then never hold MLX state, and may
/// end at any time. `false`: on the calling thread, without the hand-off. With the process's
/// threads pinned to a few cores, the hand-off costs nothing measurable (a GLM-5.2 decode step
/// on the CPU and on an H200: 0.96-1.08x the calling thread's time); unpinned on a many-core
/// host, where the scheduler puts the two threads decides (0.87-1.55x on the H200's 16 cores;
/// bench/results/h200.md). The evaluation thread inherits the CPU affinity of the thread
/// whose call first evaluates. Turn it off only if no thread that calls the library ends while
/// another thread evaluates: on CUDA that broke the other thread's evaluation and MLX aborted
/// the process.
/// With it off, an array an engine built on its own thread's stream can be evaluated by calls
/// on that thread. Set it before other threads use the library, or while none is evaluating.
/// Never fails.
#[no_mangle]
pub extern "C" fn latent_cache_set_evaluation_thread(enabled: bool) {
    ffi_boundary!(on_panic = (); set_evaluation_thread(enabled))
}
