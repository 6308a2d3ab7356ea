//! The per-thread last failure message, and the failure type the export bodies return.
use std::cell::RefCell;
use std::ffi::c_char;

use super::panic::guard;
use super::status::latent_cache_status;
use crate::core::CacheError;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// A failed call: the status to return and the message to keep for this thread.
#[derive(Debug)]
pub struct Failure {
    pub status: latent_cache_status,
    pub message: String,
}

impl Failure {
    pub fn new(status: latent_cache_status, message: impl Into<String>) -> Self {
        Failure { status, message: message.into() }
    }

    pub fn null(name: &str) -> Self {
        Failure::new(latent_cache_status::NullArgument, format!("{name} is NULL"))
    }
}

impl From<CacheError> for Failure {
    fn from(err: CacheError) -> Self {
        Failure { status: err.kind.into(), message: err.message }
    }
}

pub type FfiResult<T = ()> = Result<T, Failure>;

pub(crate) fn set_last_error(message: &str) {
    LAST_ERROR.with(|last| {
        let mut last = last.borrow_mut();
        last.clear();
        last.push_str(message);
    });
}

/// Copies this thread's last failure message into `out` (at most `out_len - 1` bytes plus a NUL
/// terminator; truncated when longer) and returns the message's full length in bytes, not
/// counting the terminator. Pass `out = NULL, out_len = 0` to learn the length. Returns 0 and
/// writes an empty string when no call on this thread has failed.
///
/// The message belongs to the calling thread: a failure on another thread never shows here.
/// A later failure on this thread replaces it; successful calls leave it as it was.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_last_error(out: *mut c_char, out_len: usize) -> usize {
    guard(0, || {
        LAST_ERROR.with(|last| {
            let last = last.borrow();
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
    })
}
