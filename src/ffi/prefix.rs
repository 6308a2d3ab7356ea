//! `latent_cache_prefix`: positions stored once and shared below the rows of other caches
//! without copies (a prompt's positions under n continuations, a stored conversation under a new
//! request), and the calls that store, attach and fork them, for one cache or a whole set. A
//! prefix handle holds one prefix per layer (one for a cache's, every layer's for a set's).
use std::sync::Arc;

use super::args::{out_ptr, write, write_optional};
use super::error::{set_last_error, Failure, FfiResult};
use super::handle::{latent_cache, with_cache};
use super::panic::ffi_boundary;
use super::registry::Registry;
use super::set::{latent_cache_set, with_layers};
use super::status::latent_cache_status;
use crate::core::cache::set::{attach_all, change_all, share_all};
use crate::core::storage::shared::SharedPrefix;

/// Shared positions of one cache or of every layer of a set (`latent_cache_share_prefix`,
/// `latent_cache_set_share_prefix`). Opaque; a token released with `latent_cache_prefix_free`.
/// Caches attached to it keep what they read alive after it is freed.
pub struct latent_cache_prefix {
    _opaque: [u8; 0],
}

/// Live prefixes by token, one `SharedPrefix` per layer.
static PREFIXES: Registry<Vec<SharedPrefix>> = Registry::new("latent_cache_prefix");

fn with_prefix<T>(ptr: *const latent_cache_prefix, f: impl FnOnce(&[SharedPrefix]) -> FfiResult<T>) -> FfiResult<T> {
    let prefix = PREFIXES.get(ptr, "prefix")?;
    f(&prefix)
}

/// `*out` receives row `row`'s first `positions` positions of `cache` as a prefix, owned by the
/// caller (`latent_cache_prefix_free`). Positions of the cache's own shared prefix are shared as
/// they are; the positions above it are copied once, into the prefix (the cache keeps writing
/// its own buffers in place). Evaluated during the call; the cache is not changed.
/// Returns `OK`, `NULL_ARGUMENT`, `OUT_OF_RANGE` (row >= batch size; positions 0 or more than
/// the row holds), `INVALID_ARGUMENT` (composed storage), `INVALID_STATE` (a round, prefill or
/// maintenance open), `CAPACITY`, `BACKEND`. Where the row holds a known segment chain within
/// those positions, the prefix carries it to the rows attached over it.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_share_prefix(
    cache: *const latent_cache,
    row: usize,
    positions: usize,
    out: *mut *mut latent_cache_prefix,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let prefix = with_cache(cache, |cache| Ok(cache.share_prefix(row, positions)?))?;
        unsafe { write(out, PREFIXES.insert(Arc::new(vec![prefix]))) };
        Ok(())
    }
}

/// Set-wide `latent_cache_share_prefix`: one prefix per layer, in one handle (for
/// `latent_cache_set_attach_prefix`). Returns what it returns, and `INVALID_STATE` when the layers
/// disagree about their rows.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_share_prefix(
    set: *const latent_cache_set,
    row: usize,
    positions: usize,
    out: *mut *mut latent_cache_prefix,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let prefixes = with_layers(set, |layers| Ok(share_all(layers, row, positions)?))?;
        unsafe { write(out, PREFIXES.insert(Arc::new(prefixes))) };
        Ok(())
    }
}

/// Releases a prefix handle (what caches attached to it read stays alive with them). `NULL` is
/// accepted; a prefix that is not live is ignored with a message.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_prefix_free(prefix: *mut latent_cache_prefix) {
    ffi_boundary!(on_panic = ();
        if !prefix.is_null() && PREFIXES.remove(prefix).is_none() {
            set_last_error("latent_cache_prefix_free: not a live latent_cache_prefix (double free?)");
        }
    )
}

/// `*layers`: the layers the prefix holds (1 for a cache's); `*positions`: its positions;
/// `*bytes`: the bytes its arrays hold over every layer, once however many caches share them
/// (where a fork kept a row's buffer, that buffer's). Each output may be NULL.
/// Returns `OK`, `NULL_ARGUMENT` (prefix NULL or not live).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_prefix_info(
    prefix: *const latent_cache_prefix,
    layers: *mut usize,
    positions: *mut usize,
    bytes: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let (n, p, b) = with_prefix(prefix, |all| {
            Ok((all.len(), all[0].positions(), all.iter().map(SharedPrefix::held_bytes).sum::<usize>()))
        })?;
        for (out, value) in [(layers, n), (positions, p), (bytes, b)] {
            unsafe { write_optional(out, value) };
        }
        Ok(())
    }
}

/// Makes the empty `cache` `rows` rows over the prefix (a cache's, of the same geometry), holding
/// no positions of their own yet; nothing is copied. Appends then go to each row's own buffers;
/// every read, attention and save sees each row as the prefix followed by its own positions.
/// The rows inherit the segment chain the prefix carries (`latent_cache_set_row_segment_chain`).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (rows 0 or over INT32_MAX, another
/// geometry, a set's prefix, composed storage), `INVALID_STATE` (the cache holds rows, or a
/// round, a prefill or prefill maintenance is open), `CAPACITY` (no room left under
/// `max_tokens`, or more rows than MLX's memory limit or the machine's memory holds a position
/// of each). On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_attach_prefix(
    cache: *mut latent_cache,
    prefix: *const latent_cache_prefix,
    rows: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let prefix = with_prefix(prefix, |all| match all {
            [one] => Ok(one.clone()),
            _ => Err(Failure::new(latent_cache_status::InvalidArgument, format!("a set's prefix ({} layers) attaches to a set", all.len()))),
        })?;
        with_cache(cache, |cache| Ok(cache.attach_prefix(&prefix, rows)?))
    }
}

/// Set-wide `latent_cache_attach_prefix`: layer `i` over the prefix's layer `i`; every layer or
/// none. Returns what it returns, and `INVALID_ARGUMENT` when the layer counts differ.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_attach_prefix(
    set: *mut latent_cache_set,
    prefix: *const latent_cache_prefix,
    rows: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let prefixes = with_prefix(prefix, |all| Ok(all.to_vec()))?;
        with_layers(set, |layers| Ok(attach_all(layers, &prefixes, rows)?))
    }
}

/// Row `row` becomes a shared prefix below `n` new rows, which replace every row of the cache
/// (n continuations of one prompt, the branches of a draft tree; a row over a prefix forks into
/// a longer one). The row's positions are not copied where its buffer holds little else (one
/// row, spare capacity under an eighth of it: reserve the prompt's length, or append it at
/// once), else copied once; the new rows then hold nothing of their own. Trims and rollbacks stop
/// at the prefix.
/// Every new row holds the forked row's segment chain (`latent_cache_set_row_segment_chain`),
/// so each continuation's next segment links to the parent's segments instead of repeating them.
/// Returns `OK`, `NULL_ARGUMENT`, `OUT_OF_RANGE` (row >= batch size, or a row of no positions),
/// `INVALID_ARGUMENT` (n 0 or over INT32_MAX, composed storage), `INVALID_STATE` (a round,
/// prefill or maintenance open), `CAPACITY` (no room left under `max_tokens`, or more rows than
/// MLX's memory limit or the machine's memory holds a position of each), `BACKEND`. On failure
/// nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_fork_row(cache: *mut latent_cache, row: usize, n: usize) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.fork_row(row, n)?)) }
}

/// Set-wide `latent_cache_fork_row`: every layer or none.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_fork_row(set: *mut latent_cache_set, row: usize, n: usize) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, |l| l.prepare_fork(row, n))?)) }
}

/// `*out` = the positions of the shared prefix below every row of `cache` (0 without one).
/// Returns `OK`, `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_shared_positions(cache: *const latent_cache, out: *mut usize) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let n = with_cache(cache, |cache| Ok(cache.shared_positions()))?;
        unsafe { write(out, n) };
        Ok(())
    }
}
