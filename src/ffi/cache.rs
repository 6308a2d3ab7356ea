//! The `latent_cache` handle's lifecycle, host-buffer appends and reads, trim and reset.
use std::ffi::c_char;

use super::args::{copy_out, copy_out_str, in_slice, optional_slice, out_ptr, write};
use super::config::{latent_cache_config, read_config};
use super::error::{set_last_error, FfiResult};
use super::family::family;
use super::handle::{latent_cache, with_cache, Handle, Release};
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::Family;
use crate::core::LatentCache;

/// Creates an empty cache with the geometry in `*config`.
///
/// - `config`: borrowed for the call; start it from `latent_cache_config_default()` (which
///   sets `struct_size`).
/// - `out`: receives the new handle, owned by the caller; release it with `latent_cache_free`.
///   Written only on success.
///
/// Returns `OK`, `NULL_ARGUMENT` (config or out is NULL), `INVALID_ARGUMENT` (a zero
/// kv_lora_rank or rope_head_dim, a width over 1,048,576, max_tokens over INT32_MAX, a
/// `struct_size` no header declares, a field this library does not know set).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_new(
    config: *const latent_cache_config,
    out: *mut *mut latent_cache,
) -> latent_cache_status {
    ffi_boundary! {
        let config = unsafe { read_config(config, "config") }?;
        let out = out_ptr(out, "out")?;
        let geometry = config.geometry()?;
        let cache = LatentCache::new(geometry)?;
        unsafe { write(out, Handle::register(cache)) };
        Ok(())
    }
}

/// Releases a cache and every buffer it owns. `NULL` is accepted and does nothing; so is a
/// handle that is not live (already freed, or never made by this library), which also sets the
/// last error message: handles are never reused, so a second free cannot reach another cache.
/// A layer lent by `latent_cache_set_layer` is not released either (message set): it belongs
/// to its set, which releases it.
/// Arrays previously returned to the caller stay valid: they are the caller's to free. A call
/// on this handle already running on another thread completes first; every later call on it is
/// refused with `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_free(cache: *mut latent_cache) {
    ffi_boundary!(on_panic = ();
        if !cache.is_null() {
            match Handle::release(cache, false) {
                Release::Released => {}
                Release::NotLive => set_last_error("latent_cache_free: not a live latent_cache (double free?)"),
                Release::OwnedBySet => {
                    set_last_error("latent_cache_free: this cache is a layer of a latent_cache_set; free the set")
                }
            }
        }
    )
}

/// Appends `tokens` positions to every one of `batch` rows, copying the caller's row-major float
/// buffers: `latent` is `[batch, tokens, kv_lora_rank]`, `rope` `[batch, tokens, rope_head_dim]`,
/// `index_keys` `[batch, tokens, index_head_dim]` on a DSA layer and `(NULL, 0)` otherwise. Each
/// `*_len` is the buffer's length in floats and must equal the product of its shape.
///
/// The buffers are borrowed for the call and may be reused as soon as it returns (the append is
/// evaluated before returning). `batch` must equal the cache's batch size once it has one.
///
/// Returns `OK`; `NULL_ARGUMENT` (cache NULL or not live, a NULL buffer with a non-zero
/// length); `SHAPE` (batch or tokens 0, a length that disagrees with its shape or overflows,
/// a batch mismatch); `INVALID_ARGUMENT` (index keys missing on a DSA layer or given on a
/// layer without them); `CAPACITY` (beyond `max_tokens`); `BACKEND`. On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_append_host(
    cache: *mut latent_cache,
    batch: usize,
    tokens: usize,
    latent: *const f32,
    latent_len: usize,
    rope: *const f32,
    rope_len: usize,
    index_keys: *const f32,
    index_keys_len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let latent = unsafe { in_slice(latent, latent_len, "latent") }?;
        let rope = unsafe { in_slice(rope, rope_len, "rope") }?;
        let index_keys = unsafe { optional_slice(index_keys, index_keys_len, "index_keys") }?;
        with_cache(cache, |cache| Ok(cache.append_host(batch, tokens, latent, rope, index_keys)?))
    }
}

/// The first append of a padded batch (prompts of different lengths, as mlx-lm's
/// `BatchKVCache(left_padding)`): as `latent_cache_append_host`, and row `b`'s first
/// `left_pad[b]` positions are padding (their values are stored but never valid), so
/// `row_offsets[b] = tokens - left_pad[b]`. `left_pad` has `left_pad_len == batch` entries, each
/// at most `tokens`, at least one of them 0 (the longest prompt). In both layouts.
///
/// Returns what `latent_cache_append_host` returns, and `INVALID_STATE` (the cache holds rows,
/// or a round is open), `INVALID_ARGUMENT` (`left_pad_len != batch`, or no row without
/// padding), `OUT_OF_RANGE` (a padding longer than `tokens`). On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_append_host_padded(
    cache: *mut latent_cache,
    batch: usize,
    tokens: usize,
    left_pad: *const usize,
    left_pad_len: usize,
    latent: *const f32,
    latent_len: usize,
    rope: *const f32,
    rope_len: usize,
    index_keys: *const f32,
    index_keys_len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let left_pad = unsafe { in_slice(left_pad, left_pad_len, "left_pad") }?;
        let latent = unsafe { in_slice(latent, latent_len, "latent") }?;
        let rope = unsafe { in_slice(rope, rope_len, "rope") }?;
        let index_keys = unsafe { optional_slice(index_keys, index_keys_len, "index_keys") }?;
        with_cache(cache, |cache| Ok(cache.append_host_padded(batch, tokens, left_pad, latent, rope, index_keys)?))
    }
}

/// Copies row `row`'s valid positions of one family (`[row_offsets[row], width]`, row-major)
/// into `out`. `family` is a `latent_cache_family` value. `out_len` is in floats and must be at
/// least `row_offsets[row] * width`; `*written` receives the number of floats copied.
/// Outputs are written only on success.
///
/// Returns `OK`; `NULL_ARGUMENT`; `INVALID_ARGUMENT` (unknown family, or index keys on a layer
/// without them); `OUT_OF_RANGE` (row >= batch size); `BUFFER_TOO_SMALL`; `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_read_row_host(
    cache: *const latent_cache,
    family: u32,
    row: usize,
    out: *mut f32,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! { unsafe { read_family(cache, family, out, out_len, written, |cache, family| cache.read_row(family, row)) } }
}

/// Copies one family's whole stored window `[batch_size, offset, width]` (row-major) into `out`.
/// Positions outside a row's `[left_pad, row_end)` (padding, and in a ragged layout the
/// positions after a row's end) hold unspecified values. `out_len` is in
/// floats; `*written` receives the number copied. Same statuses as `latent_cache_read_row_host`
/// (without `OUT_OF_RANGE`).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_read_host(
    cache: *const latent_cache,
    family: u32,
    out: *mut f32,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! { unsafe { read_family(cache, family, out, out_len, written, |cache, family| cache.read(family)) } }
}

/// The body of both host reads: check the family and pointers, read, copy out if it fits.
unsafe fn read_family(
    cache: *const latent_cache,
    family: u32,
    out: *mut f32,
    out_len: usize,
    written: *mut usize,
    read: impl FnOnce(&LatentCache, Family) -> crate::core::Result<Vec<f32>>,
) -> FfiResult {
    let family = self::family(family)?;
    let written = out_ptr(written, "written")?;
    with_cache(cache, |cache| {
        let values = read(cache, family)?;
        unsafe { copy_out(out, out_len, &values, written, "out") }
    })
}

/// Drops the last `n` positions of every row. `n` must not exceed the shortest row. Inside a
/// speculative round `bypass` must be true (prefer `latent_cache_spec_round_rollback`). Moves
/// the offset; copies nothing; later appends overwrite the dropped positions.
///
/// Returns `OK`, `NULL_ARGUMENT`, `OUT_OF_RANGE` (n beyond the shortest row; over a shared
/// prefix, n beyond the shortest row's own positions: shared positions are never changed),
/// `INVALID_STATE`
/// (inside a round without bypass; inside a round, with bypass, `n` beyond what the round
/// appended to a row: a rollback must still find what the rows held when the round began;
/// with composed storage, below `latent_cache_minimum_reusable_offset` without bypass). On
/// failure nothing changed. With bypass, a row's boundary stops at its new end.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_trim(cache: *mut latent_cache, n: usize, bypass: bool) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| cache.trim(n, bypass).map(drop).map_err(Into::into)) }
}

/// Empties the cache: no rows, no positions, no open round, padded prefill or prefill
/// maintenance, buffers released. The geometry is kept. Returns `OK` or `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_reset(cache: *mut latent_cache) -> latent_cache_status {
    ffi_boundary! {
        with_cache(cache, |cache| {
            cache.reset();
            Ok(())
        })
    }
}

/// Makes room for `tokens` positions per row now, so that appends up to that length never
/// reallocate (no growth copies, no latency spikes, no evaluation inside `append_latent`). On a
/// cache holding rows the memory is allocated (and the stored positions copied) during the
/// call, so MLX's active memory grows now and a request that cannot be held fails now. On an
/// empty cache the batch size is not known yet: the call checks that one row of `tokens`
/// positions fits, and the first append allocates `batch` rows of it (checked again then).
/// Returns `OK`, `NULL_ARGUMENT`, `CAPACITY` (beyond `max_tokens` or INT32_MAX, or more memory
/// than MLX's memory limit leaves), `BACKEND`. On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_reserve(cache: *mut latent_cache, tokens: usize) -> latent_cache_status {
    ffi_boundary! { with_cache(cache, |cache| Ok(cache.reserve(tokens)?)) }
}

/// Writes the cache's signature, its storage kind in the seed's grammar, as a NUL-terminated
/// string into `out`, so predicates that compare the seed's strings route our caches alike:
///
/// | cache | signature |
/// |---|---|
/// | target layer, float32 | `kv:mla:target` |
/// | target layer with DSA index keys, float32 | `kv:mla:target:dsa` |
/// | MTP layer (`LATENT_CACHE_ROLE_MTP`), float32 | `kv:mla:mtp` |
/// | any compact storage mode | `kv:mla-storage:<latent>-<rope>[-<index>]:` + the above, modes named `f32`, `bf16`, `f16`, `q8`, `q4`, `fp8` (for example `kv:mla-storage:q8-bf16-q8:kv:mla:target:dsa`) |
/// | ragged layout | `kv:ragged:` + the above |
///
/// Widths and `max_tokens` are not in it: read them with the getters; merges compare all of
/// them (and storage, layout and role), not only this string. `out_len` counts bytes and must
/// hold the string and its terminator; `*written` receives the length without the terminator.
/// Returns `OK`, `NULL_ARGUMENT`, `BUFFER_TOO_SMALL`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_signature(
    cache: *const latent_cache,
    out: *mut c_char,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let written = out_ptr(written, "written")?;
        with_cache(cache, |cache| {
            unsafe { copy_out_str(out, out_len, &cache.signature(), written) }
        })
    }
}
