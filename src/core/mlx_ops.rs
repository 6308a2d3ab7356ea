//! The few MLX operations the cache is built from, called through mlx-c directly so that an
//! append costs one slice update per family and nothing else on the host. Also the process-wide
//! evaluation lock.
use std::sync::{Arc, Mutex, Once, RwLock};

use mlx_rs::{Array, Stream};
use once_cell::sync::Lazy;

use super::error::{fail, Result};

/// MLX evaluation is not safe to run from several threads at once on every backend (Metal encodes
/// into a stream's shared command buffer on the calling thread), so every evaluation the library
/// performs takes this lock, or the engine's own (`set_eval_lock`). Engines that evaluate on their
/// own threads either route through `latent_cache_eval` or hand the library their lock.
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

thread_local! {
    static STREAM: Stream = Stream::new();
}

/// mlx-c reports failures through a process-wide handler; mlx-rs installs one that stashes the
/// message instead of exiting. Make sure it is installed before our first direct mlx-c call.
fn ensure_error_handler() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let _ = mlx_rs::ops::zeros::<f32>(&[1]);
    });
}

fn call(op: &str, f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32) -> Result<Array> {
    ensure_error_handler();
    STREAM.with(|stream| unsafe {
        let mut res = mlx_sys::mlx_array_new();
        if f(&mut res, stream.as_ptr()) != 0 {
            mlx_sys::mlx_array_free(res);
            return fail!(Backend, "MLX {op} failed");
        }
        Ok(Array::from_ptr(res))
    })
}

fn dims(values: &[usize]) -> Vec<i32> {
    // Callers validated every extent against i32::MAX (geometry and append checks).
    values.iter().map(|&v| v as i32).collect()
}

/// A view of `a[start..stop]` (per axis); no copy.
pub fn slice(a: &Array, start: &[usize], stop: &[usize]) -> Result<Array> {
    let (start, stop, strides) = (dims(start), dims(stop), vec![1; start.len()]);
    call("slice", |res, s| unsafe {
        mlx_sys::mlx_slice(res, a.as_ptr(), start.as_ptr(), start.len(), stop.as_ptr(), stop.len(), strides.as_ptr(), strides.len(), s)
    })
}

/// `src` with `src[start..start+update.shape]` replaced by `update`. MLX writes in place when
/// nothing else references `src`'s buffer at evaluation time.
pub fn slice_update(src: &Array, update: &Array, start: &[usize], stop: &[usize]) -> Result<Array> {
    let (start, stop, strides) = (dims(start), dims(stop), vec![1; start.len()]);
    call("slice_update", |res, s| unsafe {
        mlx_sys::mlx_slice_update(
            res, src.as_ptr(), update.as_ptr(), start.as_ptr(), start.len(), stop.as_ptr(), stop.len(), strides.as_ptr(), strides.len(), s,
        )
    })
}

/// An f32 array of zeros (allocated when evaluated).
pub fn zeros(shape: &[usize]) -> Result<Array> {
    Ok(mlx_rs::ops::zeros::<f32>(&dims(shape))?)
}

/// Evaluates `arrays` under the process-wide evaluation lock.
pub fn eval<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    let engine = ENGINE_LOCK.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    match engine {
        Some(lock) => {
            lock.lock();
            let _guard = EngineGuard(lock);
            Ok(mlx_rs::transforms::eval(arrays)?)
        }
        None => {
            let _guard = EVAL_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            Ok(mlx_rs::transforms::eval(arrays)?)
        }
    }
}

/// Whether `a` has been evaluated (its data is available).
pub fn is_evaluated(a: &Array) -> bool {
    let mut available = false;
    // SAFETY: a valid array handle; the call only reads its status.
    let rc = unsafe { mlx_sys::_mlx_array_is_available(&mut available, a.as_ptr()) };
    rc == 0 && available
}

/// Copies an evaluated-on-demand array's elements to the host, in row-major order.
/// The array must be row-contiguous once evaluated (a slice of whole trailing rows is).
pub fn to_host(a: &Array) -> Result<Vec<f32>> {
    eval([a])?;
    match a.try_as_slice::<f32>() {
        Ok(values) => Ok(values.to_vec()),
        Err(err) => fail!(Backend, "reading MLX array: {err:?}"),
    }
}
