//! Lets an engine hand the library its own evaluation lock, so one lock serializes every MLX
//! evaluation in the process (see the header's thread-safety notes).
use std::ffi::c_void;
use std::sync::Arc;

use super::error::Failure;
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::eval::{set_eval_lock, EvalLock};

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
/// `latent_cache_eval`) run between `lock(ctx)` and `unlock(ctx)`, instead of under the
/// library's own process-wide lock. Give it the lock your engine holds around its own
/// evaluations, so one lock covers the process. Pass both as NULL to go back to the library's
/// lock.
///
/// The callbacks are called from the library's evaluation thread (both on that thread), must
/// be safe to call from any thread, must not call back into this library, and must stay valid (with `ctx`) until replaced.
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
