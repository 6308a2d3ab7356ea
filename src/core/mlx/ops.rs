//! The few MLX operations the cache is built from, called through mlx-c directly so that an
//! append costs one slice update per family and nothing else on the host. Every graph the
//! library builds runs on one process-wide stream (`device`), so a handle's calls, and the
//! evaluation of the arrays they return, may land on any thread.
use mlx_rs::{Array, Dtype};

use crate::core::error::{fail, Result};
use crate::core::mlx::device::library_stream;
use crate::core::mlx::eval::eval;
use crate::core::mlx::memory::check_alloc;

pub(crate) fn call(op: &str, f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32) -> Result<Array> {
    let stream = library_stream();
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

/// Rows `[lo, hi)` of `a` along axis 0, every other axis whole: a view.
pub fn rows(a: &Array, lo: usize, hi: usize) -> Result<Array> {
    let mut start = vec![0; a.ndim()];
    let mut stop: Vec<usize> = a.shape().iter().map(|&d| d as usize).collect();
    (start[0], stop[0]) = (lo, hi);
    slice(a, &start, &stop)
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

/// `a` with `values` written at `indices` along `axis` (`indices` broadcast against `values`).
/// MLX writes in place when nothing else references `a`'s buffer at evaluation time. (Measured
/// faster than a scatter of whole vectors, and than one slice update per row, for ragged
/// appends at batch 8.)
pub fn put_along_axis(a: &Array, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
    call("put_along_axis", |res, s| unsafe {
        mlx_sys::mlx_put_along_axis(res, a.as_ptr(), indices.as_ptr(), values.as_ptr(), axis, s)
    })
}

/// A copy of a `[rows, positions, width]` view in a buffer of its own, bit for bit, so the
/// buffer it views is no longer referenced (and MLX may write that one in place). MLX's `copy`
/// shares the input's buffer, and a slice update covering a whole array returns the update
/// itself; so the values are written into fresh zeros one position longer, and viewed back.
pub fn copy(a: &Array) -> Result<Array> {
    let shape: Vec<usize> = a.shape().iter().map(|&d| d as usize).collect();
    let longer = [shape[0], shape[1] + 1, shape[2]];
    let fresh = slice_update(&zeros(&longer, a.dtype())?, a, &[0, 0, 0], &shape)?;
    slice(&fresh, &[0, 0, 0], &shape)
}

/// An int32 array holding a copy of `data` (small index arrays the library builds itself).
pub fn indices(data: &[i32], shape: &[usize]) -> Array {
    Array::from_slice(data, &dims(shape))
}

/// An array of zeros, lazily (allocated when evaluated). Callers that allocate check the size
/// with `memory::check_alloc` first.
pub fn zeros(shape: &[usize], dtype: Dtype) -> Result<Array> {
    let shape = dims(shape);
    call("zeros", |res, s| unsafe { mlx_sys::mlx_zeros(res, shape.as_ptr(), shape.len(), dtype as u32, s) })
}

/// `a` converted to `dtype` (round to nearest even); `a` itself when it already is.
pub fn astype(a: &Array, dtype: Dtype) -> Result<Array> {
    if a.dtype() == dtype {
        return Ok(a.clone());
    }
    call("astype", |res, s| unsafe { mlx_sys::mlx_astype(res, a.as_ptr(), dtype as u32, s) })
}

/// `a` broadcast to `shape`: a view (stride 0 along the broadcast axes), nothing copied.
pub fn broadcast_to(a: &Array, shape: &[usize]) -> Result<Array> {
    let shape = dims(shape);
    call("broadcast_to", |res, s| unsafe { mlx_sys::mlx_broadcast_to(res, a.as_ptr(), shape.as_ptr(), shape.len(), s) })
}

/// `a` with a new shape of the same size; a view when `a` is contiguous.
pub fn reshape(a: &Array, shape: &[usize]) -> Result<Array> {
    let shape = dims(shape);
    call("reshape", |res, s| unsafe { mlx_sys::mlx_reshape(res, a.as_ptr(), shape.as_ptr(), shape.len(), s) })
}

pub(crate) fn binary(
    op: &str,
    a: &Array,
    b: &Array,
    f: unsafe extern "C" fn(*mut mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
) -> Result<Array> {
    call(op, |res, s| unsafe { f(res, a.as_ptr(), b.as_ptr(), s) })
}

pub fn multiply(a: &Array, b: &Array) -> Result<Array> {
    binary("multiply", a, b, mlx_sys::mlx_multiply)
}

pub fn divide(a: &Array, b: &Array) -> Result<Array> {
    binary("divide", a, b, mlx_sys::mlx_divide)
}

pub fn maximum(a: &Array, b: &Array) -> Result<Array> {
    binary("maximum", a, b, mlx_sys::mlx_maximum)
}

/// A float32 scalar.
pub fn scalar(value: f32) -> Array {
    // SAFETY: a plain constructor; the handle is owned by the returned Array.
    unsafe { Array::from_ptr(mlx_sys::mlx_array_new_float(value)) }
}

/// The largest absolute value along the last axis, kept as an axis of 1.
pub fn abs_max_last(a: &Array) -> Result<Array> {
    let abs = call("abs", |res, s| unsafe { mlx_sys::mlx_abs(res, a.as_ptr(), s) })?;
    call("max", |res, s| unsafe { mlx_sys::mlx_max_axis(res, abs.as_ptr(), -1, true, s) })
}

pub(crate) fn optional(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int { value, has_value: true }
}

/// MLX's affine quantization along the last axis: `[packed uint32, scales, biases]`, scales and
/// biases in `w`'s dtype.
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<Vec<Array>> {
    let stream = library_stream();
    // SAFETY: the vector is freed here; each element is copied into an owned Array first.
    unsafe {
        let mut out = mlx_sys::mlx_vector_array_new();
        let null = mlx_sys::mlx_array_new();
        let rc =
            mlx_sys::mlx_quantize(&mut out, w.as_ptr(), optional(group_size), optional(bits), c"affine".as_ptr(), null, stream);
        mlx_sys::mlx_array_free(null);
        let mut parts = Vec::new();
        if rc == 0 {
            for i in 0..mlx_sys::mlx_vector_array_size(out) {
                let mut part = mlx_sys::mlx_array_new();
                if mlx_sys::mlx_vector_array_get(&mut part, out, i) != 0 {
                    mlx_sys::mlx_array_free(part);
                    break;
                }
                parts.push(Array::from_ptr(part));
            }
        }
        mlx_sys::mlx_vector_array_free(out);
        if rc != 0 || parts.len() != 3 {
            return fail!(Backend, "MLX quantize failed");
        }
        Ok(parts)
    }
}

/// The inverse of `quantize`, in the scales' dtype.
pub fn dequantize(w: &Array, scales: &Array, biases: &Array, group_size: i32, bits: i32) -> Result<Array> {
    call("dequantize", |res, s| unsafe {
        let null = mlx_sys::mlx_array_new();
        let no_dtype = mlx_sys::mlx_optional_dtype { value: 0, has_value: false };
        let rc = mlx_sys::mlx_dequantize(
            res,
            w.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            optional(group_size),
            optional(bits),
            c"affine".as_ptr(),
            null,
            no_dtype,
            s,
        );
        mlx_sys::mlx_array_free(null);
        rc
    })
}

/// E4M3 codes (uint8) of `a`, saturating at +-448.
pub fn to_fp8(a: &Array) -> Result<Array> {
    call("to_fp8", |res, s| unsafe { mlx_sys::mlx_to_fp8(res, a.as_ptr(), s) })
}

/// The values of E4M3 codes, as `dtype`.
pub fn from_fp8(a: &Array, dtype: Dtype) -> Result<Array> {
    call("from_fp8", |res, s| unsafe { mlx_sys::mlx_from_fp8(res, a.as_ptr(), dtype as u32, s) })
}

/// `a` laid out row-contiguously (`a` itself when it already is), so its data can be read.
pub fn contiguous(a: &Array) -> Result<Array> {
    call("contiguous", |res, s| unsafe { mlx_sys::mlx_contiguous(res, a.as_ptr(), false, s) })
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
/// lock. The array must be float32 and row-contiguous once evaluated (a slice of whole
/// trailing rows is); anything else is refused.
pub fn to_host(a: &Array) -> Result<Vec<f32>> {
    if a.dtype() != Dtype::Float32 {
        return fail!(Dtype, "reading MLX array: float32 expected, got {:?}", a.dtype());
    }
    // SAFETY: the array is float32, so mlx-c's float32 data pointer is its data.
    unsafe { copy_out(a, |x| mlx_sys::mlx_array_data_float32(x)) }
}

/// Copies an integer array's elements to the host as int64 (exactly: no float on the way),
/// row-major, after evaluating them under the library's lock.
pub fn to_host_i64(a: &Array) -> Result<Vec<i64>> {
    let wide = contiguous(&astype(a, Dtype::Int64)?)?;
    // SAFETY: `wide` is int64, so mlx-c's int64 data pointer is its data.
    unsafe { copy_out(&wide, |x| mlx_sys::mlx_array_data_int64(x)) }
}

/// Evaluates `a` under the library's lock and copies its `size` elements out through `data`
/// (mlx-c's pointer for its dtype). Read through mlx-c directly: mlx-rs's `as_slice` evaluates
/// again, outside the library's lock.
///
/// # Safety
/// `data` must return the pointer to `a`'s elements as `T` (the accessor of `a`'s dtype).
pub(crate) unsafe fn copy_out<T: Copy>(a: &Array, data: impl Fn(mlx_sys::mlx_array) -> *const T) -> Result<Vec<T>> {
    eval([a])?;
    let size = a.size();
    if size == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the array is evaluated; its data pointer covers `size` elements when it is
    // row-contiguous, which is checked first.
    unsafe {
        let mut contiguous = false;
        if mlx_sys::_mlx_array_is_row_contiguous(&mut contiguous, a.as_ptr()) != 0 || !contiguous {
            return fail!(Backend, "reading MLX array: not row-contiguous");
        }
        let data = data(a.as_ptr());
        if data.is_null() {
            return fail!(Backend, "reading MLX array: no data");
        }
        Ok(std::slice::from_raw_parts(data, size).to_vec())
    }
}
