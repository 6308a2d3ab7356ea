//! Read-only queries of one cache: its row layout (offsets, padding, ends, composed storage's
//! precision boundaries) and the numbers derived from its geometry. Each writes its outputs only
//! on success; a NULL cache or output pointer is `NULL_ARGUMENT`.
use super::args::{copy_out, out_ptr, write};
use super::error::FfiResult;
use super::handle::{latent_cache, with_cache};
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::LatentCache;

/// Writes `f(cache)` to `*out`.
unsafe fn query<T>(cache: *const latent_cache, out: *mut T, f: impl FnOnce(&LatentCache) -> T) -> FfiResult {
    let out = out_ptr(out, "out")?;
    with_cache(cache, |cache| {
        unsafe { write(out, f(cache)) };
        Ok(())
    })
}

unsafe fn query_rows(
    cache: *const latent_cache,
    out: *mut usize,
    out_len: usize,
    written: *mut usize,
    f: impl FnOnce(&LatentCache) -> Vec<usize>,
) -> FfiResult {
    let written = out_ptr(written, "written")?;
    with_cache(cache, |cache| unsafe { copy_out(out, out_len, &f(cache), written, "out") })
}

/// `*out` = the physical width T of the stored window (the longest row's position count).
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_offset(cache: *const latent_cache, out: *mut usize) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, LatentCache::offset) } }
}

/// `*out` = the number of rows; 0 before the first append and after a reset (trim never
/// changes it).
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_batch_size(cache: *const latent_cache, out: *mut usize) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, LatentCache::batch_size) } }
}

/// Copies `row_offsets` (each row's position count, `batch_size` values) into `out`; `*written`
/// receives `batch_size`. `out_len` must be at least `batch_size` (`BUFFER_TOO_SMALL`
/// otherwise); `(NULL, 0)` is fine while the batch is empty.
/// Returns `OK`, `NULL_ARGUMENT` (cache or written NULL, or out NULL with out_len > 0),
/// `BUFFER_TOO_SMALL`; nothing is written on failure. A read: safe alongside any other call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_row_offsets(
    cache: *const latent_cache,
    out: *mut usize,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! { unsafe { query_rows(cache, out, out_len, written, LatentCache::row_offsets) } }
}

/// Copies `left_pad` (where each row's valid positions start, `batch_size` values) into `out`;
/// same buffer rules as `latent_cache_row_offsets`. Row b's positions are `[left_pad[b], T)`.
/// Returns `OK`, `NULL_ARGUMENT` (cache or written NULL, or out NULL with out_len > 0),
/// `BUFFER_TOO_SMALL`; nothing is written on failure. A read: safe alongside any other call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_left_pad(
    cache: *const latent_cache,
    out: *mut usize,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! { unsafe { query_rows(cache, out, out_len, written, |cache| cache.left_pad().to_vec()) } }
}

/// Copies `row_end` (where each row's valid positions end, `batch_size` values) into `out`; same
/// buffer rules as `latent_cache_row_offsets`. Row b's positions are `[left_pad[b], row_end[b])`:
/// every row ends at `offset` when right-justified; in a ragged layout each where it ends (see
/// `latent_cache_layout` for the mask and RoPE positions an engine builds from them).
/// Returns `OK`, `NULL_ARGUMENT` (cache or written NULL, or out NULL with out_len > 0),
/// `BUFFER_TOO_SMALL`; nothing is written on failure. A read: safe alongside any other call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_row_ends(
    cache: *const latent_cache,
    out: *mut usize,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! { unsafe { query_rows(cache, out, out_len, written, |cache| cache.row_ends().to_vec()) } }
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
    ffi_boundary! { unsafe { query_rows(cache, out, out_len, written, LatentCache::converted_positions) } }
}

/// `*out` = the bytes of valid state the cache holds: the sum of `row_offsets` times
/// `bytes_per_token` (the seed's `byteLength`; padding and spare capacity are not counted).
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_byte_length(cache: *const latent_cache, out: *mut usize) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, LatentCache::byte_length) } }
}

/// `*out` = the configured kv_lora_rank.
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_kv_lora_rank(cache: *const latent_cache, out: *mut usize) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, |cache| cache.geometry().kv_lora_rank) } }
}

/// `*out` = the configured rope_head_dim.
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_rope_head_dim(cache: *const latent_cache, out: *mut usize) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, |cache| cache.geometry().rope_head_dim) } }
}

/// `*out` = the configured index_head_dim (0 on a layer without DSA index keys).
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_index_head_dim(cache: *const latent_cache, out: *mut usize) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, |cache| cache.geometry().index_head_dim) } }
}

/// `*out` = bytes one more position costs one row, in each family's storage mode (see
/// `latent_cache_storage`): (kv_lora_rank + rope_head_dim + index_head_dim) x 4 when every
/// family is float32. GLM-5.2, whole model (78 layers, index keys on 21), per position:
/// float32 190,464; bfloat16 95,232; latent Q8 + rope bfloat16 + index keys Q8 55,272 (index
/// keys FP8: 55,188); latent Q4 + rope bfloat16 + index keys Q8 35,304.
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_bytes_per_token(cache: *const latent_cache, out: *mut usize) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, LatentCache::bytes_per_token) } }
}

/// `*out` = positions an append may still add: `SIZE_MAX` when `max_tokens` is 0, else
/// `max_tokens` minus the longest row. With composed storage, outside speculative rounds, the
/// smaller of that and the positions an append may add before some row's precision boundary
/// moves (0 when the next position moves one); a larger append still succeeds, since moving a
/// boundary copies nothing. Inside a padded prefill (`latent_cache_prefill_prepare` to
/// `latent_cache_prefill_finalize`) boundaries follow the positions that cannot be right
/// padding, and so does this count: a row's last `right_padding[b]` positions to come, and
/// those past its declared prompt length (`lengths[b]`), move no boundary; where no append can
/// move one (every prompt in), only `max_tokens` limits it (`SIZE_MAX` when 0). Inside a round
/// only `max_tokens` limits it.
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_max_append_tokens(cache: *const latent_cache, out: *mut usize) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, LatentCache::max_append_tokens) } }
}

/// `*out` = the earliest offset whose stored state can resume generation; reuse policies must
/// not trim below it. 0 unless storage is composed (every position is encoded on its own, so
/// every prefix is what a fresh prefill holds); with composed storage the smallest offset a
/// trim may reach and leave each row what a fresh prefill of its remaining positions holds
/// (positions a fresh cache would hold hot must not be compact already).
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_minimum_reusable_offset(
    cache: *const latent_cache,
    out: *mut usize,
) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, LatentCache::minimum_reusable_offset) } }
}

/// `*out` = whether `latent_cache_trim` can drop positions (always true: trim moves the offset).
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_is_trimmable(cache: *const latent_cache, out: *mut bool) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, LatentCache::is_trimmable) } }
}

/// `*out` = whether a speculative round is open.
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written). A read:
/// serialized with other calls on the handle, like every call.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_in_spec_round(cache: *const latent_cache, out: *mut bool) -> latent_cache_status {
    ffi_boundary! { unsafe { query(cache, out, LatentCache::in_spec_round) } }
}
