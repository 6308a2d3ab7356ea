//! The MLX-native path: appends and reads over mlx-c `mlx_array` handles, for engines that run
//! on the same MLX runtime (one libmlx per process), plus the few array helpers an engine
//! without mlx-c needs (make an array from host floats, free one, evaluate under the library's
//! evaluation lock).
use std::mem::ManuallyDrop;

use mlx_rs::Array;
use mlx_sys::mlx_array;

use super::args::{in_slice, out_ptr, write};
use super::error::{Failure, FfiResult};
use super::handle::latent_cache;
use super::handle::with_cache;
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::{eval, mlx_ops, LatentState};

/// Borrows a caller's array for the call without taking ownership.
unsafe fn borrow(array: mlx_array, name: &str) -> FfiResult<ManuallyDrop<Array>> {
    if array.ctx.is_null() {
        return Err(Failure::null(name));
    }
    // SAFETY: a non-NULL mlx_array from the caller; ManuallyDrop keeps it the caller's.
    Ok(ManuallyDrop::new(unsafe { Array::from_ptr(array) }))
}

/// Hands an array to the caller, who frees it.
fn give(array: Array) -> mlx_array {
    let handle = array.as_ptr();
    std::mem::forget(array);
    handle
}

fn empty() -> mlx_array {
    mlx_array { ctx: std::ptr::null_mut() }
}

/// Writes the views of `state` to the non-NULL outputs; the others are dropped.
unsafe fn hand_out(state: LatentState, latent: *mut mlx_array, rope: *mut mlx_array, index_keys: *mut mlx_array) {
    unsafe {
        if !latent.is_null() {
            write(latent, give(state.latent));
        }
        if !rope.is_null() {
            write(rope, give(state.rope));
        }
        if !index_keys.is_null() {
            write(index_keys, state.index_keys.map_or_else(empty, give));
        }
    }
}

/// Appends the positions in `latent` `[B, N, kv_lora_rank]`, `rope` `[B, N, rope_head_dim]`
/// and, on a DSA layer, `index_keys` `[B, N, index_head_dim]` (all float32) to every row, and
/// returns views of everything stored: `[B, T, width]` per family.
///
/// - Inputs are borrowed for the call (the library keeps its own reference until evaluation);
///   pass `index_keys` with `ctx == NULL` on a layer without DSA.
/// - Each non-NULL output receives a new array owned by the caller (free it with
///   `mlx_array_free` or `latent_cache_array_free`); NULL outputs are skipped. On a layer
///   without DSA, `*out_index_keys` receives an array with `ctx == NULL`. Written only on
///   success.
/// - The write is not evaluated: evaluate once per step, after all layers. Release the returned
///   views before the next append to this cache, or that append copies the stored history
///   instead of writing in place. When the buffers must grow, the larger buffers are allocated
///   during the call (an evaluation under the evaluation lock; `latent_cache_reserve` avoids
///   it), so running out of memory is a `CAPACITY` status here, not a crash later.
/// - Every 64th consecutive append to a buffer nobody evaluated evaluates it (a DSA layer
///   whose index keys are never read would otherwise grow an unbounded graph).
///
/// Returns `OK`; `NULL_ARGUMENT` (cache, latent or rope missing); `DTYPE`; `SHAPE`;
/// `INVALID_ARGUMENT` (index keys missing on a DSA layer, given on another); `CAPACITY`
/// (beyond `max_tokens`, or growth beyond MLX's memory limit); `BACKEND`. On failure nothing
/// changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_append_latent(
    cache: *mut latent_cache,
    latent: mlx_array,
    rope: mlx_array,
    index_keys: mlx_array,
    out_latent: *mut mlx_array,
    out_rope: *mut mlx_array,
    out_index_keys: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let latent = borrow(latent, "latent")?;
        let rope = borrow(rope, "rope")?;
        let index_keys = match index_keys.ctx.is_null() {
            true => None,
            false => Some(borrow(index_keys, "index_keys")?),
        };
        let state = with_cache(cache, |cache| Ok(cache.append_latent(&latent, &rope, index_keys.as_deref())?))?;
        hand_out(state, out_latent, out_rope, out_index_keys);
        Ok(())
    } }
}

/// `*out` receives the index keys stored before the coming append, `[B, T, index_head_dim]`
/// (`[0, 0, index_head_dim]` before the first append): a view owned by the caller, to be freed
/// and released before the next append. Written only on success.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a layer without DSA index keys), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_stored_index_keys(cache: *const latent_cache, out: *mut mlx_array) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let out = out_ptr(out, "out")?;
        let keys = with_cache(cache, |cache| Ok(cache.stored_index_keys()?))?;
        write(out, give(keys));
        Ok(())
    } }
}

/// Views of every stored family (`[B, T, width]`; `[0, 0, width]` before the first append),
/// with the same output rules as `latent_cache_append_latent`.
/// Returns `OK`, `NULL_ARGUMENT`, `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_state(
    cache: *const latent_cache,
    out_latent: *mut mlx_array,
    out_rope: *mut mlx_array,
    out_index_keys: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let state = with_cache(cache, |cache| Ok(cache.state()?))?;
        hand_out(state, out_latent, out_rope, out_index_keys);
        Ok(())
    } }
}

/// Makes a float32 array `[batch, tokens, width]` holding a copy of `data` (`data_len` floats,
/// which must equal the product). `*out` receives it, owned by the caller. For engines without
/// mlx-c of their own. Returns `OK`, `NULL_ARGUMENT`, `SHAPE`, `CAPACITY` (the copy would take
/// MLX past its memory limit).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_from_host(
    data: *const f32,
    data_len: usize,
    batch: usize,
    tokens: usize,
    width: usize,
    out: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! {
        let data = unsafe { in_slice(data, data_len, "data") }?;
        let out = out_ptr(out, "out")?;
        let array = mlx_ops::from_host(data, &[batch, tokens, width], "data")?;
        unsafe { write(out, give(array)) };
        Ok(())
    }
}

/// Frees an array returned by this library (same as mlx-c's `mlx_array_free`). An array with
/// `ctx == NULL` is accepted and ignored. Never free an array twice.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_free(array: mlx_array) {
    ffi_boundary!(on_panic = ();
        if !array.ctx.is_null() {
            // SAFETY: the caller hands over an array it owns.
            drop(unsafe { Array::from_ptr(array) });
        }
    )
}

/// Evaluates `arrays` (borrowed, `len` entries) in one MLX evaluation, under the process-wide
/// evaluation lock the library itself uses (or the one given to `latent_cache_set_eval_lock`).
/// Entries with `ctx == NULL` are skipped, so the outputs of an append or `state` on a layer
/// without index keys can be passed as they came. Engines that evaluate from several threads
/// should evaluate through this call, or under the lock they handed the library.
/// Returns `OK`, `NULL_ARGUMENT` (`arrays` NULL with `len > 0`), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_eval(arrays: *const mlx_array, len: usize) -> latent_cache_status {
    ffi_boundary! {
        let handles = unsafe { in_slice(arrays, len, "arrays") }?;
        let mut borrowed = Vec::with_capacity(handles.len());
        for (i, &handle) in handles.iter().enumerate().filter(|(_, h)| !h.ctx.is_null()) {
            borrowed.push(unsafe { borrow(handle, &format!("arrays[{i}]")) }?);
        }
        Ok(eval::eval(borrowed.iter().map(|a| &**a))?)
    }
}
