//! `latent_cache_last_error`: how C reads the message of this thread's last failed call.
use std::ffi::c_char;

use super::error::with_last_error;
use super::panic::ffi_boundary;

/// Copies this thread's last failure message into `out` (at most `out_len - 1` bytes plus a NUL
/// terminator; truncated when longer) and returns the message's full length in bytes, not
/// counting the terminator. Pass `out = NULL, out_len = 0` to learn the length. Returns 0 and
/// writes an empty string when no call on this thread has failed.
///
/// The message belongs to the calling thread: a failure on another thread never shows here.
/// A later failure on this thread replaces it; successful calls leave it as it was.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_last_error(out: *mut c_char, out_len: usize) -> usize {
    ffi_boundary!(on_panic = 0;
        with_last_error(|last| {
            if !out.is_null() && out_len > 0 {
                let n = last.len().min(out_len - 1);
                // SAFETY: the caller provides `out_len` writable bytes at `out`.
                unsafe {
                    std::ptr::copy_nonoverlapping(last.as_ptr(), out.cast::<u8>(), n);
                    *out.add(n) = 0;
                }
            }
            last.len()
        })
    )
}
