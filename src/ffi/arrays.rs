//! The MLX-native path: appends and reads over mlx-c `mlx_array` handles, for engines that run
//! on the same MLX runtime (one libmlx per process), plus the few array helpers an engine
//! without mlx-c needs (make an array from host floats, free one, evaluate under the library's
//! evaluation lock).
use std::mem::ManuallyDrop;

use mlx_sys::mlx_array;

use super::args::{copy_out, in_slice, out_ptr, write};
use super::error::{Failure, FfiResult};
use super::family::family;
use super::handle::{latent_cache, with_cache};
use super::mlx_array::{borrow, borrow_optional, empty, free, give, give_optional};
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use super::storage::latent_cache_storage;
use crate::core::mlx::eval;
use crate::core::mlx::ops;
use crate::core::LatentState;

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
            write(index_keys, give_optional(state.index_keys));
        }
    }
}

/// Appends the positions in `latent` `[B, N, kv_lora_rank]`, `rope` `[B, N, rope_head_dim]`
/// and, on a DSA layer, `index_keys` `[B, N, index_head_dim]` (float32, bfloat16 or float16,
/// converted to each family's `latent_cache_storage` on the write) to every row, and returns
/// the values of everything stored: `[B, T, width]` per family (views in the stored dtype for
/// the float modes; float32 decodes, O(stored) when evaluated, for the quantized ones).
///
/// - Inputs are borrowed for the call (the library keeps its own reference until evaluation);
///   pass `index_keys` with `ctx == NULL` on a layer without DSA.
/// - Each non-NULL output receives a new array owned by the caller (free it with
///   `mlx_array_free` or `latent_cache_array_free`); NULL outputs are skipped, and with every
///   output NULL no value is built at all (what an engine reading `latent_cache_packed_state`
///   in a quantized mode wants: the decode is never made). On a layer
///   without DSA, `*out_index_keys` receives an array with `ctx == NULL`. Written only on
///   success.
/// - The write is not evaluated: evaluate once per step, after all layers. Release the returned
///   views before the next append to this cache, or that append copies the stored history
///   instead of writing in place. When the buffers must grow, the larger buffers are allocated
///   during the call (an evaluation under the evaluation lock; `latent_cache_reserve` avoids
///   it), so running out of memory is a `CAPACITY` status here, not a crash later.
/// - Every 64th consecutive append to a buffer nobody evaluated evaluates it (a DSA layer
///   whose index keys are never read would otherwise grow an unbounded graph).
/// - Rows that joined and left a running batch may lie in up to four runs of slots (see
///   `latent_cache_filter_rows`): the returned values are then the runs joined, a copy
///   (O(stored) when evaluated), as are `latent_cache_state`'s and `latent_cache_packed_state`'s.
///   The library's attention (`latent_cache_donor_*`) reads each run in place;
///   `latent_cache_shrink_rows` puts the rows in one run.
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
    ffi_boundary! { unsafe { append_arrays(cache, None, [latent, rope, index_keys], [out_latent, out_rope, out_index_keys]) } }
}

/// Both MLX-array appends: borrows the inputs, appends (as a padded first append when
/// `left_pad` is given), and hands out the values the non-NULL outputs ask for. With every
/// output NULL nothing is built (a quantized family's decode included).
unsafe fn append_arrays(
    cache: *mut latent_cache,
    left_pad: Option<&[usize]>,
    [latent, rope, index_keys]: [mlx_array; 3],
    [out_latent, out_rope, out_index_keys]: [*mut mlx_array; 3],
) -> FfiResult {
    unsafe {
        let latent = borrow(latent, "latent")?;
        let rope = borrow(rope, "rope")?;
        let index_keys = borrow_optional(index_keys, "index_keys")?;
        let views = !(out_latent.is_null() && out_rope.is_null() && out_index_keys.is_null());
        let state = with_cache(cache, |cache| Ok(cache.append_with(left_pad, &latent, &rope, index_keys.as_deref(), views)?))?;
        if let Some(state) = state {
            hand_out(state, out_latent, out_rope, out_index_keys);
        }
        Ok(())
    }
}

/// The first append of a padded batch over MLX arrays: `latent_cache_append_latent` with row
/// `b`'s first `left_pad[b]` positions as padding (the rules of
/// `latent_cache_append_host_padded`: an empty cache, `left_pad_len` equal to the batch, each
/// entry at most the token count, one of them 0). Same outputs and ownership as
/// `latent_cache_append_latent`.
/// Returns what `latent_cache_append_latent` returns, and `INVALID_STATE`, `INVALID_ARGUMENT`,
/// `OUT_OF_RANGE` as `latent_cache_append_host_padded`. On failure nothing changed.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_append_latent_padded(
    cache: *mut latent_cache,
    left_pad: *const usize,
    left_pad_len: usize,
    latent: mlx_array,
    rope: mlx_array,
    index_keys: mlx_array,
    out_latent: *mut mlx_array,
    out_rope: *mut mlx_array,
    out_index_keys: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let left_pad = in_slice(left_pad, left_pad_len, "left_pad")?;
        append_arrays(cache, Some(left_pad), [latent, rope, index_keys], [out_latent, out_rope, out_index_keys])
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

/// The values of every stored family (`[B, T, width]`; `[0, 0, width]` before the first
/// append), as `latent_cache_append_latent` returns them and with the same output rules.
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

/// One family's stored parts, as `latent_cache_packed_state` returns them: views `[B, T, ...]`
/// owned by the caller (release them with `latent_cache_packed_release`, before the next
/// append). The arrays a mode does not have are `ctx == NULL`.
#[repr(C)]
#[derive(Debug)]
pub struct latent_cache_packed {
    /// The family's mode: a `latent_cache_storage` value.
    pub storage: u32,
    /// Bits per code: 32 or 16 for the float modes, 8 for `Q8` and `FP8`, 4 for `Q4`.
    pub bits: u32,
    /// Values sharing one scale: 64 for `Q8`/`Q4`, 128 for `FP8`, 0 for the float modes.
    pub group_size: u32,
    /// Float modes: the values `[B, T, width]` in the stored dtype. `Q8`/`Q4`: uint32 codes
    /// `[B, T, width * bits / 32]`. `FP8`: uint8 E4M3 codes `[B, T, width]`.
    pub values: mlx_array,
    /// `Q8`/`Q4`: bfloat16 scales `[B, T, width / 64]`. `FP8`: float32 scales
    /// `[B, T, width / 128]`, value = `from_fp8(code) * scale` per block.
    pub scales: mlx_array,
    /// `Q8`/`Q4`: bfloat16 biases `[B, T, width / 64]`, value = `code * scale + bias`
    /// (`mx.dequantize` / `mx.quantized_matmul` with `mode = "affine"`).
    pub biases: mlx_array,
}

/// `*out` receives views of one family's stored parts (`family` a `latent_cache_family`), no
/// copy and no decode: for the float modes the same view `latent_cache_state` returns; for the
/// quantized ones the codes, scales and biases an engine passes to MLX's quantized matmul. The
/// same release rules as `latent_cache_state`. Written only on success.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (unknown family, or index keys on a layer
/// without them), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_packed_state(
    cache: *const latent_cache,
    family: u32,
    out: *mut latent_cache_packed,
) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let out = out_ptr(out, "out")?;
        let family = self::family(family)?;
        let (mode, parts) = with_cache(cache, |cache| Ok((cache.storage_mode(family)?, cache.stored_parts(family)?)))?;
        let mut parts = parts.into_iter().map(give);
        let packed = latent_cache_packed {
            storage: latent_cache_storage::of(mode) as u32,
            bits: mode.bits() as u32,
            group_size: mode.group_size() as u32,
            values: parts.next().unwrap_or_else(empty),
            scales: parts.next().unwrap_or_else(empty),
            biases: parts.next().unwrap_or_else(empty),
        };
        write(out, packed);
        Ok(())
    } }
}

/// Frees the arrays of `*packed` (those with `ctx != NULL`) and sets them to `ctx == NULL`, so a
/// second release is harmless. NULL is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_packed_release(packed: *mut latent_cache_packed) {
    ffi_boundary!(on_panic = ();
        // SAFETY: the caller passes a packed state it owns, or NULL.
        if let Some(packed) = unsafe { packed.as_mut() } {
            for array in [&mut packed.values, &mut packed.scales, &mut packed.biases] {
                unsafe { free(std::mem::replace(array, empty())) };
            }
        }
    )
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
        let array = ops::from_host(data, &[batch, tokens, width], "data")?;
        unsafe { write(out, give(array)) };
        Ok(())
    }
}

/// Makes a float32 array of any rank holding a copy of `data`: `shape` has `ndim` extents
/// (each at most INT32_MAX, at most 8 of them) whose product must equal `data_len`. `*out`
/// receives it, owned by the caller. For engines without mlx-c of their own (queries, masks).
/// Returns `OK`, `NULL_ARGUMENT`, `SHAPE`, `CAPACITY`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_from_host_shape(
    data: *const f32,
    data_len: usize,
    shape: *const usize,
    ndim: usize,
    out: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! {
        let data = unsafe { in_slice(data, data_len, "data") }?;
        let shape = unsafe { in_slice(shape, ndim, "shape") }?;
        let out = out_ptr(out, "out")?;
        if shape.is_empty() || shape.len() > 8 {
            return Err(Failure::new(latent_cache_status::Shape, format!("ndim is {}; 1 to 8 extents are taken", shape.len())));
        }
        let array = ops::from_host(data, shape, "data")?;
        unsafe { write(out, give(array)) };
        Ok(())
    }
}

/// Evaluates `array` (borrowed; under the evaluation lock) and copies its values to `out` as
/// float32, row-major; `*written` receives the element count. `out_len` (in floats) must hold
/// them all. Works on any array the library returned (views included) or an engine's own.
/// Returns `OK`, `NULL_ARGUMENT`, `BUFFER_TOO_SMALL`, `BACKEND`; nothing is written on failure.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_to_host(
    array: mlx_array,
    out: *mut f32,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! { unsafe {
        let written = out_ptr(written, "written")?;
        let array = borrow(array, "array")?;
        let values = ops::to_host(&ops::contiguous(&ops::astype(&array, mlx_rs::Dtype::Float32)?)?)?;
        copy_out(out, out_len, &values, written, "out")
    } }
}

/// Frees an array returned by this library (same as mlx-c's `mlx_array_free`). An array with
/// `ctx == NULL` is accepted and ignored. Never free an array twice.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_array_free(array: mlx_array) {
    ffi_boundary!(on_panic = ();
        // SAFETY: the caller hands over an array it owns.
        unsafe { free(array) }
    )
}

/// Evaluates `arrays` (borrowed, `len` entries) in one MLX evaluation, under the process-wide
/// evaluation lock the library itself uses (or the one given to `latent_cache_set_eval_lock`),
/// and returns when their values are ready: for arrays already handed to
/// `latent_cache_eval_async`, it waits for them. Entries with `ctx == NULL` are skipped, so the
/// outputs of an append or `state` on a layer without index keys can be passed as they came.
/// Engines that evaluate from several threads should evaluate through this call, or under the
/// lock they handed the library.
/// Returns `OK`, `NULL_ARGUMENT` (`arrays` NULL with `len > 0`), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_eval(arrays: *const mlx_array, len: usize) -> latent_cache_status {
    ffi_boundary! {
        let borrowed = unsafe { borrow_all(arrays, len) }?;
        Ok(eval::eval(borrowed.iter().map(|a| &**a))?)
    }
}

/// Hands `arrays` (borrowed, `len` entries; `ctx == NULL` skipped) to MLX and returns as soon
/// as their work is queued (MLX's `async_eval`), under the same lock as `latent_cache_eval`;
/// `latent_cache_eval` of the same arrays later waits for their values. A decode loop builds
/// step n + 1, hands it over with this call, and only then waits for step n, so the device runs
/// one step while the host builds the next. Appends into a layer whose buffers step n still
/// reads wait inside the append until that layer's reads are done, so they write in place
/// instead of copying the history (the host stays about a layer behind the device); views of an
/// earlier step the engine still holds make them copy, as without pipelining. Errors MLX
/// reports while running the work surface at the wait.
/// Returns `OK`, `NULL_ARGUMENT` (`arrays` NULL with `len > 0`), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_eval_async(arrays: *const mlx_array, len: usize) -> latent_cache_status {
    ffi_boundary! {
        let borrowed = unsafe { borrow_all(arrays, len) }?;
        Ok(eval::eval_async(borrowed.iter().map(|a| &**a))?)
    }
}

/// Borrows the non-null entries of `arrays` (`len` entries).
///
/// # Safety
/// `arrays` points to `len` handles (or is NULL with `len == 0`).
unsafe fn borrow_all(arrays: *const mlx_array, len: usize) -> FfiResult<Vec<ManuallyDrop<mlx_rs::Array>>> {
    let handles = unsafe { in_slice(arrays, len, "arrays") }?;
    let mut borrowed = Vec::with_capacity(handles.len());
    for (i, &handle) in handles.iter().enumerate().filter(|(_, h)| !h.ctx.is_null()) {
        borrowed.push(unsafe { borrow(handle, &format!("arrays[{i}]")) }?);
    }
    Ok(borrowed)
}
