//! The panic boundary: every export runs its body through `guard` or `run`, so a panic never
//! unwinds into C. `run` also turns a failure into its status and records the message.
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::error::{set_last_error, FfiResult};
use super::status::latent_cache_status;

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
/// message and returns its status; a panic returns `LATENT_CACHE_STATUS_PANIC`.
pub fn run(body: impl FnOnce() -> FfiResult) -> latent_cache_status {
    guard(latent_cache_status::Panic, || match body() {
        Ok(()) => latent_cache_status::Ok,
        Err(failure) => {
            set_last_error(&failure.message);
            failure.status
        }
    })
}
