//! The few MLX operations the cache is built from, called through mlx-c directly so that an
//! append costs one slice update per family and nothing else on the host. Every graph the
//! library builds runs on one process-wide stream (see `stream`), so a handle's calls, and the
//! evaluation of the arrays they return, may land on any thread.
use mlx_rs::Array;
use once_cell::sync::Lazy;

use super::error::{fail, Result};
use super::eval::eval;
use super::memory::check_alloc;

/// The library's stream. MLX 0.32 binds ordinary streams to the thread that made them: an array
/// left unevaluated on thread A's stream cannot be evaluated on thread B, and every thread that
/// touches MLX's default stream gets a worker thread of its own. A stream from
/// `mlx_stream_new_thread_unsafe` is registered for the whole process instead: usable from any
/// thread, one worker however many threads call us, and its evaluations serialized by the
/// library's evaluation lock (`eval`). Made once, on the default device (the GPU where MLX has
/// one: Metal on Apple silicon, CUDA on NVIDIA), and never freed.
struct LibraryStream(mlx_sys::mlx_stream);

// SAFETY: the stream is registered process-wide by MLX; the handle is an immutable token, and
// evaluation on it is serialized by the evaluation lock.
unsafe impl Send for LibraryStream {}
unsafe impl Sync for LibraryStream {}

static STREAM: Lazy<LibraryStream> = Lazy::new(|| {
    ensure_error_handler();
    // SAFETY: plain mlx-c constructors; the device is freed once the stream holds its own copy.
    unsafe {
        let mut device = mlx_sys::mlx_device_new();
        mlx_sys::mlx_get_default_device(&mut device);
        let stream = mlx_sys::mlx_stream_new_thread_unsafe(device);
        mlx_sys::mlx_device_free(device);
        LibraryStream(stream)
    }
});

/// mlx-c reports failures through a process-wide handler; mlx-rs installs one that keeps the
/// message for the failing thread instead of exiting the process. Make sure it is installed
/// before our first direct mlx-c call. Cloning an array is a guarded mlx-rs call that touches
/// no stream (an evaluation would make the calling thread a stream and a worker of its own).
fn ensure_error_handler() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| drop(Array::from_slice(&[0f32], &[1]).clone()));
}

fn call(op: &str, f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32) -> Result<Array> {
    let stream = STREAM.0;
    // SAFETY: `res` is a fresh handle that either receives the result or is freed here.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        if f(&mut res, stream) != 0 {
            mlx_sys::mlx_array_free(res);
            return fail!(Backend, "MLX {op} failed");
        }
        Ok(Array::from_ptr(res))
    }
}

fn dims(values: &[usize]) -> Vec<i32> {
    // Callers validated every extent against i32::MAX (geometry, append and reserve checks).
    values.iter().map(|&v| v as i32).collect()
}

/// A view of `a[start..stop]` (per axis); no copy.
pub fn slice(a: &Array, start: &[usize], stop: &[usize]) -> Result<Array> {
    let (start, stop, strides) = (dims(start), dims(stop), vec![1; start.len()]);
    call("slice", |res, s| unsafe {
        mlx_sys::mlx_slice(
            res,
            a.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s,
        )
    })
}

/// `src` with `src[start..start+update.shape]` replaced by `update`. MLX writes in place when
/// nothing else references `src`'s buffer at evaluation time.
pub fn slice_update(src: &Array, update: &Array, start: &[usize], stop: &[usize]) -> Result<Array> {
    let (start, stop, strides) = (dims(start), dims(stop), vec![1; start.len()]);
    call("slice_update", |res, s| unsafe {
        mlx_sys::mlx_slice_update(
            res,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s,
        )
    })
}

/// An f32 array of zeros, lazily (allocated when evaluated). Callers that allocate check the
/// size with `memory::check_alloc` first.
pub fn zeros(shape: &[usize]) -> Result<Array> {
    let shape = dims(shape);
    call("zeros", |res, s| unsafe { mlx_sys::mlx_zeros(res, shape.as_ptr(), shape.len(), mlx_sys::mlx_dtype__MLX_FLOAT32, s) })
}

/// An f32 array `shape` holding a copy of `data` (the one host-to-array path). The length must
/// equal the shape's product and every extent must fit MLX's int32 shapes; the copy is checked
/// against MLX's memory limit before it is made.
pub fn from_host(data: &[f32], shape: &[usize], name: &str) -> Result<Array> {
    let expected = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if expected != Some(data.len()) || shape.iter().any(|&d| d > i32::MAX as usize) {
        return fail!(
            Shape,
            "{name} has {} floats; shape {shape:?} needs their product (each extent at most INT32_MAX)",
            data.len()
        );
    }
    check_alloc(Some(std::mem::size_of_val(data)), name)?;
    Ok(Array::from_slice(data, &dims(shape)))
}

/// Copies an array's elements to the host, row-major, after evaluating it under the library's
/// lock. The array must be row-contiguous once evaluated (a slice of whole trailing rows is).
pub fn to_host(a: &Array) -> Result<Vec<f32>> {
    eval([a])?;
    let size = a.size();
    if size == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the array is evaluated and float32; its data pointer covers `size` elements when
    // it is row-contiguous, which is checked first. Read through mlx-c directly: mlx-rs's
    // `as_slice` evaluates again, outside the library's lock.
    unsafe {
        let mut contiguous = false;
        if mlx_sys::_mlx_array_is_row_contiguous(&mut contiguous, a.as_ptr()) != 0 || !contiguous {
            return fail!(Backend, "reading MLX array: not row-contiguous");
        }
        let data = mlx_sys::mlx_array_data_float32(a.as_ptr());
        if data.is_null() {
            return fail!(Backend, "reading MLX array: no data");
        }
        Ok(std::slice::from_raw_parts(data, size).to_vec())
    }
}
