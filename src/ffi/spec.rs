//! Speculative verify rounds on one cache: begin, commit, and rollback with one keep count or
//! one per row (their set-wide forms are in `set`).
use super::args::in_slice;
use super::handle::{latent_cache, with_cache};
use super::panic::ffi_boundary;
use super::status::latent_cache_status;

/// Opens a round: records every row's position count. Appends, reads and queries inside the
/// round behave as outside it; `latent_cache_trim` needs `bypass`.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_STATE` (a round is already open).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_spec_round_begin(cache: *mut latent_cache) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.spec_round_begin()?)) }
}

/// Closes the round, keeping everything appended in it.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_STATE` (no round is open).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_spec_round_commit(cache: *mut latent_cache) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.spec_round_commit()?)) }
}

/// Closes the round; every row keeps the first `keep` positions it appended in the round and
/// drops the rest (a trim: moves the offset, copies nothing).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_STATE` (no round is open), `OUT_OF_RANGE` (some
/// row appended fewer than `keep`). On failure nothing changed and the round stays open.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_spec_round_rollback(cache: *mut latent_cache, keep: usize) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.spec_round_rollback_all(keep)?)) }
}

/// Closes the round; row b keeps the first `keep[b]` positions it appended in the round
/// (`keep` is borrowed, `keep_len` must equal the batch size). Equal drops are a trim; unequal
/// drops shift rows so they stay right-justified (kept values are exact; this copies the
/// shifted rows once).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (keep_len != batch size),
/// `INVALID_STATE` (no round), `OUT_OF_RANGE` (a keep[b] beyond what row b appended),
/// `BACKEND`. On failure nothing changed and the round stays open.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_spec_round_rollback_rows(
    cache: *mut latent_cache,
    keep: *const usize,
    keep_len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let keep = unsafe { in_slice(keep, keep_len, "keep") }?;
        with_cache(cache, |cache| Ok(cache.spec_round_rollback(keep)?))
    }
}
