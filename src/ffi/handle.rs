//! The opaque `latent_cache` handle: a core cache behind a mutex, plus a registry of live handles
//! so that NULL, foreign and already-freed pointers are refused instead of dereferenced.
use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

use once_cell::sync::Lazy;

use super::error::{Failure, FfiResult};
use super::status::latent_cache_status;
use crate::core::LatentCache;

/// One layer's cache. Opaque to C: create with `latent_cache_new`, release with
/// `latent_cache_free`.
pub struct latent_cache {
    /// Serializes every call on this handle: MLX graph building is not thread-safe per array,
    /// and a call's validate-then-commit must not interleave with another's.
    inner: Mutex<LatentCache>,
}

/// Addresses of handles that are live (created and not yet freed).
static LIVE: Lazy<Mutex<HashSet<usize>>> = Lazy::new(|| Mutex::new(HashSet::new()));

fn live() -> MutexGuard<'static, HashSet<usize>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl latent_cache {
    /// Boxes a cache and registers it; the pointer is what C holds.
    pub(crate) fn into_raw(cache: LatentCache) -> *mut latent_cache {
        let ptr = Box::into_raw(Box::new(latent_cache { inner: Mutex::new(cache) }));
        live().insert(ptr as usize);
        ptr
    }

    /// Unregisters and drops a handle; false when `ptr` was not live.
    pub(crate) unsafe fn free(ptr: *mut latent_cache) -> bool {
        if !live().remove(&(ptr as usize)) {
            return false;
        }
        // SAFETY: the pointer was live, so it came from into_raw and is freed exactly once.
        drop(unsafe { Box::from_raw(ptr) });
        true
    }

    /// Borrows a live handle.
    pub(crate) unsafe fn from_ptr<'a>(ptr: *const latent_cache, name: &str) -> FfiResult<&'a latent_cache> {
        if ptr.is_null() {
            return Err(Failure::null(name));
        }
        if !live().contains(&(ptr as usize)) {
            return Err(Failure::new(
                latent_cache_status::NullArgument,
                format!("{name} is not a live latent_cache (freed, or never created by latent_cache_new)"),
            ));
        }
        // SAFETY: registered handles point to live boxes until latent_cache_free.
        Ok(unsafe { &*ptr })
    }

    /// Locks the cache for one call.
    pub(crate) fn lock(&self) -> FfiResult<MutexGuard<'_, LatentCache>> {
        self.inner.lock().map_err(|_| {
            Failure::new(
                latent_cache_status::Panic,
                "this cache was left unusable by an earlier internal panic; free it",
            )
        })
    }
}

/// Locks `handle` and runs `f` on its cache.
pub(crate) unsafe fn with_cache<T>(
    ptr: *const latent_cache,
    f: impl FnOnce(&mut LatentCache) -> FfiResult<T>,
) -> FfiResult<T> {
    let handle = unsafe { latent_cache::from_ptr(ptr, "cache") }?;
    let mut cache = handle.lock()?;
    f(&mut cache)
}

/// Locks `handle` and runs `f` with a borrowed list of row counts or indices (`keep`).
pub(crate) unsafe fn with_cache_and_rows(
    ptr: *const latent_cache,
    keep: *const usize,
    keep_len: usize,
    f: impl FnOnce(&mut LatentCache, &[usize]) -> crate::core::Result<()>,
) -> super::status::latent_cache_status {
    super::panic::run(|| unsafe {
        let keep = super::args::in_slice(keep, keep_len, "keep")?;
        with_cache(ptr, |cache| Ok(f(cache, keep)?))
    })
}
