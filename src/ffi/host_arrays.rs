//! `latent_cache_dtype` and MLX arrays for engines without mlx-c: an array's shape and element
//! type, arrays made from host data of the types engines pass (float32, bfloat16, float16,
//! int32), and arrays copied back to the host in those types.
use mlx_rs::Dtype;
use mlx_sys::mlx_array;

use super::args::{copy_out, in_slice, out_ptr, write};
use super::error::{Failure, FfiResult};
use super::mlx_array::{borrow, give};
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::mlx::host::{self, HostDtype};

/// An MLX array's element type (`latent_cache_array_dtype`, and the `dtype` argument of the
/// typed host calls, passed as `uint32_t`). The host calls take `FLOAT32`, `BFLOAT16`, `FLOAT16`
/// and `INT32`; 16-bit floats travel as their bit patterns in `uint16_t` (bfloat16: the upper
/// half of the float32; float16: IEEE binary16).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum latent_cache_dtype {
    Float32 = 0,
    Bfloat16 = 1,
    Float16 = 2,
    Int32 = 3,
    Uint32 = 4,
    Int64 = 5,
    Uint8 = 6,
    Bool = 7,
    Int8 = 8,
    Int16 = 9,
    Uint16 = 10,
    Uint64 = 11,
    Float64 = 12,
    Complex64 = 13,
}

impl latent_cache_dtype {
    fn of(dtype: Dtype) -> Self {
        use latent_cache_dtype as D;
        match dtype {
            Dtype::Float32 => D::Float32,
            Dtype::Bfloat16 => D::Bfloat16,
            Dtype::Float16 => D::Float16,
            Dtype::Int32 => D::Int32,
            Dtype::Uint32 => D::Uint32,
            Dtype::Int64 => D::Int64,
            Dtype::Uint8 => D::Uint8,
            Dtype::Bool => D::Bool,
            Dtype::Int8 => D::Int8,
            Dtype::Int16 => D::Int16,
            Dtype::Uint16 => D::Uint16,
            Dtype::Uint64 => D::Uint64,
            Dtype::Float64 => D::Float64,
            Dtype::Complex64 => D::Complex64,
        }
    }
}

/// The host types of the typed calls; any other value is `DTYPE`.
fn host_dtype(value: u32) -> FfiResult<HostDtype> {
    match value {
        0 => Ok(HostDtype::Float32),
        1 => Ok(HostDtype::Bfloat16),
        2 => Ok(HostDtype::Float16),
        3 => Ok(HostDtype::Int32),
        _ => Err(Failure::new(
            latent_cache_status::Dtype,
            format!("dtype {value}: host data is FLOAT32 (0), BFLOAT16 (1), FLOAT16 (2) or INT32 (3)"),
        )),
    }
}

/// Makes an array of `dtype` (a `latent_cache_dtype`: `FLOAT32`, `BFLOAT16`, `FLOAT16` or
/// `INT32`) and shape `shape` (`ndim` extents, 1 to 8, each at most INT32_MAX) holding a copy of
/// `data`: `data_len` elements of that type (`float`, `uint16_t` bit patterns, or `int32_t`),
/// which must equal the shape's product. `*out` receives it, owned by the caller. bfloat16
/// queries reach the 16-bit attention paths; int32 arrays serve as indices.
/// Returns `OK`, `NULL_ARGUMENT`, `DTYPE` (another type), `SHAPE`, `CAPACITY` (the copy would
/// take MLX past its memory limit).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_from_host_typed(
    data: *const core::ffi::c_void,
    data_len: usize,
    dtype: u32,
    shape: *const usize,
    ndim: usize,
    out: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! {
        let dtype = host_dtype(dtype)?;
        let bytes = data_len
            .checked_mul(dtype.size())
            .ok_or_else(|| Failure::new(latent_cache_status::Shape, format!("data_len {data_len} is beyond this process")))?;
        let data = unsafe { in_slice(data.cast::<u8>(), bytes, "data") }?;
        let shape = unsafe { in_slice(shape, ndim, "shape") }?;
        let out = out_ptr(out, "out")?;
        if shape.is_empty() || shape.len() > 8 {
            return Err(Failure::new(latent_cache_status::Shape, format!("ndim is {}; 1 to 8 extents are taken", shape.len())));
        }
        let array = host::from_host_bytes(data, dtype, shape, "data")?;
        unsafe { write(out, give(array)) };
        Ok(())
    }
}

/// Evaluates `array` (borrowed; under the evaluation lock), converts it to `dtype` (as MLX's
/// `astype`: `FLOAT32`, `BFLOAT16`, `FLOAT16` or `INT32`) and copies its elements to `out`,
/// row-major; `out_len` counts elements of that type and must hold them all; `*written`
/// receives the element count. Nothing is written on failure.
/// Returns `OK`, `NULL_ARGUMENT`, `DTYPE`, `BUFFER_TOO_SMALL`, `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_to_host_typed(
    array: mlx_array,
    dtype: u32,
    out: *mut core::ffi::c_void,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let dtype = host_dtype(dtype)?;
        let written = out_ptr(written, "written")?;
        let array = borrow(array, "array")?;
        let bytes = host::to_host_bytes(&array, dtype)?;
        let elements = bytes.len() / dtype.size();
        let room = out_len.saturating_mul(dtype.size());
        let mut count = 0usize;
        copy_out(out.cast::<u8>(), room, &bytes, &mut count, "out").map_err(|failure| match failure.status {
            latent_cache_status::BufferTooSmall => Failure::new(
                latent_cache_status::BufferTooSmall,
                format!("out holds {out_len} elements; {elements} are needed"),
            ),
            _ => failure,
        })?;
        write(written, elements);
        Ok(())
    } }
}

/// `*out` = `array`'s element type, a `latent_cache_dtype` (no evaluation).
/// Returns `OK`, `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_dtype(array: mlx_array, out: *mut u32) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let out = out_ptr(out, "out")?;
        let array = borrow(array, "array")?;
        write(out, latent_cache_dtype::of(array.dtype()) as u32);
        Ok(())
    } }
}

/// `*out` = `array`'s rank, the number of its extents (0 for a scalar; no evaluation).
/// Returns `OK`, `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_ndim(array: mlx_array, out: *mut usize) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let out = out_ptr(out, "out")?;
        let array = borrow(array, "array")?;
        write(out, array.ndim());
        Ok(())
    } }
}

/// Copies `array`'s extents to `out` (`out_len` entries, at least its rank,
/// `latent_cache_array_ndim`) and stores their count in `*ndim` (no evaluation).
/// Returns `OK`, `NULL_ARGUMENT`, `BUFFER_TOO_SMALL` (nothing written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_shape(
    array: mlx_array,
    out: *mut usize,
    out_len: usize,
    ndim: *mut usize,
) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let ndim = out_ptr(ndim, "ndim")?;
        let array = borrow(array, "array")?;
        copy_out(out, out_len, &host::shape(&array), ndim, "out")
    } }
}
