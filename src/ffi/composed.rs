//! Composed storage's calls: prefill maintenance (for one cache and set-wide), each row's
//! precision boundary, and the config a cache was made with.
use super::args::{copy_out, in_slice, out_ptr, write};
use super::config::latent_cache_config;
use super::handle::{latent_cache, with_cache};
use super::panic::ffi_boundary;
use super::set::{latent_cache_set, with_layers};
use super::status::latent_cache_status;
use crate::core::cache::set::change_all;
use crate::core::LatentCache;

/// Opens prefill maintenance for a chunked prefill (the seed's `beginPrefill`). Here a
/// boundary move copies nothing and boundaries follow each row's length at every chunk, so a
/// chunked prefill holds the same state as one append and there is nothing to defer: the
/// calls keep the seed's protocol and its checks, on every layer alike (composed or not).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_STATE` (maintenance already open). On failure nothing
/// changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_prefill_begin(cache: *mut latent_cache) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.prefill_begin()?)) }
}

/// Marks `rows[0..len]` (borrowed for the call) as at their requests' prompt ends (the seed's
/// `commitPrefill`). Each row's boundary already stands where its length puts it, and a
/// sibling's later chunks do not move it.
/// Returns `OK`, `NULL_ARGUMENT`, `OUT_OF_RANGE` (a row the cache does not hold),
/// `INVALID_STATE` (no `latent_cache_prefill_begin` before). On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_prefill_commit(
    cache: *mut latent_cache,
    rows: *const usize,
    len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let rows = unsafe { in_slice(rows, len, "rows") }?;
        with_cache(cache, |cache| Ok(cache.prefill_commit(rows)?))
    }
}

/// Closes prefill maintenance (the seed's `endPrefill`). A prompt prefilled in one append or in
/// chunks of any sizes (with siblings' forwards split between them) holds bit-identical state.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_STATE` (no `latent_cache_prefill_begin` before).
/// On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_prefill_end(cache: *mut latent_cache) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.prefill_end()?)) }
}

/// Set-wide `latent_cache_prefill_begin`: every layer or none.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_prefill_begin(set: *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, LatentCache::prepare_prefill_begin)?)) }
}

/// Set-wide `latent_cache_prefill_commit`: every layer or none.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_prefill_commit(
    set: *mut latent_cache_set,
    rows: *const usize,
    len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let rows = unsafe { in_slice(rows, len, "rows") }?;
        with_layers(set, |layers| Ok(change_all(layers, |l| l.prepare_prefill_commit(rows))?))
    }
}

/// Set-wide `latent_cache_prefill_end`: every layer or none.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_prefill_end(set: *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, LatentCache::prepare_prefill_end)?)) }
}

/// Copies each row's precision boundary into `out` (`out_len` entries of room) and the row
/// count into `*written`: how many of the row's valid positions, counted from its first, are
/// read in the compact mode (the rest are hot). Nothing for a cache that is not composed
/// (`*written` = 0).
/// Returns `OK`, `NULL_ARGUMENT` (cache or written NULL, or out NULL with out_len > 0),
/// `BUFFER_TOO_SMALL`; nothing is written on failure.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_converted_positions(
    cache: *const latent_cache,
    out: *mut usize,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let written = out_ptr(written, "written")?;
        with_cache(cache, |cache| unsafe { copy_out(out, out_len, &cache.converted_positions(), written, "out") })
    }
}

/// `*out` = the config the cache was made with (or loaded as): its geometry, storage modes,
/// layout, role and composition (`hot_window`, `hot_storage`).
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_get_config(
    cache: *const latent_cache,
    out: *mut latent_cache_config,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        with_cache(cache, |cache| {
            unsafe { write(out, latent_cache_config::of(cache.geometry())) };
            Ok(())
        })
    }
}
