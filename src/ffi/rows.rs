//! Batch row operations for continuous batching: merge sources into a cache (filling it, or
//! joining its rows), extract one row as its own cache, filter rows, reserve rows.
use super::args::{in_slice, out_ptr, write};
use super::error::Failure;
use super::handle::{latent_cache, with_cache, Handle};
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::LatentCache;

/// Appends every row of every source after the rows of `destination`, in order: a batch source
/// gives all its rows, an empty source that never had rows gives one empty row. Rows are
/// right-justified to the longest (the ragged layout: each starts at position 0), as if every
/// row were rebuilt. Sources are borrowed and not changed; a source may appear more than once
/// but may not be the destination. All must have the destination's geometry.
///
/// - An empty destination is filled: every row is copied into new buffers.
/// - A destination holding rows (a request joining a running batch) keeps its rows where they
///   are and writes the joining rows into free slots, wherever they lie: the slots of rows that
///   left (`latent_cache_filter_rows`) or that `latent_cache_reserve_rows` made, the one after
///   the last row first. The cost is the joining rows' positions, whatever order requests came
///   and went in (a first-in-first-out batch wraps around its slots). Where the rows would then
///   lie in more than four runs of consecutive slots, they are gathered into one run first,
///   copying the rows that change slots (the fewest positions). The batch is rebuilt once
///   (every row copied) without enough free slots; where the rows already there would have to shift unevenly (the ragged layout after
///   a padded prefill); in the right-justified layout, for a joining row longer than the rows
///   there, unless rows left padding behind (the window's first position then moves back
///   instead). The ragged layout never shifts the rows there. With composed storage the hot
///   side (each row's newest positions, about a window) is rebuilt for every row.
///
/// Returns `OK`; `NULL_ARGUMENT` (a NULL or dead handle, `sources` NULL); `INVALID_ARGUMENT`
/// (zero sources, a geometry mismatch, the destination among the sources, another shared
/// prefix); `INVALID_STATE` (the destination is in a round, a padded prefill or prefill
/// maintenance); `CAPACITY`; `BACKEND`. On failure nothing changed.
///
/// Locks every handle involved (in a fixed order, so concurrent merges cannot deadlock).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_merge_rows(
    destination: *mut latent_cache,
    sources: *const *const latent_cache,
    sources_len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let mut handles = vec![(destination as usize, Handle::get(destination, "destination")?)];
        let sources = unsafe { in_slice(sources, sources_len, "sources") }?;
        if sources.is_empty() {
            return Err(Failure::new(latent_cache_status::InvalidArgument, "merge needs at least one source"));
        }
        for (i, &source) in sources.iter().enumerate() {
            if source == destination.cast_const() {
                return Err(Failure::new(latent_cache_status::InvalidArgument, format!("sources[{i}] is the destination")));
            }
            handles.push((source as usize, Handle::get(source, &format!("sources[{i}]"))?));
        }
        // Each distinct handle is locked once, in token order, so concurrent merges cannot
        // deadlock.
        handles.sort_by_key(|&(token, _)| token);
        handles.dedup_by_key(|&mut (token, _)| token);
        let mut guards = Vec::with_capacity(handles.len());
        for (token, handle) in &handles {
            guards.push((*token, handle.lock()?));
        }
        let at = guards.iter().position(|&(token, _)| token == destination as usize).expect("locked");
        let (_, mut destination_cache) = guards.remove(at);
        let source_caches: Vec<&LatentCache> =
            sources.iter().map(|&s| &*guards.iter().find(|&&(token, _)| token == s as usize).expect("locked").1).collect();
        Ok(destination_cache.merge_rows(&source_caches)?)
    }
}

/// Creates a new, independent single-row cache holding exactly row `row`'s valid positions (no
/// padding). `*out` receives it, owned by the caller (free with `latent_cache_free`); written
/// only on success. The source is not changed.
///
/// Returns `OK`, `NULL_ARGUMENT`, `OUT_OF_RANGE` (row >= batch size), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_extract_row(
    cache: *const latent_cache,
    row: usize,
    out: *mut *mut latent_cache,
) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let out = out_ptr(out, "out")?;
        let extracted = with_cache(cache, |cache| Ok(cache.extract_row(row)?))?;
        write(out, Handle::register(extracted));
        Ok(())
    } }
}

/// Keeps the rows listed in `keep` (borrowed, `keep_len` entries), in that order, and drops the
/// left padding no kept row needs.
///
/// A request leaving keeps its slot for the next row to join (`latent_cache_merge_rows`), so
/// the buffers' bytes (what `latent_cache_set_bytes_in_use` counts) do not shrink. Every kept
/// row stays in its slot, whichever rows leave and in whatever order the rest are kept, so a
/// leave copies nothing (dropping the padding the longest row needed included); the rows may
/// then lie in several runs of consecutive slots, each read in place by attention. Where they
/// would lie in more than four runs, they are gathered into one, copying the rows that change
/// slots (the fewest positions: about once every few leaves from the middle). Rows whose
/// padding differs otherwise (the ragged layout after a padded prefill) are rebuilt (every kept
/// row copied).
/// With composed storage the hot side (about a window per row) is rebuilt for every kept row.
///
/// Returns `OK`; `NULL_ARGUMENT`; `INVALID_ARGUMENT` (empty list, a row listed twice);
/// `OUT_OF_RANGE` (a row >= batch size); `INVALID_STATE` (inside a round); `CAPACITY`;
/// `BACKEND`. On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_filter_rows(
    cache: *mut latent_cache,
    keep: *const usize,
    keep_len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let keep = unsafe { in_slice(keep, keep_len, "keep") }?;
        with_cache(cache, |cache| Ok(cache.filter_rows(keep)?))
    }
}

/// Makes room for `rows` rows now, so that requests joining the batch up to that many rows
/// (`latent_cache_merge_rows` into this cache) are written into free slots and copy nothing
/// else. On a cache holding rows the memory is allocated (and the rows copied once) during the
/// call: every slot takes as many positions as a row (`latent_cache_set_bytes_in_use` counts
/// them). On an empty cache the first allocation takes that many slots. Never shrinks (see
/// `latent_cache_shrink_rows`); `latent_cache_reset` forgets it.
///
/// Returns `OK`, `NULL_ARGUMENT`, `CAPACITY` (beyond INT32_MAX, or more memory than MLX's
/// memory limit leaves), `BACKEND`. On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_reserve_rows(cache: *mut latent_cache, rows: usize) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.reserve_rows(rows)?)) }
}

/// Releases the slots no row holds (the slots of rows that left, or reserved ones): the rows are
/// copied once into buffers of exactly their count of slots, keeping every stored position and
/// the room for positions, so the buffers' bytes (`latent_cache_set_bytes_in_use`) and MLX's
/// active memory shrink. A later join takes a new slot by rebuilding the batch (or reserve rows
/// again). On an empty cache it forgets a `latent_cache_reserve_rows`. Rounds, prefills and rows
/// are unchanged.
///
/// Returns `OK`, `NULL_ARGUMENT`, `CAPACITY` (the copy needs more memory than MLX's memory limit
/// leaves), `BACKEND`. On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_shrink_rows(cache: *mut latent_cache) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.shrink_rows()?)) }
}
