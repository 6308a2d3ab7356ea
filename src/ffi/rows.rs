//! Batch row operations for continuous batching: merge sources into an empty cache, extract one
//! row as its own cache, filter rows.
use super::args::{in_slice, out_ptr, write};
use super::error::Failure;
use super::handle::{latent_cache, with_cache, Handle};
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::LatentCache;

/// Fills the empty `destination` with every row of every source, in order: a batch source
/// gives all its rows, an empty source that never had rows gives one empty row. Rows are
/// right-justified to the longest. Sources are borrowed and not changed; a source may appear
/// more than once but may not be the destination. All must have the destination's geometry.
///
/// Returns `OK`; `NULL_ARGUMENT` (a NULL or dead handle, `sources` NULL); `INVALID_ARGUMENT`
/// (zero sources, a geometry mismatch, the destination among the sources); `INVALID_STATE`
/// (the destination is not empty or is in a round); `CAPACITY`; `BACKEND`. On failure nothing
/// changed.
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
/// Returns `OK`; `NULL_ARGUMENT`; `INVALID_ARGUMENT` (empty list, a row listed twice);
/// `OUT_OF_RANGE` (a row >= batch size); `INVALID_STATE` (inside a round); `BACKEND`. On
/// failure nothing changed.
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
