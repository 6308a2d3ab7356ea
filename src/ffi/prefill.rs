//! One cache's prefill calls: a padded batched prefill (mlx-lm's `BatchKVCache.prepare` /
//! `finalize`) and prefill maintenance (the seed's `beginPrefill` / `commitPrefill` /
//! `endPrefill`). Their set-wide forms are in `set`.
use super::args::{in_slice, optional_slice};
use super::error::FfiResult;
use super::handle::{latent_cache, with_cache};
use super::panic::ffi_boundary;
use super::status::latent_cache_status;

/// The three optional per-row vectors of a prepare, each `rows` long or NULL (absent).
pub(crate) type Padding<'a> = (Option<&'a [usize]>, Option<&'a [usize]>, Option<&'a [usize]>);

/// A prepare's vectors (`lengths`, `left_padding`, `right_padding`), each NULL or `rows` long.
pub(crate) unsafe fn padding<'a>(
    lengths: *const usize,
    left_padding: *const usize,
    right_padding: *const usize,
    rows: usize,
) -> FfiResult<Padding<'a>> {
    let len = |p: *const usize| if p.is_null() { 0 } else { rows };
    Ok(unsafe {
        (
            optional_slice(lengths, len(lengths), "lengths")?,
            optional_slice(left_padding, len(left_padding), "left_padding")?,
            optional_slice(right_padding, len(right_padding), "right_padding")?,
        )
    })
}

/// Opens a padded batched prefill. Each of `lengths`, `left_padding`, `right_padding` is NULL
/// (absent) or `rows` entries, borrowed for the call; `rows` is the batch size (of the coming
/// first append on an empty cache).
/// - `left_padding` (empty cache only): the first append's rows start after that many padding
///   positions, as with `latent_cache_append_latent_padded` (when that append gives none).
/// - `right_padding[b]`: the last positions the prefill appends to row b are padding (a shorter
///   prompt padded at its end). `latent_cache_prefill_finalize` drops them, so the row ends with
///   its prompt's last position; before it, reads and attention see them.
/// - `lengths[b]`: row b's prompt length, checked at finalize against what the row gained; with
///   it, a row extracted (or merged into another cache) mid-prefill keeps exactly its prompt,
///   even before its padding arrived.
///
/// On an empty cache the vectors bind the first append's batch (another batch: `SHAPE`).
/// Between prepare and finalize, appends and trims work as usual, a speculative round cannot
/// begin, a merge into the cache is refused, `latent_cache_filter_rows` keeps the kept rows'
/// padding, and `latent_cache_extract_row` (and a merge from this cache) takes each row without
/// its right padding.
///
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a vector's length is not the batch size;
/// left padding with no unpadded row, which no append could take),
/// `OUT_OF_RANGE` (an entry over INT32_MAX), `INVALID_STATE` (a round or a prefill is open, or
/// left padding on a cache that holds rows). On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_prefill_prepare(
    cache: *mut latent_cache,
    lengths: *const usize,
    left_padding: *const usize,
    right_padding: *const usize,
    rows: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let (lengths, left, right) = unsafe { padding(lengths, left_padding, right_padding, rows) }?;
        with_cache(cache, |cache| Ok(cache.prefill_prepare(lengths, left, right)?))
    }
}

/// Closes the prefill: every row drops its right padding (right-justified rows shift, only the
/// rows that move and only their positions, in place; ragged row ends move). Without an open
/// prefill it does nothing and returns `OK`.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (right_padding's or lengths' entries do not
/// match the rows), `OUT_OF_RANGE` (a row holds fewer positions than its right padding),
/// `CAPACITY`, `BACKEND`. On failure nothing changed and the prefill stays open.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_prefill_finalize(cache: *mut latent_cache) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.prefill_finalize()?)) }
}

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
