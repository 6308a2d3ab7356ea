//! `latent_cache_set`: one handle for a model's layers, and every set-wide call (rounds, trims,
//! rows, prefills; saving and loading a set are in `persist` and `mlxbun`). Set-wide calls
//! change every layer or none (see `core::cache::set`); each layer is also lent as an ordinary
//! `latent_cache*` for the per-layer calls of a forward (appends, reads).
use std::sync::{Arc, MutexGuard};

use super::args::{in_slice, out_ptr, write, write_optional};
use super::config::{latent_cache_config, read_config_at, CONFIG_SIZE};
use super::error::{set_last_error, Failure, FfiResult};
use super::handle::{latent_cache, Handle, Release};
use super::panic::ffi_boundary;
use super::prefill::padding;
use super::registry::Registry;
use super::status::latent_cache_status;
use crate::core::cache::set::{change_all, check_agree, extract_row_all, merge_all, new_all, recover_all, rollback_all};
use crate::core::LatentCache;

/// A model's caches as one handle. Opaque: a token from `latent_cache_set_new` (or
/// `latent_cache_set_extract_row`), released with `latent_cache_set_free`, never reused.
pub struct latent_cache_set {
    _opaque: [u8; 0],
}

/// A live set: its layers' tokens (increasing) and handles.
struct SetHandle {
    layers: Vec<(usize, Arc<Handle>)>,
}

/// Live sets by token.
static SETS: Registry<SetHandle> = Registry::new("latent_cache_set");

/// Registers caches as a new set's layers.
pub(crate) fn register_set(caches: Vec<LatentCache>) -> *mut latent_cache_set {
    let layers = caches
        .into_iter()
        .map(|cache| {
            let (token, handle) = Handle::register_layer(cache);
            (token as usize, handle)
        })
        .collect();
    SETS.insert(Arc::new(SetHandle { layers }))
}

fn get(ptr: *const latent_cache_set, name: &str) -> FfiResult<Arc<SetHandle>> {
    SETS.get(ptr, name)
}

/// Locks every layer of `set` (in token order, so set-wide calls cannot deadlock with each
/// other or with merges).
fn lock(set: &SetHandle) -> FfiResult<Vec<MutexGuard<'_, LatentCache>>> {
    set.layers.iter().map(|(_, handle)| handle.lock()).collect()
}

/// Looks up `ptr`, locks all its layers and runs `f` on them.
pub(crate) fn with_set_layers<T>(
    ptr: *const latent_cache_set,
    f: impl FnOnce(&mut [&mut LatentCache]) -> FfiResult<T>,
) -> FfiResult<T> {
    with_layers(ptr, |layers| {
        check_agree(layers)?;
        f(layers)
    })
}

/// Looks up `ptr`, locks all its layers and runs `f` on them.
pub(crate) fn with_layers<T>(
    ptr: *const latent_cache_set,
    f: impl FnOnce(&mut [&mut LatentCache]) -> FfiResult<T>,
) -> FfiResult<T> {
    let set = get(ptr, "set")?;
    let mut guards = lock(&set)?;
    let mut layers: Vec<&mut LatentCache> = guards.iter_mut().map(|g| &mut **g).collect();
    f(&mut layers)
}

/// Creates a set of `n_layers` empty caches, layer `i` with `layers[i]` (each checked as
/// `latent_cache_new` checks it). `*out` receives the set, owned by the caller (free it with
/// `latent_cache_set_free`); written only on success.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (no layers, or a layer's config refused;
/// the message names the layer).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_new(
    layers: *const latent_cache_config,
    n_layers: usize,
    out: *mut *mut latent_cache_set,
) -> latent_cache_status {
    ffi_boundary! {
        if layers.is_null() && n_layers > 0 {
            return Err(Failure::null("layers"));
        }
        let out = out_ptr(out, "out")?;
        // The array's stride is the caller's struct size, which the first config says; every
        // config must say the same (one header compiled them all).
        let first_size = if n_layers == 0 { 0 } else { unsafe { layers.cast::<usize>().read() } };
        let stride = if first_size == 0 { CONFIG_SIZE } else { first_size };
        let mut geometries = Vec::with_capacity(n_layers);
        for i in 0..n_layers {
            let name = format!("layers[{i}]");
            // SAFETY: the caller's promise: `n_layers` configs of its own size; the stride is
            // checked by read_config_at before any byte past the first config is read, and
            // the first config's size before the second's address is formed.
            let at = unsafe { layers.cast::<u8>().add(i * stride) };
            let size = unsafe { at.cast::<usize>().read_unaligned() };
            if size != first_size {
                return Err(Failure::new(
                    latent_cache_status::InvalidArgument,
                    format!("{name}.struct_size is {size}, layers[0]'s {first_size}: configs of one array come from one header"),
                ));
            }
            let config = unsafe { read_config_at(at, size, &name) }?;
            geometries.push(config.geometry().map_err(|f| f.prefixed(&name))?);
        }
        let caches = new_all(&geometries)?;
        unsafe { write(out, register_set(caches)) };
        Ok(())
    }
}

/// Releases a set and every layer's cache (layer handles lent by `latent_cache_set_layer` stop
/// being live). `NULL` is accepted; a set that is not live is ignored with a message set.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_free(set: *mut latent_cache_set) {
    ffi_boundary!(on_panic = ();
        if set.is_null() {
            return;
        }
        match SETS.remove(set) {
            Some(handle) => {
                for (token, _) in &handle.layers {
                    let released = Handle::release(*token as *const latent_cache, true);
                    debug_assert_eq!(released, Release::Released);
                }
            }
            None => set_last_error("latent_cache_set_free: not a live latent_cache_set (double free?)"),
        }
    )
}

/// `*out` = the number of layers.
/// Returns `OK`, or `NULL_ARGUMENT` when set or out is NULL (nothing is written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_layer_count(set: *const latent_cache_set, out: *mut usize) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let count = get(set, "set")?.layers.len();
        unsafe { write(out, count) };
        Ok(())
    }
}

/// `*out` = layer `i`'s cache, lent: valid while the set lives, usable with every
/// `latent_cache_*` call (appends and reads during a forward). Never free it:
/// `latent_cache_free` on it does nothing but set a message; `latent_cache_set_free` releases it.
/// Driving one layer's rows alone (a trim, a round) makes the set's layers disagree, which the
/// next set-wide call reports (`INVALID_STATE`).
/// Returns `OK`, `NULL_ARGUMENT`, `OUT_OF_RANGE` (`i` >= the layer count).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_layer(
    set: *const latent_cache_set,
    i: usize,
    out: *mut *mut latent_cache,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let handle = get(set, "set")?;
        let Some(&(token, _)) = handle.layers.get(i) else {
            return Err(Failure::new(
                latent_cache_status::OutOfRange,
                format!("layer {i} out of range: the set has {} layers", handle.layers.len()),
            ));
        };
        unsafe { write(out, token as *mut latent_cache) };
        Ok(())
    }
}

/// Set-wide trim: every layer drops its last `n` positions (rules of `latent_cache_trim`).
/// Every set-wide call below changes all layers or none; when the layers disagree about their
/// rows or round it returns `INVALID_STATE` and changes nothing.
/// Returns what `latent_cache_trim` returns, and `INVALID_STATE`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_trim(set: *mut latent_cache_set, n: usize, bypass: bool) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, |l| l.prepare_trim(n, bypass))?)) }
}

/// Set-wide `latent_cache_spec_round_begin`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_spec_round_begin(set: *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, LatentCache::prepare_round_begin)?)) }
}

/// Set-wide `latent_cache_spec_round_commit`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_spec_round_commit(set: *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, LatentCache::prepare_round_commit)?)) }
}

/// Set-wide `latent_cache_spec_round_rollback` (every row keeps `keep`). The layers need only
/// have begun the round together: where a forward inside the round was refused at a middle layer
/// (the layers before it hold the new positions, the others not), a rollback keeping 0 brings
/// every layer back to the round's start (a keep more than some layer appended is
/// `OUT_OF_RANGE`, nothing changed). Returns what `latent_cache_spec_round_rollback` returns,
/// and `INVALID_STATE` when the layers did not begin one round over the same rows.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_spec_round_rollback(set: *mut latent_cache_set, keep: usize) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(rollback_all(layers, |l| l.prepare_rollback_all(keep))?)) }
}

/// Cuts every layer of `set` back to the positions all its layers hold: the way back from a
/// forward refused partway (an append refused at layer 40, say, under MLX's memory limit, left
/// layers 0-39 holding the new positions; every other set-wide call then returns
/// `INVALID_STATE`). Each layer drops what it holds beyond the shortest layer, the same count
/// from every row (with bypass: inside a round this stays above the round's start, and a
/// rollback still finds it). `*dropped` (optional: NULL for none) receives the most positions a
/// layer dropped (0 when the layers agreed; nothing changes then). Every layer or none.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_STATE` (layers that differ otherwise: their rows, an
/// open round or prefill on some only, counts that differ from row to row).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_recover(set: *mut latent_cache_set, dropped: *mut usize) -> latent_cache_status {
    ffi_boundary! {
        let most = with_layers(set, |layers| Ok(recover_all(layers)?))?;
        unsafe { write_optional(dropped, most) };
        Ok(())
    }
}

/// Set-wide `latent_cache_spec_round_rollback_rows` (layers need only have begun the round
/// together, as for `latent_cache_set_spec_round_rollback`).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_spec_round_rollback_rows(
    set: *mut latent_cache_set,
    keep: *const usize,
    keep_len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let keep = unsafe { in_slice(keep, keep_len, "keep") }?;
        with_layers(set, |layers| Ok(rollback_all(layers, |l| l.prepare_rollback(keep))?))
    }
}

/// Set-wide `latent_cache_reserve`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_reserve(set: *mut latent_cache_set, tokens: usize) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, |l| l.prepare_reserve(tokens))?)) }
}

/// Set-wide `latent_cache_reserve_rows`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_reserve_rows(set: *mut latent_cache_set, rows: usize) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, |l| l.prepare_reserve_rows(rows))?)) }
}

/// Set-wide `latent_cache_shrink_rows`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_shrink_rows(set: *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, LatentCache::prepare_shrink_rows)?)) }
}

/// Set-wide `latent_cache_reset` (also of layers that disagree). Returns `OK` or `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_reset(set: *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! {
        with_layers(set, |layers| {
            layers.iter_mut().for_each(|l| l.reset());
            Ok(())
        })
    }
}

/// Set-wide `latent_cache_filter_rows`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_filter_rows(
    set: *mut latent_cache_set,
    rows: *const usize,
    rows_len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let rows = unsafe { in_slice(rows, rows_len, "rows") }?;
        with_layers(set, |layers| Ok(change_all(layers, |l| l.prepare_filter(rows))?))
    }
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

/// Set-wide `latent_cache_prefill_begin`: every layer or none.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_prefill_begin(set: *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, LatentCache::prepare_prefill_begin)?)) }
}

/// Set-wide `latent_cache_prefill_commit`: every layer or none.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_prefill_commit(
    set: *mut latent_cache_set,
    rows: *const usize,
    len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let rows = unsafe { in_slice(rows, len, "rows") }?;
        with_layers(set, |layers| Ok(change_all(layers, |l| l.prepare_prefill_commit(rows))?))
    }
}

/// Set-wide `latent_cache_prefill_end`: every layer or none.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_prefill_end(set: *mut latent_cache_set) -> latent_cache_status {
    ffi_boundary! { with_layers(set, |layers| Ok(change_all(layers, LatentCache::prepare_prefill_end)?)) }
}

/// Appends every row of every source set after the rows of `destination`, in order, layer by
/// layer (rules of `latent_cache_merge_rows`: an empty set is filled; a set holding rows keeps
/// them and the joining rows take free slots; sources must have as many layers, each with the
/// destination layer's geometry, limit, storage, layout and role). Sources are not changed.
/// Every layer or none. Returns what `latent_cache_merge_rows` returns, and `INVALID_STATE`
/// (layers that disagree).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_merge_rows(
    destination: *mut latent_cache_set,
    sources: *const *const latent_cache_set,
    sources_len: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let sources = unsafe { in_slice(sources, sources_len, "sources") }?;
        if sources.is_empty() {
            return Err(Failure::new(latent_cache_status::InvalidArgument, "merge needs at least one source"));
        }
        let destination_set = get(destination, "destination")?;
        let mut sets = vec![(destination as usize, destination_set)];
        for (i, &source) in sources.iter().enumerate() {
            if source == destination.cast_const() {
                return Err(Failure::new(latent_cache_status::InvalidArgument, format!("sources[{i}] is the destination")));
            }
            sets.push((source as usize, get(source, &format!("sources[{i}]"))?));
        }
        // Every distinct set locked once, in token order.
        sets.sort_by_key(|&(token, _)| token);
        sets.dedup_by_key(|&mut (token, _)| token);
        let mut guards = Vec::with_capacity(sets.len());
        for (token, set) in &sets {
            guards.push((*token, lock(set)?));
        }
        let at = guards.iter().position(|&(token, _)| token == destination as usize).expect("locked");
        let (_, mut destination_guards) = guards.remove(at);
        let source_layers: Vec<Vec<&LatentCache>> = sources
            .iter()
            .map(|&s| guards.iter().find(|&&(token, _)| token == s as usize).expect("locked").1.iter().map(|g| &**g).collect())
            .collect();
        let mut destination_layers: Vec<&mut LatentCache> = destination_guards.iter_mut().map(|g| &mut **g).collect();
        Ok(merge_all(&mut destination_layers, &source_layers)?)
    }
}

/// A new set holding exactly row `row` of every layer (`latent_cache_extract_row` per layer).
/// `*out` receives it, owned by the caller; written only on success. The source is not changed.
/// Returns `OK`, `NULL_ARGUMENT`, `OUT_OF_RANGE`, `INVALID_STATE`, `CAPACITY`, `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_extract_row(
    set: *const latent_cache_set,
    row: usize,
    out: *mut *mut latent_cache_set,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let caches = with_layers(set, |layers| Ok(extract_row_all(layers, row)?))?;
        unsafe { write(out, register_set(caches)) };
        Ok(())
    }
}

/// `*out` = the bytes every layer's buffers hold now (capacity and free slots included, not only
/// valid state).
/// Returns `OK`, or `NULL_ARGUMENT` when set or out is NULL (nothing is written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_bytes_in_use(set: *const latent_cache_set, out: *mut usize) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let bytes = with_layers(set, |layers| Ok(layers.iter().map(|l| l.bytes_in_use()).sum::<usize>()))?;
        unsafe { write(out, bytes) };
        Ok(())
    }
}
