//! The opaque `latent_cache` handle. The pointer C holds is a token, not an address: a number
//! drawn once from a process-wide counter and never reused, looked up in a registry of live
//! caches. A NULL, foreign or freed handle is refused on every call, even when the allocator has
//! since reused memory for another cache, and a second `latent_cache_free` touches nothing.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use once_cell::sync::Lazy;

use super::error::{Failure, FfiResult};
use super::status::latent_cache_status;
use crate::core::LatentCache;

/// One layer's cache, as C names it. Opaque and never dereferenced: a `latent_cache*` is a
/// token from `latent_cache_new` (or `latent_cache_extract_row`), released with
/// `latent_cache_free`.
pub struct latent_cache {
    _opaque: [u8; 0],
}

/// A live cache. Calls hold an `Arc` for their duration, so a free racing a call releases the
/// cache only after that call returns.
pub(crate) struct Handle {
    /// Serializes every call on this cache: a call's validate-then-commit must not interleave
    /// with another's.
    inner: Mutex<LatentCache>,
    /// A layer of a `latent_cache_set`: lent to the caller, released only with its set.
    owned_by_set: bool,
}

/// What `Handle::release` did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Release {
    Released,
    NotLive,
    /// A set's layer: left alone (the set releases it).
    OwnedBySet,
}

/// Tokens step by 16 so they look like aligned pointers to tools that inspect them; the counter
/// starts at 1 so no token is NULL. A 64-bit counter does not wrap within a process's life.
const TOKEN_STEP: usize = 16;
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(1);

/// A fresh token, never handed out before (caches and sets share the counter).
pub(crate) fn next_token() -> usize {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) * TOKEN_STEP
}

/// Live caches by token.
static LIVE: Lazy<RwLock<HashMap<usize, Arc<Handle>>>> = Lazy::new(|| RwLock::new(HashMap::new()));

fn live_read() -> std::sync::RwLockReadGuard<'static, HashMap<usize, Arc<Handle>>> {
    LIVE.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn live_write() -> std::sync::RwLockWriteGuard<'static, HashMap<usize, Arc<Handle>>> {
    LIVE.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Handle {
    /// Registers a cache under a new token; the token is what C holds.
    pub(crate) fn register(cache: LatentCache) -> *mut latent_cache {
        Self::register_as(cache, false).0
    }

    /// Registers a set's layer: callable like any cache, released only by its set.
    pub(crate) fn register_layer(cache: LatentCache) -> (*mut latent_cache, Arc<Handle>) {
        Self::register_as(cache, true)
    }

    fn register_as(cache: LatentCache, owned_by_set: bool) -> (*mut latent_cache, Arc<Handle>) {
        let token = next_token();
        let handle = Arc::new(Handle { inner: Mutex::new(cache), owned_by_set });
        live_write().insert(token, handle.clone());
        (token as *mut latent_cache, handle)
    }

    /// Unregisters a token; its cache is dropped once no call holds it. A set's layer is left
    /// alone unless `by_set`.
    pub(crate) fn release(ptr: *const latent_cache, by_set: bool) -> Release {
        let mut live = live_write();
        match live.get(&(ptr as usize)) {
            None => Release::NotLive,
            Some(handle) if handle.owned_by_set && !by_set => Release::OwnedBySet,
            Some(_) => {
                live.remove(&(ptr as usize));
                Release::Released
            }
        }
    }

    /// The live cache behind a token.
    pub(crate) fn get(ptr: *const latent_cache, name: &str) -> FfiResult<Arc<Handle>> {
        if ptr.is_null() {
            return Err(Failure::null(name));
        }
        live_read().get(&(ptr as usize)).cloned().ok_or_else(|| {
            Failure::new(
                latent_cache_status::NullArgument,
                format!("{name} is not a live latent_cache (freed, or never created by this library)"),
            )
        })
    }

    /// Locks the cache for one call.
    pub(crate) fn lock(&self) -> FfiResult<MutexGuard<'_, LatentCache>> {
        self.inner.lock().map_err(|_| {
            Failure::new(latent_cache_status::Panic, "this cache was left unusable by an earlier internal panic; free it")
        })
    }
}

/// Looks up `ptr`, locks its cache and runs `f` on it.
pub(crate) fn with_cache<T>(ptr: *const latent_cache, f: impl FnOnce(&mut LatentCache) -> FfiResult<T>) -> FfiResult<T> {
    let handle = Handle::get(ptr, "cache")?;
    let mut cache = handle.lock()?;
    f(&mut cache)
}
