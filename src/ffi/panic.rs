//! The panic boundary. Every export's body is one `ffi_boundary!` (the only pattern
//! `tests/abi/ffi_contract.rs` accepts), so a panic never unwinds into C, a failure becomes its
//! status plus this thread's message, and helpers below it just return `FfiResult`.
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::error::{set_last_error, FfiResult};
use super::status::latent_cache_status;
use crate::core::mlx::runtime;

fn panic_message(payload: &(dyn Any + Send)) -> String {
    let detail = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    format!("internal panic caught at the C boundary: {detail}")
}

/// Runs `body`; a panic returns `on_panic` (and records its message) instead of unwinding.
pub(crate) fn guard<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            set_last_error(&panic_message(payload.as_ref()));
            on_panic
        }
    }
}

/// Runs a fallible export body: `Ok` becomes `LATENT_CACHE_STATUS_OK`; a failure records its
/// message and returns its status; a panic returns `LATENT_CACHE_STATUS_PANIC`. Under an MLX
/// runtime this library does not admit (`core::mlx::runtime`, checked once), every such call is
/// `BACKEND` with the message naming both versions, and runs nothing.
pub fn run(body: impl FnOnce() -> FfiResult) -> latent_cache_status {
    guard(latent_cache_status::Panic, || match runtime::check_admitted().map_err(Into::into).and_then(|()| body()) {
        Ok(()) => latent_cache_status::Ok,
        Err(failure) => {
            set_last_error(&failure.message);
            failure.status
        }
    })
}

/// The body of every export. `ffi_boundary! { ... }` runs a body returning `FfiResult` and
/// returns a `latent_cache_status`; `ffi_boundary!(on_panic = VALUE; ...)` runs a body returning
/// the export's own type and returns `VALUE` (recording a message) if it panics.
macro_rules! ffi_boundary {
    (on_panic = $value:expr; $($body:tt)*) => {
        $crate::ffi::panic::guard($value, || { $($body)* })
    };
    ($($body:tt)*) => {
        $crate::ffi::panic::run(|| -> $crate::ffi::error::FfiResult { $($body)* })
    };
}
pub(crate) use ffi_boundary;
