//! Argument plumbing: every pointer (slices, strings, outputs) is checked here before anything
//! is read or changed, and outputs are written only through these helpers, after the call has
//! succeeded.
use std::ffi::{c_char, CStr};
use std::path::PathBuf;

use super::error::{Failure, FfiResult};
use super::status::latent_cache_status;

/// A borrowed input slice. `(NULL, 0)` is the empty slice; `NULL` with a length is an error.
pub(crate) unsafe fn in_slice<'a, T>(ptr: *const T, len: usize, name: &str) -> FfiResult<&'a [T]> {
    if ptr.is_null() {
        return match len {
            0 => Ok(&[]),
            _ => Err(Failure::null(name)),
        };
    }
    // SAFETY: the caller promises `len` readable elements at `ptr`.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// An optional input slice: `NULL` with length 0 is "absent".
pub(crate) unsafe fn optional_slice<'a, T>(ptr: *const T, len: usize, name: &str) -> FfiResult<Option<&'a [T]>> {
    match (ptr.is_null(), len) {
        (true, 0) => Ok(None),
        _ => unsafe { in_slice(ptr, len, name) }.map(Some),
    }
}

/// An optional borrowed string: NULL is "absent"; otherwise NUL-terminated UTF-8
/// (`INVALID_ARGUMENT` when not UTF-8).
pub(crate) unsafe fn optional_str<'a>(ptr: *const c_char, name: &str) -> FfiResult<Option<&'a str>> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: a non-NULL, NUL-terminated string from the caller.
    let s = unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| Failure::new(latent_cache_status::InvalidArgument, format!("{name} is not UTF-8")))?;
    Ok(Some(s))
}

/// The `path` argument of saves and loads: a NUL-terminated UTF-8 string, NULL refused.
pub(crate) unsafe fn path(ptr: *const c_char) -> FfiResult<PathBuf> {
    let s = unsafe { optional_str(ptr, "path") }?.ok_or_else(|| Failure::null("path"))?;
    Ok(PathBuf::from(s))
}

/// Checks an output pointer is not NULL; returns it for a later `write`.
pub(crate) fn out_ptr<T>(ptr: *mut T, name: &str) -> FfiResult<*mut T> {
    if ptr.is_null() {
        return Err(Failure::null(name));
    }
    Ok(ptr)
}

/// Checks a caller's output buffer: non-NULL unless `needed` is 0, and at least `needed` long.
fn out_buffer<T>(ptr: *mut T, len: usize, needed: usize, name: &str) -> FfiResult<()> {
    if ptr.is_null() && len > 0 {
        return Err(Failure::null(name));
    }
    if len < needed {
        return Err(Failure::new(
            latent_cache_status::BufferTooSmall,
            format!("{name} holds {len} elements; {needed} are needed"),
        ));
    }
    // NULL with len 0 and needed 0 is the empty buffer; NULL with needed > 0 failed above.
    Ok(())
}

/// The one copy-out of the C API (host reads, row queries, the signature): copies `values` into
/// the caller's buffer `(ptr, len)` when it holds them all, then stores their count in
/// `*written` (checked by `out_ptr`). Nothing is written on failure.
pub(crate) unsafe fn copy_out<T: Copy>(ptr: *mut T, len: usize, values: &[T], written: *mut usize, name: &str) -> FfiResult {
    out_buffer(ptr, len, values.len(), name)?;
    unsafe { write_buffer(ptr, values, written) };
    Ok(())
}

/// `copy_out` for a string: its bytes and a NUL terminator (which `out_len` counts); `*written`
/// receives the length without the terminator.
pub(crate) unsafe fn copy_out_str(out: *mut c_char, out_len: usize, s: &str, written: *mut usize) -> FfiResult {
    let mut bytes = s.as_bytes().to_vec();
    bytes.push(0);
    unsafe { copy_out(out.cast::<u8>(), out_len, &bytes, written, "out")? };
    // The count excludes the terminator.
    unsafe { *written -= 1 };
    Ok(())
}

/// Copies `values` into a buffer checked by `out_buffer` and stores the count in `written`.
unsafe fn write_buffer<T: Copy>(ptr: *mut T, values: &[T], written: *mut usize) {
    if !values.is_empty() {
        // SAFETY: out_buffer checked the pointer and that the buffer holds `values.len()`.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), ptr, values.len()) };
    }
    // SAFETY: checked by out_ptr.
    unsafe { *written = values.len() };
}

/// Stores one output value (checked by `out_ptr`).
pub(crate) unsafe fn write<T>(ptr: *mut T, value: T) {
    // SAFETY: checked by out_ptr; the caller owns the pointee.
    unsafe { ptr.write(value) };
}

/// Stores an output the caller may decline with NULL (written only when given).
pub(crate) unsafe fn write_optional<T>(ptr: *mut T, value: T) {
    if !ptr.is_null() {
        // SAFETY: a non-NULL output points at a writable value, as the caller's docs require.
        unsafe { ptr.write(value) };
    }
}
