//! An evaluated MLX array's bytes in row-major order, read where they lie: the array is walked as
//! runs of contiguous memory (a slice of a stored buffer is contiguous per row), so saving hashes
//! and writes a cache's state without laying it out again.
use mlx_rs::Array;

use crate::core::error::{fail, Result};

/// Calls `f` with the array's bytes, in row-major order, as contiguous runs. The array must be
/// evaluated, and its innermost axis contiguous (see `inner_contiguous`).
pub fn for_each_run(a: &Array, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
    // SAFETY: the array is evaluated (the caller's contract); shape and strides have `ndim`
    // entries; every run read below lies inside the array's data, by its shape and strides.
    unsafe {
        let raw = a.as_ptr();
        let size = mlx_sys::mlx_array_size(raw);
        if size == 0 {
            return Ok(());
        }
        let item = mlx_sys::mlx_array_itemsize(raw);
        let data = mlx_sys::mlx_array_data_uint8(raw);
        if data.is_null() {
            return fail!(Backend, "reading a tensor: no data");
        }
        let ndim = mlx_sys::mlx_array_ndim(raw);
        if ndim == 0 {
            return f(std::slice::from_raw_parts(data, item));
        }
        let shape: Vec<usize> =
            std::slice::from_raw_parts(mlx_sys::mlx_array_shape(raw), ndim).iter().map(|&d| d as usize).collect();
        let strides = std::slice::from_raw_parts(mlx_sys::mlx_array_strides(raw), ndim).to_vec();
        // The innermost axes that are laid out row-major form one run.
        let (mut inner, mut run) = (ndim, 1usize);
        while inner > 0 && strides[inner - 1] == run {
            inner -= 1;
            run *= shape[inner];
        }
        if inner == ndim {
            return fail!(Backend, "reading a tensor: its innermost axis is not contiguous");
        }
        let mut index = vec![0usize; inner];
        loop {
            let offset: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
            f(std::slice::from_raw_parts(data.add(offset * item), run * item))?;
            // The next outer index, row-major; done when it wraps.
            let mut axis = inner;
            loop {
                if axis == 0 {
                    return Ok(());
                }
                axis -= 1;
                index[axis] += 1;
                if index[axis] < shape[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
    }
}

/// Whether an evaluated array's innermost axis is contiguous (what `for_each_run` needs).
pub fn inner_contiguous(a: &Array) -> bool {
    // SAFETY: strides have `ndim` entries.
    unsafe {
        let raw = a.as_ptr();
        let ndim = mlx_sys::mlx_array_ndim(raw);
        ndim == 0 || *mlx_sys::mlx_array_strides(raw).add(ndim - 1) == 1
    }
}
