//! Saving and loading: a set or one cache to a file or to bytes, and back (see `core::persist`
//! for the format, mlx-lm's prompt-cache layout for float storage).
use std::ffi::c_char;

use super::args::{in_slice, out_ptr, path, write};
use super::error::{Failure, FfiResult};
use super::handle::{latent_cache, with_cache, Handle};
use super::panic::ffi_boundary;
use super::set::{latent_cache_set, register_set, with_set_layers};
use super::status::latent_cache_status;

use crate::core::persist;
use crate::core::LatentCache;

/// Hands bytes to the caller (freed with `latent_cache_bytes_free`).
pub(crate) unsafe fn give_bytes(bytes: Vec<u8>, out: *mut *mut u8, out_len: *mut usize) {
    let boxed = bytes.into_boxed_slice();
    let len = boxed.len();
    unsafe {
        write(out_len, len);
        write(out, Box::into_raw(boxed).cast::<u8>());
    }
}

fn one_layer(mut caches: Vec<LatentCache>) -> FfiResult<LatentCache> {
    match caches.len() {
        1 => Ok(caches.remove(0)),
        n => Err(Failure::new(latent_cache_status::InvalidArgument, format!("the state holds {n} layers; load it as a set"))),
    }
}

/// Saves every layer of `set` to `path` (safetensors; the README and docs/packaging describe
/// the layout): written to a temporary file in the same folder, synced, then renamed over
/// `path`, so a crash never leaves a partial file under that name. Evaluates the set's state.
/// A file holds caches at rest: a save while any layer has a speculative round open (between
/// `spec_round_begin` and its commit or rollback), a padded prefill open (between
/// `prefill_prepare` and `prefill_finalize`) or prefill maintenance open (between
/// `prefill_begin` and `prefill_end`) is refused with `INVALID_STATE`, nothing written, so a
/// loaded cache is always exactly the one saved (rows, values, composed boundaries,
/// `max_append_tokens`, `minimum_reusable_offset`). Commit or roll back, finalize, end, then save.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a path that is not UTF-8 or names no
/// file), `INVALID_STATE` (layers that disagree, or an operation open as above), `BACKEND` (the
/// file could not be written).
/// Composed layers are saved with their hot side (format 3; without one, format 2): each family
/// as stored in its compact mode (a float one in mlx-lm's layout), the hot values beside it.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_save(set: *const latent_cache_set, path: *const c_char) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        with_set_layers(set, |layers| Ok(persist::save(&layers.iter().map(|l| &**l).collect::<Vec<_>>(), &path)?))
    }
}

/// Loads a set saved by `latent_cache_set_save` (or a GLM-5 prompt cache mlx-lm's
/// `save_prompt_cache` wrote: float storage in its dtype, rows right-justified). Everything is
/// checked first (format version, geometry, every tensor's shape, dtype and checksum, the rows);
/// on any failure nothing is created. Every count in the file is range-checked as it is (never
/// narrowed), and composed boundaries against the rule. What the tensors will hold is checked
/// against MLX's memory limit before any is read. `*out` receives the set, owned by the caller.
/// The path is opened once and must name a regular file (a FIFO, a device or a folder is
/// `INVALID_ARGUMENT`); the file must end with its last tensor.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (unreadable, damaged or foreign files, a
/// newer format, bytes after the last tensor), `CAPACITY` (its tensors would take MLX past its
/// memory limit), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_load(path: *const c_char, out: *mut *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        let out = out_ptr(out, "out")?;
        let caches = persist::load(&path)?;
        unsafe { write(out, register_set(caches)) };
        Ok(())
    }
}

/// `latent_cache_set_save` into bytes: `*out` (`*out_len` bytes) receives them, owned by the
/// caller (free with `latent_cache_bytes_free`), to ship a request's state over the engine's own
/// transport; the same bytes a file holds.
/// Returns what `latent_cache_set_save` returns.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_save_to_buffer(
    set: *const latent_cache_set,
    out: *mut *mut u8,
    out_len: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let (out, out_len) = (out_ptr(out, "out")?, out_ptr(out_len, "out_len")?);
        let bytes = with_set_layers(set, |layers| Ok(persist::save_to_bytes(&layers.iter().map(|l| &**l).collect::<Vec<_>>())?))?;
        unsafe { give_bytes(bytes, out, out_len) };
        Ok(())
    }
}

/// `latent_cache_set_load` from `len` bytes at `data` (borrowed), read from memory: no
/// temporary file (TMPDIR plays no part).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_load_from_buffer(
    data: *const u8,
    len: usize,
    out: *mut *mut latent_cache_set,
) -> latent_cache_status {
    ffi_boundary! {
        let data = unsafe { in_slice(data, len, "data") }?;
        let out = out_ptr(out, "out")?;
        let caches = persist::load_from_bytes(data)?;
        unsafe { write(out, register_set(caches)) };
        Ok(())
    }
}

/// Saves one cache to `path` (a one-layer state; rules of `latent_cache_set_save`: refused with
/// `INVALID_STATE`, nothing written, inside a speculative round, a padded prefill or prefill
/// maintenance).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_save(cache: *const latent_cache, path: *const c_char) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        with_cache(cache, |cache| Ok(persist::save(&[&*cache], &path)?))
    }
}

/// Loads a one-layer state into a new cache (rules of `latent_cache_set_load`; a state of
/// several layers is `INVALID_ARGUMENT`: load it as a set). `*out` is the caller's.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_load(path: *const c_char, out: *mut *mut latent_cache) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        let out = out_ptr(out, "out")?;
        let cache = one_layer(persist::load(&path)?)?;
        unsafe { write(out, Handle::register(cache)) };
        Ok(())
    }
}

/// Saves one cache into bytes (rules of `latent_cache_set_save_to_buffer`).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_save_to_buffer(
    cache: *const latent_cache,
    out: *mut *mut u8,
    out_len: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let (out, out_len) = (out_ptr(out, "out")?, out_ptr(out_len, "out_len")?);
        let bytes = with_cache(cache, |cache| Ok(persist::save_to_bytes(&[&*cache])?))?;
        unsafe { give_bytes(bytes, out, out_len) };
        Ok(())
    }
}

/// Loads a one-layer state from bytes into a new cache.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_load_from_buffer(
    data: *const u8,
    len: usize,
    out: *mut *mut latent_cache,
) -> latent_cache_status {
    ffi_boundary! {
        let data = unsafe { in_slice(data, len, "data") }?;
        let out = out_ptr(out, "out")?;
        let cache = one_layer(persist::load_from_bytes(data)?)?;
        unsafe { write(out, Handle::register(cache)) };
        Ok(())
    }
}

/// Frees bytes a `..._save_to_buffer` call returned (`len` as it returned it). NULL is ignored.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_bytes_free(data: *mut u8, len: usize) {
    ffi_boundary!(on_panic = ();
        if !data.is_null() {
            // SAFETY: the pointer and length a save returned, freed once.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(data, len)) });
        }
    )
}
