//! `latent_cache_store`: the prefix store (see `core::store`): the longest stored prefix of a
//! token sequence restored into a set, or lent below its rows, from RAM and from an SSD folder,
//! within byte budgets.
use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard};

use super::args::{in_slice, optional_str, out_ptr, write, write_optional};
use super::error::{set_last_error, Failure, FfiResult};
use super::panic::ffi_boundary;
use super::registry::Registry;
use super::set::{latent_cache_set, with_set_layers};
use super::status::latent_cache_status;
use crate::core::model::geometry::Geometry;
use crate::core::store::{Store, StoreConfig, StoreStats};
use crate::core::LatentCache;

/// A prefix store. Opaque: a token from `latent_cache_store_open`, released with
/// `latent_cache_store_free`, never reused. Every call may come from any thread; calls on one
/// store run one at a time.
pub struct latent_cache_store {
    _opaque: [u8; 0],
}

/// A store's numbers (`latent_cache_store_info`). Blocks and bytes are what each tier holds
/// now (the SSD's as this process last saw its folder); the rest count since it opened.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct latent_cache_store_stats {
    pub ram_blocks: u64,
    pub ram_bytes: u64,
    pub ssd_blocks: u64,
    pub ssd_bytes: u64,
    /// Lookups, restores and attaches that found at least one block, and those that found none.
    pub hits: u64,
    pub misses: u64,
    /// Blocks evicted from RAM; block files evicted from the folder by this process's writes.
    pub ram_evictions: u64,
    pub ssd_evictions: u64,
    pub restores: u64,
    pub attaches: u64,
    /// Blocks puts copied in, and blocks the budgets let no tier take.
    pub blocks_put: u64,
    pub blocks_not_stored: u64,
    /// Block files written behind, and writes that failed (full disk, read-only folder, budget).
    pub blocks_written: u64,
    pub write_failures: u64,
    /// Block files found damaged, moved or planted (at open, a refresh or a read) and dropped.
    pub damaged: u64,
}

static STORES: Registry<Mutex<Store>> = Registry::new("latent_cache_store");

fn with_store<T>(ptr: *const latent_cache_store, f: impl FnOnce(&mut Store) -> FfiResult<T>) -> FfiResult<T> {
    let store = STORES.get(ptr, "store")?;
    let mut guard: MutexGuard<'_, Store> = store.lock().map_err(|_| {
        Failure::new(latent_cache_status::Panic, "this store was left unusable by an earlier internal panic; free it")
    })?;
    f(&mut guard)
}

/// The caller's namespace and tokens, borrowed for the call.
unsafe fn request<'a>(
    namespace: *const u8,
    namespace_len: usize,
    tokens: *const u32,
    n_tokens: usize,
) -> FfiResult<(&'a [u8], &'a [u32])> {
    Ok((unsafe { in_slice(namespace, namespace_len, "namespace") }?, unsafe { in_slice(tokens, n_tokens, "tokens") }?))
}

/// A call answering positions (`*positions`, written on success): the request checked, then
/// `f` with the store and the set's layers locked.
unsafe fn answer(
    store: *mut latent_cache_store,
    set: *const latent_cache_set,
    (namespace, namespace_len, tokens, n_tokens): (*const u8, usize, *const u32, usize),
    positions: *mut usize,
    f: impl FnOnce(&mut Store, &mut [&mut LatentCache], &[u8], &[u32]) -> FfiResult<usize>,
) -> FfiResult<()> {
    let out = out_ptr(positions, "positions")?;
    let (namespace, tokens) = unsafe { request(namespace, namespace_len, tokens, n_tokens) }?;
    let n = with_store(store, |store| with_set_layers(set, |layers| f(store, layers, namespace, tokens)))?;
    unsafe { write(out, n) };
    Ok(())
}

/// Opens a prefix store. Blocks of `block_tokens` tokens (1 to 65536; 256 is a good start) are
/// the unit it stores, keys, evicts and restores. The RAM tier holds at most `ram_bytes` bytes
/// of MLX arrays; where `folder` is not NULL, blocks are also written, behind the calls, to
/// files in it (made where missing), at most `ssd_bytes` bytes of them, and the blocks already
/// there (from earlier runs or other processes) are indexed from their headers: files that do
/// not check (damaged, truncated, another namespace's or geometry's, planted) are removed,
/// temporaries of writes that never finished reaped, symlinks, FIFOs and other names never
/// opened. Processes may share a folder: every change to it holds a lock on `folder/.lock`.
/// `*out` receives the store, owned by the caller (`latent_cache_store_free`).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a block size out of range, a folder that
/// cannot be made or is not a folder, a path not UTF-8), `BACKEND` (the folder stayed locked).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_store_open(
    folder: *const c_char,
    block_tokens: usize,
    ram_bytes: u64,
    ssd_bytes: u64,
    out: *mut *mut latent_cache_store,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let folder = unsafe { optional_str(folder, "folder") }?.map(Into::into);
        let ram_bytes = usize::try_from(ram_bytes).unwrap_or(usize::MAX);
        let store = Store::open(&StoreConfig { block: block_tokens, ram_bytes, ssd_bytes, folder })?;
        unsafe { write(out, STORES.insert(Arc::new(Mutex::new(store)))) };
        Ok(())
    }
}

/// Releases a store: the blocks already handed to its writer are written first; its RAM blocks
/// stay alive with the sets they were lent to. `NULL` is accepted; a store that is not live is
/// ignored with a message.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_store_free(store: *mut latent_cache_store) {
    ffi_boundary!(on_panic = ();
        if !store.is_null() && STORES.remove(store).is_none() {
            set_last_error("latent_cache_store_free: not a live latent_cache_store (double free?)");
        }
    )
}

/// Stores row `row` of `set`, whose first positions are `tokens` (`n_tokens` of them, the
/// engine's token ids), under `namespace` (the caller's bytes, at most 1024: model identity,
/// adapter, anything that must never mix; `NULL, 0` for none): every whole block of those
/// positions (up to the row's length) the store lacks is copied into RAM (nothing the set holds
/// is kept or changed) and written to the folder behind the call; blocks it holds are marked
/// used. `*stored` (may be NULL) receives the blocks newly stored. Blocks neither tier can take
/// (budgets) are counted, not refused.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (composed storage, a namespace too long),
/// `OUT_OF_RANGE` (`row`), `INVALID_STATE` (a round, prefill or maintenance open; layers that
/// disagree), `CAPACITY` (the copies over MLX's memory limit; nothing stored).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_store_put(
    store: *mut latent_cache_store,
    set: *mut latent_cache_set,
    row: usize,
    namespace: *const u8,
    namespace_len: usize,
    tokens: *const u32,
    n_tokens: usize,
    stored: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let (namespace, tokens) = unsafe { request(namespace, namespace_len, tokens, n_tokens) }?;
        let put = with_store(store, |store| {
            with_set_layers(set, |layers| {
                let layers: Vec<&_> = layers.iter().map(|l| &**l).collect();
                Ok(store.put(&layers, row, namespace, tokens)?)
            })
        })?;
        unsafe { write_optional(stored, put.stored) };
        Ok(())
    }
}

/// `*positions` receives the positions of the longest prefix of `tokens` the store holds for
/// `set`'s layers under `namespace` (whole blocks; 0 for none), answered from the indexes (no
/// tensor is read), and past their end from the folder: a block file another process wrote
/// since is found by its name (one `stat` where there is none; its header is read and checked).
/// `set` only names the layers' geometry; it is not changed.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (composed storage, a namespace too long).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_store_lookup(
    store: *mut latent_cache_store,
    set: *const latent_cache_set,
    namespace: *const u8,
    namespace_len: usize,
    tokens: *const u32,
    n_tokens: usize,
    positions: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        unsafe {
            answer(store, set, (namespace, namespace_len, tokens, n_tokens), positions, |store, layers, ns, tokens| {
                let geometries: Vec<Geometry> = layers.iter().map(|l| *l.geometry()).collect();
                Ok(store.lookup(&geometries, ns, tokens)?)
            })
        }
    }
}

/// Restores the longest prefix of `tokens` the store holds into `set`, which must be empty: it
/// then holds one row of those positions, bit for bit as they were put, copied once into its
/// buffers (RAM blocks are read where they lie; blocks from the folder are read, checked
/// against their checksums and promoted to RAM). A block that fails its read (damaged, or
/// evicted by another process) ends the prefix there. `*positions` receives the positions
/// restored (0: none stored; the set stays empty). Every layer or none.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (composed storage, a namespace too long),
/// `INVALID_STATE` (the set holds rows), `CAPACITY` (over MLX's memory limit; the set stays empty).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_store_restore(
    store: *mut latent_cache_store,
    set: *mut latent_cache_set,
    namespace: *const u8,
    namespace_len: usize,
    tokens: *const u32,
    n_tokens: usize,
    positions: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        unsafe {
            answer(store, set, (namespace, namespace_len, tokens, n_tokens), positions, |store, layers, ns, tokens| {
                Ok(store.restore(layers, ns, tokens)?)
            })
        }
    }
}

/// Puts `rows` empty rows of `set` (which must be empty) over the longest prefix of `tokens` the
/// store holds, as `latent_cache_set_attach_prefix` does: RAM blocks are lent as the store holds
/// them, not copied (where the prefix lies in more than 4 stored spans, they are joined once
/// into one, which later attaches lend); blocks from the folder are read and promoted first.
/// Lent blocks are pinned: never evicted while a set reads them. `*positions` receives the
/// prefix's positions (0: none stored; the set stays empty). Every layer or none.
/// Returns what `latent_cache_store_restore` returns, and `INVALID_ARGUMENT` for `rows` 0.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_store_attach(
    store: *mut latent_cache_store,
    set: *mut latent_cache_set,
    namespace: *const u8,
    namespace_len: usize,
    tokens: *const u32,
    n_tokens: usize,
    rows: usize,
    positions: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        unsafe {
            answer(store, set, (namespace, namespace_len, tokens, n_tokens), positions, |store, layers, ns, tokens| {
                Ok(store.attach(layers, ns, tokens, rows)?)
            })
        }
    }
}

/// Waits until every block put so far is in the folder (durable: synced and renamed).
/// Returns `OK`, `NULL_ARGUMENT`, `BACKEND` (a write since the last sync failed: the message
/// names the first; those blocks stay in RAM only).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_store_sync(store: *mut latent_cache_store) -> latent_cache_status {
    ffi_boundary! {
        // The writer runs without the store's lock; waiting on it under the lock only holds
        // other calls on this store for as long.
        with_store(store, |store| Ok(store.sync()?))
    }
}

/// Indexes the folder again (files other processes removed, damaged files dropped; the blocks
/// they wrote are found by lookups without it); `*blocks` (may be NULL) receives the blocks it
/// holds.
/// Returns `OK`, `NULL_ARGUMENT`, `BACKEND` (the folder stayed locked).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_store_refresh(store: *mut latent_cache_store, blocks: *mut usize) -> latent_cache_status {
    ffi_boundary! {
        let n = with_store(store, |store| Ok(store.refresh()?))?;
        unsafe { write_optional(blocks, n) };
        Ok(())
    }
}

/// `*out` receives the store's numbers.
/// Returns `OK`, `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_store_info(
    store: *const latent_cache_store,
    out: *mut latent_cache_store_stats,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let s: StoreStats = with_store(store, |store| Ok(store.stats()))?;
        let stats = latent_cache_store_stats {
            ram_blocks: s.ram_blocks,
            ram_bytes: s.ram_bytes,
            ssd_blocks: s.ssd_blocks,
            ssd_bytes: s.ssd_bytes,
            hits: s.hits,
            misses: s.misses,
            ram_evictions: s.ram_evictions,
            ssd_evictions: s.ssd_evictions,
            restores: s.restores,
            attaches: s.attaches,
            blocks_put: s.blocks_put,
            blocks_not_stored: s.blocks_not_stored,
            blocks_written: s.blocks_written,
            write_failures: s.write_failures,
            damaged: s.damaged,
        };
        unsafe { write(out, stats) };
        Ok(())
    }
}
