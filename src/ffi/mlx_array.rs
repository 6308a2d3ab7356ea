//! MLX arrays across the C boundary: borrowing a caller's `mlx_array` for a call, giving an
//! array to the caller, and freeing one the caller hands back. Every export that takes or
//! returns an `mlx_array` goes through these.
use std::mem::ManuallyDrop;

use mlx_rs::Array;
use mlx_sys::mlx_array;

use super::error::{Failure, FfiResult};

/// The absent array (`ctx == NULL`).
pub(crate) fn empty() -> mlx_array {
    mlx_array { ctx: std::ptr::null_mut() }
}

/// Borrows a caller's array for the call without taking ownership; `ctx == NULL` is refused
/// (`NULL_ARGUMENT`, naming `name`).
pub(crate) unsafe fn borrow(array: mlx_array, name: &str) -> FfiResult<ManuallyDrop<Array>> {
    if array.ctx.is_null() {
        return Err(Failure::null(name));
    }
    // SAFETY: a non-NULL mlx_array from the caller; ManuallyDrop keeps it the caller's.
    Ok(ManuallyDrop::new(unsafe { Array::from_ptr(array) }))
}

/// Borrows an optional array: `ctx == NULL` is "absent" (index keys on a layer without DSA, no
/// mask).
pub(crate) unsafe fn borrow_optional(array: mlx_array, name: &str) -> FfiResult<Option<ManuallyDrop<Array>>> {
    match array.ctx.is_null() {
        true => Ok(None),
        false => unsafe { borrow(array, name) }.map(Some),
    }
}

/// Hands an array to the caller, who frees it.
pub(crate) fn give(array: Array) -> mlx_array {
    let handle = array.as_ptr();
    std::mem::forget(array);
    handle
}

/// Hands an optional array to the caller: `None` becomes the absent array.
pub(crate) fn give_optional(array: Option<Array>) -> mlx_array {
    array.map_or_else(empty, give)
}

/// Frees an array the caller hands back (its owner); the absent array is ignored.
pub(crate) unsafe fn free(array: mlx_array) {
    if !array.ctx.is_null() {
        // SAFETY: the caller hands over an array it owns.
        drop(unsafe { Array::from_ptr(array) });
    }
}
