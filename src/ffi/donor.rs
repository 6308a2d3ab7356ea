//! `latent_cache_donor`: an immutable snapshot of a cache's rows, and GLM-5's absorbed MLA
//! attention over it (the read path). Donors are tokens in a registry of their own, like caches.
use std::sync::{Arc, Mutex};

use mlx_sys::mlx_array;

use super::args::{copy_out, out_ptr, write};
use super::error::{set_last_error, Failure, FfiResult};
use super::handle::{latent_cache, with_cache};
use super::mlx_array::{borrow, borrow_optional, give, give_optional};
use super::panic::ffi_boundary;
use super::registry::Registry;
use super::status::latent_cache_status;
use crate::core::attention::{Donor, MaskMode};

/// A snapshot of a cache's rows (`latent_cache_capture_donor_rows`). Opaque; a token released
/// with `latent_cache_donor_free`, never reused.
pub struct latent_cache_donor {
    _opaque: [u8; 0],
}

/// Which positions each query sees, besides its row's valid range (`latent_cache_donor_attend`,
/// passed as `uint32_t`).
/// cbindgen:prefix-with-name=false
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum latent_cache_mask_mode {
    /// Every valid position of the row.
    LatentCacheMaskNone = 0,
    /// Bottom-right aligned, as MLX's SDPA: query `i` of `Lq` sees the row's positions up to
    /// `row_end - Lq + i` (the queries are the row's last `Lq` positions); in a row shorter
    /// than `Lq`, the first queries see none and give zeros (a left-padded prompt's padding).
    LatentCacheMaskCausal = 1,
    /// Every valid position, plus the additive `mask` array.
    LatentCacheMaskArray = 2,
}

/// Converts a `latent_cache_mask_mode` value received as an integer.
fn mask_mode(value: u32) -> FfiResult<MaskMode> {
    match value {
        m if m == latent_cache_mask_mode::LatentCacheMaskNone as u32 => Ok(MaskMode::None),
        m if m == latent_cache_mask_mode::LatentCacheMaskCausal as u32 => Ok(MaskMode::Causal),
        m if m == latent_cache_mask_mode::LatentCacheMaskArray as u32 => Ok(MaskMode::Array),
        m => Err(Failure::new(latent_cache_status::InvalidArgument, format!("mode {m} is not a latent_cache_mask_mode"))),
    }
}

/// Live donors by token. A donor's arrays are handles MLX shares between threads; the mutex
/// keeps calls on one donor one at a time, like calls on one cache.
static DONORS: Registry<Mutex<Donor>> = Registry::new("latent_cache_donor");

/// Looks up `ptr`, locks its donor and runs `f` on it.
fn with_donor<T>(ptr: *const latent_cache_donor, f: impl FnOnce(&Donor) -> FfiResult<T>) -> FfiResult<T> {
    let donor = DONORS.get(ptr, "donor")?;
    let guard = donor.lock().map_err(|_| Failure::new(latent_cache_status::Panic, "this donor was left unusable by a panic"))?;
    f(&guard)
}

/// `*out` receives a snapshot of every stored family of `cache` and of its row layout (batch,
/// offset, `left_pad`, `row_ends`), owned by the caller (`latent_cache_donor_free`). No copy is
/// made: it holds the cache's current buffers, so it stays valid and unchanged after the cache
/// appends, trims or is freed, and the cache's next append copies those buffers instead of
/// writing in place while the donor lives. Written only on success.
/// Returns `OK`, `NULL_ARGUMENT`, `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_capture_donor_rows(
    cache: *const latent_cache,
    out: *mut *mut latent_cache_donor,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let donor = with_cache(cache, |cache| Ok(cache.capture_donor_rows()?))?;
        unsafe { write(out, DONORS.insert(Arc::new(Mutex::new(donor)))) };
        Ok(())
    }
}

/// Releases a donor. `NULL` is accepted; a donor that is not live is ignored with a message.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_donor_free(donor: *mut latent_cache_donor) {
    ffi_boundary!(on_panic = ();
        if !donor.is_null() && DONORS.remove(donor).is_none() {
            set_last_error("latent_cache_donor_free: not a live latent_cache_donor (double free?)");
        }
    )
}

/// `*batch` and `*offset` of the snapshot; `left_pad` and `row_ends` (each `batch` values) are
/// copied when non-NULL (`rows_len` is their length, at least `batch`).
/// Returns `OK`, `NULL_ARGUMENT`, `BUFFER_TOO_SMALL`; nothing is written on failure.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_donor_rows(
    donor: *const latent_cache_donor,
    batch: *mut usize,
    offset: *mut usize,
    left_pad: *mut usize,
    row_ends: *mut usize,
    rows_len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let (batch, offset) = (out_ptr(batch, "batch")?, out_ptr(offset, "offset")?);
        with_donor(donor, |donor| {
            let rows = donor.batch_size();
            if (!left_pad.is_null() || !row_ends.is_null()) && rows_len < rows {
                return Err(Failure::new(latent_cache_status::BufferTooSmall, format!("rows_len is {rows_len}; {rows} are needed")));
            }
            let mut written = 0;
            if !left_pad.is_null() {
                unsafe { copy_out(left_pad, rows_len, donor.left_pad(), &mut written, "left_pad")? };
            }
            if !row_ends.is_null() {
                unsafe { copy_out(row_ends, rows_len, &donor.row_ends(), &mut written, "row_ends")? };
            }
            unsafe {
                write(batch, rows);
                write(offset, donor.offset());
            }
            Ok(())
        })
    }
}

/// GLM-5's absorbed MLA attention over the donor's rows:
/// `*out` `[B, H, Lq, kv_lora_rank]` (float32) =
/// `softmax(scale * (q_latent . latent^T + q_rope . rope^T) + mask) . latent`, with `q_latent`
/// `[B, H, Lq, kv_lora_rank]` and `q_rope` `[B, H, Lq, rope_head_dim]` (float32, bfloat16 or
/// float16, borrowed), every row's padding and positions past its end masked out, and `mask`
/// (`ctx == NULL` unless `mode` is `LATENT_CACHE_MASK_ARRAY`) an additive float array
/// broadcastable to `[B, H, Lq, T]` over window positions. Lazy: nothing is evaluated; `*out` is
/// the caller's (free it with `latent_cache_array_free`).
///
/// Float storage is read as stored. The products run in the queries' dtype where the family is
/// stored in it (bfloat16 queries over bfloat16 storage: bfloat16 products, as an engine computing
/// in bfloat16 would, reading nothing converted); float32 queries are computed in float32
/// (exact; a narrower family is converted for the call). `Q8` / `Q4` families are read by MLX's
/// quantized matmul from their packed codes, never expanded (computing in float32), except on
/// MLX's CUDA backend, which has no kernel for these batched shapes: there they are decoded for
/// the call, like `FP8` families everywhere (O(stored) each time), unless the kernel below
/// reads them. By the quantized matmul or decoded, a `Q8` / `Q4` value is `code * scale + bias`
/// in float32 (the bfloat16 scale and bias exact in it), where the cache's reads
/// (`latent_cache_state`, `latent_cache_read_host`: MLX's `dequantize`) and the kernel below
/// round it to bfloat16 (by 2^-9 of it at most).
///
/// On MLX's CUDA backend, mode `NONE` or `CAUSAL` over latent and rope stored in the queries'
/// dtype (bfloat16 or float16), or over a `Q8`, `Q4` or `FP8` latent with `BF16` rope and
/// bfloat16 queries, runs the library's own split-K decoding kernel: the same formula, its
/// probabilities rounded to that dtype for the product with the latent as MLX's fused attention
/// does, sums in float32; a packed latent is read as stored and decoded a tile at a time (`Q8`
/// and `Q4` as MLX's `dequantize` decodes them; `FP8` codes times their scale, rounded to
/// bfloat16). Composed storage with `BF16` hot positions over such a latent takes the same
/// kernel, one pass over each side (O(hot window) extra where rows' hot positions start apart). It is compiled at the first call with each scale (a model
/// has one); past eight scales in a process, further scales run MLX's ops.
///
/// On Apple GPUs (MLX's Metal backend), mode `NONE` or `CAUSAL` over latent and rope stored in
/// the queries' dtype (`F32`, `BF16` or `F16`, not composed), with widths that are multiples of
/// 32, runs the library's Metal split-K kernel: the same formula in float32 arithmetic. It is
/// **untested on Apple hardware**, so the first call of a process with each shape (dtype, widths,
/// heads, queries, causal) first runs it on a small problem and compares it with a float64
/// computation on the host (an evaluation, so that call takes the evaluation lock); where it
/// fails, it is off for that shape (a line on stderr) and MLX's ops compute it. Elsewhere, MLX's
/// ops.
///
/// Returns `OK`, `NULL_ARGUMENT`, `DTYPE`, `SHAPE` (a query's batch or width), `INVALID_ARGUMENT`
/// (unknown mode, a mask with another mode or none with `ARRAY`), `INVALID_STATE` (an empty
/// row), `BACKEND`.
///
/// A query that sees no position gives zeros (never NaN): with `CAUSAL`, the first `Lq - len`
/// queries of a row holding `len < Lq` positions (after `latent_cache_append_latent_padded`,
/// the queries of a prompt's padding, so one call attends a whole batch of prompts of different
/// lengths), which run MLX's operations rather than the kernels; with `ARRAY`, a query whose
/// mask row is -inf at every position.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_donor_attend(
    donor: *const latent_cache_donor,
    q_latent: mlx_array,
    q_rope: mlx_array,
    scale: f32,
    mode: u32,
    mask: mlx_array,
    out: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let mode = mask_mode(mode)?;
        let (q_latent, q_rope) = unsafe { (borrow(q_latent, "q_latent")?, borrow(q_rope, "q_rope")?) };
        let mask = unsafe { borrow_optional(mask, "mask") }?;
        let result = with_donor(donor, |d| Ok(d.attend(&q_latent, &q_rope, scale, mode, mask.as_deref())?))?;
        unsafe { write(out, give(result)) };
        Ok(())
    }
}

/// DSA index scores over the donor's stored index keys: `*out` `[B, Lq, T]` float32 =
/// `sum over index heads h of weights[b, q, h] * ReLU(q_index[b, h, q] . k[b, t])`, with
/// `q_index` `[B, Hi, Lq, index_head_dim]` and `weights` `[B, Lq, Hi]` (float, scaled as the
/// model scales them; borrowed). Positions a query does not see (padding, past its row's end,
/// and with `CAUSAL` the later ones) score -inf. Lazy; `*out` is the caller's.
/// Returns `OK`, `NULL_ARGUMENT`, `DTYPE`, `SHAPE`, `INVALID_ARGUMENT` (a layer without index
/// keys, the `ARRAY` mode, an unknown mode), `INVALID_STATE` (a row with nothing to see), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_donor_index_scores(
    donor: *const latent_cache_donor,
    q_index: mlx_array,
    weights: mlx_array,
    mode: u32,
    out: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let mode = mask_mode(mode)?;
        let (q_index, weights) = unsafe { (borrow(q_index, "q_index")?, borrow(weights, "weights")?) };
        let scores = with_donor(donor, |d| Ok(d.index_scores(&q_index, &weights, mode)?))?;
        unsafe { write(out, give(scores)) };
        Ok(())
    }
}

/// The `k` window positions with the highest `scores` (`[B, Lq, T]`, from
/// `latent_cache_donor_index_scores`) per query: `*out` `[B, Lq, k]` int32, in no particular
/// order (GLM-5.2 uses k = 2048). When the window holds no more than `k` positions `*out`
/// receives `ctx == NULL`: attend densely (`latent_cache_donor_attend`), as DeepSeek's indexer
/// does. Lazy; `*out` is the caller's. Where several positions tie at the k-th highest score,
/// which of them are taken depends on the device: on CUDA and Apple GPUs (the library's top-k
/// kernels) the first ones, in window order; elsewhere as MLX's `argpartition` breaks ties.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (`k` is 0), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_donor_select(
    donor: *const latent_cache_donor,
    scores: mlx_array,
    k: usize,
    out: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let scores = unsafe { borrow(scores, "scores") }?;
        let selected = with_donor(donor, |d| Ok(d.select(&scores, k)?))?;
        unsafe { write(out, give_optional(selected)) };
        Ok(())
    }
}

/// DSA's selection in one call: `latent_cache_donor_select` of `latent_cache_donor_index_scores`
/// (same arguments, checked as there; `*out` as `latent_cache_donor_select` gives it, the same
/// positions). For an engine that needs the selection and not the scores: where the library's
/// kernels run (CUDA, Apple GPUs) the index-score kernel also counts what the top-k kernel's
/// first pass would, one MLX operation fewer per indexer layer. Lazy; `*out` is the caller's.
/// Returns what `latent_cache_donor_index_scores` and `latent_cache_donor_select` return.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_donor_index_select(
    donor: *const latent_cache_donor,
    q_index: mlx_array,
    weights: mlx_array,
    mode: u32,
    k: usize,
    out: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let mode = mask_mode(mode)?;
        let (q_index, weights) = unsafe { (borrow(q_index, "q_index")?, borrow(weights, "weights")?) };
        let selected = with_donor(donor, |d| Ok(d.index_select(&q_index, &weights, mode, k)?))?;
        unsafe { write(out, give_optional(selected)) };
        Ok(())
    }
}

/// Attention over the selected positions alone: `latent_cache_donor_attend`'s formula with each
/// query reading only its `k` positions from `indices` (`[B, Lq, k]` int32, from
/// `latent_cache_donor_select`); selected positions the query does not see are masked out.
/// `*out` `[B, H, Lq, kv_lora_rank]` float32, lazily; reads k positions, not the window.
/// Computed as `latent_cache_donor_attend` computes through MLX's ops, in every storage mode:
/// the selected positions are read as that function reads the window (`Q8` / `Q4` as
/// `code * scale + bias` in float32, `FP8` decoded to float32, float storage as stored, composed
/// storage's hot positions from their values), the products in the queries' dtype where the
/// family is stored in it, else in float32; so it equals `latent_cache_donor_attend` with a mask
/// array hiding the other positions, to float32 rounding (TF32 products on MLX's CUDA
/// backend). For a decode step (`Lq` 1) whose rows each span the window (no padding), the
/// selected positions are read as stored, through the indices, by the split-K kernel where
/// `latent_cache_donor_attend` would take it (MLX's CUDA backend; Apple GPUs, as that function
/// says), computing as that kernel does (on CUDA: 16-bit queries only, a packed latent decoded
/// in bfloat16), so there it agrees with the masked `latent_cache_donor_attend` (MLX's ops) to
/// bfloat16 precision.
/// Indices are not checked against the window (that would need their values on the host): one
/// outside `[0, T)` is clamped, never read outside the cache's buffers. It reads the nearest
/// window position through MLX's ops; on the kernels, the nearest position of the stored buffer,
/// which past `T` holds no valid value.
/// Returns what `latent_cache_donor_attend` returns (`mode` `NONE` or `CAUSAL`), and `SHAPE`
/// for indices of another shape or dtype.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_donor_attend_selected(
    donor: *const latent_cache_donor,
    q_latent: mlx_array,
    q_rope: mlx_array,
    scale: f32,
    mode: u32,
    indices: mlx_array,
    out: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let mode = mask_mode(mode)?;
        let (q_latent, q_rope) = unsafe { (borrow(q_latent, "q_latent")?, borrow(q_rope, "q_rope")?) };
        let indices = unsafe { borrow(indices, "indices") }?;
        let result = with_donor(donor, |d| Ok(d.attend_selected(&q_latent, &q_rope, scale, mode, &indices)?))?;
        unsafe { write(out, give(result)) };
        Ok(())
    }
}
