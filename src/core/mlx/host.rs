//! Host data of several element types in and out of MLX arrays, for engines without mlx-c of
//! their own: bfloat16 queries (so the 16-bit attention paths are reachable), int32 indices,
//! and the shape and dtype of any array. The float32-only paths stay in `ops`.
use mlx_rs::{Array, Dtype};

use crate::core::error::{fail, Result};
use crate::core::mlx::memory::check_alloc;
use crate::core::mlx::ops::{self, call};

/// The element types host data may have. 16-bit floats travel as their bit patterns (`u16`):
/// C has no portable bfloat16 type, and a bit copy is exact both ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostDtype {
    Float32,
    Bfloat16,
    Float16,
    Int32,
}

impl HostDtype {
    pub fn dtype(self) -> Dtype {
        match self {
            HostDtype::Float32 => Dtype::Float32,
            HostDtype::Bfloat16 => Dtype::Bfloat16,
            HostDtype::Float16 => Dtype::Float16,
            HostDtype::Int32 => Dtype::Int32,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            HostDtype::Bfloat16 | HostDtype::Float16 => 2,
            HostDtype::Float32 | HostDtype::Int32 => 4,
        }
    }
}

/// An array of `dtype` and `shape` holding a copy of `bytes` (row-major elements of `dtype`).
/// The byte count must be the shape's product times the element size, every extent must fit
/// MLX's int32 shapes, and the copy is checked against MLX's memory limit before it is made.
pub fn from_host_bytes(bytes: &[u8], dtype: HostDtype, shape: &[usize], name: &str) -> Result<Array> {
    let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let expected = elements.and_then(|n| n.checked_mul(dtype.size()));
    if expected != Some(bytes.len()) || shape.iter().any(|&d| d > i32::MAX as usize) {
        return fail!(
            Shape,
            "{name} has {} elements of {dtype:?}; shape {shape:?} needs their product (each extent at most INT32_MAX)",
            bytes.len() / dtype.size()
        );
    }
    check_alloc(Some(bytes.len()), name)?;
    let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    // SAFETY: `bytes` holds exactly the elements the shape and dtype describe (checked above);
    // mlx_array_new_data copies them.
    let raw =
        unsafe { mlx_sys::mlx_array_new_data(bytes.as_ptr().cast(), dims.as_ptr(), dims.len() as i32, dtype.dtype() as u32) };
    if raw.ctx.is_null() {
        return fail!(Backend, "MLX could not make {name}");
    }
    // SAFETY: a fresh array handle, owned from here on.
    Ok(unsafe { Array::from_ptr(raw) })
}

/// Evaluates `a` (under the library's lock), converts it to `dtype` the way MLX's `astype`
/// does, and copies its elements out as bytes, row-major.
pub fn to_host_bytes(a: &Array, dtype: HostDtype) -> Result<Vec<u8>> {
    let converted = ops::contiguous(&ops::astype(a, dtype.dtype())?)?;
    match dtype {
        HostDtype::Float32 => Ok(bytes_of(ops::to_host(&converted)?)),
        // SAFETY (both arms): the array has the accessor's element type (int32, or the 16-bit
        // bits of a float16/bfloat16 array through `view`).
        HostDtype::Int32 => Ok(bytes_of(unsafe { ops::copy_out(&converted, |x| mlx_sys::mlx_array_data_int32(x)) }?)),
        HostDtype::Bfloat16 | HostDtype::Float16 => {
            let bits = call("view", |res, s| unsafe { mlx_sys::mlx_view(res, converted.as_ptr(), Dtype::Uint16 as u32, s) })?;
            Ok(bytes_of(unsafe { ops::copy_out(&bits, |x| mlx_sys::mlx_array_data_uint16(x)) }?))
        }
    }
}

/// The native-endian bytes of plain numbers.
fn bytes_of<T: Copy>(values: Vec<T>) -> Vec<u8> {
    let len = std::mem::size_of_val(values.as_slice());
    // SAFETY: plain numbers (f32, i32, u16) have no padding; the bytes are copied out.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), len) }.to_vec()
}

/// An array's extents (no evaluation: the shape is known when the graph is built).
pub fn shape(a: &Array) -> Vec<usize> {
    a.shape().iter().map(|&d| d as usize).collect()
}
