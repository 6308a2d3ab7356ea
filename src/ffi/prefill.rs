//! A padded batched prefill (mlx-lm's `BatchKVCache.prepare` / `finalize`), for one cache and
//! set-wide.
use super::args::optional_slice;
use super::handle::{latent_cache, with_cache};
use super::panic::ffi_boundary;
use super::set::{latent_cache_set, with_layers};
use super::status::latent_cache_status;
use crate::core::cache::set::change_all;
use crate::core::LatentCache;

/// The three optional per-row vectors of a prepare, each `rows` long or NULL (absent).
type Padding<'a> = (Option<&'a [usize]>, Option<&'a [usize]>, Option<&'a [usize]>);

unsafe fn padding<'a>(
    lengths: *const usize,
    left_padding: *const usize,
    right_padding: *const usize,
    rows: usize,
) -> super::error::FfiResult<Padding<'a>> {
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

/// Set-wide `latent_cache_prefill_prepare` (the same vectors for every layer).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_prefill_prepare(
    set: *mut latent_cache_set,
    lengths: *const usize,
    left_padding: *const usize,
    right_padding: *const usize,
    rows: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let (lengths, left, right) = unsafe { padding(lengths, left_padding, right_padding, rows) }?;
        with_layers(set, |layers| Ok(change_all(layers, |l| l.prepare_prefill_prepare(lengths, left, right))?))
    }
}

/// Set-wide `latent_cache_prefill_finalize`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_prefill_finalize(set: *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, LatentCache::prepare_prefill_finalize)?)) }
}
