//! The MLX operations the read path computes with (matrix products, softmax, masks), on the
//! library's stream like every other graph it builds (see `ops`).
use mlx_rs::{Array, Dtype};

use crate::core::error::{fail, Result};
use crate::core::mlx::ops::{binary, call, optional};

pub fn matmul(a: &Array, b: &Array) -> Result<Array> {
    binary("matmul", a, b, mlx_sys::mlx_matmul)
}

pub fn add(a: &Array, b: &Array) -> Result<Array> {
    binary("add", a, b, mlx_sys::mlx_add)
}

pub fn greater_equal(a: &Array, b: &Array) -> Result<Array> {
    binary("greater_equal", a, b, mlx_sys::mlx_greater_equal)
}

pub fn less(a: &Array, b: &Array) -> Result<Array> {
    binary("less", a, b, mlx_sys::mlx_less)
}

pub fn logical_and(a: &Array, b: &Array) -> Result<Array> {
    binary("logical_and", a, b, mlx_sys::mlx_logical_and)
}

/// `x` where `condition`, else `y` (broadcast).
pub fn select(condition: &Array, x: &Array, y: &Array) -> Result<Array> {
    call("where", |res, s| unsafe { mlx_sys::mlx_where(res, condition.as_ptr(), x.as_ptr(), y.as_ptr(), s) })
}

/// `arrays` joined along `axis` (each copied into the result).
pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
    // SAFETY: the vector takes its own references to the arrays and is freed here.
    unsafe {
        let vector = mlx_sys::mlx_vector_array_new();
        let mut rc = 0;
        for a in arrays {
            rc |= mlx_sys::mlx_vector_array_append_value(vector, a.as_ptr());
        }
        let out = match rc {
            0 => call("concatenate", |res, s| mlx_sys::mlx_concatenate_axis(res, vector, axis, s)),
            _ => fail!(Backend, "concatenate: could not gather its {} arrays", arrays.len()),
        };
        mlx_sys::mlx_vector_array_free(vector);
        out
    }
}

pub fn swapaxes(a: &Array, axis1: i32, axis2: i32) -> Result<Array> {
    call("swapaxes", |res, s| unsafe { mlx_sys::mlx_swapaxes(res, a.as_ptr(), axis1, axis2, s) })
}

pub fn expand_dims(a: &Array, axis: i32) -> Result<Array> {
    call("expand_dims", |res, s| unsafe { mlx_sys::mlx_expand_dims(res, a.as_ptr(), axis, s) })
}

/// Softmax along `axis`, accumulated in float32 whatever the input dtype.
pub fn softmax(a: &Array, axis: i32) -> Result<Array> {
    call("softmax", |res, s| unsafe { mlx_sys::mlx_softmax_axis(res, a.as_ptr(), axis, true, s) })
}

/// `[0, 1, ..., n - 1]` as int32.
pub fn arange(n: usize) -> Result<Array> {
    call("arange", |res, s| unsafe { mlx_sys::mlx_arange(res, 0.0, n as f64, 1.0, Dtype::Int32 as u32, s) })
}

/// `x` times MLX's affine-dequantized `w` (`transpose`: times its transpose), without expanding
/// `w`: MLX's quantized matmul reads the packed codes.
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    transpose: bool,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    call("quantized_matmul", |res, s| unsafe {
        mlx_sys::mlx_quantized_matmul(
            res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            transpose,
            optional(group_size),
            optional(bits),
            c"affine".as_ptr(),
            s,
        )
    })
}

/// `a`'s values at `indices` along `axis` (`indices` broadcast against `a` on the other axes).
pub fn take_along_axis(a: &Array, indices: &Array, axis: i32) -> Result<Array> {
    call("take_along_axis", |res, s| unsafe { mlx_sys::mlx_take_along_axis(res, a.as_ptr(), indices.as_ptr(), axis, s) })
}

/// Indices that partition `a` along `axis` around its `kth` smallest element (the first `kth + 1`
/// indices point at the smallest values, in no particular order).
pub fn argpartition(a: &Array, kth: i32, axis: i32) -> Result<Array> {
    call("argpartition", |res, s| unsafe { mlx_sys::mlx_argpartition_axis(res, a.as_ptr(), kth, axis, s) })
}

/// The largest value along `axis`, kept as an axis of extent 1.
pub fn max_keep(a: &Array, axis: i32) -> Result<Array> {
    call("max", |res, s| unsafe { mlx_sys::mlx_max_axis(res, a.as_ptr(), axis, true, s) })
}

pub fn sum(a: &Array, axis: i32) -> Result<Array> {
    call("sum", |res, s| unsafe { mlx_sys::mlx_sum_axis(res, a.as_ptr(), axis, false, s) })
}

pub fn negative(a: &Array) -> Result<Array> {
    call("negative", |res, s| unsafe { mlx_sys::mlx_negative(res, a.as_ptr(), s) })
}

/// MLX's fused attention, `softmax(scale * q . k^T + mask) . v`, with an additive `mask` (in
/// `q`'s dtype) broadcast to `[B, H, Lq, T]`; `k` and `v` may have one head for all of `q`'s.
pub fn sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Array) -> Result<Array> {
    call("scaled_dot_product_attention", |res, s| unsafe {
        let no_sinks = mlx_sys::mlx_array_new();
        mlx_sys::mlx_fast_scaled_dot_product_attention(
            res,
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            scale,
            c"".as_ptr(),
            mask.as_ptr(),
            no_sinks,
            false,
            s,
        )
    })
}

pub fn subtract(a: &Array, b: &Array) -> Result<Array> {
    binary("subtract", a, b, mlx_sys::mlx_subtract)
}

pub fn less_equal(a: &Array, b: &Array) -> Result<Array> {
    binary("less_equal", a, b, mlx_sys::mlx_less_equal)
}

pub fn logical_or(a: &Array, b: &Array) -> Result<Array> {
    binary("logical_or", a, b, mlx_sys::mlx_logical_or)
}

pub fn exp(a: &Array) -> Result<Array> {
    call("exp", |res, s| unsafe { mlx_sys::mlx_exp(res, a.as_ptr(), s) })
}

/// `log(sum(exp(a)))` along `axis`, kept as an axis of extent 1 (-inf where every value is).
pub fn logsumexp_keep(a: &Array, axis: i32) -> Result<Array> {
    call("logsumexp", |res, s| unsafe { mlx_sys::mlx_logsumexp_axis(res, a.as_ptr(), axis, true, s) })
}

/// `a`'s entries at `indices` along `axis` (the result takes the indices' shape there).
pub fn take(a: &Array, indices: &Array, axis: i32) -> Result<Array> {
    call("take", |res, s| unsafe { mlx_sys::mlx_take_axis(res, a.as_ptr(), indices.as_ptr(), axis, s) })
}

pub fn minimum(a: &Array, b: &Array) -> Result<Array> {
    binary("minimum", a, b, mlx_sys::mlx_minimum)
}
