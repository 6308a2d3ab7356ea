//! Evaluation: the one place the library runs MLX work, under one process-wide lock (the
//! library's own, or the engine's). Every graph the library builds lives on one stream usable
//! from any thread, so evaluations must never overlap: this lock is what makes that stream safe.
use std::sync::{Arc, Mutex, RwLock};

use mlx_rs::Array;
use once_cell::sync::Lazy;

use super::error::Result;

/// MLX evaluation is not safe to run from several threads at once on a shared stream (Metal
/// also encodes into a stream's command buffer on the calling thread), so every evaluation the
/// library performs takes this lock, or the engine's own (`set_eval_lock`).
static EVAL_LOCK: Lazy<Mutex<()>> = Lazy::new(|| Mutex::new(()));

/// A lock the engine owns, to be held around every evaluation the library performs, so that one
/// lock serializes MLX evaluation across the whole process (the engine's and ours).
pub trait EvalLock: Send + Sync {
    fn lock(&self);
    fn unlock(&self);
}

/// The engine's lock when one is installed; otherwise `EVAL_LOCK` is used.
static ENGINE_LOCK: Lazy<RwLock<Option<Arc<dyn EvalLock>>>> = Lazy::new(|| RwLock::new(None));

/// Installs the engine's evaluation lock (`None` restores the library's own).
pub fn set_eval_lock(lock: Option<Arc<dyn EvalLock>>) {
    *ENGINE_LOCK.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = lock;
}

/// Releases the engine's lock when dropped, so an error or panic inside eval cannot leak it.
struct EngineGuard(Arc<dyn EvalLock>);

impl Drop for EngineGuard {
    fn drop(&mut self) {
        self.0.unlock();
    }
}

/// Whether `a` has been evaluated (its data is available).
pub fn is_evaluated(a: &Array) -> bool {
    let mut available = false;
    // SAFETY: a valid array handle; the call only reads its status.
    let rc = unsafe { mlx_sys::_mlx_array_is_available(&mut available, a.as_ptr()) };
    rc == 0 && available
}

/// Evaluates `arrays` under the evaluation lock. Arrays already evaluated are skipped, and a
/// call with nothing left to evaluate returns at once: MLX would otherwise run an empty
/// evaluation on the calling thread's own default stream, giving that thread a worker.
pub fn eval<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    let pending: Vec<&Array> = arrays.into_iter().filter(|a| !is_evaluated(a)).collect();
    if pending.is_empty() {
        return Ok(());
    }
    let engine = ENGINE_LOCK.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    match engine {
        Some(lock) => {
            lock.lock();
            let _guard = EngineGuard(lock);
            Ok(mlx_rs::transforms::eval(pending)?)
        }
        None => {
            let _guard = EVAL_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            Ok(mlx_rs::transforms::eval(pending)?)
        }
    }
}
